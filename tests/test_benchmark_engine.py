"""``benchmarks/engine.py`` (``make bench``), ``benchmarks/store_pass.py`` and
``benchmarks/fairshare.py`` run, on small sizes, and refuse bad arguments in one line. Their times are theirs to report, never checked
here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("distinct", [[], ["--distinct", "unmetered"], ["--distinct", "metered"]])
def test_the_engine_benchmark_prints_each_size_and_the_stream(distinct: list[str]) -> None:
    run = bench("engine.py", "--sizes", "100,300", "--stream", "2", *distinct)
    assert run.returncode == 0, run.stderr
    header, *rows, streamed = run.stdout.splitlines()
    assert header.split()[:3] == ["queued", "case", "pass"]
    assert [row.split()[0] for row in rows] == ["100", "100", "300", "300"]
    granted = [int(row.split()[-2]) for row in rows]
    assert granted[0] > 0 and granted[1] == 0  # admits work; nothing admissible
    assert streamed.startswith("stream at 300 queued: ") and "in 2 passes" in streamed


def test_the_store_benchmark_prints_each_size_and_the_ratio() -> None:
    run = bench("store_pass.py", "--sizes", "30,100")
    assert run.returncode == 0, run.stderr
    header, *rows, ratio = run.stdout.splitlines()
    assert header.split()[:3] == ["queued", "load", "s"]
    assert [row.split()[0] for row in rows] == ["30", "100"]
    assert all(float(value) >= 0 for row in rows for value in row.split()[1:])
    assert ratio.startswith("ratio 100/30 (3.33333x the requests): load ")


@pytest.mark.parametrize(("script", "args", "said"), [
    ("store_pass.py", ["--sizes", "10,x"], "--sizes: not positive integers, comma-separated"),
    ("engine.py", ["--sizes", "abc"], "--sizes: not positive integers, comma-separated"),
    ("engine.py", ["--sizes", "0"], "--sizes: not positive integers, comma-separated"),
    ("engine.py", ["--stream", "0"], "--stream: not a positive integer: '0'"),
    ("fairshare.py", ["--runs", "0"], "--runs: not a positive integer: '0'"),
    ("fairshare.py", ["--sizes", "10"], "--sizes: not pools:operations pairs"),
])
def test_bad_arguments_are_one_line(script: str, args: list[str], said: str) -> None:
    run = bench(script, *args)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr.splitlines()[-1], run.stderr


def test_the_fair_share_benchmark_prints_each_size() -> None:
    run = bench("fairshare.py", "--sizes", "10:100,100:1000", "--runs", "1")
    assert run.returncode == 0, run.stderr
    header, *rows = run.stdout.splitlines()[:3]
    assert "update ms" in header
    assert [row.split()[:2] for row in rows] == [["10", "100"], ["100", "1000"]]
