"""``benchmarks/workloads.py`` runs at tiny sizes (its numbers are its own to report, never
checked here), and bad arguments are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "workloads.py")


def test_it_prints_a_row_per_size() -> None:
    run = subprocess.run([sys.executable, SCRIPT, "--sizes", "3,6", "--submits", "2"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    header, *rows = run.stdout.splitlines()
    assert "ratio" in header and [row.split()[0] for row in rows] == ["3", "6"]


@pytest.mark.parametrize(("args", "said"), [
    (["--sizes", "0"], "--sizes: a comma-separated list of positive sizes: '0'"),
    (["--sizes", "x"], "--sizes: a comma-separated list of positive sizes: 'x'"),
    (["--sizes", "5,5"], "--sizes: a size given twice: '5,5'"),  # a crash, the store reused
    (["--submits", "0"], "--submits"),
])
def test_bad_arguments_are_refused(args: list[str], said: str) -> None:
    run = subprocess.run([sys.executable, SCRIPT, *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr.splitlines()[-1], run.stderr
