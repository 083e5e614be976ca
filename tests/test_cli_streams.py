"""The CLI as a Unix tool, in processes of their own: closed and broken standard streams, a
full disk, ASCII locales, COLUMNS that names no width, endless input, Ctrl-C, and the
arguments of a command ``run`` runs passed on as bytes (helper-95)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_cli import CLI, cli_env

#: ``sh -c SCRIPT sh CLI...``: the CLI as "$@", its streams redirected by the script.
SH = ["sh", "-c"]


def shell(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` run by sh with the CLI as ``"$@"``, e.g. ``'"$@" resource-pool list >&-'``;
    in a session of its own, so with no terminal to ask on."""
    return subprocess.run([*SH, script, "sh", *CLI], env=env, capture_output=True, text=True,
                          timeout=120, start_new_session=True)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    made = cli_env(tmp_path)
    made.pop("COLUMNS")
    for args in (["resource-pool", "create", "p", "-c", "{gpu: 4}", "-d", "GPU für Ω"],
                 ["resource-pool", "attach-policy", "p", "orch", "-p", "1"]):
        subprocess.run([*CLI, *args], env=made, check=True, capture_output=True)
    return made


def test_closed_and_broken_standard_streams(env: dict[str, str], tmp_path: Path) -> None:
    # Output into a pipe nobody reads (`| head`, `| true`): quiet, as Unix tools are; it
    # said "Error: [Errno 32] Broken pipe".
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as gone:
        broken = subprocess.run([*CLI, "resource-pool", "list", "-o", "json"], env=env,
                                stdout=gone, stderr=subprocess.PIPE, text=True, timeout=60)
    assert (broken.returncode, broken.stderr) == (1, ""), broken
    # Output closed (`>&-`): said, not dropped without a word with exit 0.
    for args in ("resource-pool list", "resource-pool describe p -o json"):
        closed = shell(f'"$@" {args} >&-', env)
        assert (closed.returncode, closed.stderr) == (
            1, "Error: [Errno 9] standard output is closed\n"), closed
    # Diagnostics closed (`2>&-`): the command still runs (the spinner's check failed it).
    made = shell('"$@" resource-pool create q -c "{gpu: 1}" -o json 2>&-', env)
    assert made.returncode == 0 and json.loads(made.stdout)["name"] == "q", made
    # Input closed (`<&-`): a document not read, a prompt answered no.
    unread = shell('"$@" config validate -f - <&-', env)
    assert (unread.returncode, unread.stderr) == (
        1, "Error: cannot read stdin: standard input is closed\n"), unread
    unanswered = shell('"$@" resource-pool delete q <&-', env)
    assert unanswered.returncode == 1 and unanswered.stderr.endswith("Aborted!\n"), unanswered
    assert "q" in shell('"$@" resource-pool describe q', env).stdout
    # A full disk under -h or --version: one line, not a traceback.
    for args in ("--version", "-h"):
        full = shell(f'"$@" {args} >/dev/full', env)
        assert (full.returncode, full.stderr) == (
            1, "Error: [Errno 28] No space left on device\n"), full


def test_ascii_locales_and_columns_that_name_no_width(env: dict[str, str]) -> None:
    # One pool's 'Ω' failed every table under an ASCII stdout; escaped as JSON escapes it.
    for locale in ({"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "PYTHONUTF8": "0"}):
        shown = subprocess.run([*CLI, "resource-pool", "describe", "p"], env={**env, **locale},
                               capture_output=True, timeout=60)
        assert shown.returncode == 0, shown
        assert b"GPU f\\xfcr \\u03a9" in shown.stdout, shown
    # COLUMNS=0 printed every table as nothing (exit 0); one that is no number set 80.
    wide = subprocess.run([*CLI, "resource-pool", "list"], env=env, capture_output=True,
                          text=True, timeout=60).stdout
    assert wide.count("\n") == 6, wide  # a line per row, piped
    for columns in ("0", "00", "", "abc", "-5", "\u00b2", "\u0660"):
        listed = subprocess.run([*CLI, "resource-pool", "list"], env={**env, "COLUMNS": columns},
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout == wide, (columns, listed)


def test_an_endless_document_is_read_no_further_than_a_document_may_be(
        env: dict[str, str]) -> None:
    """``yes x | fairpool config validate -f -`` read all of it first: gigabytes."""
    for script in ('yes x | "$@" config validate -f -', '"$@" config validate -f /dev/zero',
                   'yes x | "$@" pool-tree apply -f -'):
        endless = shell(script, env)
        assert endless.returncode == 1, endless
        assert endless.stderr.endswith(
            "it holds more than 60000 characters, the most a document may have\n"), endless


def test_a_config_from_a_pipe_asks_for_yes_when_no_terminal_can_answer(
        env: dict[str, str]) -> None:
    """stdin held the document, so the confirmation always read no (exit 1, "Aborted!")."""
    piped = shell("""printf 'resource_queues: []\\n' | "$@" config apply -f -""", env)
    assert piped.returncode == 2, piped
    assert piped.stderr.startswith(
        "Error: the config comes from stdin, which cannot then answer the confirmation: give "
        "--yes"), piped
    assert json.loads(shell('"$@" config list -o json', env).stdout)["items"] == []
    applied = shell("""printf 'resource_queues: []\\n' | "$@" config apply -f - --yes""", env)
    assert applied.returncode == 0, applied


def test_ctrl_c_exits_130(env: dict[str, str]) -> None:
    """A command cut short by Ctrl-C exits 128 + SIGINT, as `--wait` and `run` did (click's
    "Aborted!" exited 1): here one waiting for a server that never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen([*CLI, "resource-pool", "list"], env={**env, "FAIRPOOL_URL": url},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        accepted, _ = silent.accept()  # the request is sent: it waits for the answer
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        accepted.close()
    assert (process.returncode, out, err) == (130, "", "\nAborted!\n")


def test_run_passes_its_commands_arguments_as_bytes(env: dict[str, str], tmp_path: Path) -> None:
    """A file's name is bytes: `run -- ls NAME` refused one that is not UTF-8."""
    name = os.fsencode(tmp_path) + b"/f\xffile"
    Path(os.fsdecode(name)).touch()
    ran = subprocess.run([*CLI, "run", "--component", "orch", "--gpu-count", "1", "--",
                          "ls", os.fsdecode(name)], env=env, capture_output=True, timeout=60)
    assert ran.returncode == 0, ran
    assert ran.stdout == name + b"\n"
    # A root option's value that reads "run" is no command, and one after `run` as a value
    # is still fairpool's to check (helper-97).
    (tmp_path / "run").mkdir()
    ran = subprocess.run([*CLI, "--home", "run", "run", "--component", "orch", "--", "ls",
                          os.fsdecode(name)], env=env, capture_output=True, timeout=60,
                         cwd=tmp_path)
    assert b"no orchestrator named `orch`" in ran.stderr, ran  # the command's args passed
    refused_url = subprocess.run([*CLI, "--home", "run", "--url", "http://h/\udcff",
                                  "resource-pool", "list"], env=env, capture_output=True,
                                 text=True, errors="surrogateescape", timeout=60, cwd=tmp_path)
    assert refused_url.stderr == (
        "Error: argument: must be valid Unicode text (got 'http://h/\\udcff')\n"), refused_url
    # fairpool's own options are still checked, by what reads them.
    refused = subprocess.run([*CLI, "run", "--component", "or\udcffch", "--gpu-count", "1", "--",
                              "true"], env=env, capture_output=True, text=True,
                             errors="surrogateescape", timeout=60)
    assert refused.returncode == 1, refused
    assert refused.stderr == "Error: component: must be valid Unicode text (got 'or\\udcffch')\n"
