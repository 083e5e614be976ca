"""``fairpool run`` in a subprocess: env, exit codes, release, preemption with retry, timeout,
signals (while waiting and while running), SIGKILL after the grace, an unreachable server, lost
connections to the database it works on directly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import make_url

from fairpool import Client
from tests.conftest import POSTGRES_CONNINFO
from tests.servers import ApiServer, request_arrived, running, setup_pool
from tests.test_api import poll_until
from tests.test_cli import CLI, cli_env, fairpool
from tests.test_postgres import terminate_all


def setup(home: Path) -> None:
    fairpool(home, "resource-pool", "create", "p", "-c", '{"gpu": 1}').ok()
    fairpool(home, "resource-pool", "attach-policy", "p", "low", "-p", "1").ok()
    fairpool(home, "resource-pool", "attach-policy", "p", "high", "-p", "9").ok()


def statuses(home: Path) -> list[tuple[str, str, int]]:
    items = fairpool(home, "resource-request", "list", "-o", "json").ok().json["items"]
    return [(i["component"], i["status"], i["attempt"]) for i in items]


def reasons(home: Path) -> dict[str, str]:
    """Each component's last request's reason."""
    items = fairpool(home, "resource-request", "list", "-o", "json").ok().json["items"]
    return {i["component"]: i["status_reason"] for i in items}


def test_run_passes_the_grant_in_the_environment_and_its_exit_code_back(tmp_path: Path) -> None:
    setup(tmp_path)
    script = (
        "import json, os, sys; print(os.environ['FAIRPOOL_POOL'], "
        "json.loads(os.environ['FAIRPOOL_RESOURCES'])['gpu'], "
        "len(os.environ['FAIRPOOL_REQUEST_ID'])); sys.exit(3)"
    )
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--",
                      sys.executable, "-c", script)
    assert result.code == 3, result
    assert result.out.split() == ["p", "1", "36"]
    assert statuses(tmp_path) == [("low", "released", 1)]


def test_run_with_a_closed_stderr_runs_the_command_and_releases(tmp_path: Path) -> None:
    """`fairpool run ... 2>&1 | true`: its first line to stderr (the allocation) raised
    BrokenPipeError, and it exited 1 without running the command, its units held until the
    lease ran out."""
    setup(tmp_path)
    marker = tmp_path / "ran"
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run(
            [*CLI, "run", "--component", "low", "--gpu-count", "1", "--", "touch", str(marker)],
            env=cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=write, timeout=60,
        )
    finally:
        os.close(write)
    assert run.returncode == 0 and marker.exists()
    assert statuses(tmp_path) == [("low", "released", 1)]


def test_run_refuses_what_can_never_fit(tmp_path: Path) -> None:
    setup(tmp_path)
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "2", "--", "true")
    assert result.code == 1
    assert "was rejected: pool p: gpu requested 2 > capacity 1" in result.err


def test_run_gives_up_after_timeout_and_cancels(tmp_path: Path) -> None:
    setup(tmp_path)
    fairpool(tmp_path, "resource-request", "create", "--component", "high", "--gpu-count", "1").ok()
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1",
                      "--timeout", "1", "--", "true")
    assert result.code == 2, result
    assert "position 1 in pool `p`" in result.err
    assert statuses(tmp_path) == [("high", "allocated", 1), ("low", "cancelled", 1)]
    assert reasons(tmp_path)["low"] == "cancelled: gave up waiting after 1 s"


def test_preempted_command_is_terminated_and_rerun_on_its_retry(tmp_path: Path) -> None:
    setup(tmp_path)
    marker = tmp_path / "runs.txt"
    script = (
        "import signal, sys, time\n"
        f"open({str(marker)!r}, 'a').write('start\\n')\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        f"time.sleep(0.2 if open({str(marker)!r}).read().count('start') > 1 else 30)\n"
    )
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--max-retries",
                   "1", "--lease-ttl", "1", "--grace", "2", "--", sys.executable, "-c", script)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    boss = fairpool(tmp_path, "resource-request", "create", "--component", "high",
                    "--gpu-count", "1", "-o", "json").ok().json
    assert boss["status"] == "allocated"
    time.sleep(2)  # the runner hears of it at its next heartbeat and stops the command
    fairpool(tmp_path, "resource-request", "release", boss["id"]).ok()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert marker.read_text().count("start") == 2
    assert "was preempted: preempted by request" in err
    assert "Retrying as attempt 2" in err
    assert sorted(statuses(tmp_path)) == [
        ("high", "released", 1), ("low", "preempted", 1), ("low", "released", 2),
    ]
    events = json.dumps(statuses(tmp_path))
    assert "allocated" not in events


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adopts orphans by prctl")
def test_what_the_command_leaves_running_is_stopped_with_it(tmp_path: Path) -> None:
    """A shell script's background step outlived the script (orphaned to init), running on
    units given back; on preemption, next to the retry attempt."""
    setup(tmp_path)
    pid_file = tmp_path / "pid"
    result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--grace", "2",
                      "--", "sh", "-c", f"sleep 60 & echo $! > {pid_file}; exit 4")
    assert result.code == 4, result
    assert "Stopped 1 process the command left running" in result.err
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists()  # stopped, and reaped before run exited
    assert statuses(tmp_path) == [("low", "released", 1)]


def start(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``fairpool ARGS`` started, not waited for."""
    return subprocess.Popen(
        [*CLI, *args], env=env or cli_env(home), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )


def dead(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone, or a zombie not reaped yet (by init, soon
    after it dies)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


#: The commands that wait for units, as they would wait for a GPU held by "high".
WAITING = {
    "run": ("run", "--component", "low", "--gpu-count", "1", "--", "true"),
    "create --wait": ("resource-request", "create", "--component", "low", "--gpu-count", "1",
                      "--wait"),
}


def waiting(home: Path, command: str) -> subprocess.Popen[str]:
    """``command`` (of ``WAITING``) started, and in its wait for the GPU "high" holds."""
    setup(home)
    fairpool(home, "resource-request", "create", "--component", "high", "--gpu-count", "1").ok()
    runner = start(home, *WAITING[command])
    poll_until(lambda: ("low", "queued", 1) in statuses(home))
    time.sleep(0.3)  # in its wait
    return runner


@pytest.mark.parametrize("command", WAITING)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_waiting_cancels_the_request(
    tmp_path: Path, signum: int, command: str
) -> None:
    """Else it would stay queued, and be granted units nobody uses (without a lease, for
    ``create --wait``: for ever)."""
    runner = waiting(tmp_path, command)
    runner.send_signal(signum)
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 128 + signum, err
    assert "Interrupted: resource request" in err and "cancelled" in err
    assert statuses(tmp_path) == [("high", "allocated", 1), ("low", "cancelled", 1)]
    name = signal.Signals(signum).name
    assert reasons(tmp_path)["low"] == f"cancelled: interrupted while waiting ({name})"


#: The CLI with one Ctrl-C landing in a finalizer, in the main thread, at its wait's first
#: sleep: an object dropped there, whose ``__del__`` raises SIGINT.
IN_A_FINALIZER = """
import runpy, signal, sys, time
import fairpool.service

class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)
        for _ in range(3):  # a loop: where the interpreter runs the signal's handler
            pass

class Clock:
    slept = False
    def __getattr__(self, name):
        return getattr(time, name)
    def sleep(self, seconds):
        if not Clock.slept:
            Clock.slept = True
            Finalized()
        time.sleep(seconds)

fairpool.service.time = Clock()
sys.argv = ["fairpool", *sys.argv[1:]]
runpy.run_module("fairpool.cli.main", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("command", WAITING)
def test_a_ctrl_c_handled_in_a_finalizer_still_cancels_the_wait(
    tmp_path: Path, command: str
) -> None:
    """Python drops what a finalizer raises (cpython#95959): the Ctrl-C was lost, and the
    wait went on to its timeout (exit 2, the request left queued)."""
    setup(tmp_path)
    fairpool(tmp_path, "resource-request", "create", "--component", "high", "--gpu-count", "1").ok()
    args = [*WAITING[command]]
    args.insert(args.index("--component"), "--timeout")
    args.insert(args.index("--component"), "20")
    runner = subprocess.run([sys.executable, "-c", IN_A_FINALIZER, *args], env=cli_env(tmp_path),
                            capture_output=True, text=True, timeout=60, check=False)
    assert runner.returncode == 128 + signal.SIGINT, runner.stderr
    assert statuses(tmp_path) == [("high", "allocated", 1), ("low", "cancelled", 1)]
    assert reasons(tmp_path)["low"] == "cancelled: interrupted while waiting (SIGINT)"


@pytest.mark.parametrize("command", WAITING)
def test_a_second_ending_signal_while_cancelling_waits_for_the_cancel(
    tmp_path: Path, command: str
) -> None:
    """A closed terminal sends SIGHUP twice (the shell's, the kernel's): the second, landing
    while the first cancelled, escaped as 'Aborted!' (exit 1) and left the request queued,
    to be granted to nobody."""
    runner = waiting(tmp_path, command)
    runner.send_signal(signal.SIGHUP)
    runner.send_signal(signal.SIGTERM)  # another signal: not merged with the first
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 128 + signal.SIGHUP, err
    assert statuses(tmp_path) == [("high", "allocated", 1), ("low", "cancelled", 1)]


@pytest.mark.parametrize("command", WAITING)
@pytest.mark.parametrize(("first", "then", "gap"), [
    (signal.SIGHUP, signal.SIGHUP, 0.15),  # once it exits: killed by its default action
    (signal.SIGINT, signal.SIGINT, 0.01),  # while it cancels: 'Aborted!', exit 1
], ids=["SIGHUP-then-SIGHUP", "SIGINT-then-SIGINT"])
def test_a_repeated_signal_while_it_cancels_or_exits_keeps_its_exit_status(
    tmp_path: Path, command: str, first: int, then: int, gap: float
) -> None:
    """128 + the first signal's number, whenever the second lands (helper-59)."""
    runner = waiting(tmp_path, command)
    runner.send_signal(first)
    time.sleep(gap)
    with contextlib.suppress(ProcessLookupError):
        runner.send_signal(then)
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 128 + first, err
    assert "Interrupted" in err and "Aborted!" not in err, err


def test_a_signal_between_the_grant_and_the_commands_start_gives_the_units_back(
    tmp_path: Path,
) -> None:
    """Sent as `fairpool run` says it is allocated, before the command runs: the signal's
    default action ended it there (no exit status of ours), the units held until the lease
    ran out (helper-59). Now it is forwarded to the command, or cancels the request."""
    setup(tmp_path)
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--", "sleep", "30")
    assert runner.stderr is not None
    for line in runner.stderr:
        if line.startswith("Allocated on pool"):
            runner.send_signal(signal.SIGTERM)
            break
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 128 + signal.SIGTERM, err
    assert statuses(tmp_path)[0][1] in ("released", "cancelled")


def test_a_command_that_cannot_start_exits_as_a_shell_would(tmp_path: Path) -> None:
    """127 not found, 126 not runnable, before anything is requested: it was found only once
    units were granted, after what may be hours of waiting (and `''` was 126)."""
    setup(tmp_path)
    not_runnable = tmp_path / "script.sh"
    not_runnable.write_text("echo hi\n")
    for command, code, why in ((str(tmp_path / "nowhere"), 127, "no such file"),
                               ("no-such-command-here", 127, "not found on PATH"),
                               ("", 127, "not found on PATH"),
                               (str(not_runnable), 126, "not executable"),
                               (str(tmp_path), 126, "is a directory")):
        result = fairpool(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--", command)
        assert result.code == code, result
        assert result.err_lines == [f"Error: cannot run {command!r}: {why}; nothing was "
                                    "requested"], result
    assert statuses(tmp_path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_the_command_dies_with_a_killed_run(tmp_path: Path) -> None:
    """kill -9 of ``fairpool run`` (no handler runs): its command goes too, rather than run
    on alone on units its lease will give to another command."""
    setup(tmp_path)
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--",
                       sys.executable, "-c", script)
    poll_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    command = int(pid_file.read_text())
    runner.kill()
    runner.wait(timeout=30)
    for pipe in (runner.stdout, runner.stderr):  # the command may hold their other ends
        assert pipe is not None
        pipe.close()

    poll_until(lambda: dead(command))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signals_reach_the_command_and_its_exit_code_comes_back(
    tmp_path: Path, signum: int
) -> None:
    """SIGHUP (a closed terminal) ended `run` at once, the command killed by its death
    signal, the units held until the lease ran out."""
    setup(tmp_path)
    marker = tmp_path / "started"
    script = (
        "import signal, sys, time\n"
        f"signal.signal({int(signum)}, lambda n, _: (print('got', n), sys.exit(7)))\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "time.sleep(30)\n"
    )
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--",
                       sys.executable, "-c", script)
    poll_until(marker.exists)
    runner.send_signal(signum)
    out, err = runner.communicate(timeout=30)
    assert runner.returncode == 7, err
    assert out.split() == ["got", str(int(signum))]
    assert statuses(tmp_path) == [("low", "released", 1)]


def test_a_preempted_command_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    setup(tmp_path)
    marker = tmp_path / "started"
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--lease-ttl", "1",
                       "--grace", "2", "--", sys.executable, "-c", script)
    poll_until(marker.exists)
    # Timed from before the preempting command: it commits some time before it exits.
    preempting = time.monotonic()
    fairpool(tmp_path, "resource-request", "create", "--component", "high", "--gpu-count", "1").ok()
    _, err = runner.communicate(timeout=60)
    took = time.monotonic() - preempting
    assert runner.returncode == 128 + signal.SIGKILL, err
    assert "was preempted" in err
    # The grace, then at most the preempting command's run, a heartbeat interval (1/3 s) and
    # slack.
    assert 2 <= took < 2 + 1 + 3


def test_the_command_goes_on_when_its_database_connections_are_lost(
    tmp_path: Path, new_database: Callable[..., str]
) -> None:
    """Working directly on PostgreSQL (FAIRPOOL_DATABASE_URL, no server), its connections
    ended once (a restart, a failover): the next heartbeat stopped the command and `fairpool
    run` exited 1, its request allocated until the lease ran out. The heartbeats now run on
    new connections: the command runs to its end, and its units are released."""
    url = new_database("postgresql", migrated=True)
    with Client(database_url=url) as client:
        client.create_pool("p", {"gpu": 1})
        client.attach_policy("p", "low")
    started, go = tmp_path / "started", tmp_path / "go"
    script = (
        "import os, time\n"
        f"open({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('finished')\n"
    )
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--lease-ttl", "6",
                   "--", sys.executable, "-c", script,
                   env={**cli_env(tmp_path), "FAIRPOOL_DATABASE_URL": url})
    poll_until(started.exists)
    dbname = make_url(url).database
    with psycopg.connect(POSTGRES_CONNINFO, dbname=dbname, autocommit=True) as other:
        assert terminate_all(other) >= 1
    time.sleep(2.5)  # a heartbeat (every 2 s)
    # Then none can be made for a moment (a restart): a heartbeat fails, and says so in
    # fairpool's words, naming the database (the driver's "connection failed: …", before).
    with psycopg.connect(POSTGRES_CONNINFO, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s", [dbname])
            time.sleep(2.5)  # a heartbeat fails; the lease rides it out
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
    time.sleep(2.5)  # heartbeats get through again
    go.touch()
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert out == "finished\n"
    assert f"Warning: cannot reach the database {make_url(url).render_as_string(hide_password=True)}" in err, err
    assert "Heartbeats get through again" in err, err
    with Client(database_url=url) as client:
        assert [(r.status, r.status_reason) for r in client.list_requests()] == [
            ("released", "released by its holder")]


def test_the_command_goes_on_while_the_server_cannot_be_reached(tmp_path: Path) -> None:
    """Its heartbeats fail (the server is gone): the command runs to its end and its exit
    code comes back, rather than being left running alone by a failed ``fairpool run``."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "served")
    with running(server):
        setup_pool(server.url, "gone-gpus", ["gone-orch"], {"gpu": 1})
        marker = tmp_path / "started"
        script = (
            "import time\n"
            f"open({str(marker)!r}, 'w').close()\n"
            "time.sleep(3)\n"
            "raise SystemExit(5)\n"
        )
        env = {**cli_env(tmp_path), "FAIRPOOL_URL": server.url}
        runner = start(tmp_path, "run", "--component", "gone-orch", "--gpu-count", "1",
                           "--lease-ttl", "3", "--", sys.executable, "-c", script, env=env)
        poll_until(marker.exists)
        server.kill()
        _, err = runner.communicate(timeout=90)
    assert runner.returncode == 5, err
    assert f"Warning: cannot reach the fairpool server at {server.url}" in err
    assert "the command goes on" in err
    assert "the units go back when the lease expires" in err


def preemptible(home: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """``run`` of ``script`` for "low" with a retry, started."""
    return start(home, "run", "--component", "low", "--gpu-count", "1", "--max-retries", "1",
                 *args, "--", sys.executable, "-c", script)


def preempt(home: Path) -> str:
    """A request of "high" takes the GPU: its id."""
    boss = fairpool(home, "resource-request", "create", "--component", "high", "--gpu-count",
                    "1", "-o", "json").ok().json
    assert boss["status"] == "allocated"
    return str(boss["id"])


#: A command that notes SIGTERM in the file ``log`` and goes on: slow to stop.
SLOW_TO_STOP = (
    "import signal, sys, time\n"
    "log = sys.argv[1]\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(log, 'a').write('term\\n'))\n"
    "runs = open(log, 'a').write('start\\n') and open(log).read().count('start')\n"
    "time.sleep(60 if runs == 1 else 0.1)\n"
)


def test_a_signal_while_the_preempted_command_stops_cancels_its_retry(tmp_path: Path) -> None:
    """The signal went to the command, stopping already, and ``run`` then ran it again on the
    retry attempt: a deleted pod's job came back."""
    setup(tmp_path)
    log = tmp_path / "log"
    runner = preemptible(tmp_path, SLOW_TO_STOP.replace("sys.argv[1]", repr(str(log))),
                         "--lease-ttl", "1", "--grace", "3")
    poll_until(log.exists)
    preempt(tmp_path)
    poll_until(lambda: "term" in log.read_text())
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM, err
    assert log.read_text().count("start") == 1
    assert sorted(statuses(tmp_path)) == [
        ("high", "allocated", 1), ("low", "cancelled", 2), ("low", "preempted", 1),
    ]
    assert reasons(tmp_path)["low"] == "cancelled: interrupted while waiting (SIGTERM)"
    assert "Retry attempt" in err and "cancelled" in err


def test_a_command_that_ends_before_it_hears_of_its_preemption_leaves_no_retry(
    tmp_path: Path,
) -> None:
    """Its release found it preempted (``run`` heard of it no sooner than the next
    heartbeat): ``run`` exited with the command's code, and left the retry attempt queued,
    to be granted to nobody."""
    setup(tmp_path)
    go = tmp_path / "go"
    started = tmp_path / "started"
    script = (f"import os, time\nopen({str(started)!r}, 'w').close()\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n")
    runner = preemptible(tmp_path, script, "--lease-ttl", "60")  # a heartbeat every 20 s
    poll_until(started.exists)
    preempt(tmp_path)
    go.touch()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert "was preempted as the command ended" in err
    assert sorted(statuses(tmp_path)) == [
        ("high", "allocated", 1), ("low", "cancelled", 2), ("low", "preempted", 1),
    ]
    assert reasons(tmp_path)["low"] == (
        "cancelled: not followed: its holder ended before it heard of the preemption")


#: A command that stops at SIGTERM, leaving behind a process that ignores it.
LEAVES_ONE_BEHIND = (
    "import signal, subprocess, sys, time\n"
    "log = sys.argv[1]\n"
    "runs = open(log, 'a').write('start\\n') and open(log).read().count('start')\n"
    "if runs == 1:\n"
    "    subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
    "    signal.signal(signal.SIGTERM, lambda *_: open(log, 'a').write('term\\n') and sys.exit(0))\n"
    "    time.sleep(60)\n"
)


@pytest.mark.parametrize("script", [SLOW_TO_STOP, LEAVES_ONE_BEHIND],
                         ids=["the-command", "its-leftovers"])
def test_a_retry_granted_while_the_command_stops_keeps_its_lease(
    tmp_path: Path, script: str
) -> None:
    """Granted during a grace longer than its lease, nothing heartbeated it: it expired, and
    ``run`` exited 1 without running the command again. So for the grace of the processes
    the command left behind, until 2026-11-29."""
    setup(tmp_path)
    log = tmp_path / "log"
    runner = preemptible(tmp_path, script.replace("sys.argv[1]", repr(str(log))),
                         "--lease-ttl", "1", "--grace", "3")
    poll_until(log.exists)
    time.sleep(0.5)  # a process it leaves behind started
    boss = preempt(tmp_path)
    poll_until(lambda: "term" in log.read_text())
    fairpool(tmp_path, "resource-request", "release", boss).ok()  # the retry is granted
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert ("Stopped 1 process the command left running" in err) is (
        script is LEAVES_ONE_BEHIND)
    assert log.read_text().count("start") == 2
    assert sorted(statuses(tmp_path)) == [
        ("high", "released", 1), ("low", "preempted", 1), ("low", "released", 2),
    ]


#: A command that ignores SIGTERM, as does the process it starts (``sh -c 'trap "" TERM;
#: python3 work.py'``), whose pid it writes to the file ``log``.
DEAF_WITH_A_CHILD = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "time.sleep(60)\n"
)


def test_the_processes_a_preempted_command_leaves_get_no_second_grace(tmp_path: Path) -> None:
    """Preempted, the command is killed when its grace ends; what it leaves was given a
    grace of its own from then, running on twice ``--grace`` after the preemption on units
    already another's, and ``run`` said their units were "given back" (helper-72)."""
    setup(tmp_path)
    log = tmp_path / "log"
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--grace", "4",
                   "--lease-ttl", "1", "--", sys.executable, "-c",
                   DEAF_WITH_A_CHILD.replace("sys.argv[1]", repr(str(log))))
    poll_until(lambda: log.exists() and log.read_text())
    grandchild = int(log.read_text())
    preempt(tmp_path)
    preempted = time.monotonic()

    def gone() -> bool:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return True
        return False

    poll_until(gone, 30, every=0.05)
    ended = time.monotonic() - preempted
    _, err = runner.communicate(timeout=60)
    # The grace and a heartbeat (1/3 s) to hear of it; 8 s and more before.
    assert ended < 7.5, ended
    assert "Stopped 1 process the command left running: its units are preempted" in err, err


def test_a_request_deleted_while_held_stops_the_command_saying_so(tmp_path: Path) -> None:
    """``run`` ended with the heartbeat's `Error: no request '...'`, as the SDK did not."""
    setup(tmp_path)
    runner = start(tmp_path, "run", "--component", "low", "--gpu-count", "1", "--lease-ttl",
                   "3", "--", "sleep", "30")
    poll_until(lambda: ("low", "allocated", 1) in statuses(tmp_path))
    (held,) = fairpool(tmp_path, "resource-request", "list", "-o", "json").ok().json["items"]
    fairpool(tmp_path, "resource-request", "delete", held["id"]).ok()
    _, err = runner.communicate(timeout=30)
    assert runner.returncode == 128 + signal.SIGTERM, err
    assert (f"Resource request `{held['id']}` was deleted: deleted while held"
            in err.splitlines()[-1]), err


@pytest.mark.parametrize("command", WAITING)
def test_a_signal_nohup_ignores_leaves_the_wait_be(tmp_path: Path, command: str) -> None:
    """``nohup fairpool run ... &``: the SIGHUP of a closed session cancelled the request."""
    setup(tmp_path)
    boss = preempt(tmp_path)
    runner = subprocess.Popen(
        [*CLI, *WAITING[command]], env=cli_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    poll_until(lambda: ("low", "queued", 1) in statuses(tmp_path))
    runner.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    fairpool(tmp_path, "resource-request", "release", boss).ok()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert ("low", "cancelled", 1) not in statuses(tmp_path)


@pytest.mark.parametrize("own_group", [False, True], ids=["in-ours", "in-its-own"])
def test_one_ctrl_c_in_a_terminal_reaches_the_command_once(tmp_path: Path, own_group: bool
                                                          ) -> None:
    """The terminal sends it to its foreground process group, which holds the command too;
    ``run`` forwarded its own on top, and a second KeyboardInterrupt cut short what the
    command did on the first (saving a checkpoint). A command in a group of its own
    (``timeout``, ``setsid``) gets it from ``run`` only."""
    import pty

    setup(tmp_path)
    started = tmp_path / "started"
    script = (
        "import os, time\n"
        f"{'os.setpgid(0, 0)' if own_group else ''}\n"
        # Marked started inside the try: a Ctrl-C once the file exists but before open()
        # returned was a traceback (seen on a loaded machine).
        f"try:\n    open({str(started)!r}, 'w').close()\n    time.sleep(30)\n"
        "except KeyboardInterrupt:\n    time.sleep(1)\n    print('checkpoint saved')\n"
    )
    argv = [*CLI, "run", "--component", "low", "--gpu-count", "1", "--",
            sys.executable, "-c", script]
    pid, terminal = pty.fork()  # as a shell runs a job: in a terminal, in its foreground
    if pid == 0:
        os.execve(argv[0], argv, cli_env(tmp_path))
    poll_until(started.exists)
    os.write(terminal, b"\x03")  # Ctrl-C
    out = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's last process is gone
        while data := os.read(terminal, 65536):
            out += data
    os.close(terminal)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert (code, b"checkpoint saved" in out) == (0, True), out.decode(errors="replace")
    assert statuses(tmp_path) == [("low", "released", 1)]


def test_a_wait_interrupted_while_the_server_is_down_says_what_it_leaves(
    tmp_path: Path,
) -> None:
    """The cancel could not be sent: ``create --wait`` printed only that the server could not
    be reached, leaving the request to be granted later to nobody, for ever without a
    lease."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "served")
    with running(server):
        setup_pool(server.url, "down-gpus", ["down-orch"], {"gpu": 1})
        env = {**cli_env(tmp_path), "FAIRPOOL_URL": server.url}
        held = subprocess.run([*CLI, "resource-request", "create", "--component", "down-orch",
                               "--gpu-count", "1"], env=env, capture_output=True, check=True)
        assert held.returncode == 0
        waiter = start(tmp_path, "resource-request", "create", "--component", "down-orch",
                       "--gpu-count", "1", "--wait", env=env)
        assert waiter.stderr is not None
        assert "queued: position 1" in waiter.stderr.readline()
        time.sleep(0.3)  # into its wait
        server.kill()
        waiter.send_signal(signal.SIGTERM)
        _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 128 + signal.SIGTERM, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("Interrupted: resource request `") and "is still waiting (" in line
    assert ": cancel it with `fairpool resource-request cancel " in line


def test_a_preempted_command_is_killed_on_time_while_the_server_is_away(
    tmp_path: Path,
) -> None:
    """Keeping its retry attempt, a heartbeat riding out the outage (seconds of retries)
    held up the SIGKILL due at the end of the grace: 5.8 s for a grace of 2. The retry
    attempt, which `run` could not read then, is named with the command that cancels it."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "served")
    log = tmp_path / "log"
    script = (
        "import os, signal, time\n"
        f"log = {str(log)!r}\n"
        "signal.signal(signal.SIGTERM, lambda *_: open(log, 'a').write('term\\n'))\n"
        "open(log, 'a').write(f'start {os.getpid()}\\n')\n"
        "time.sleep(60)\n"
    )
    with running(server):
        setup_pool(server.url, "away-gpus", ["away-low"], {"gpu": 1})
        env = {**cli_env(tmp_path), "FAIRPOOL_URL": server.url}
        runner = start(tmp_path, "run", "--component", "away-low", "--gpu-count", "1",
                       "--max-retries", "1", "--lease-ttl", "1", "--grace", "2", "--",
                       sys.executable, "-c", script, env=env)
        poll_until(lambda: log.exists() and "start" in log.read_text())
        pid = int(log.read_text().split()[1])
        with httpx.Client(base_url=server.url + "/api/v1") as http:
            assert http.post("/pools/away-gpus/policies",
                             json={"component": "away-high", "priority": 9}).status_code == 201
            assert http.post("/requests", json={"component": "away-high",
                                                "resources": {"gpu": 1}}).status_code == 201
        poll_until(lambda: "term" in log.read_text())
        termed = time.monotonic()
        server.kill()

        poll_until(lambda: dead(pid))
        took = time.monotonic() - termed
        _, err = runner.communicate(timeout=60)
    assert 1.5 < took < 3.5, (took, err)
    assert runner.returncode == 1, err
    assert "Retry attempt `" in err and "is still waiting (cannot reach" in err, err


def test_run_that_times_out_while_the_server_is_down_says_what_it_leaves(
    tmp_path: Path,
) -> None:
    """The cancel could not be sent: ``run --timeout`` exited 1 with only the server's
    error, naming no request, where a timeout exits 2."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "served")
    with running(server):
        setup_pool(server.url, "down-gpus", ["down-orch"], {"gpu": 1})
        env = {**cli_env(tmp_path), "FAIRPOOL_URL": server.url}
        subprocess.run([*CLI, "resource-request", "create", "--component", "down-orch",
                        "--gpu-count", "1"], env=env, capture_output=True, check=True)
        waiter = start(tmp_path, "run", "--component", "down-orch", "--gpu-count", "1",
                       "--timeout", "2", "--", "true", env=env)
        assert waiter.stderr is not None
        assert "position 1" in waiter.stderr.readline()
        server.kill()
        _, err = waiter.communicate(timeout=90)
    assert waiter.returncode == 2, err
    assert "Timed out waiting for units" in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("Resource request `") and "is still waiting (" in line, err
    assert ": cancel it with `fairpool resource-request cancel " in line


@pytest.mark.parametrize("command", WAITING)
def test_a_signal_during_the_submit_cancels_the_request_it_makes(
    tmp_path: Path, command: str
) -> None:
    """The handlers came after the submit: a SIGTERM while the server had not answered yet
    ended the process by the default action, leaving the request it made queued."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "served")
    with running(server):
        setup_pool(server.url, "slow-gpus", ["low"], {"gpu": 1})
        env = {**cli_env(tmp_path), "FAIRPOOL_URL": server.url}
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)  # the submit waits for its answer
        try:
            waiter = start(tmp_path, *WAITING[command], env=env)
            # Started, and its submit sent: it waits in the stopped server's socket (a fixed
            # sleep was too short on a busy machine).
            poll_until(lambda: request_arrived(server.port) or waiter.poll() is not None, 60)
            waiter.send_signal(signal.SIGTERM)
        finally:
            server.process.send_signal(signal.SIGCONT)
        _, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 128 + signal.SIGTERM, err
        requests = httpx.get(f"{server.url}/api/v1/requests").json()["items"]
    assert [(r["status"], r["status_reason"]) for r in requests] == [
        ("cancelled", "cancelled: interrupted while waiting (SIGTERM)")]


def test_a_command_that_ends_while_the_heartbeat_tells_of_its_preemption_is_not_run_again(
    tmp_path: Path,
) -> None:
    """The command ended by itself while the heartbeat that told of its preemption was on
    its way (slow: the write lock is held meanwhile): ``run`` found it ended when it came to
    stop it, took it for stopped, and ran the finished command again on the retry."""
    import sqlite3

    setup(tmp_path)
    log, go = tmp_path / "log", tmp_path / "go"
    script = (f"import os, time\nopen({str(log)!r}, 'a').write('run\\n')\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n")
    runner = preemptible(tmp_path, script, "--lease-ttl", "6")  # a heartbeat every 2 s
    poll_until(log.exists)
    started = time.monotonic()

    def at(seconds: float) -> None:
        time.sleep(max(0.0, started + seconds - time.monotonic()))

    preempt(tmp_path)
    # Taken at once (it was taken at 1.6 s, timed from when the test saw the command start:
    # a command slow to start, or seen late, let the heartbeat at 2 s through first, which
    # stopped it and ran it again): the heartbeat at 2 s, the first that can tell of the
    # preemption, waits for it until the command has ended by itself.
    lock = sqlite3.connect(tmp_path / "fairpool.db", isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")
    try:
        at(2.6)
        go.touch()  # the command ends now, by itself
        at(3.2)
    finally:
        lock.execute("COMMIT")
        lock.close()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert log.read_text() == "run\n"
    assert reasons(tmp_path)["low"] == (
        "cancelled: not followed: its holder ended before it heard of the preemption")


def test_a_retry_preempted_while_the_command_stops_is_followed(tmp_path: Path) -> None:
    """Granted during the grace and preempted again, the retry attempt was taken for the
    end: ``run`` exited 1, leaving the next attempt queued, to be granted to nobody."""
    setup(tmp_path)
    log = tmp_path / "log"
    runner = preemptible(tmp_path, SLOW_TO_STOP.replace("sys.argv[1]", repr(str(log))),
                         "--lease-ttl", "1", "--grace", "5", "--max-retries", "2")
    poll_until(log.exists)
    boss = preempt(tmp_path)
    poll_until(lambda: "term" in log.read_text())
    fairpool(tmp_path, "resource-request", "release", boss).ok()  # the retry is granted
    poll_until(lambda: ("low", "allocated", 2) in statuses(tmp_path))
    boss = preempt(tmp_path)  # and preempted, the command still stopping
    fairpool(tmp_path, "resource-request", "release", boss).ok()
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert log.read_text().count("start") == 2
    assert [s for s in sorted(statuses(tmp_path)) if s[0] == "low"] == [
        ("low", "preempted", 1), ("low", "preempted", 2), ("low", "released", 3)]
