"""``benchmarks/http.py`` runs end to end: a bare endpoint and a fairpool server per backend,
real clients, every figure printed. A brief run, for its working only: the figures are
checked to be there and positive, never against a time (the benchmark reports them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import PostgresServer

ROOT = Path(__file__).resolve().parents[1]


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
    bare = re.findall(r"bare FastAPI POST endpoint \((first|last)\), 2 clients: ([\d,]+) "
                      r"requests/s; per request server CPU [\d.]+ ms, clients' CPU [\d.]+ ms", out)
    assert [when for when, _ in bare] == ["first", "last"], out
    assert all(int(rate.replace(",", "")) > 0 for _, rate in bare), out
    rows = re.findall(r"^(sqlite|postgresql) +(uncontended|contended) +(\d+) +([\d,]+) ", out,
                      re.MULTILINE)
    assert [(backend, case) for backend, case, _, _ in rows] == [
        ("sqlite", "uncontended"), ("sqlite", "contended"),
        ("postgresql", "uncontended"), ("postgresql", "contended"),
    ], out
    assert all(int(admissions.replace(",", "")) > 0 for *_, admissions in rows), out
    assert len(re.findall(r"^ratio admissions/s / bare requests/s \(\w+, \w+\): [\d.]+ ",
                          out, re.MULTILINE)) == 4, out
