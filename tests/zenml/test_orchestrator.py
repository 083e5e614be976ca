"""The ``fairpool_local`` orchestrator flavor: preemption interrupts a running step on one
machine. Real ZenML, two pipelines in two processes on one in-process (SQLite) store."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("zenml.zen_stores.resource_pools.store_interface")

from tests.zenml.conftest import ZenML


def at(events: list[dict[str, Any]], step: str, what: str) -> dict[str, Any]:
    return next(e for e in events if e["step"] == step and e["at"] == what)


#: A submitted step's future waited for while the step stops (3 s, a checkpoint's save):
#: ZenML's future returned at CANCELLING, as if the step had succeeded.
SUBMITTED = {"SCENARIO_STOP_SECONDS": "3"}


@pytest.mark.parametrize("low", ["train_long", "train_long_submitted"])
def test_preemption_interrupts_the_running_step(zenml_home: ZenML, low: str) -> None:
    """A low-priority step (600 s of work, retried once by ZenML) holds the only GPU; a
    higher-priority pipeline's step arrives. The low step is interrupted in its own process
    long before its natural end, its request ends ``preempted`` and its step run is retried;
    the high step runs as soon as the GPU is free, then the retry (a new request) runs.
    The work is far longer than the test waits for anything: the high pipeline's start takes
    ~15 s on an idle machine and several times that on a loaded one, where 60 s of work
    could end first, with nothing left to preempt. The step is called, or submitted and its
    future waited for while the step is stopping."""
    setup = zenml_home.scenario("preempt_setup_isolated")
    high, low_result, low_out = zenml_home.preemption(
        low, "train_short", setup["stacks"],
        low_env={"SCENARIO_LONG_SECONDS": "600", **(SUBMITTED if "submitted" in low else {})},
    )
    assert low_result["error"] is None, low_out[-4000:]
    events = low_result["events"]
    if "submitted" in low:  # the pipeline waited for the future before the step stopped
        assert at(events, "pipeline", "waits")["t"] < at(events, "long#1", "interrupted")["t"] + 3

    # The first attempt ran in its own process and was interrupted (KeyboardInterrupt from
    # ZenML's step heartbeat) before its 600 s were up.
    first = at(events, "long#1", "start")
    interrupted = at(events, "long#1", "interrupted")
    assert first["pid"] != low_result["pid"]
    assert interrupted["after"] < 600
    assert not [e for e in events if e["step"] == "long#1" and e["at"] == "end"]
    assert "is remotely stopped, interrupting main thread" in low_out

    # The high step started after the interruption and before the low step's natural end;
    # the retry ran after the high step, to its end.
    short_start = at(high["events"], "short", "start")["t"]
    assert interrupted["t"] <= short_start < first["t"] + 600
    assert at(events, "long#2", "start")["t"] >= at(high["events"], "short", "end")["t"]
    at(events, "long#2", "end")

    # ZenML's and fairpool's records: the victim's request preempted (by the high request,
    # with fairpool's reason), its step run retried; every other request released.
    victim = next(r for r in low_result["requests"] if r["status"] == "preempted")
    preemptor = next(r for r in high["requests"] if r["id"] != victim["id"])
    assert victim["reason"].startswith(f"preempted by request {preemptor['id']} on pool gpus")
    assert "(priority 10 > 1)" in victim["reason"]
    assert (victim["step_version"], victim["step_status"]) == (1, "retried")
    others = [r for r in low_result["requests"] if r["id"] != victim["id"]]
    assert sorted((r["status"], r["step_status"], r["step_version"]) for r in others) == [
        ("released", "completed", 1), ("released", "completed", 2)
    ], low_result["requests"]


def test_a_submitted_step_preempted_without_retries_fails_its_pipeline(
    zenml_home: ZenML,
) -> None:
    """Without retries a preempted step fails (the seeds' "After preemption"): its submitted
    future, waited for while the step stops, raises, and the run fails; the victim's request
    ends ``preempted`` once its step run is ``cancelled``, and the high step runs. ZenML's
    future returned at CANCELLING: the run ended ``completed``, nothing published the step's
    end, and its request held the GPU (``preempting``) with the high step waiting for ever."""
    setup = zenml_home.scenario("preempt_setup_isolated")
    high, low_result, low_out = zenml_home.preemption(
        "train_long_submitted_once", "train_short", setup["stacks"],
        low_env={"SCENARIO_LONG_SECONDS": "600", **SUBMITTED},
    )
    assert low_result["error"] is not None, low_out[-4000:]
    assert "cancelled" in low_result["error"].lower(), low_result["error"]
    events = low_result["events"]
    assert at(events, "pipeline", "waits")["t"] < at(events, "long", "interrupted")["t"] + 3
    assert at(high["events"], "short", "end")
    [victim] = low_result["requests"][:1]
    assert (victim["status"], victim["step_status"]) == ("preempted", "cancelled"), victim
    assert [s["status"] for s in low_result["step_runs"] if s["name"] == "long"] == ["cancelled"]


def test_a_step_preempted_after_its_pipeline_was_killed_ends_its_request(
    zenml_home: ZenML,
) -> None:
    """The pipeline's process killed (SIGTERM: no atexit), its submitted step runs on in its
    own process; preempted there, it is interrupted and publishes its own end, which ends
    its request. Its end was the pipeline's runner's to publish: the request stayed
    ``preempting`` and the high step waited for ever (helper-76)."""
    stacks = zenml_home.scenario("preempt_setup_isolated")["stacks"]
    events = zenml_home.cwd / "low.jsonl"
    zenml_home.killed_at("train_long_submitted_once", {
        **zenml_home.env, "ZENML_ACTIVE_STACK_ID": stacks["low"],
        "SCENARIO_EVENTS": str(events), "SCENARIO_LONG_SECONDS": "600",
    }, events, '"at": "start"')
    high = zenml_home.scenario("train_short", events="high.jsonl",
                               extra_env={"ZENML_ACTIVE_STACK_ID": stacks["high"]})
    assert high["error"] is None, high["log"][-3000:]
    assert at(high["events"], "short", "end")
    at(json_lines(events), "long", "interrupted")
    victim, _ = high["requests"]
    assert (victim["status"], victim["step_status"]) == ("preempted", "cancelled"), victim


def json_lines(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_step_granted_after_its_pipeline_was_killed_holds_its_units(
    zenml_home: ZenML,
) -> None:
    """docs/zenml.md, Missing: no liveness for a waiting step. The pipeline's process is
    killed (SIGTERM: no atexit) while one step runs in its own process and another waits; the
    running step ends and releases, the waiting one's request is then granted with nobody to
    run it, and holds its GPU until deleted by hand."""
    stacks = zenml_home.scenario("preempt_setup_isolated")["stacks"]
    events = zenml_home.cwd / "killed.jsonl"
    # The running step holds until the pipeline is dead (it held 5 s: a SIGTERM later than
    # that, on a loaded machine, found the other step granted and run by the pipeline).
    release = zenml_home.cwd / "release-running"
    try:
        zenml_home.killed_at("one_waits", {
            **zenml_home.env, "ZENML_ACTIVE_STACK_ID": stacks["low"],
            "SCENARIO_EVENTS": str(events), "SCENARIO_LONG_SECONDS": "300",
            "SCENARIO_HOLD_UNTIL": str(release),
        }, events, "saw_queue")
    finally:
        release.touch()
    result = zenml_home.scenario("delete_orphan", events="orphan.jsonl")
    assert result["error"] is None, result["log"][-3000:]
    granted, deleted = result["events"]
    assert (granted["occupied"], deleted["occupied"]) == ({"gpu": 1}, {"gpu": 0})
    ran = [json.loads(line)["step"] for line in events.read_text().splitlines()]
    assert [(r["status"], r["step_status"]) for r in result["requests"]] == [
        ("released", "completed")
    ], result["requests"]  # the step that ran; the other's request is gone
    assert len(set(ran)) == 1  # the other step never ran



def test_stopping_a_run_stops_its_running_step_and_withdraws_the_waiting_one(
    zenml_home: ZenML,
) -> None:
    """``zenml pipeline runs stop`` (forcefully, its default) on a ``fairpool_local`` run:
    its running step is interrupted, its waiting step never runs, the run ends ``stopped``
    (``ZenML.stopped_run``). ZenML refused (the orchestrator could not stop forcefully)
    after setting the run ``STOPPING``, and gracefully the run's ``STOPPING`` never reached
    its steps: the first ran its 600 s, then the second."""
    stacks = zenml_home.scenario("preempt_setup_isolated")["stacks"]
    zenml_home.stopped_run(stacks, graceful=False)


def test_a_submitted_steps_future_polls_at_most_every_2_s_and_waits_through_stopping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZenML's future doubles its wait up to 64 s, for a remote cluster's pods: a local
    step's end held the run up to a minute (helper-86). Here: ZenML's own future class, as the
    orchestrator installs it, over the statuses a step run goes through, with the waits it
    makes recorded instead of slept."""
    from types import SimpleNamespace

    from zenml.enums import ExecutionStatus
    from zenml.execution.pipeline.dynamic import utils
    from zenml.execution.pipeline.dynamic.outputs import _IsolatedStepFuture

    from fairpool.integrations.zenml import orchestrator

    statuses = [ExecutionStatus.RUNNING] * 6 + [ExecutionStatus.CANCELLING,
                                                 ExecutionStatus.CANCELLED]
    read = iter(statuses)
    monkeypatch.setattr(utils, "get_latest_step_run",
                        lambda *_, **__: SimpleNamespace(status=next(read)))
    slept: list[float] = []
    monkeypatch.setattr(orchestrator.time, "sleep", slept.append)
    monkeypatch.setattr(_IsolatedStepFuture, "_wait_for_step_to_finish",
                        _IsolatedStepFuture._wait_for_step_to_finish)  # put back after
    orchestrator._wait_through_stopping()
    future = SimpleNamespace(_wrapped=None, pipeline_run_id="run", invocation_id="step")
    ended = _IsolatedStepFuture._wait_for_step_to_finish(future)  # type: ignore[arg-type]
    assert ended.status is ExecutionStatus.CANCELLED
    assert slept == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_a_run_on_fairpool_local_without_enable_says_nothing_is_pooled(
    zenml_home: ZenML,
) -> None:
    """In process, `enable()` forgotten: the steps asked no pool and ran at once, and nothing
    said so (helper-86). The run goes on unpooled, with a warning saying how to pool it."""
    setup = zenml_home.scenario("preempt_setup_isolated")
    result = zenml_home.scenario("train_short", extra_env={
        "ZENML_ACTIVE_STACK_ID": setup["stacks"]["high"], "SCENARIO_NOT_ENABLED": "1"})
    assert result["error"] is None, result["log"][-3000:]
    assert "fairpool is not enabled in this process: the steps of this run ask no resource " \
        "pool for units. Call `fairpool.integrations.zenml.enable()`" in result["log"]
    assert [s["has_request"] for s in result["step_runs"]] == [False]


def test_a_submitted_step_rejected_at_its_launch_is_retried(zenml_home: ZenML) -> None:
    """ZenML launches a submitted isolated step with retry=False, leaving retries to its
    monitor, which watches only a step whose launch returned: a step rejected at its launch
    stayed `retrying` for good, with one request, and the run failed without the retry
    (helper-86). On fairpool_local a launch the store answered `retrying` is made again."""
    setup = zenml_home.scenario("preempt_setup_isolated")
    result = zenml_home.scenario("too_big_retried_submitted",
                                 extra_env={"ZENML_ACTIVE_STACK_ID": setup["stacks"]["low"]})
    assert "was rejected" in (result["error"] or ""), result["log"][-3000:]
    assert [(r["status"], r["step_version"]) for r in result["requests"]] == [
        ("rejected", 1), ("rejected", 2)
    ]
    assert [(s["version"], s["status"]) for s in result["step_runs"]] == [
        (1, "retried"), (2, "failed")]
