"""Real ZenML pipelines for the integration tests, run as a user would: a separate process.

    python scenarios.py SCENARIO [--server]

Without ``--server`` the process plugs fairpool into its in-process (local SQLite) store with
``enable()``; with it, the client talks to a ZenML server that loaded fairpool from
``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE``. The scenario's findings are printed as
one JSON line prefixed ``RESULT `` (ZenML's logs go around it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from zenml import pipeline, step
from zenml.client import Client
from zenml.config import ResourceSettings
from zenml.config.retry_config import StepRetryConfig
from zenml.enums import ResourceRequestStatus
from zenml.models import ResourceRequestFilter

EVENTS = os.environ.get("SCENARIO_EVENTS", "events.jsonl")


def record(**event: Any) -> None:
    event["t"] = time.time()
    with open(EVENTS, "a") as f:
        f.write(json.dumps(event) + "\n")


def requests() -> list[Any]:
    page = Client().zen_store.list_resource_requests(ResourceRequestFilter(size=100), hydrate=True)
    return sorted(page.items, key=lambda r: r.created)


def wait_for_pending(count: int, timeout: float = 60.0) -> list[Any]:
    """Poll until ``count`` requests are pending (queued behind this step)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        pending = [r for r in requests() if r.status == ResourceRequestStatus.PENDING]
        if len(pending) >= count:
            return pending
        time.sleep(0.2)
    raise TimeoutError(f"{count} pending request(s) never showed up")


GPU1 = {"resources": ResourceSettings(gpu_count=1)}


@step(settings=GPU1)
def hold(name: str, seconds: float, watch_pending: int = 0) -> str:
    """Holds one GPU for ``seconds``. With ``watch_pending``, the first such step to start
    waits until that many requests queue behind it and records what ZenML shows for them; one
    that starts before that record holds its GPU until it is made. ZenML submits a pipeline's
    steps at once, so which one starts first is not known in advance."""
    record(step=name, at="start")
    if watch_pending and claim("watcher"):
        pending = wait_for_pending(watch_pending)
        pool = Client().get_resource_pool("gpus", hydrate=True)
        record(
            step=name,
            at="saw_queue",
            pending=[{"status": r.status.value, "reason": r.status_reason} for r in pending],
            queue_length=pool.queue_length,
            occupied=pool.occupied_resources,
            queued=[str(q.request.id) for q in pool.queued_requests],
            active=[str(a.request.id) for a in pool.active_requests],
        )
    elif watch_pending:
        wait_for_event("saw_queue")
    hold_until(seconds)
    record(step=name, at="end")
    return name


def claim(role: str) -> bool:
    """True for the first caller in this scenario run (steps may be threads or processes)."""
    try:
        os.close(os.open(f"{EVENTS}.{role}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def wait_for_event(at: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(EVENTS) as f:
            if f'"at": "{at}"' in f.read():  # a line being written may not parse yet
                return
        time.sleep(0.1)
    raise TimeoutError(f"no step recorded {at!r}")


def hold_until(seconds: float) -> None:
    """Sleeps ``seconds``, or with SCENARIO_HOLD_UNTIL until that file exists, or with
    SCENARIO_HOLD_UNTIL_PREEMPTING set until a request is being preempted (``seconds`` then
    only caps the wait): a test that looks at the held state, or preempts it, ends the hold
    when it is done, instead of guessing how long that takes on a slow machine."""
    until = os.environ.get("SCENARIO_HOLD_UNTIL")
    preempting = bool(os.environ.get("SCENARIO_HOLD_UNTIL_PREEMPTING"))
    deadline = time.time() + seconds
    while time.time() < deadline and not (until and os.path.exists(until)):
        if preempting and any(r.status == ResourceRequestStatus.PREEMPTING for r in requests()):
            return
        time.sleep(0.1)


@step(settings=GPU1)
def train(name: str, seconds: float) -> str:
    """Holds one GPU for ``seconds`` like a training loop (short slices of work, so an
    interruption lands within one); records each second of progress and an interruption."""
    from zenml import get_step_context

    run = str(get_step_context().pipeline_run.id)
    record(step=name, at="start", pid=os.getpid(), run=run)
    started = time.time()
    try:
        while time.time() - started < seconds:
            time.sleep(0.1)
    except KeyboardInterrupt:
        record(step=name, at="interrupted", after=time.time() - started)
        # SCENARIO_STOP_SECONDS: the step takes that long to stop (saving a checkpoint).
        time.sleep(float(os.environ.get("SCENARIO_STOP_SECONDS", "0")))
        raise
    record(step=name, at="end")
    return name


@step(settings=GPU1, retry=StepRetryConfig(max_retries=1))
def train_retried(name: str, seconds: float) -> str:
    """``train``, retried once by ZenML; the retry is short."""
    from zenml import get_step_context

    attempt = get_step_context().step_run.version
    return train.entrypoint(f"{name}#{attempt}", seconds if attempt == 1 else 0.5)


@step(settings={"resources": ResourceSettings(gpu_count=3)})
def greedy() -> None:
    record(step="greedy", at="start")


@step(settings={"resources": ResourceSettings(gpu_count=3)}, retry=StepRetryConfig(max_retries=1))
def greedy_retried() -> None:
    record(step="greedy_retried", at="start")


@step(settings=GPU1)
def plain() -> int:
    return 1


@pipeline(dynamic=True, enable_cache=False)
def queue_three() -> None:
    """Pool of 2 GPUs: two steps run, the third queues until one ends."""
    a = hold.submit("a", 1.0, 1, id="a")
    b = hold.submit("b", 1.0, 1, id="b")
    c = hold.submit("c", 0.5, 1, id="c")
    a.result()
    b.result()
    c.result()


@pipeline(dynamic=True, enable_cache=False)
def two_on_one() -> None:
    """Pool of 1 GPU: the second step runs after the first."""
    a = hold.submit("a", 3.0, 0, id="a")
    b = hold.submit("b", 0.5, 0, id="b")
    a.result()
    b.result()


@pipeline(dynamic=True, enable_cache=False)
def too_big() -> None:
    greedy()


@pipeline(dynamic=True, enable_cache=False)
def too_big_retried() -> None:
    greedy_retried()


@pipeline(dynamic=True, enable_cache=False)
def too_big_retried_submitted() -> None:
    greedy_retried.submit().result()


@pipeline(dynamic=False, enable_cache=False)
def static_pipeline() -> None:
    plain()


@pipeline(dynamic=True, enable_cache=False)
def long_one() -> None:
    hold("long", float(os.environ.get("SCENARIO_LONG_SECONDS", "8")), 0)


@pipeline(dynamic=True, enable_cache=False)
def short_one() -> None:
    hold("short", 0.5, 0)


@pipeline(dynamic=True, enable_cache=False)
def train_long() -> None:
    train_retried("long", float(os.environ.get("SCENARIO_LONG_SECONDS", "60")))


def submitted(train_step: Any) -> None:
    """``train_step`` submitted; its future is waited for once its request is being preempted
    (the pipeline did other work meanwhile), while the step is still stopping."""
    future = train_step.submit(
        "long", float(os.environ.get("SCENARIO_LONG_SECONDS", "60")), id="long"
    )
    deadline = time.time() + 300
    while not any(r.status == ResourceRequestStatus.PREEMPTING for r in requests()):
        if time.time() > deadline:
            raise TimeoutError("the step was never preempted")
        time.sleep(0.1)
    record(step="pipeline", at="waits")
    future.result()


@pipeline(dynamic=True, enable_cache=False)
def train_long_submitted() -> None:
    submitted(train_retried)


@pipeline(dynamic=True, enable_cache=False)
def train_long_submitted_once() -> None:
    submitted(train)


@pipeline(dynamic=True, enable_cache=False)
def stopped() -> None:
    """Pool of 1 GPU: one step trains (SCENARIO_LONG_SECONDS), the other waits for it; the test
    stops the run (``zenml pipeline runs stop``) meanwhile. The pipeline goes on after them,
    with a third step."""
    seconds = float(os.environ.get("SCENARIO_LONG_SECONDS", "600"))
    a = train.submit("a", seconds, id="a")
    b = train.submit("b", seconds, id="b")
    wait_for_pending(1)
    record(step="pipeline", at="one waits")
    for future in (a, b):
        try:
            future.result()
        except Exception as error:
            record(step="pipeline", at="ended", error=str(error))
    train("c", 0.5)  # a step submitted after the stop


@pipeline(dynamic=True, enable_cache=False)
def train_short() -> None:
    train("short", 0.5)


@pipeline(dynamic=True, enable_cache=False)
def one_waits() -> None:
    """Two steps on a 1-GPU policy: the one granted first records the other queued."""
    seconds = float(os.environ.get("SCENARIO_LONG_SECONDS", "5"))
    a = hold.submit("a", seconds, 1, id="a")
    b = hold.submit("b", seconds, 1, id="b")
    a.result()
    b.result()


@pipeline(dynamic=False, enable_cache=False)
def three_plain() -> None:
    """Three step runs, for checks that make requests for them by hand."""
    plain()
    plain()
    plain()


def store_checks() -> None:
    """The store's hooks called as ZenML calls them, on step runs made by a static pipeline
    and set back to QUEUED (granted, their launcher not yet told): what each step shows."""
    from uuid import uuid4

    from sqlmodel import Session
    from zenml.enums import ExecutionStatus, StackComponentType
    from zenml.models import ResourceRequestRequest
    from zenml.zen_stores.schemas import StepRunSchema

    client = Client()
    store = client.zen_store
    default = client.active_stack.orchestrator

    # A policy with resource keys is updated (it failed: a deleted instance, a 500).
    pool = client.create_resource_pool("upd", {"gpu": 4})
    policy = client.create_resource_pool_subject_policy(
        component_id=default.id, pool_id=pool.id, priority=1, reserved={"gpu": 1},
        limit={"gpu": 2})
    updated = client.update_resource_pool_subject_policy(
        policy.id, priority=5, reserved={"gpu": 2})
    record(step="policy", at="updated", priority=updated.priority,
           reserved=updated.reserved, limit=updated.limit)
    # A policy for a component that does not exist, or cannot request (the IntegrityError
    # of a foreign key: a 500).
    for subject in (uuid4(), client.active_stack.artifact_store.id):
        try:
            client.create_resource_pool_subject_policy(
                component_id=subject, pool_id=pool.id, priority=1)
        except Exception as error:
            record(step="policy", at="refused", error=type(error).__name__, message=str(error))

    lo, hi = (client.create_stack_component(
        name=name, flavor="local", component_type=StackComponentType.ORCHESTRATOR,
        configuration={}) for name in ("lo", "hi"))
    one = client.create_resource_pool("one", {"gpu": 2})
    policies = {
        orchestrator.name: client.create_resource_pool_subject_policy(
            component_id=orchestrator.id, pool_id=one.id, priority=priority,
            reserved={"gpu": reserved}, limit={"gpu": 2})
        for orchestrator, priority, reserved in ((lo, 1, 0), (hi, 10, 2))
    }
    three_plain()
    run = client.get_pipeline("three_plain").last_run
    steps = [s.id for s in client.list_run_steps(pipeline_run_id=run.id, sort_by="created").items]
    pools = store.resource_pools

    def ask(component: Any, step_run: Any, gpus: int) -> Any:
        with Session(store.engine) as session:
            row = session.get(StepRunSchema, step_run)
            row.status = ExecutionStatus.QUEUED.value
            session.add(row)
            session.commit()
        with Session(store.engine) as session:
            return pools.create_resource_request(session, ResourceRequestRequest(
                user=client.active_user.id, component_id=component.id, step_run_id=step_run,
                requested_resources={"gpu": gpus, "step_run": 1}, preemptible=True))

    def seen(at: str) -> None:
        pool = client.get_resource_pool("one", hydrate=True)
        record(step="requests", at=at, occupied=pool.occupied_resources,
               queue_length=pool.queue_length,
               queued=[q.request.status.value for q in pool.queued_requests],
               requests=[(r.status.value, r.status_reason) for r in requests()])

    # A component with no policy is not pooled: no request, its step runs as it would.
    free = client.create_stack_component(
        name="free", flavor="local", component_type=StackComponentType.ORCHESTRATOR,
        configuration={})
    record(step="unpooled", at="asked", answer=repr(ask(free, steps[0], 1)),
           requests=len(requests()))
    # lo borrows both GPUs, granted while its step run is queued; hi's reserve preempts it.
    ask(lo, steps[0], 2)
    ask(hi, steps[1], 2)
    seen("preempted")  # lo: preempted (its launcher stops), its GPUs held until its step ends
    # Its launcher had seen the grant just before: the step runs, and is stopped.
    with Session(store.engine) as session:
        row = session.get(StepRunSchema, steps[0])
        row.status = ExecutionStatus.RUNNING.value
        session.add(row)
        session.commit()
    pools.get_resource_request(requests()[-1].id)  # the pending preemptor's poll: a pass
    with Session(store.engine) as session:
        record(step="requests", at="victim started",
               step_status=session.get(StepRunSchema, steps[0]).status,
               requests=[(r.status.value, r.status_reason) for r in requests()])
    with Session(store.engine) as session:  # the step ended: ZenML's update_run_step hook
        pools.release_step_run_resources(session, steps[0])
    seen("victim ended")
    # hi's priority raised while it holds: its reason tells the new one, as fairpool's does.
    client.update_resource_pool_subject_policy(policies["hi"].id, priority=12)
    seen("hi raised")
    try:  # it holds units: refused, naming them (lo's, on the same pool, holds none)
        client.delete_resource_pool_subject_policy(policies["hi"].id)
    except Exception as error:
        record(step="policy", at="hi detached", error=type(error).__name__, message=str(error))
    ask(lo, steps[2], 1)  # waits behind hi
    client.delete_pipeline_run(run.id)  # the step runs go: their requests' step_run_id NULL
    client.get_resource_pool("one")
    with Session(store.engine) as session:
        pools.get_resource_request(requests()[-1].id)  # any pass ends them
    seen("run deleted")


def setup(capacity: int, reserved: int, limit: int, priority: int = 10) -> None:
    client = Client()
    pool = client.create_resource_pool("gpus", {"gpu": capacity})
    client.create_resource_pool_subject_policy(
        component_id=client.active_stack.orchestrator.id,
        pool_id=pool.id,
        priority=priority,
        reserved={"gpu": reserved},
        limit={"gpu": limit},
    )


def setup_preemption(flavor: str = "local") -> None:
    """Two orchestrators of ``flavor`` on one 1-GPU pool: ``low`` borrows (priority 1,
    reserved 0), ``high`` owns the GPU (priority 10, reserved 1). Their stacks are chosen per
    process with ZENML_ACTIVE_STACK_ID."""
    from zenml.enums import StackComponentType

    client = Client()
    if flavor != "local" and flavor not in {  # a server may have it (`fairpool zenml install`)
        f.name for f in client.get_flavors_by_type(StackComponentType.ORCHESTRATOR)
    }:
        from fairpool.integrations.zenml import FLAVOR_SOURCE

        client.create_flavor(FLAVOR_SOURCE, StackComponentType.ORCHESTRATOR)
    # SCENARIO_POOL: on a shared server, a pool of its own, its orchestrators named after it.
    shared = os.environ.get("SCENARIO_POOL")
    pool = client.create_resource_pool(shared or "gpus", {"gpu": 1})
    artifact_store = client.active_stack.artifact_store
    stacks = {}
    for role, priority, reserved in (("low", 1, 0), ("high", 10, 1)):
        name = f"{shared}-{role}" if shared else role
        # SCENARIO_STOP_GRACE: fairpool_local's stop_grace_seconds (a test that waits it out).
        grace = os.environ.get("SCENARIO_STOP_GRACE")
        orchestrator = client.create_stack_component(
            name=name, flavor=flavor, component_type=StackComponentType.ORCHESTRATOR,
            configuration={"stop_grace_seconds": float(grace)} if grace else {},
        )
        stack = client.create_stack(
            name=f"{name}-stack",
            components={
                StackComponentType.ORCHESTRATOR: str(orchestrator.id),
                StackComponentType.ARTIFACT_STORE: str(artifact_store.id),
            },
        )
        stacks[role] = str(stack.id)
        client.create_resource_pool_subject_policy(
            component_id=orchestrator.id, pool_id=pool.id, priority=priority,
            reserved={"gpu": reserved}, limit={"gpu": 1},
        )
    print("STACKS " + json.dumps(stacks), flush=True)


def delete_preemptor() -> None:
    """Once a request is being preempted and its preemptor waits for it (pending), deletes the
    preemptor as ``zenml resource-request delete`` does."""
    deadline = time.time() + 120
    while True:
        found = {r.status: r for r in requests()}
        if {ResourceRequestStatus.PREEMPTING, ResourceRequestStatus.PENDING} <= found.keys():
            break
        if time.time() > deadline:
            raise TimeoutError("no request was ever preempted")
        time.sleep(0.2)
    preemptor = found[ResourceRequestStatus.PENDING]
    record(step="delete", at="found", preemptor=str(preemptor.id),
           victim=str(found[ResourceRequestStatus.PREEMPTING].id))
    Client().zen_store.delete_resource_request(preemptor.id)


def delete_orphan() -> None:
    """Once a request is granted while its step run is still queued (its pipeline's process
    was killed while it waited), deletes it by hand; records the pool's occupancy around."""
    from zenml.enums import ExecutionStatus

    deadline = time.time() + 120
    while not (orphans := [
        r for r in requests() if r.status == ResourceRequestStatus.ALLOCATED
        and r.step_run is not None and r.step_run.status == ExecutionStatus.QUEUED
    ]):
        if time.time() > deadline:
            raise TimeoutError("no request was granted to a step that waits no more")
        time.sleep(0.5)
    [orphan] = orphans
    pool = Client().get_resource_pool("gpus")
    record(step="orphan", at="granted", id=str(orphan.id), occupied=pool.occupied_resources)
    Client().zen_store.delete_resource_request(orphan.id)
    pool = Client().get_resource_pool("gpus")
    record(step="orphan", at="deleted", occupied=pool.occupied_resources)


def run(pipeline_fn: Any) -> str | None:
    """Run a pipeline; the error text when it fails."""
    try:
        pipeline_fn()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def summary() -> list[dict[str, Any]]:
    return [
        {
            "id": str(r.id),
            "status": r.status.value,
            "reason": r.status_reason,
            "resources": r.requested_resources,
            "step": r.step_run.name if r.step_run else None,
            "step_status": r.step_run.status.value if r.step_run else None,
            "step_version": r.step_run.version if r.step_run else None,
            "run": str(r.step_run.pipeline_run_id) if r.step_run else None,
        }
        for r in requests()
    ]


def main() -> None:
    scenario = sys.argv[1]
    if "--server" not in sys.argv and not os.environ.get("SCENARIO_NOT_ENABLED"):
        from fairpool.integrations.zenml import enable

        enable()
    open(EVENTS, "w").close()
    if os.path.exists(f"{EVENTS}.watcher"):
        os.remove(f"{EVENTS}.watcher")
    error: str | None = None
    if scenario == "queue_three":
        setup(capacity=2, reserved=2, limit=2)
        error = run(queue_three)
    elif scenario == "two_on_one":
        setup(capacity=1, reserved=1, limit=1)
        error = run(two_on_one)
    elif scenario == "too_big":
        setup(capacity=4, reserved=1, limit=2)
        error = run(too_big)
    elif scenario == "too_big_retried":
        setup(capacity=4, reserved=1, limit=2)
        error = run(too_big_retried)
    elif scenario == "static":
        setup(capacity=1, reserved=1, limit=1)
        error = run(static_pipeline)
    elif scenario == "too_big_server":
        error = run(too_big)
    elif scenario == "preempt_setup":
        setup_preemption()
    elif scenario == "preempt_setup_isolated":
        setup_preemption("fairpool_local")
    elif scenario == "one_waits":
        error = run(one_waits)
    elif scenario == "delete_orphan":
        error = run(delete_orphan)
    elif scenario == "store_checks":
        error = run(store_checks)
    elif scenario == "delete_preemptor":
        error = run(delete_preemptor)
    elif scenario in ("long", "short"):
        # Pools and policies are made by the caller (the CLI); this only runs the pipeline.
        error = run(long_one if scenario == "long" else short_one)
    elif scenario in ("train_long", "train_short", "train_long_submitted",
                      "train_long_submitted_once", "stopped", "too_big_retried_submitted"):
        error = run(globals()[scenario])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if os.environ.get("SCENARIO_NOT_ENABLED"):  # the run went unpooled; now read the store
        from fairpool.integrations.zenml import enable

        enable()
    with open(EVENTS) as f:
        events = [json.loads(line) for line in f]
    steps = Client().list_run_steps(size=100, sort_by="created").items
    result = {
        "error": error,
        "events": events,
        "requests": summary(),
        "step_runs": [
            {"name": s.name, "status": s.status.value, "version": s.version,
             "has_request": s.resource_request is not None}
            for s in steps
        ],
        "runs": {str(r.id): r.status.value for r in Client().list_pipeline_runs(size=100).items},
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
