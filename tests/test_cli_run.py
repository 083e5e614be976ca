"""``fairpool run`` in a subprocess: env, exit codes, release, preemption with retry, timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.test_cli import CLI, cli_env, fairpool


def setup(home: Path) -> None:
    fairpool(home, "resource-pool", "create", "p", "-c", '{"gpu": 1}').ok()
    fairpool(home, "resource-pool", "attach-policy", "p", "low", "-p", "1").ok()
    fairpool(home, "resource-pool", "attach-policy", "p", "high", "-p", "9").ok()


def statuses(home: Path) -> list[tuple[str, str, int]]:
    items = fairpool(home, "resource-request", "list", "-o", "json").ok().json["items"]
    return [(i["component"], i["status"], i["attempt"]) for i in items]


def test_run_passes_the_grant_in_the_environment_and_its_exit_code_back(tmp_path: Path) -> None:
    setup(tmp_path)
    script = (
        "import json, os, sys; print(os.environ['FAIRPOOL_POOL'], "
        "json.loads(os.environ['FAIRPOOL_RESOURCES'])['gpu'], "
        "len(os.environ['FAIRPOOL_REQUEST_ID'])); sys.exit(3)"
    )
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--",
                      sys.executable, "-c", script)
    assert result.code == 3, result
    assert result.out.split() == ["p", "1", "36"]
    assert statuses(tmp_path) == [("low", "released", 1)]


def test_run_refuses_what_can_never_fit(tmp_path: Path) -> None:
    setup(tmp_path)
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "2", "--", "true")
    assert result.code == 1
    assert "was rejected: pool p: gpu requested 2 > capacity 1" in result.err


def test_run_gives_up_after_timeout_and_cancels(tmp_path: Path) -> None:
    setup(tmp_path)
    fairpool(tmp_path, "resource-request", "create", "--component", "high", "--gpu-count", "1").ok()
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1",
                      "--timeout", "1", "--", "true")
    assert result.code == 2, result
    assert "position 1 in pool `p`" in result.err
    assert statuses(tmp_path) == [("high", "allocated", 1), ("low", "cancelled", 1)]


def test_preempted_command_is_terminated_and_rerun_on_its_retry(tmp_path: Path) -> None:
    setup(tmp_path)
    marker = tmp_path / "runs.txt"
    script = (
        "import signal, sys, time\n"
        f"open({str(marker)!r}, 'a').write('start\\n')\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        f"time.sleep(0.2 if open({str(marker)!r}).read().count('start') > 1 else 30)\n"
    )
    runner = subprocess.Popen(
        [*CLI, "run", "--component", "low", "--gpu-count", "1", "--max-retries", "1",
         "--lease-ttl", "1", "--grace", "2", "--", sys.executable, "-c", script],
        env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    boss = fairpool(tmp_path, "resource-request", "create", "--component", "high",
                    "--gpu-count", "1", "-o", "json").ok().json
    assert boss["status"] == "allocated"
    time.sleep(2)  # the runner hears of it at its next heartbeat and stops the command
    fairpool(tmp_path, "resource-request", "release", boss["id"]).ok()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert marker.read_text().count("start") == 2
    assert "was preempted: preempted by request" in err
    assert "Retrying as attempt 2" in err
    assert sorted(statuses(tmp_path)) == [
        ("high", "released", 1), ("low", "preempted", 1), ("low", "released", 2),
    ]
    events = json.dumps(statuses(tmp_path))
    assert "allocated" not in events
