"""Instructions per admission, counted by callgrind: a measure that does not drift.

    python benchmarks/instructions.py [--cycles 100,300]

This machine's speed drifts by tens of percent within minutes, which hides a change of a few
percent in ``benchmarks/http.py``. ``valgrind --tool=callgrind`` counts the instructions a
program runs, the same from one run to the next (0.3 % apart for the same code). Each case
runs in a process of its own under callgrind, on a temporary SQLite store, twice: after the
same warm-up, once per ``--cycles`` count. The difference of the two counts over the
difference of the cycles is the count per cycle, imports and start-up cancelling out.

* app: fairpool's API driven by ASGI calls, no sockets and no uvicorn: a submit, allocated
  at once, then its release;
* batched: the same, by ``CLIENTS`` clients at once sharing the cycles, as the HTTP
  benchmark's clients are: their writes share transactions (batches of ``CLIENTS``
  operations), as in a loaded server;
* shaped: the same two requests, the service answering them with prepared views (no write);
* bare: two requests to a bare FastAPI POST endpoint, as ``benchmarks/http.py``'s;
* service: the service's create and release called directly, without HTTP.

It prints them, the in-process analogue of ``http.py``'s ratio (a bare request over an
admission, one at a time and batched), and the ratio a service that cost nothing would
reach (a bare request over a shaped cycle). uvicorn and h11, which add the same cost to
every request, are in neither.
"""

from __future__ import annotations

import sys
from pathlib import Path

# With its folder on the path (``python benchmarks/instructions.py``), ``benchmarks/http.py``
# would shadow the standard library's http package, which FastAPI imports.
_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or ".").resolve() != _HERE]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import atexit  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable, Coroutine  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from fairpool.service import Service

WARMUP_CYCLES = 50
CASES = ("app", "batched", "shaped", "bare", "service")
#: The batched case's clients, as many as ``benchmarks/http.py``'s by default.
CLIENTS = 8
BODY = json.dumps({"component": "bench", "resources": {"gpu": 1}}).encode()


# -- the cases, each run in a process of its own ----------------------------------------


async def asgi(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through ``app``'s ASGI interface: its status and body."""
    headers = [(b"host", b"bench")]
    if body:
        headers += [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    received = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:  # nothing more comes: the client waits for the answer
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def admissions(app: Any, cycles: int) -> None:
    for _ in range(cycles):
        status, answer = await asgi(app, "POST", "/api/v1/requests", BODY)
        request = json.loads(answer)
        if status != 201 or request["status"] != "allocated":
            raise RuntimeError(f"submit: {status} {answer[:200]!r}")
        status, answer = await asgi(app, "POST", f"/api/v1/requests/{request['id']}/release")
        if status != 200:
            raise RuntimeError(f"release: {status} {answer[:200]!r}")


def bench_service() -> Service:
    """A service on a new SQLite store with the pool and policy the cycles use."""
    from fairpool.service import open_service

    home = tempfile.mkdtemp(prefix="fairpool-bench-instructions-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # 8 were left by each run
    service = open_service(home)
    service.create_pool("bench", {"gpu": 64})
    service.attach_policy("bench", "bench")
    return service


async def by_clients(app: Any, cycles: int) -> None:
    """``cycles`` admissions by ``CLIENTS`` clients at once."""
    await asyncio.gather(*(admissions(app, cycles // CLIENTS + (i < cycles % CLIENTS))
                           for i in range(CLIENTS)))


async def fairpool_app(cycles: int, shaped: bool, batched: bool = False) -> None:
    from fairpool.api.app import create_app

    service = bench_service()
    try:
        if shaped:
            held = service.create_request("bench", demand={"gpu": 1})
            released = service.release_request(held.id)
            service.create_request = lambda *_, **__: held  # type: ignore[method-assign]
            service.release_request = lambda *_, **__: released  # type: ignore[method-assign]
        app = create_app(service, tick=3600.0)
        run = by_clients if batched else admissions
        async with app.router.lifespan_context(app):
            await run(app, WARMUP_CYCLES)
            await run(app, cycles)
    finally:
        service.close()


async def bare_app(cycles: int) -> None:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()

    @app.post("/noop")
    async def noop() -> JSONResponse:
        return JSONResponse({"ok": True})

    for _ in range(WARMUP_CYCLES + cycles):
        for _ in range(2):  # an admission is two requests
            status, _ = await asgi(app, "POST", "/noop", BODY)
            if status != 200:
                raise RuntimeError(f"bare endpoint: {status}")


def service_only(cycles: int) -> None:
    service = bench_service()
    try:
        for _ in range(WARMUP_CYCLES + cycles):
            service.release_request(service.create_request("bench", demand={"gpu": 1}).id)
    finally:
        service.close()


def run_case(case: str, cycles: int) -> None:
    runs: dict[str, Callable[[int], Coroutine[Any, Any, None]]] = {
        "app": lambda n: fairpool_app(n, shaped=False),
        "batched": lambda n: fairpool_app(n, shaped=False, batched=True),
        "shaped": lambda n: fairpool_app(n, shaped=True),
        "bare": bare_app,
    }
    if case == "service":
        service_only(cycles)
    else:
        asyncio.run(runs[case](cycles))


# -- counting ----------------------------------------------------------------------------


def instructions(case: str, cycles: int, workdir: Path) -> int:
    """The instructions a process running ``case`` for ``cycles`` cycles executes in all."""
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir / 'callgrind.out'}",
         sys.executable, str(Path(__file__).resolve()), "--case", case, "--cycles",
         str(cycles)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"{case}: callgrind failed:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", default="100,300",
                        help="the two cycle counts whose difference is measured")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:  # a child: one count
        run_case(args.case, int(args.cycles))
        return
    try:
        low, high = (int(part) for part in args.cycles.split(","))
    except ValueError:
        parser.error(f"--cycles: two counts, e.g. 100,300 (got {args.cycles!r})")
    if not 0 < low < high:
        parser.error(f"--cycles: 0 < first < second (got {args.cycles!r})")
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py: valgrind is not installed (apt install valgrind)")
    per_cycle: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fairpool-bench-instructions-") as tmp:
        for case in CASES:
            counts = [instructions(case, cycles, Path(tmp)) for cycles in (low, high)]
            per_cycle[case] = (counts[1] - counts[0]) / (high - low)
            print(f"{case:8} {per_cycle[case] / 1e6:6.2f} million instructions per cycle",
                  flush=True)
    bare_request = per_cycle["bare"] / 2
    print(f"ratio, bare request / admission, in process: {bare_request / per_cycle['app']:.2f}"
          f" (batched: {bare_request / per_cycle['batched']:.2f})")
    print(f"ratio a service that cost nothing would reach, in process: "
          f"{bare_request / per_cycle['shaped']:.2f}")


if __name__ == "__main__":
    main()
