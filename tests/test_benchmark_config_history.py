"""``benchmarks/config_history.py`` runs at tiny sizes (its numbers are its own to report,
never checked here), and bad arguments are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "config_history.py")


def test_it_prints_a_row_per_step_and_the_ratios() -> None:
    run = subprocess.run([sys.executable, SCRIPT, "--versions", "2", "--every", "1",
                          "--queues", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    _, header, *rows, ratios = run.stdout.splitlines()
    assert "in process ms" in header and [row.split()[0] for row in rows] == ["1", "2"]
    assert "list KB" in header and ratios.startswith("last/first ")
    assert len(ratios.split()) == 6


@pytest.mark.parametrize(("args", "said"), [
    (["--versions", "0"], "--versions must be at least 1"),
    (["--every", "x"], "--every: invalid int value: 'x'"),
    (["--queues", "0"], "--queues must be at least 1"),
    # Its documents are longer than a config may be: a traceback at the first apply.
    (["--queues", "150"], "--queues 150: its documents are longer than the 60,000"),
])
def test_bad_arguments_are_refused(args: list[str], said: str) -> None:
    run = subprocess.run([sys.executable, SCRIPT, *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr.splitlines()[-1], run.stderr
