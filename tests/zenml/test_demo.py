"""``make zenml-demo`` (examples/zenml/run.sh) end to end, with the race it once lost forced:
its pipeline and watch.py start at once, and ZenML rewrites its config.yaml in place (no
atomic rename), so watch.py could read it empty and use a local SQLite store instead of the
server ("Resource pool functionality is not enabled")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zenml.zen_stores.resource_pools.store_interface")

from tests.zenml.conftest import zenml_bin

ROOT = Path(__file__).parents[2]

#: The venv's python for run.sh: pipeline.py empties config.yaml, as ZenML's in-place write
#: does for a moment, and keeps it empty until watch.py has loaded its configuration.
SHIM = """#!/usr/bin/env bash
real={real}
marks={marks}
wait_for() {{
    for _ in $(seq 1200); do [ -e "$1" ] && return; sleep 0.1; done
    echo "shim: $1 never appeared" >&2; exit 3
}}
case "${{1:-}}" in
examples/zenml/pipeline.py)
    cp "$ZENML_CONFIG_PATH/config.yaml" "$marks/config.yaml"
    : > "$ZENML_CONFIG_PATH/config.yaml"
    touch "$marks/emptied"
    wait_for "$marks/watch-loaded"
    cp "$marks/config.yaml" "$ZENML_CONFIG_PATH/config.yaml"
    exec "$real" "$@" ;;
examples/zenml/watch.py)
    wait_for "$marks/emptied"
    exec "$real" -c '
import runpy, sys
from zenml.config.global_config import GlobalConfiguration
GlobalConfiguration().zen_store  # the configuration watch.py will use, loaded now
open(sys.argv[1], "w").close()
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
' "$marks/watch-loaded" "$@" ;;
esac
exec "$real" "$@"
"""


def test_the_demo_runs_while_the_pipeline_rewrites_its_config(tmp_path: Path) -> None:
    venv, marks = tmp_path / "venv", tmp_path / "marks"
    (venv / "bin").mkdir(parents=True)
    marks.mkdir()
    (venv / "bin" / "zenml").symlink_to(zenml_bin())
    shim = venv / "bin" / "python"
    shim.write_text(SHIM.format(real=sys.executable, marks=marks))
    shim.chmod(0o755)
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith("ZENML_") and key != "VIRTUAL_ENV"
    }
    env.update(ZENML_VENV=str(venv), TMPDIR=str(tmp_path))
    log = tmp_path / "demo.out"
    with log.open("w") as sink:
        demo = subprocess.Popen(["bash", "examples/zenml/run.sh"], cwd=ROOT, env=env,
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        code = demo.wait(timeout=800)  # ~150 s on an idle machine; over 400 s seen on a loaded one
    finally:
        if demo.poll() is None:  # SIGTERM: run.sh's exit trap stops the server
            demo.send_signal(signal.SIGTERM)
            demo.wait(timeout=60)
    out = log.read_text()
    assert code == 0, out[-4000:]
    assert (marks / "watch-loaded").exists()  # the race was forced
    assert "--- 1 step(s) queued behind a full pool" in out
    assert "--- the queued step(s) granted" in out
    assert "Pipeline `training_sweep` completed successfully." in out
    # The three train steps' requests and the report step's.
    assert out.count("released: step run completed") == 4, out[-3000:]
