"""HTTP benchmark: sustained submit -> allocated -> release cycles against a real server.

    python benchmarks/http.py [--clients 8] [--duration 10] [--backends sqlite,postgresql]

Starts ``python -m fairpool.api`` on a free loopback port, once per backend (SQLite under a
temporary home; PostgreSQL in a throwaway database created here and dropped after), and a
bare FastAPI app (one POST route that does nothing) on the same stack: uvicorn, one process,
the same uvicorn settings as ``fairpool server``, an ``async`` route as fairpool's busy routes
are (``Api.write``). The bare endpoint is measured first and again after each case; a case's
ratio uses the mean of the two measurements just before and after it, since the machine's
speed drifts (by a fifth within a minute, some days, on a shared machine). All are printed.

N client threads (one keep-alive connection each) then loop for ``--duration`` seconds after
a short warm-up, on a pool of their own per case. They use the standard library's
http.client: the load generator shares the machine with the server, so it must cost little.
With httpx it took ~1 ms of CPU per request, and its one process (the GIL) capped the bare
endpoint at ~950 requests/s, where http.client reaches ~3,400 (0.15 ms per request): the
ratio then measured the client, not the server. The clients' CPU time is printed too.

* uncontended: capacity N, so every submit is allocated at once; a cycle is submit + release.
* contended: capacity N/4 (``--contended-capacity``), so most clients wait: submit answers
  "queued", the client long-polls ``/requests/{id}/wait`` until allocated, then releases.

Prints per case the admissions per second, the server process's CPU time per admission
(Linux: /proc; the bare endpoint's per request beside it) and the clients', the mean write
batch (operations per write transaction, from the server's /metrics: a batch's transaction,
lock, pass and commit are paid once for all its operations), and, for the contended case,
p50/p99 of the time
from a client sending a release to the next waiter's long-poll answering "allocated" (the
waiter is the one the server allocated in that release's transaction: writes are serialized,
so it is the release with the latest ``released_at`` at or before the waiter's
``allocated_at``). Then the ratio of admissions/s to the bare endpoint's requests/s, measured
by the same clients in the same run (target >= 0.3), and beside it the ratio of the server CPU
per bare request to the server CPU per admission, which drifts less. All numbers come from
this one run.
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

# This file is named http.py: with its folder on the path (``python benchmarks/http.py``) it
# would shadow the standard library's http package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _HERE]

import http.client  # noqa: E402
import json  # noqa: E402
import urllib.request  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

ROOT = _HERE.parent
API = "/api/v1"
WARMUP_SECONDS = 1.0
#: A long-poll's timeout: short enough that a client notices the end of the run.
WAIT_SECONDS = 2.0
POSTGRES_CONNINFO = os.environ.get(
    "FAIRPOOL_TEST_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)


# -- servers -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """A server subprocess on a free loopback port, ready once ``/readyz`` answers 200."""

    def __init__(self, name: str, argv: Callable[[int], list[str]], log: Path) -> None:
        self.name = name
        self._argv = argv
        self.log = log
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        for _ in range(3):  # another process may take the free port before the server binds
            self.port = free_port()
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    self._argv(self.port), stdout=log, stderr=subprocess.STDOUT, env=env,
                    cwd=ROOT, start_new_session=True,  # Ctrl-C reaches us, not the servers
                )
            if self._ready(30.0):
                return
            self.stop()
        raise RuntimeError(f"{self.name} did not become ready; its log:\n{self.log.read_text()}")

    def _ready(self, seconds: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            probe = Client(self.url, timeout=1.0)
            try:
                probe.call("GET", "/readyz", 200)
                return True
            except (OSError, http.client.HTTPException, RuntimeError):
                pass
            finally:
                probe.close()
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def fairpool_server(workdir: Path, database_url: str | None) -> Process:
    def argv(port: int) -> list[str]:
        args = [sys.executable, "-m", "fairpool.api", "--host", "127.0.0.1", "--port",
                str(port), "--home", str(workdir / "home"), "--log-level", "warning"]
        return args + (["--database-url", database_url] if database_url else [])

    return Process("fairpool server", argv, workdir / "server.log")


def baseline_server(workdir: Path) -> Process:
    def argv(port: int) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--serve-baseline", str(port)]

    return Process("bare FastAPI server", argv, workdir / "baseline.log")


def serve_baseline(port: int) -> None:
    """The bare app: FastAPI, one POST route that does nothing, uvicorn configured as
    ``fairpool.api.server.serve`` configures it (one process, default loop and HTTP)."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from fairpool.api.server import GRACE_SECONDS

    app = FastAPI()

    @app.post("/noop")
    async def noop() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        return JSONResponse({"status": "ready"})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
        timeout_graceful_shutdown=GRACE_SECONDS, server_header=False,
    )
    uvicorn.Server(config).run()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty database (the server migrates it); dropped on exit."""
    import psycopg
    from psycopg import sql
    from sqlalchemy import URL

    name = f"fairpool_bench_{uuid.uuid4().hex}"
    with psycopg.connect(POSTGRES_CONNINFO, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        info = admin.info
        url = URL.create("postgresql+psycopg", username=info.user,
                         password=info.password or None, host=info.host, port=info.port,
                         database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(POSTGRES_CONNINFO, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# -- load --------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one client thread saw; merged after the run."""

    admissions: int = 0
    waited: int = 0
    requests: int = 0
    #: (server released_at, client monotonic time the release was sent)
    releases: list[tuple[datetime, float]] = field(default_factory=list)
    #: (server allocated_at, client monotonic time the long-poll answered "allocated")
    woken: list[tuple[datetime, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Window:
    """The measured interval: after the warm-up, for ``duration`` seconds."""

    def __init__(self, duration: float) -> None:
        self.start = time.monotonic() + WARMUP_SECONDS
        self.end = self.start + duration
        self.stopped = threading.Event()

    def counts(self, at: float) -> bool:
        return self.start <= at < self.end

    def over(self) -> bool:
        return self.stopped.is_set() or time.monotonic() >= self.end


class Client:
    """One client's keep-alive connection to the server (http.client: see the docstring)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self._connection = http.client.HTTPConnection(parts.hostname, parts.port,
                                                      timeout=timeout)

    def call(self, method: str, path: str, expected: int,
             body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON answer of ``method path``; RuntimeError unless its status is
        ``expected``."""
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        self._connection.request(method, path, data, headers)
        response = self._connection.getresponse()
        payload = response.read()
        if response.status != expected:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:200]!r}")
        answer: dict[str, Any] = json.loads(payload)
        return answer

    def close(self) -> None:
        self._connection.close()


def write_batches(url: str) -> tuple[float, float]:
    """The server's write transactions so far and the operations they held, wherever they
    ran (its /metrics: ``fairpool_write_batches_total``, ``..._batch_operations_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    totals = {"fairpool_write_batches_total": 0.0, "fairpool_write_batch_operations_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["fairpool_write_batches_total"], totals["fairpool_write_batch_operations_total"]


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process ``pid`` has used so far; None without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Load:
    """What ``run_clients`` measured: the clients' merged tally, the measured seconds, and
    the CPU seconds used in that window by the server (None without /proc) and by the
    clients (this process)."""

    tally: Tally
    seconds: float
    server_cpu: float | None
    client_cpu: float

    def server_ms(self, count: int) -> float | None:
        """The server's CPU milliseconds per one of ``count`` (requests, admissions)."""
        return None if self.server_cpu is None else self.server_cpu * 1e3 / max(1, count)

    def client_ms(self, count: int) -> float:
        return self.client_cpu * 1e3 / max(1, count)


def run_clients(clients: int, duration: float, work: Callable[[Client, Window, Tally], None],
                server: Process) -> Load:
    """``clients`` threads each run ``work`` until the window is over."""
    window = Window(duration)
    tallies = [Tally() for _ in range(clients)]
    assert server.process is not None
    pid = server.process.pid
    cpu: list[float | None] = []
    own: list[float] = []

    def sample_cpu() -> None:
        for moment in (window.start, window.end):
            time.sleep(max(0.0, moment - time.monotonic()))
            cpu.append(cpu_seconds(pid))
            own.append(time.process_time())

    sampler = threading.Thread(target=sample_cpu, daemon=True)
    sampler.start()
    url = server.url

    def client(tally: Tally) -> None:
        connection = Client(url)
        try:
            work(connection, window, tally)
        except Exception as error:
            tally.errors.append(f"{type(error).__name__}: {error}")
            window.stopped.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in tallies]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        window.stopped.set()
    sampler.join()
    before, after = cpu
    merged = Tally()
    for tally in tallies:
        merged.admissions += tally.admissions
        merged.waited += tally.waited
        merged.requests += tally.requests
        merged.releases += tally.releases
        merged.woken += tally.woken
        merged.errors += tally.errors
    used = after - before if before is not None and after is not None else None
    return Load(merged, duration, used, own[1] - own[0])


def bare_requests(client: Client, window: Window, tally: Tally) -> None:
    body = {"component": "bench", "resources": {"gpu": 1}}
    while not window.over():
        client.call("POST", "/noop", 200, body)
        if window.counts(time.monotonic()):
            tally.requests += 1


def cycles(pool: str, component: str) -> Callable[[Client, Window, Tally], None]:
    """Submit, wait (long-poll) while queued, release; again until the window is over."""
    body = {"component": component, "resources": {"gpu": 1}}

    def work(client: Client, window: Window, tally: Tally) -> None:
        while not window.over():
            request = client.call("POST", f"{API}/requests", 201, body)
            waited = False
            while request["status"] == "queued":
                if window.stopped.is_set():  # another client failed: give up the place
                    client.call("POST", f"{API}/requests/{request['id']}/cancel", 200)
                    return
                waited = True
                request = client.call(
                    "GET", f"{API}/requests/{request['id']}/wait?timeout={WAIT_SECONDS}", 200
                )
            if request["status"] != "allocated":
                raise RuntimeError(f"request {request['id']} ended {request['status']}: "
                                   f"{request['status_reason']}")
            observed = time.monotonic()
            if window.counts(observed):
                tally.admissions += 1
                if waited:
                    tally.waited += 1
                    tally.woken.append((datetime.fromisoformat(request["allocated_at"]),
                                        observed))
            # Every release, measured or not, so that each woken waiter finds its own.
            sent = time.monotonic()
            released = client.call("POST", f"{API}/requests/{request['id']}/release", 200)
            tally.releases.append((datetime.fromisoformat(released["released_at"]), sent))

    return work


def wake_latencies(tally: Tally) -> list[float]:
    """Per woken waiter: seconds from the release that allocated it being sent to its
    long-poll answering. That release is the latest one at or before its allocation."""
    releases = sorted(tally.releases)
    times = [at for at, _ in releases]
    latencies = []
    for allocated_at, observed in tally.woken:
        index = bisect.bisect_right(times, allocated_at) - 1
        if index >= 0:
            latencies.append(observed - releases[index][1])
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- the run -----------------------------------------------------------------------------


@dataclass
class Bare:
    rate: float
    cpu_ms: float | None


@dataclass
class Case:
    backend: str
    name: str
    capacity: int
    rate: float
    #: The server's CPU milliseconds per admission (None if unknown), and the clients'.
    cpu_ms: float | None
    client_cpu_ms: float
    waited: float
    #: Write operations per write transaction over the load (warm-up included).
    batch_size: float
    latencies: list[float]
    #: The bare endpoint measured just before and just after this case.
    bares: tuple[Bare, Bare]

    @property
    def bare_rate(self) -> float:
        return statistics.mean(bare.rate for bare in self.bares)

    @property
    def ratio(self) -> float:
        """Admissions/s over the bare endpoint's requests/s around the case."""
        return self.rate / self.bare_rate

    @property
    def cpu_ratio(self) -> float | None:
        """The bare endpoint's server CPU per request over this case's per admission."""
        before, after = (bare.cpu_ms for bare in self.bares)
        if self.cpu_ms is None or before is None or after is None:
            return None
        return (before + after) / 2 / self.cpu_ms


def measure_bare(baseline: Process, args: argparse.Namespace, when: str) -> Bare:
    baseline.start()
    load = run_clients(args.clients, args.duration, bare_requests, baseline)
    baseline.stop()
    requests = load.tally.requests
    if load.tally.errors:
        raise RuntimeError(f"bare endpoint: {load.tally.errors[0]}")
    cpu_ms = load.server_ms(requests)
    bare = Bare(requests / load.seconds, cpu_ms)
    server = "" if cpu_ms is None else f"server CPU {cpu_ms:.2f} ms, "
    print(f"bare FastAPI POST endpoint ({when}), {args.clients} clients: {bare.rate:,.0f} "
          f"requests/s; per request {server}clients' CPU {load.client_ms(requests):.2f} ms",
          flush=True)
    return bare


def measure_backend(backend: str, server: Process, args: argparse.Namespace,
                    baseline: Process, bares: list[Bare]) -> list[Case]:
    """Both cases on ``server``, the bare endpoint measured again after each (appended to
    ``bares``): a case's ratio uses the measurements just before and after it."""
    results = []
    for name, capacity in (("uncontended", args.clients),
                           ("contended", args.contended_capacity)):
        pool, component = f"bench-{name}", f"bench-{name}"
        admin = Client(server.url)  # one per case: the server closes a connection left idle
        try:
            admin.call("POST", f"{API}/pools", 201, {"name": pool, "capacity": {"gpu": capacity}})
            admin.call("POST", f"{API}/pools/{pool}/policies", 201, {"component": component})
        finally:
            admin.close()
        batches, operations = write_batches(server.url)
        load = run_clients(args.clients, args.duration, cycles(pool, component), server)
        batches_after, operations_after = write_batches(server.url)
        batch_size = (operations_after - operations) / max(1.0, batches_after - batches)
        tally = load.tally
        if tally.errors:
            raise RuntimeError(f"{backend} {name}: {tally.errors[0]}")
        bares.append(measure_bare(baseline, args, f"after {backend} {name}"))
        results.append(Case(backend, name, capacity, tally.admissions / load.seconds,
                            load.server_ms(tally.admissions), load.client_ms(tally.admissions),
                            tally.waited / max(1, tally.admissions), batch_size,
                            wake_latencies(tally),
                            (bares[-2], bares[-1])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="measured seconds per case (default 10)")
    parser.add_argument("--contended-capacity", type=int, default=None,
                        help="pool capacity of the contended case (default clients/4)")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline is not None:
        serve_baseline(args.serve_baseline)
        return
    if args.clients < 2 or not 0 < args.duration < 3600:  # nan, inf: a case never ended
        parser.error("--clients must be at least 2 and --duration positive, under an hour")
    if args.contended_capacity is None:
        args.contended_capacity = max(1, args.clients // 4)
    if not 1 <= args.contended_capacity < args.clients:
        parser.error("--contended-capacity must be at least 1 and less than --clients")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or not set(backends) <= {"sqlite", "postgresql"} or (
            len(set(backends)) < len(backends)):
        parser.error("--backends: sqlite and/or postgresql, each once")

    def interrupted(signum: int, _: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    workdir = Path(tempfile.mkdtemp(prefix="fairpool-bench-http-"))
    cases: list[Case] = []
    try:
        with ExitStack() as stack:
            baseline = baseline_server(workdir)
            stack.callback(baseline.stop)
            bares = [measure_bare(baseline, args, "first")]
            for backend in backends:
                database_url = None
                if backend == "postgresql":
                    try:
                        database_url = stack.enter_context(postgres_database())
                    except Exception as error:  # unreachable: say so, measure the rest
                        print(f"postgresql: skipped, {type(error).__name__}: "
                              f"{str(error).strip().splitlines()[0]}")
                        continue
                (workdir / backend).mkdir()
                server = fairpool_server(workdir / backend, database_url)
                stack.callback(server.stop)
                server.start()
                cases += measure_backend(backend, server, args, baseline, bares)
                server.stop()
    except KeyboardInterrupt:
        print("interrupted; servers stopped, databases dropped", file=sys.stderr)
        sys.exit(130)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n{args.clients} clients, {args.duration:g} s per case after {WARMUP_SECONDS:g} s "
          f"warm-up, a pool of its own per case; {os.cpu_count()} CPUs, load average {load}\n")
    header = ("backend", "case", "capacity", "admissions/s", "CPU ms", "client", "batch",
              "waited", "wake p50 ms", "wake p99 ms", "wakes", "bare/s", "ratio", "CPU ratio")
    print("{:<11} {:<12} {:>8} {:>12} {:>6} {:>6} {:>5} {:>7} {:>11} {:>11} {:>6} {:>7} {:>6} "
          "{:>9}".format(*header))
    for case in cases:
        p50 = p99 = "-"
        if case.latencies:
            p50 = f"{statistics.median(case.latencies) * 1e3:.1f}"
            p99 = f"{percentile(case.latencies, 99) * 1e3:.1f}"
        cpu = "-" if case.cpu_ms is None else f"{case.cpu_ms:.2f}"
        cpu_ratio = "-" if case.cpu_ratio is None else f"{case.cpu_ratio:.2f}"
        print(f"{case.backend:<11} {case.name:<12} {case.capacity:>8} {case.rate:>12,.0f} "
              f"{cpu:>6} {case.client_cpu_ms:>6.2f} {case.batch_size:>5.1f} {case.waited:>7.0%} "
              f"{p50:>11} {p99:>11} "
              f"{len(case.latencies):>6} {case.bare_rate:>7,.0f} "
              f"{case.ratio:>6.2f} {cpu_ratio:>9}")
    print("\nCPU ms: the server's CPU time per admission; client: the clients'. batch: write "
          "operations per write transaction (group commit; an admission is two, its submit "
          "and its release). bare/s: the "
          "bare endpoint's requests/s, the mean of its measurements just before and after the "
          "case, which the ratio uses. CPU ratio: the bare endpoint's server CPU per request "
          "over the case's per admission.")
    for case in cases:
        print(f"ratio admissions/s / bare requests/s ({case.backend}, {case.name}): "
              f"{case.ratio:.2f}  (target >= 0.3)")


if __name__ == "__main__":
    main()
