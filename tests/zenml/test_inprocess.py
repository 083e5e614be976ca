"""Real ZenML dynamic pipelines on the stock local orchestrator, with fairpool plugged into the
in-process (local SQLite) store by ``enable()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("zenml.zen_stores.resource_pools.store_interface")

from tests.zenml.conftest import ZenML


def interval(events: list[dict[str, Any]], step: str) -> tuple[float, float]:
    start = next(e["t"] for e in events if e["step"] == step and e["at"] == "start")
    end = next(e["t"] for e in events if e["step"] == step and e["at"] == "end")
    return start, end


def test_steps_queue_behind_a_full_pool_and_run_when_units_free(zenml_home: ZenML) -> None:
    result = zenml_home.scenario("queue_three")
    assert result["error"] is None, result["log"][-3000:]
    events = result["events"]
    # While two steps hold both GPUs, the third waits: ZenML shows it pending with fairpool's
    # reason, in the pool's queue, and the pool's occupied units.
    seen = next(e for e in events if e["at"] == "saw_queue")
    assert seen["pending"] == [{
        "status": "pending",
        "reason": "waiting: policy default on gpus: gpu requested 1, in use 2 of limit 2",
    }]
    assert seen["queue_length"] == 1
    assert seen["occupied"] == {"gpu": 2}
    assert len(seen["active"]) == 2 and len(seen["queued"]) == 1
    # The step that waited starts only after one of the other two has ended. ZenML submits
    # the three steps at once, so which one waits is whichever reached fairpool last: the
    # last to start (the test once assumed c, and failed when b came last; the scenario once
    # had a watch the queue, and failed when a came last).
    first, second, last = sorted(interval(events, step) for step in "abc")
    assert last[0] >= min(first[1], second[1]), (first, second, last)
    # Every request was released when its step completed; `step_run: 1` was added by ZenML.
    assert [(r["status"], r["step_status"]) for r in result["requests"]] == [
        ("released", "completed")
    ] * 3
    assert all(r["resources"] == {"gpu": 1, "step_run": 1} for r in result["requests"])
    assert "Waiting for resource request" in result["log"]


def test_two_concurrent_steps_on_one_gpu_run_one_after_the_other(zenml_home: ZenML) -> None:
    result = zenml_home.scenario("two_on_one")
    assert result["error"] is None, result["log"][-3000:]
    a = interval(result["events"], "a")
    b = interval(result["events"], "b")
    assert a[1] <= b[0] or b[1] <= a[0], f"the steps overlapped: a={a} b={b}"
    assert [r["status"] for r in result["requests"]] == ["released", "released"]


def test_a_step_over_its_policy_limit_fails_with_fairpools_reason(zenml_home: ZenML) -> None:
    result = zenml_home.scenario("too_big")
    reason = "policy default on gpus: gpu requested 3 > limit 2"
    assert result["error"] is not None
    assert "was rejected: " + reason in result["error"]
    assert result["events"] == []  # the step body never ran
    [request] = result["requests"]
    assert (request["status"], request["reason"], request["step_status"]) == (
        "rejected", reason, "failed"
    )


def test_retries_are_zenmls_one_request_per_attempt(zenml_home: ZenML) -> None:
    """StepRetryConfig(max_retries=1): ZenML makes a second step run, which gets its own
    request; fairpool adds no retry of its own."""
    result = zenml_home.scenario("too_big_retried")
    assert "was rejected" in (result["error"] or "")
    assert [(r["status"], r["step_version"]) for r in result["requests"]] == [
        ("rejected", 1), ("rejected", 2)
    ]
    assert [s["version"] for s in result["step_runs"]] == [1, 2]
    assert result["step_runs"][0]["status"] == "retried"


def test_static_pipelines_make_no_requests_and_release_is_a_no_op(zenml_home: ZenML) -> None:
    result = zenml_home.scenario("static")
    assert result["error"] is None, result["log"][-3000:]
    assert result["requests"] == []
    assert [(s["status"], s["has_request"]) for s in result["step_runs"]] == [
        ("completed", False)
    ]


def test_preemption_on_the_local_orchestrator(zenml_home: ZenML) -> None:
    """A higher-priority owner preempts a borrower: the victim's request becomes preempting
    and its step run CANCELLING at once. The stock local orchestrator cannot interrupt an
    inline step, so the victim keeps its GPU until its step ends (never two holders of one
    GPU), is then marked preempted and its step cancelled; the preemptor runs after it."""
    setup = zenml_home.scenario("preempt_setup")
    # It holds until it is being preempted: started while the high one starts, a fixed hold
    # could end first on a slow machine, with nothing left to preempt.
    high, low_result, _ = zenml_home.preemption(
        "long", "short", setup["stacks"],
        low_env={"SCENARIO_LONG_SECONDS": "120", "SCENARIO_HOLD_UNTIL_PREEMPTING": "1"},
    )
    victim, preemptor = low_result["requests"][0], high["requests"][1]
    assert victim["status"] == "preempted"
    assert victim["reason"].startswith(f"preempted by request {preemptor['id']} on pool gpus")
    assert "(priority 10 > 1)" in victim["reason"]
    assert victim["step_status"] == "cancelled"
    assert preemptor["status"] == "released" and preemptor["step_status"] == "completed"
    # The victim ran to its end (no interruption on this flavor); the preemptor after it.
    _, long_end = interval(low_result["events"], "long")
    short_start, _ = interval(high["events"], "short")
    assert short_start >= long_end
    assert "Cancelling steps can not be transitioned" in (low_result["error"] or "")


def test_deleting_a_waiting_preemptor_leaves_its_victim_preempting(zenml_home: ZenML) -> None:
    """`zenml resource-request delete` of a preemptor that waits for its victim: the delete
    works (it once failed with "badly formed hexadecimal UUID string"), the victim stays
    preempting, keeping its GPU until its step ends, and is then preempted; the deleted
    preemptor's step fails."""
    stacks = zenml_home.scenario("preempt_setup")["stacks"]
    release, low_events = zenml_home.cwd / "release-long", zenml_home.cwd / "low.jsonl"
    low, low_log = zenml_home.background("long", {
        **zenml_home.env, "ZENML_ACTIVE_STACK_ID": stacks["low"],
        "SCENARIO_EVENTS": str(low_events), "SCENARIO_LONG_SECONDS": "300",
        "SCENARIO_HOLD_UNTIL": str(release),
    })
    high = None
    try:
        deadline = time.time() + 120
        while not (low_events.exists() and "start" in low_events.read_text()):
            assert time.time() < deadline and low.poll() is None, low_log.read_text()[-3000:]
            time.sleep(0.2)
        high, high_log = zenml_home.background("short", {
            **zenml_home.env, "ZENML_ACTIVE_STACK_ID": stacks["high"],
            "SCENARIO_EVENTS": str(zenml_home.cwd / "high.jsonl"),
        })
        # Deleted before ZenML's step launcher first looks, the request is no longer its
        # step run's, and ZenML runs the step as if it needed nothing (seen in CI): the
        # delete must come once the launcher waits.
        while "to be approved" not in high_log.read_text():
            assert time.time() < deadline and high.poll() is None, high_log.read_text()[-3000:]
            time.sleep(0.2)
        deleted = zenml_home.scenario("delete_preemptor", events="delete.jsonl")
        release.touch()
        assert high.wait(timeout=180) == 0, high_log.read_text()[-3000:]
        assert low.wait(timeout=180) == 0, low_log.read_text()[-3000:]
    finally:
        for process in (low, high):
            if process is not None and process.poll() is None:
                process.kill()
    assert deleted["error"] is None, deleted["log"][-3000:]
    [found] = deleted["events"]
    # Right after the delete: the preemptor is gone, the victim still preempting.
    assert [(r["id"], r["status"]) for r in deleted["requests"]] == [
        (found["victim"], "preempting")
    ]
    assert "someone deleted the resource request" in high_log.read_text()
    low_result = next(json.loads(line[7:]) for line in low_log.read_text().splitlines()
                      if line.startswith("RESULT "))
    [victim] = low_result["requests"]
    assert (victim["status"], victim["step_status"]) == ("preempted", "cancelled")
    assert victim["reason"].startswith(f"preempted by request {found['preemptor']} on pool gpus")


def test_the_stores_hooks_end_what_would_hang(zenml_home: ZenML) -> None:
    """Found by QA with real pipelines (2026-11-29), checked here by calling the hooks as
    ZenML calls them: a policy with keys is updated; a policy for an unknown component is a
    KeyError, for one that cannot request a ValueError; a component with no policy is not
    pooled (every dynamic pipeline of its stack failed, rejected); a request granted while its step
    waited, then chosen as a victim, ends preempted at once (it stayed preempting, which its
    launcher waits on, and its preemptor waited on it: both for ever), holding its GPUs until
    its step ends, and stopped if its step starts after all; deleting a run ends its requests (they held GPUs for ever)."""
    result = zenml_home.scenario("store_checks")
    assert result["error"] is None, result["log"][-3000:]
    events = {(e["step"], e["at"]): e for e in result["events"]}
    updated = events[("policy", "updated")]
    assert (updated["priority"], updated["reserved"], updated["limit"]) == (
        5, {"gpu": 2}, {"gpu": 2})
    refused = [(e["error"], e["message"]) for e in result["events"] if e["at"] == "refused"]
    assert [error for error, _ in refused] == ["KeyError", "ValueError"]
    assert "a policy's subject is an orchestrator or a step operator, not artifact_store" in (
        refused[1][1])

    assert events[("unpooled", "asked")]["answer"] == "None"
    assert events[("unpooled", "asked")]["requests"] == 0
    preempted = events[("requests", "preempted")]
    assert preempted["occupied"] == {"gpu": 2}  # still the victim's, until its step ends
    (victim, victim_reason), (preemptor, preemptor_reason) = preempted["requests"][-2:]
    assert victim == "preempted" and victim_reason.startswith("preempted by request ")
    assert preemptor == "pending"  # and says what it waits for (it kept its old reason)
    # In the pool's queue too, though it preempted on its first pass (with no queue row
    # yet, it was left out of the queued view and the queue length).
    assert (preempted["queue_length"], preempted["queued"]) == (1, ["pending"])
    assert preemptor_reason.startswith(
        "waiting for the steps of the requests it preempted to end: ")
    started = events[("requests", "victim started")]  # its launcher had seen the grant
    assert started["step_status"] == "cancelling"
    assert [status for status, _ in started["requests"][-2:]] == ["preempting", "pending"]
    ended = events[("requests", "victim ended")]
    assert [status for status, _ in ended["requests"][-2:]] == ["preempted", "allocated"]
    assert ended["requests"][-2][1].endswith("; step run cancelling")
    assert events[("requests", "hi raised")]["requests"][-1] == [
        "allocated", "allocated on pool one (policy priority 12), was 10"]
    detached = events[("policy", "hi detached")]
    assert detached["error"] == "IllegalOperationError"
    assert "The policy of component `hi` on resource pool `one` has 1 live allocation(s)" in (
        detached["message"])
    deleted = events[("requests", "run deleted")]
    assert deleted["occupied"] == {"gpu": 0}
    assert deleted["requests"][-2:] == [
        ["released", "released: its step run was deleted"],
        ["cancelled", "cancelled: its step run was deleted"],
    ]


def test_the_fairpool_command_runs_beside_zenml(tmp_path: Path) -> None:
    """ZenML pins click <= 8.2.1, where fairpool's CLI did not import (a subscript only click
    8.3 takes): every `fairpool` command, `fairpool zenml install` among them, was a traceback
    in ZenML's environment (found by helper-70)."""
    env = {**os.environ, "FAIRPOOL_HOME": str(tmp_path)}
    for args in (["zenml", "--help"], ["prune", "--older-than", "1d", "--dry-run"]):
        done = subprocess.run([sys.executable, "-m", "fairpool.cli.main", *args], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
