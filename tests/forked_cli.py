"""The CLI run as ``python -m fairpool.cli.main`` runs it, in a process of its own, but forked
from a server process that has imported it already.

A CLI call's Python start-up is ~1 s on this project's machine (SQLAlchemy, pydantic, rich),
most of it imports, and the suite makes a few thousand calls. Each call here is still a fresh
process with its own environment, standard streams and exit code, running the module as
``-m`` would (``runpy``, as ``__main__``); only the imports are paid once per test worker.
The tests that send signals to the CLI start it with ``subprocess`` itself.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import os
import runpy
import sys
import tempfile
import threading
import traceback
from pathlib import Path

#: What the server imports before it forks: the CLI, and what the tests run in processes of
#: their own through the same server (tests/test_store.py).
PRELOAD = ["fairpool.cli.main", "tests.test_store", "sqlalchemy.dialects.postgresql.psycopg"]
TIMEOUT = 120.0
#: Held while a process starts or is reaped. ``Process.start`` reaps every finished child
#: (``multiprocessing.process._cleanup``), so a start in one thread could read a child's exit
#: status while that child's thread read it too: one of them then got EOF, and an exit status
#: of 255 (5 in 1,500 of these calls from 8 threads; one failed a CI run).
_REAPING = threading.Lock()


def context() -> multiprocessing.context.ForkServerContext:
    """The forkserver context, preloading ``PRELOAD`` (one server per test worker)."""
    forked = multiprocessing.get_context("forkserver")
    forked.set_forkserver_preload(PRELOAD)
    return forked


def run(args: list[str], env: dict[str, str], input: str | None = None) -> tuple[int, str, str]:
    """``python -m fairpool.cli.main *args`` with ``env`` and ``input`` on its standard input
    (else /dev/null): its exit status (negative for a signal, as ``subprocess`` gives it),
    standard output and standard error."""
    with tempfile.TemporaryDirectory(prefix="fairpool-cli-") as scratch:
        streams = [Path(scratch, name) for name in ("in", "out", "err")]
        for stream, text in zip(streams, [input or "", "", ""], strict=True):
            stream.write_text(text)
        process = context().Process(
            target=_main, args=(args, env, [str(s) for s in streams], input is not None)
        )
        with _REAPING:
            process.start()
        ended = multiprocessing.connection.wait([process.sentinel], TIMEOUT)
        with _REAPING:
            if not ended:
                process.kill()
            process.join()
        if not ended:
            raise TimeoutError(f"fairpool {' '.join(args)} ran over {TIMEOUT:g} s")
        return process.exitcode, streams[1].read_text(), streams[2].read_text()


def _main(args: list[str], env: dict[str, str], streams: list[str], has_input: bool) -> None:
    """In the forked process: its environment and standard streams as a new process's, then
    the module as ``-m`` runs it, then the end of an interpreter (non-daemon threads joined,
    exit handlers run, streams flushed)."""
    os.environ.clear()
    os.environ.update(env)
    for fd, (path, flags) in enumerate(zip(
        [streams[0] if has_input else os.devnull, streams[1], streams[2]],
        [os.O_RDONLY, os.O_WRONLY, os.O_WRONLY], strict=True,
    )):
        os.dup2(os.open(path, flags), fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    sys.argv = ["-m", *args]  # runpy puts the module's path first, as -m does
    # Run as __main__ only, as -m does; what it imports stays imported.
    sys.modules.pop("fairpool.cli.main", None)
    code = 0
    try:
        runpy.run_module("fairpool.cli.main", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = _exit_status(done.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_status(code: object) -> int:
    """``sys.exit(code)``'s status, as the interpreter makes it (a message goes to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
