"""``benchmarks/http.py`` runs end to end: a bare endpoint and a fairpool server per backend,
real clients, every figure printed. A brief run, for its working only: the figures are
checked to be there and positive, never against a time (the benchmark reports them)."""

from __future__ import annotations

import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from tests.conftest import PostgresServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
def test_the_http_benchmark_measures_both_backends_and_the_bare_endpoint(
    postgres: PostgresServer,
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "http.py"), "--clients", "2",
         "--duration", "0.5"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    bare = re.findall(r"bare FastAPI POST endpoint \(([\w ]+)\), 2 clients: ([\d,]+) "
                      r"requests/s; per request server CPU [\d.]+ ms, clients' CPU [\d.]+ ms", out)
    cases = [("sqlite", "uncontended"), ("sqlite", "contended"),
             ("postgresql", "uncontended"), ("postgresql", "contended")]
    # Measured before the first case and after each, for the ratio of the case between.
    assert [when for when, _ in bare] == ["first"] + [f"after {b} {c}" for b, c in cases], out
    rates = [int(rate.replace(",", "")) for _, rate in bare]
    assert all(rates), out
    rows = re.findall(r"^(sqlite|postgresql) +(uncontended|contended) +(\d+) +([\d,]+) "
                      r".* ([\d,]+) +([\d.]+) +([\d.]+)$", out, re.MULTILINE)
    assert [(backend, case) for backend, case, *_ in rows] == cases, out
    for (_, _, _, admissions, bare_rate, ratio, cpu_ratio), around in zip(
        rows, pairwise(rates), strict=True
    ):
        # As printed, each rounded: within a unit, or a hundredth.
        mean = sum(around) / 2
        assert int(admissions.replace(",", "")) > 0, out
        assert abs(int(bare_rate.replace(",", "")) - mean) <= 1, out
        assert abs(float(ratio) - int(admissions.replace(",", "")) / mean) <= 0.011, out
        assert float(cpu_ratio) > 0, out
    # The mean write batch: at least the one operation a transaction holds.
    batches = re.findall(r"^(?:sqlite|postgresql) +\w+ +\d+ +[\d,]+ +[\d.]+ +[\d.]+ +([\d.]+) ",
                         out, re.MULTILINE)
    assert len(batches) == 4 and all(float(size) >= 1 for size in batches), out
    assert len(re.findall(r"^ratio admissions/s / bare requests/s \(\w+, \w+\): [\d.]+ ",
                          out, re.MULTILINE)) == 4, out
    # Contended: the release -> next waiter's allocation times, p50 <= p99, over the wakes
    # counted (a brief run may see none: then none is printed).
    wakes = re.findall(r"^(?:sqlite|postgresql) +contended .* (\S+) +(\S+) +(\d+) +[\d,]+ +[\d.]+ +[\d.]+$",
                       out, re.MULTILINE)
    assert len(wakes) == 2, out
    for p50, p99, count in wakes:
        if int(count):
            assert 0 < float(p50) <= float(p99), out
        else:
            assert (p50, p99) == ("-", "-"), out


@pytest.mark.parametrize(("args", "said"), [
    (["--duration", "nan"], "--duration positive, under an hour"),  # never ended
    (["--duration", "inf"], "--duration positive, under an hour"),
    (["--backends", "sqlite,sqlite"], "--backends: sqlite and/or postgresql, each once"),
    (["--backends", ","], "--backends: sqlite and/or postgresql, each once"),  # measured nothing
])
def test_bad_arguments_are_one_line(args: list[str], said: str) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "http.py"), *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2, run.stderr
    assert said in run.stderr.splitlines()[-1], run.stderr
