"""``fairpool run`` and ``fairpool server``."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import click

from fairpool.cli import output as o
from fairpool.cli.common import Duration, Seconds, database_url_option, service
from fairpool.cli.resource_request import (
    EXIT_TIMEOUT,
    cancel_and_exit,
    cancel_saying,
    catch_ending_signals,
    holding_signals,
    queue_summary,
    reason_of,
    request_fields,
    request_options,
    restore,
    wait_or_cancel,
)
from fairpool.errors import Conflict, NotFound, Unreachable, from_database, said
from fairpool.leases import (
    DEFAULT_LEASE_TTL,
    MAX_LEASE_TTL,
    deleted,
    gave_up,
    heartbeat_interval,
    interrupted,
    kept_next,
    lost_as_it_ended,
    not_followed,
    passing,
    still_waiting,
)
from fairpool.views import MAX_RETENTION, MIN_KEEP_HISTORY, RequestView


@click.command(
    "run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@request_options
@click.option("--lease-ttl", type=click.IntRange(1, MAX_LEASE_TTL), default=DEFAULT_LEASE_TTL,
              show_default=True,
              help="Seconds the units stay held if fairpool stops hearing from this command.")
@click.option("--timeout", type=Seconds(min=0), default=None,
              help="Give up waiting for units after this many seconds (exit code 2).")
@click.option("--grace", type=Seconds(min=0), default=10.0, show_default=True,
              help="On preemption: seconds between SIGTERM and SIGKILL.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(lease_ttl: int, timeout: float | None, grace: float, command: tuple[str, ...],
        **fields: Any) -> None:
    """Run COMMAND once units are granted; release them when it exits.

    Waits (showing position and reason), runs COMMAND with FAIRPOOL_REQUEST_ID, FAIRPOOL_POOL
    and FAIRPOOL_RESOURCES (JSON) in its environment, heartbeats while it runs, forwards
    SIGINT/SIGTERM/SIGHUP, and exits with its exit code. If the units are preempted, COMMAND gets
    SIGTERM, then SIGKILL after --grace seconds, and runs again on the retry attempt when
    --max-retries allows.
    """
    _check_runnable(command[0])
    svc = service()
    with holding_signals() as received:
        request = svc.create_request(**request_fields(**fields), lease_ttl=lease_ttl)
    if received:
        cancel_and_exit(request, received[0])
    _adopt_orphans()
    while True:
        # From the grant to the command's start, ending signals are held (their default
        # action ended us there, the units held until the lease ran out): one before the
        # start cancels the request, one during it is forwarded to the command.
        with holding_signals() as held:
            data = wait_or_cancel(request, timeout)
            if data["status"] == "preempted" and data["retried_as_id"]:
                # A retry granted, and preempted again, while the command stopped: its own.
                request = svc.get_request(data["retried_as_id"])
                o.declare(f"Resource request `{data['id']}` was preempted before it ran: "
                          f"{reason_of(data)}; retrying as attempt {request.attempt} "
                          f"(request `{request.id}`)")
                continue
            if data["status"] == "queued":  # only with a --timeout
                o.declare(f"Timed out waiting for units: "
                          f"{queue_summary(data) or reason_of(data)}")
                cancel_saying("Resource request", request.id, gave_up(timeout or 0))
                sys.exit(EXIT_TIMEOUT)
            if data["status"] != "allocated":
                raise click.ClickException(
                    f"Resource request `{data['id']}` was {data['status']}: {reason_of(data)}"
                )
            request = svc.get_request(request.id)
            if held:
                cancel_and_exit(request, held[0])
            o.declare(f"Allocated on pool `{request.pool}`: {json.dumps(request.resources)}")
            code, lost, signum = _run_once(request, command, lease_ttl, grace, held)
        if lost is None:
            try:
                with holding_signals():
                    svc.release_request(request.id)
            except Conflict:  # expired or preempted just as the command ended
                ended = svc.get_request(request.id)
                o.declare(lost_as_it_ended(ended, "command"))
                _not_followed(ended, not_followed())
            except Exception as error:  # out of reach, or the database full: it stays ours
                if not isinstance(error, Unreachable) and not from_database(error):
                    raise
                o.declare(f"Warning: {said(error)}; the units go back when the lease expires")
            sys.exit(code)
        o.declare(f"Resource request `{lost.id}` was {lost.status}: {lost.status_reason}")
        if signum is not None:  # stopped from outside meanwhile: nobody wants the retry
            _not_followed(lost, interrupted(signal.Signals(signum).name))
            sys.exit(128 + signum)
        if lost.retried_as_id is None:
            sys.exit(code if code != 0 else 1)
        try:
            request = svc.get_request(lost.retried_as_id)
        except Unreachable as error:  # nobody will wait for it: say what is left
            o.declare(still_waiting("Retry attempt", lost.retried_as_id, error))
            raise
        o.declare(f"Retrying as attempt {request.attempt} (request `{request.id}`)")


def _check_runnable(program: str) -> None:
    """A command that cannot start is refused before anything is requested: found only once
    units were granted, it came after what may be hours of waiting. (Checked again as it
    starts: it may go meanwhile.)"""
    if shutil.which(program) is not None:
        return
    if os.sep in program and os.path.exists(program):  # a shell's 126: found, not runnable
        why = "is a directory" if os.path.isdir(program) else "not executable"
        raise _NotRunnable(f"cannot run {program!r}: {why}; nothing was requested")
    where = "no such file" if os.sep in program else "not found on PATH"
    raise _NotFound(f"cannot run {program!r}: {where}; nothing was requested")


def _not_followed(request: RequestView, reason: str) -> None:
    """Cancel the retry attempt of ``request``, if it has one, which nobody will run."""
    if request.retried_as_id is not None:
        cancel_saying("Retry attempt", request.retried_as_id, reason)


def _run_once(
    request: RequestView, command: tuple[str, ...], lease_ttl: int, grace: float,
    held: list[int],
) -> tuple[int, RequestView | None, int | None]:
    """Run the command while heartbeating; (exit code, the request if its units were lost,
    the first ending signal we received meanwhile, ``held`` ones as it started included).
    While heartbeats fail for a passing reason (``passing``: the server or the database out
    of reach, a long write elsewhere) the command goes on (its lease covers the outage, or
    the next heartbeat that gets through finds the units gone); refused (its token
    revoked), or on any other failure here, the command is stopped before the error goes
    up, never left running alone."""
    svc = service()
    env = {
        **os.environ,
        "FAIRPOOL_REQUEST_ID": request.id,
        "FAIRPOOL_POOL": request.pool or "",
        "FAIRPOOL_RESOURCES": json.dumps(request.resources, sort_keys=True),
    }
    others = _children()  # ours before the command: not its leftovers
    try:
        child = subprocess.Popen(command, env=env, preexec_fn=_dies_with(os.getpid()))
    except OSError as error:
        svc.release_request(request.id)
        failure = _NotFound if isinstance(error, FileNotFoundError) else _NotRunnable
        raise failure(f"cannot run {command[0]!r}: {error}") from None
    received: list[int] = []

    def forward(signum: int, _: FrameType | None) -> None:
        received.append(signum)
        if not _the_terminal_sent_it(signum, child):
            child.send_signal(signum)

    previous = catch_ending_signals(forward)
    for signum in held:  # received as it started
        forward(signum, None)
    unreachable = False
    interval = heartbeat_interval(lease_ttl)
    keep = _keeping(None)  # what keeps a retry attempt while we stop (none yet)
    # When the command's grace ends, once we stop it: the processes it leaves get no more.
    deadline: float | None = None
    lost: RequestView | None = None
    try:
        while True:
            try:
                return _exit_code(child.wait(timeout=interval)), None, next(iter(received), None)
            except subprocess.TimeoutExpired:
                pass
            try:
                current = svc.heartbeat(request.id)
            except NotFound:  # deleted while held: its units are others' now
                current = deleted(request)
            except Exception as error:
                if not passing(error):
                    raise
                if not unreachable:  # ours (``Unreachable``) names the database or server
                    o.declare(f"Warning: {said(error)}; the command goes on")
                unreachable = True
                continue
            if unreachable:
                o.declare("Heartbeats get through again")
                unreachable = False
            if current.status != "allocated":
                if child.poll() is not None:  # it ended by itself meanwhile: not stopped by us
                    return _exit_code(child.returncode), None, next(iter(received), None)
                keep, lost = _keeping(current.retried_as_id), current
                deadline = time.monotonic() + grace
                return _stop(child, deadline, interval, keep), current, next(iter(received), None)
    except BaseException:
        deadline = time.monotonic() + grace
        _stop(child, deadline, interval)
        raise
    finally:
        left = _stop_leftovers(others | {child.pid}, deadline or time.monotonic() + grace,
                               interval, keep)
        if left:
            # Preempted, its units were another's already.
            given = f": its units are {lost.status}" if lost else ": its units are given back"
            o.declare(f"Stopped {left} process{'es' if left > 1 else ''} the command left "
                      f"running{given}")
        restore(previous)


def _the_terminal_sent_it(signum: int, child: subprocess.Popen[bytes]) -> bool:
    """Ctrl-C, or a hang-up, in a terminal whose foreground process group is ours and the
    command's: the terminal sent it to the command too, which must not get it twice (a
    second Ctrl-C cuts short what a program does on the first, saving a checkpoint, say).
    A command in a group of its own (``timeout``, ``setsid``) gets it from us. (Sent to our
    pid alone by ``kill -INT`` then, it is not forwarded: SIGTERM always is.)"""
    if signum not in (signal.SIGINT, signal.SIGHUP):
        return False
    try:
        with open("/dev/tty", "rb", buffering=0) as tty:
            foreground = os.tcgetpgrp(tty.fileno())
        return foreground == os.getpgrp() == os.getpgid(child.pid)
    except OSError:  # no controlling terminal; the command gone
        return False


def _keeping(retry: str | None) -> Callable[[], None]:
    """What heartbeats the retry attempt while the preempted command stops: granted
    meanwhile, its lease runs from then, and a grace longer than the lease would let it
    expire. Preempted in turn, it is its own retry attempt that is kept. Each heartbeat runs
    on a thread of its own, one at a time: one riding out an outage (seconds of retries) held
    up the SIGKILL the grace was due to end in."""
    beating: threading.Thread | None = None
    svc = service()  # here: the CLI's service is found in click's context, this thread's

    def beat() -> None:
        nonlocal retry
        assert retry is not None
        try:
            kept = svc.heartbeat(retry)
        except (Conflict, NotFound):  # it ended meanwhile
            return
        except Exception as error:
            if not passing(error):
                o.declare(f"Warning: retry attempt `{retry}` not kept ({error}): its lease "
                          "may run out")
            return
        retry = kept_next(retry, kept)

    def keep() -> None:
        nonlocal beating
        if retry is not None and (beating is None or not beating.is_alive()):
            beating = threading.Thread(target=beat, name="fairpool-keep-retry", daemon=True)
            beating.start()

    return keep


class _NotFound(click.ClickException):
    exit_code = 127  # as a shell exits when the command is not found


class _NotRunnable(click.ClickException):
    exit_code = 126  # found, but not runnable


def _dies_with(parent: int) -> Callable[[], None] | None:
    """Linux: what makes the command, in its process before it starts, die by SIGKILL when
    ``fairpool run`` dies, even by SIGKILL itself, which no handler sees: its lease then
    runs out and its units go to another command, so it must not run on alone. Elsewhere
    nothing (it may outlive us)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before that: nobody would send the signal
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent


#: prctl(2): the signal this process gets when its parent dies; and orphans of its
#: descendants become its children (not init's).
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> None:
    """Linux: what the command starts and leaves behind when it ends (a shell script's
    ``sleep``, a daemon) becomes our child, so that ``_stop_leftovers`` finds it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _children() -> set[int]:
    """Our live child processes (Linux; elsewhere none are known)."""
    me, found = os.getpid(), set[int]()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    # The name may hold spaces and parentheses: the fields after its last ")".
                    state, ppid = stat.read().rpartition(")")[2].split()[:2]
            except (OSError, ValueError):
                continue  # ended meanwhile
            if int(ppid) == me and state != "Z":
                found.add(int(entry.name))
    return found


def _stop_leftovers(ours: set[int], deadline: float, every: float,
                    meanwhile: Callable[[], None]) -> int:
    """Stop the processes the command left running once it ended (SIGTERM, then SIGKILL at
    ``deadline``, the command's own when we stopped it: a second grace let them run on
    units already another's): they would go on using units given back. How many there
    were. As ``_stop``, ``meanwhile`` is called ``every`` seconds (a retry attempt kept: a
    grace longer than its lease let it expire)."""
    stopped = set[int]()
    kept = time.monotonic()
    while True:
        if time.monotonic() - kept >= every:
            meanwhile()
            kept = time.monotonic()
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap the ones that ended
                pass
        left = _children() - ours
        if not left:
            return len(stopped)
        late = time.monotonic() >= deadline
        for pid in left:
            if late or pid not in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
            stopped.add(pid)
        time.sleep(0.05)


def _stop(child: subprocess.Popen[bytes], deadline: float, every: float,
          meanwhile: Callable[[], None] = lambda: None) -> int:
    """SIGTERM, then SIGKILL if the command has not ended at ``deadline``, calling
    ``meanwhile`` ``every`` seconds while it stops; its exit code."""
    if child.poll() is None:
        child.terminate()
        while True:
            try:
                child.wait(timeout=max(0.0, min(every, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    child.kill()
                    break
                meanwhile()
    return _exit_code(child.wait())


def _exit_code(code: int) -> int:
    """A shell's convention: killed by signal N exits 128 + N."""
    return 128 - code if code < 0 else code


@click.command("server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; the default serves this machine only.")
@click.option("--port", type=click.IntRange(1, 65535), default=8600, show_default=True)
@database_url_option("The database to serve (default: fairpool --database-url or "
                     "FAIRPOOL_DATABASE_URL, else the embedded store under --home).")
@click.option("--tick", type=Seconds(min=0.05), default=1.0, show_default=True,
              help="Seconds between reconcile passes (lease expiry, timeouts).")
@click.option("--auth/--no-auth", default=None,
              help="Require API tokens (`fairpool token create`). Default: only when --host is "
              "not a loopback address.")
@click.option("--insecure", is_flag=True,
              help="Allow --no-auth on a non-loopback host (a trusted network only).")
@click.option("--keep-history", type=Duration(MIN_KEEP_HISTORY, MAX_RETENTION), default=None,
              help="Prune what ended longer ago than this (30d, 12h; at least 1h), at start "
              "and then hourly, as `fairpool prune` does. Default: keep everything.")
@click.option("--root-path", default="", metavar="PREFIX",
              help="The path prefix a proxy serves the server under, e.g. /fairpool: the "
              "documentation pages and the schema name it. Default: none.")
@click.pass_context
def server(ctx: click.Context, host: str, port: int, database_url: str | None,
           tick: float, auth: bool | None, insecure: bool, keep_history: int | None,
           root_path: str) -> None:
    """Serve the HTTP API (OpenAPI at /docs) with a reconciler, until SIGTERM, SIGHUP or
    Ctrl-C."""
    from fairpool.api.auth import AuthSetupError, auth_enabled
    from fairpool.api.server import serve

    root_ctx = ctx.find_root()
    if root_ctx.get_parameter_source("url") is click.core.ParameterSource.COMMANDLINE:
        # It was ignored: the server then served the store under --home, not the one meant.
        raise click.UsageError(
            f"--url {root_ctx.params['url']!r}: a server serves a database, it does not talk "
            "to another server; choose the database with --home or --database-url"
        )
    try:
        auth_enabled(host, auth, insecure)
    except AuthSetupError as error:
        raise click.UsageError(str(error)) from None
    root = root_ctx.obj
    serve(host, port, root.get("home"), database_url or root.get("database_url"), tick,
          auth=auth, insecure=insecure, keep_history=keep_history, root_path=root_path)
