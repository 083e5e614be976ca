"""``benchmarks/instructions.py``: each case's workload runs (without valgrind, which would
take minutes), and bad arguments are refused. The counts themselves are the benchmark's to
report, never checked here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "instructions.py")


@pytest.mark.parametrize("case", ["app", "batched", "shaped", "bare", "service"])
def test_each_case_runs_its_cycles(case: str, tmp_path: Path) -> None:
    """... and leaves nothing behind (a store was left in /tmp by each case's run)."""
    run = subprocess.run([sys.executable, SCRIPT, "--case", case, "--cycles", "3"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cycles", ["300,100", "0,100", "100", "x"])
def test_bad_cycles_are_refused_in_one_line(cycles: str) -> None:
    run = subprocess.run([sys.executable, SCRIPT, "--cycles", cycles],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2
    assert "--cycles: " in run.stderr and repr(cycles) in run.stderr, run.stderr
