"""Helpers for the ZenML integration tests: every test gets its own ZenML config directory
(ZENML_CONFIG_PATH, so nothing touches ~/.config/zenml) and runs ZenML in subprocesses, as a
user would. The tests need ZenML installed (``tests/zenml/run.sh`` makes that environment);
without it they are skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
SCENARIOS = HERE / "scenarios.py"
SOURCE = "fairpool.integrations.zenml.store.FairpoolResourcePools"


def zenml_bin() -> str:
    return str(Path(sys.executable).parent / "zenml")


class ZenML:
    """One isolated ZenML installation: a config directory and a working directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cwd = root / "work"
        self.cwd.mkdir(parents=True, exist_ok=True)
        shutil.copy(SCENARIOS, self.cwd / "scenarios.py")
        self.env = {
            **os.environ,
            "ZENML_CONFIG_PATH": str(root / "config"),
            "ZENML_ANALYTICS_OPT_IN": "false",
            "ZENML_AUTO_OPEN_DASHBOARD": "false",
            "ZENML_LOGGING_COLORS_DISABLED": "true",
            "ZENML_ENABLE_RICH_TRACEBACK": "false",
            "ZENML_DEFAULT_OUTPUT": "table",
            "COLUMNS": "200",
        }
        self.env.pop("ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE", None)

    def scenario(
        self, name: str, *, server: bool = False, extra_env: Mapping[str, str] | None = None,
        events: str = "events.jsonl", timeout: float = 300,
    ) -> dict[str, Any]:
        args = [sys.executable, "scenarios.py", name, *(["--server"] if server else [])]
        env = {**self.env, "SCENARIO_EVENTS": str(self.cwd / events), **(extra_env or {})}
        done = subprocess.run(
            args, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[len("RESULT "):])
                result["log"] = done.stdout + done.stderr
                for other in ("STACKS ",):
                    for extra in done.stdout.splitlines():
                        if extra.startswith(other):
                            result[other.strip().lower()] = json.loads(extra[len(other):])
                return result
        raise AssertionError(
            f"scenario {name} printed no result (exit {done.returncode}):\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )

    def background(
        self, name: str, env: Mapping[str, str], *, server: bool = False
    ) -> tuple[subprocess.Popen[str], Path]:
        """Scenario ``name`` started in the background with ``env`` (all of it), its output
        going to a file (returned): a pipe nobody reads while the test waits fills (64 KiB)
        and blocks the pipeline."""
        log = self.cwd / f"{name}-{time.monotonic_ns()}.out"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, "scenarios.py", name, *(["--server"] if server else [])],
                cwd=self.cwd, env=dict(env), stdout=sink, stderr=subprocess.STDOUT, text=True,
            )
        return process, log

    def killed_at(self, name: str, env: Mapping[str, str], events: Path, mark: str) -> None:
        """Scenario ``name`` started in the background with ``env``, killed by SIGTERM (no
        atexit: as a pipeline's process is killed) once ``mark`` shows in its ``events``."""
        pipeline, log = self.background(name, env)
        try:
            deadline = time.time() + 120
            while not (events.exists() and mark in events.read_text()):
                assert time.time() < deadline and pipeline.poll() is None, \
                    log.read_text()[-3000:]
                time.sleep(0.2)
            pipeline.send_signal(signal.SIGTERM)
            assert pipeline.wait(timeout=30) == -signal.SIGTERM
        finally:
            if pipeline.poll() is None:
                pipeline.kill()

    def preemption(
        self, low: str, high: str, stacks: Mapping[str, str], *, server: bool = False,
        low_env: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """Scenario ``low`` in the background on the low stack; once its step has started,
        ``high`` on the high stack. ``high``'s result (it must succeed), then ``low``'s (with
        its process's ``pid``) and its whole output."""
        events = self.cwd / "low.jsonl"
        env = {**self.env, "ZENML_ACTIVE_STACK_ID": stacks["low"], "SCENARIO_EVENTS": str(events),
               **(low_env or {})}
        if server:  # a client config of its own: ZenML rewrites it in place (no rename)
            env["ZENML_CONFIG_PATH"] = str(
                shutil.copytree(self.env["ZENML_CONFIG_PATH"], self.root / "config-low")
            )
        process, log = self.background(low, env, server=server)
        try:
            deadline = time.time() + 120
            while not (events.exists() and "start" in events.read_text()):
                assert time.time() < deadline and process.poll() is None, \
                    "low never started:\n" + log.read_text()[-3000:]
                time.sleep(0.2)
            high_result = self.scenario(high, server=server, events="high.jsonl",
                                        extra_env={"ZENML_ACTIVE_STACK_ID": stacks["high"]})
            process.wait(timeout=180)
        finally:
            if process.poll() is None:
                process.kill()
        out = log.read_text()
        assert high_result["error"] is None, high_result["log"][-3000:]
        low_result: dict[str, Any] = next(
            json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")
        )
        low_result["pid"] = process.pid
        return high_result, low_result, out

    def stopped_run(
        self, stacks: Mapping[str, str], *, graceful: bool, server: bool = False
    ) -> None:
        """Scenario ``stopped`` on the low stack (one step trains for 600 s, the other waits
        for the GPU), stopped with ``zenml pipeline runs stop`` once both are so: the running
        step is interrupted (a ``KeyboardInterrupt``: it can save a checkpoint) and ends
        ``stopped``, its request ``released``; the waiting step never runs, its request ends
        ``cancelled``; the run ends ``stopped``, long before its work would have."""
        events = self.cwd / "stopped.jsonl"
        env = {**self.env, "ZENML_ACTIVE_STACK_ID": stacks["low"],
               "SCENARIO_EVENTS": str(events), "SCENARIO_LONG_SECONDS": "600"}
        pipeline, log = self.background("stopped", env, server=server)
        try:
            deadline = time.time() + 120
            while not (events.exists() and "waits" in (seen := events.read_text())
                       and '"start"' in seen):
                assert time.time() < deadline and pipeline.poll() is None, \
                    log.read_text()[-3000:]
                time.sleep(0.2)
            started = next(e for e in map(json.loads, seen.splitlines()) if e["at"] == "start")
            said = self.say("pipeline", "runs", "stop", started["run"], "-y",
                            *(["--graceful"] if graceful else []))
            assert "stopped pipeline run" in said.lower(), said
            pipeline.wait(timeout=120)
        finally:
            if pipeline.poll() is None:
                pipeline.kill()
        out = log.read_text()
        result = json.loads(next(line[7:] for line in out.splitlines()
                                 if line.startswith("RESULT ")))
        running, waiting = started["step"], {"a": "b", "b": "a"}[started["step"]]
        [interrupted] = [e for e in result["events"]
                         if (e["step"], e["at"]) == (running, "interrupted")]
        assert interrupted["after"] < 600, out[-3000:]
        assert not [e for e in result["events"] if e["step"] in (waiting, "c")], result["events"]
        requests = {r["step"]: r for r in result["requests"] if r["run"] == started["run"]}
        assert sorted((r["step"], r["status"], r["step_status"]) for r in requests.values()) == \
            sorted([(running, "released", "stopped"), (waiting, "cancelled", "stopped")]), \
            result["requests"]
        # ZenML's: a step the pipeline goes on with is refused.
        assert "Cannot create step 'train' for pipeline in stopping state" in result["error"]
        assert result["runs"][started["run"]] == "stopped", out[-3000:]

    def cli(self, *args: str, check: bool = True, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [zenml_bin(), *args], cwd=self.cwd, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=180,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"zenml {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        return done

    def say(self, *args: str) -> str:
        """A command's whole output (ZenML prints messages on stderr), whitespace collapsed."""
        done = self.cli(*args)
        return " ".join((done.stdout + done.stderr).split())

    def cli_json(self, *args: str) -> Any:
        out = self.cli(*args, "-o", "json").stdout
        if "{" not in out:  # an empty page prints its "nothing found" message instead
            return {"items": []}
        return json.loads(out[out.index("{"):])


@pytest.fixture
def zenml_home(tmp_path: Path) -> ZenML:
    return ZenML(tmp_path)
