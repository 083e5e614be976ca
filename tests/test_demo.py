"""``make demo``'s tour (examples/tour.sh), run as the README's first command runs it: the
installed ``fairpool`` command on a fresh embedded store, each section's outcome checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parent.parent / "examples" / "tour.sh"


@pytest.mark.long
def test_the_demo_tour_runs_and_shows_what_it_says(tmp_path: Path) -> None:
    venv_bin = str(Path(sys.executable).parent)  # the `fairpool` console script, its python3
    done = subprocess.run(
        ["bash", str(TOUR)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
             "FAIRPOOL_HOME": str(tmp_path / "home"), "COLUMNS": "250"},
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert (tmp_path / "home" / "fairpool.db").is_file()  # the home given, not a temporary one
    out = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).split())
    sections = re.split(r"== ", out)[1:]
    assert len(sections) == 10, [s[:60] for s in sections]
    pools, teams, burst, rejections, preemption, waits, release, config, trees, starving = sections

    assert "Created resource pool `training-gpus`." in pools
    assert teams.count("Attached pool policy") == 2
    assert burst.count("allocated in resource pool `training-gpus`") == 3
    assert "rejected: pool training-gpus: gpu requested 10 > capacity 8" in rejections
    assert ("rejected: policy prod-orch on training-gpus: gpu requested 4 > reserved 2 "
            "(non-preemptible: reserve more gpu in the policy, or make the request "
            "preemptible)") in rejections
    # Prod is granted at once; sandbox's newest borrowed run was preempted, its retry queued.
    assert re.search(r"REASON │ allocated on pool training-gpus \(policy priority 100\), "
                     r"preempting request [0-9a-f-]{36} │", preemption), preemption
    assert preemption.count("│ active │ allocated │") == 3
    assert "│ queued │ queued │ sandbox-orch │ gpu 2, step_run 1 │ 1 │" in preemption
    assert "waiting: pool training-gpus: gpu requested 2, free 0 of 8" in waits
    # After prod's release the retry (attempt 2 of the preempted request) is granted.
    assert re.search(r"status: allocated .* attempt: 2 previous_attempt_id: \S+", release)
    assert "gpu 6/8" in release
    assert config.count("-> admitted to queue q-m5-2xlarge-cap3") == 3
    assert "-> queued in queue q-m5-2xlarge-cap3: flavor m5-2xlarge: cpu requested 8, " \
        "free 0 of nominal_quota 24" in config
    # Research, starving below its fair share with the timeout at 0, took it back from batch.
    before = trees.split("$ fairpool pool-tree show physical")[1]
    after = starving.split("$ fairpool pool-tree show physical")[1]
    assert re.search(r"│ research │ 0\.625 │ 0\.(?!625)\d+ │", before), before
    assert re.search(r"│ research │ 0\.625 │ 0\.625 │", after), after
