"""Helpers for tests that run real servers: ``python -m fairpool.api`` processes on free
loopback ports (on a ``--home`` or a ``--database-url``), streams of concurrent clients, and an
audit of what the database recorded.

The audit replays the event log in commit order (event ids grow with commits: writers are
serialized on both backends), so "capacity never over-committed" is checked at every committed
state, not only at the moments a monitor happened to sample.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from fairpool.errors import Conflict, FairpoolError
from fairpool.remote import RemoteService
from fairpool.store.db import Database
from fairpool.views import RequestView
from tests.conftest import database_on

API = "/api/v1"
TERMINAL_EVENTS = {"released", "rejected", "preempted", "cancelled", "lease_expired"}
#: Events that give units back when the request held an allocation.
FREEING_EVENTS = {"released", "preempted", "lease_expired", "cancelled", "deleted"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request_arrived(port: int) -> bool:
    """Whether a connection to 127.0.0.1:``port`` holds bytes its server has not read: with
    the server's process stopped (SIGSTOP), a client's request has been sent and waits in
    the kernel. Linux (/proc/net/tcp): the server-side socket, ESTABLISHED, its receive
    queue not empty."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if (int(local.rsplit(":", 1)[1], 16) == port and state == "01"
                    and int(queues.split(":")[1], 16) > 0):
                return True
    return False


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}


class ApiServer:
    """A ``python -m fairpool.api`` process; ``kill()`` then ``start()`` restarts it on the
    same port and store."""

    def __init__(
        self,
        log: Path,
        *,
        home: Path | None = None,
        database_url: str | None = None,
        tick: float = 1.0,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.log_path = log
        self.extra = extra
        self.store = ["--home", str(home)] if home is not None else ["--database-url", str(database_url)]
        self.tick = tick
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> float:
        """Start (on a new free port the first time, on the same port after that); the
        seconds until it answered ``/healthz``."""
        for _ in range(3):  # another process may take a fresh free port before we bind it
            fresh = self.port == 0
            if fresh:
                self.port = free_port()
            started = time.monotonic()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "fairpool.api", "--host", "127.0.0.1",
                     "--port", str(self.port), *self.store, "--tick", str(self.tick),
                     "--log-level", "warning", *self.extra],
                    stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                )
            if self._wait_up(timeout):
                return time.monotonic() - started
            self.stop()
            if fresh:
                self.port = 0
        pytest.fail(f"the server did not start:\n{self.log_path.read_text()}")

    def _wait_up(self, seconds: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        return False

    def terminate(self) -> int:
        """SIGTERM; the exit status. Failing after 15 s, with what the server logged."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit 15 s after SIGTERM:\n{self.log()[-5000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def server_on(
    request: pytest.FixtureRequest, backend: str, root: Path, **options: Any
) -> ApiServer:
    """A server (not started) on ``backend``: the embedded SQLite store under ``root``, or a
    migrated PostgreSQL database of its own, dropped when ``request``'s scope ends. It logs
    to ``root``; ``options`` as ``ApiServer``'s."""
    root.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        return ApiServer(root / "server.log", home=root / "home", **options)
    return ApiServer(root / "server.log", database_url=database_on(request, "postgresql", root),
                     **options)


@contextmanager
def running(*servers: ApiServer) -> Iterator[tuple[ApiServer, ...]]:
    """Start the servers (in parallel), stop them (SIGTERM) at the end."""
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(), servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a thread of this process, so that what a test patches
    holds in it too, on a free loopback port: its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def setup_pool(url: str, pool: str, components: Sequence[str], capacity: dict[str, int]) -> None:
    with httpx.Client(base_url=url + API, timeout=30.0) as http:
        response = http.post("/pools", json={"name": pool, "capacity": capacity})
        assert response.status_code == 201, response.text
        for component in components:
            response = http.post(f"/pools/{pool}/policies", json={"component": component})
            assert response.status_code == 201, response.text


# -- a stream of concurrent clients --------------------------------------------------------


@dataclass
class Stream:
    """What the clients saw: every request they submitted, the ones they were told were
    allocated and released, per-operation completion times, errors they recovered from."""

    submitted: list[str] = field(default_factory=list)
    allocated: set[str] = field(default_factory=set)
    released: set[str] = field(default_factory=set)
    completions: list[float] = field(default_factory=list)
    recovered: Counter[str] = field(default_factory=Counter)
    cycles: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self, kind: str, request_id: str) -> None:
        with self.lock:
            if kind == "submitted":
                self.submitted.append(request_id)
            else:
                getattr(self, kind).add(request_id)
            self.completions.append(time.monotonic())


def run_stream(
    urls: Sequence[str],
    component: str,
    *,
    threads: int,
    cycles: int,
    sizes: Sequence[int] = (1, 1, 2),
    lease_ttl: int | None = None,
    faults: bool = False,
    on_progress: Callable[[int], None] | None = None,
    stream: Stream | None = None,
) -> Stream:
    """``threads`` clients, each doing ``cycles`` submit → wait → hold briefly → release.

    Client ``i`` submits its ``k``-th request through ``urls[(i + k) % len(urls)]`` and waits
    and releases through the next one, so with two replicas every wake-up crosses processes.
    Without ``faults`` every request must be allocated then released; with ``faults`` (a
    server is killed meanwhile) an operation whose retries ran out is re-issued.
    """
    stream = stream if stream is not None else Stream()
    progress = Counter[str]()
    progress_lock = threading.Lock()

    def retrying(call: Callable[[], RequestView], what: str) -> RequestView:
        deadline = time.monotonic() + 60
        while True:
            try:
                return call()
            except FairpoolError as error:
                if not faults or isinstance(error, Conflict) or time.monotonic() > deadline:
                    raise
                with stream.lock:
                    stream.recovered[what] += 1
                time.sleep(0.2)

    def client(index: int) -> None:
        rng = random.Random(index)
        services = [RemoteService(url) for url in urls]
        try:
            for k in range(cycles):
                here = services[(index + k) % len(services)]
                there = services[(index + k + 1) % len(services)]
                demand = {"gpu": rng.choice(sizes)}
                created = retrying(
                    partial(here.create_request, component, demand=demand, lease_ttl=lease_ttl),
                    "create",
                )
                stream.done("submitted", created.id)
                request = created
                while request.status == "queued":
                    request = retrying(partial(there.wait, created.id, 10.0), "wait")
                if request.status != "allocated":
                    # Only with faults: a lease that ran out while the server was away.
                    assert faults and request.status == "released", request
                    with stream.lock:
                        stream.recovered["lease expired"] += 1
                    continue
                stream.done("allocated", request.id)
                time.sleep(rng.uniform(0, 0.005))
                try:
                    released = retrying(partial(here.release_request, created.id), "release")
                except Conflict:
                    released = here.get_request(created.id)
                    assert faults and released.status == "released", released
                    with stream.lock:
                        stream.recovered["release conflict"] += 1
                assert released.status == "released", released
                stream.done("released", released.id)
                with progress_lock:
                    progress["cycles"] += 1
                    done = progress["cycles"]
                if on_progress is not None:
                    on_progress(done)
        finally:
            for service in services:
                service.close()

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(client, i) for i in range(threads)]:
            future.result()
    stream.seconds = time.monotonic() - started
    stream.cycles = progress["cycles"]
    return stream


class Monitor:
    """Samples a pool through the API while a stream runs: occupied never above capacity,
    and equal to what the active requests hold."""

    def __init__(self, urls: Sequence[str], pool: str, capacity: dict[str, int]) -> None:
        self.samples: list[int] = []
        self.problems: list[str] = []
        self._urls = urls
        self._pool = pool
        self._capacity = capacity
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        clients = [httpx.Client(base_url=url + API, timeout=5.0) for url in self._urls]
        try:
            turn = 0
            while not self._stop.is_set():
                http = clients[turn % len(clients)]
                turn += 1
                try:
                    pool = http.get(f"/pools/{self._pool}").json()
                except (httpx.TransportError, ValueError):
                    time.sleep(0.05)  # a server being killed / restarted
                    continue
                if "occupied" not in pool:
                    continue  # an error answer (e.g. 503 while the database is busy)
                for key, total in self._capacity.items():
                    used = pool["occupied"].get(key, 0)
                    held = sum(r["resources"].get(key, 0) for r in pool["active_requests"])
                    if used > total or used != held:
                        self.problems.append(f"{key}: occupied {used}, held {held}, of {total}")
                self.samples.append(pool["occupied"].get("gpu", 0))
                time.sleep(0.05)  # a pool's detail is a heavy read: leave the server to the clients
        finally:
            for http in clients:
                http.close()


# -- auditing the database -------------------------------------------------------------------


@dataclass
class Audit:
    statuses: dict[str, str]
    demands: dict[str, dict[str, int]]
    #: Allocation rows per request.
    allocation_rows: dict[str, int]
    live_allocations: set[str]
    events: dict[str, list[str]]
    #: Highest usage per key seen while replaying the event log.
    peak: dict[str, int]
    problems: list[str]


def audit(database_url: str, capacity: dict[str, int]) -> Audit:
    """Read the database and check its history, on either backend:

    - each request's events: first ``created`` (or ``retried``), at most one ``allocated``,
      exactly one terminal event, last, matching its status; releases only after allocation;
    - every request has at most one allocation row; live allocations are exactly the
      requests with status ``allocated``, and hold at most the capacity;
    - replaying the event log in commit order, usage never exceeds the capacity.
    """
    with Database.open(database_url) as db, db.read() as conn:
        statuses = {r: s for r, s in conn.exec_driver_sql("SELECT id, status FROM request")}
        demands: dict[str, dict[str, int]] = defaultdict(dict)
        for request_id, key, amount in conn.exec_driver_sql(
            "SELECT request_id, key, amount FROM request_resource"
        ):
            demands[request_id][key] = int(amount)
        allocation_rows: Counter[str] = Counter()
        live: set[str] = set()
        for request_id, released_at in conn.exec_driver_sql(
            "SELECT request_id, released_at FROM allocation"
        ):
            allocation_rows[request_id] += 1
            if released_at is None:
                live.add(request_id)
        log = list(conn.exec_driver_sql(
            "SELECT id, kind, request_id FROM event WHERE request_id IS NOT NULL ORDER BY id"
        ))
    problems: list[str] = []
    events: dict[str, list[str]] = defaultdict(list)
    usage = dict.fromkeys(capacity, 0)
    peak = dict(usage)
    holding: set[str] = set()
    for _, kind, request_id in log:
        events[request_id].append(kind)
        if kind == "allocated":
            holding.add(request_id)
            for key in capacity:
                usage[key] += demands[request_id].get(key, 0)
                peak[key] = max(peak[key], usage[key])
                if usage[key] > capacity[key]:
                    problems.append(f"over-committed: {key} {usage[key]} > {capacity[key]} "
                                    f"when {request_id} was allocated")
        elif kind in FREEING_EVENTS and request_id in holding:
            holding.discard(request_id)
            for key in capacity:
                usage[key] -= demands[request_id].get(key, 0)
    for request_id, status in statuses.items():
        kinds = events.get(request_id, [])
        terminal = [k for k in kinds if k in TERMINAL_EVENTS]
        if not kinds or kinds[0] not in ("created", "retried"):
            problems.append(f"{request_id}: history does not start with created: {kinds}")
        if kinds.count("allocated") > 1:
            problems.append(f"{request_id}: allocated twice: {kinds}")
        if status == "queued" or status == "allocated":
            if terminal:
                problems.append(f"{request_id}: {status} after a terminal event: {kinds}")
        else:
            expected = {"released": ("released", "lease_expired")}.get(status, (status,))
            if len(terminal) != 1 or terminal[0] not in expected or kinds[-1] != terminal[0]:
                problems.append(f"{request_id}: {status} with history {kinds}")
        if status in ("allocated", "released", "preempted") and "allocated" not in kinds:
            problems.append(f"{request_id}: {status} but never allocated: {kinds}")
        if allocation_rows[request_id] > 1:
            problems.append(f"{request_id}: {allocation_rows[request_id]} allocation rows")
    allocated = {r for r, s in statuses.items() if s == "allocated"}
    if live != allocated:
        problems.append(f"live allocations {sorted(live)} != allocated requests {sorted(allocated)}")
    if live != holding:
        problems.append(f"live allocations {sorted(live)} != replayed holders {sorted(holding)}")
    for key, total in capacity.items():
        held = sum(demands[r].get(key, 0) for r in live)
        if held > total:
            problems.append(f"live allocations hold {key} {held} > {total}")
    return Audit(statuses, dict(demands), dict(allocation_rows), live, dict(events), peak, problems)
