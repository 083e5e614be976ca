"""A scheduling service that reuses the live state and compiled parts of its last pass
decides as one that loads and compiles everything afresh on each write: the same
operations, replayed on a new database by each, answer and store byte for byte the same.
The operations: submits, releases, cancels, config applies (repricing, orphaning, no rules),
passes, some by a second service on the same database (another process), and passes that
fail after their writes and roll back."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairpool import scheduling
from fairpool.frontends import workloads as wl
from fairpool.ids import id_at
from fairpool.scheduling import SchedulingService
from fairpool.store.db import Database
from tests.conftest import BACKENDS, Backend
from tests.test_service import Clock

FLAVORS = """
resource_flavors:
  - {name: a}
  - name: b
    selector: [{key: team, operator: not_in, values: ["y"]}]
"""
PRE = """
  - name: pre
    preemption: {within_resource_queue: lower_priority}
    resource_groups:
      - covered_resources: [gpu]
        flavors:
          - {name: a, resources: [{name: gpu, nominal_quota: 3}]}
          - {name: b, resources: [{name: gpu, nominal_quota: 2}]}
"""
CONFIGS = (
    f"{FLAVORS}resource_queues:{PRE}scheduling_rules: [{{resource_queue: pre}}]\n",
    # Team x to a queue that never preempts; the others clamped to 4 (running ones repriced).
    f"""{FLAVORS}resource_queues:{PRE}
  - name: calm
    resource_groups:
      - covered_resources: [gpu]
        flavors: [{{name: a, resources: [{{name: gpu, nominal_quota: 2}}]}}]
scheduling_rules:
  - selector: [{{key: team, operator: in, values: ["x"]}}]
    resource_queue: calm
  - resource_queue: pre
    priority_policy: {{default: 1, max: 4, on_violation: force_update}}
""",
    # No rules: everything passes through, and a preempted workload could not queue again.
    f"{FLAVORS}resource_queues:{PRE}scheduling_rules: []\n",
    # The quota queues gone: what runs there is orphaned.
    f"{FLAVORS}resource_queues: [{{name: open}}]\nscheduling_rules: [{{resource_queue: open}}]\n",
)

Op = tuple[Any, ...]
SERVICES = st.integers(0, 1)  # 0: the service compared, 1: a second one (another process)
OPS = st.one_of(
    st.tuples(st.just("submit"), SERVICES, st.sampled_from([None, "x", "y"]),
              st.one_of(st.none(), st.integers(0, 6)), st.integers(1, 3)),
    st.tuples(st.sampled_from(["release", "cancel"]), SERVICES, st.integers(0, 50)),
    st.tuples(st.just("apply"), SERVICES, st.integers(0, len(CONFIGS) - 1)),
    st.tuples(st.just("reconcile"), SERVICES),
    st.tuples(st.just("fail"), st.integers(1, 3), st.integers(0, 6)),
)


class Failed(Exception):
    """The pass failed after its writes."""


class Failing(SchedulingService):
    """A service whose next pass can be made to fail once it has written its decisions."""

    fail_next = False

    def _pass(self, tx: Any) -> wl.Outcome:
        outcome = super()._pass(tx)
        if self.fail_next:
            self.fail_next = False
            raise Failed("the pass failed after its writes")
        return outcome


@contextmanager
def numbered_ids() -> Iterator[None]:
    """Workload ids 1, 2, 3 ... (as UUIDs), so that two replays make the same ones."""
    counter = itertools.count(1)
    with mock.patch.object(scheduling.store, "new_id", lambda: id_at(next(counter), 0)):
        yield


def replay(url: str, ops: list[Op], reuse: bool) -> list[object]:
    """Everything ``ops`` answer, and every workload's view after each."""
    seen: list[object] = []
    ids: list[str] = []
    clock = Clock()
    with Database.open(url) as db, numbered_ids():
        main = Failing(db, clock, reuse=reuse)
        services = (main, SchedulingService(db, clock, reuse=reuse))
        for kind, who, *args in ops:
            service = main if kind == "fail" else services[who]
            try:
                seen.append(run(service, ids, kind, who, args))
            except Failed:
                assert main._committed is None  # a rolled back pass leaves no state behind
                seen.append("failed")
            except Exception as error:  # refused: a conflict, an unknown id
                seen.append(f"{type(error).__name__}: {error}")
            else:
                assert (main._committed is not None) == reuse or who == 1
            # Reads start from the kept state too, when nobody wrote since.
            seen.append([view.as_dict() for view in main.list_workloads()])
            seen.append([view.as_dict() for view in main.list_queues()])
            seen.append(main.explain(labels={"team": "x"}, demand={"gpu": 2}).as_dict())
    return seen


def run(service: SchedulingService, ids: list[str], kind: str, who: int,
        args: list[Any]) -> object:
    if kind in ("submit", "fail"):
        # A failing one is the compared service's, ``who`` GPUs and no labels.
        team, priority, gpu = args if kind == "submit" else (None, args[0], who)
        if isinstance(service, Failing):
            service.fail_next = kind == "fail"
        view = service.submit_workload(
            labels={} if team is None else {"team": team}, priority=priority,
            demand={"gpu": gpu},
        )
        ids.append(view.id)
        return view.as_dict()
    if kind in ("release", "cancel"):
        ref = ids[args[0] % len(ids)] if ids else "none"
        end = service.release_workload if kind == "release" else service.cancel_workload
        return end(ref).as_dict()
    if kind == "apply":
        return service.apply_config(CONFIGS[args[0]]).as_dict()
    return repr(service.reconcile())


def check_same(reused: list[object], afresh: list[object], ops: list[Op]) -> None:
    # Step by step first, for a message naming the first operation that differs.
    for step, (one, other) in enumerate(zip(reused, afresh, strict=True)):
        assert one == other, (step // 4, ops[step // 4])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=25))
def test_reusing_decides_as_afresh(ops: list[Op], tmp_path_factory: Any) -> None:
    root = tmp_path_factory.mktemp("reuse")
    check_same(replay(f"sqlite:///{root / 'reused.db'}", ops, reuse=True),
               replay(f"sqlite:///{root / 'afresh.db'}", ops, reuse=False), ops)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reusing_decides_as_afresh_over_a_long_random_run(
    backend: Backend, new_database: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seeded run of every kind of operation, on both backends; with reuse, the service
    loads the live state only after another's write (or a failed one of its own)."""
    rng = random.Random(4)
    ops: list[Op] = [("apply", 0, 0)]
    for _ in range(80):
        ops.append(rng.choice([
            ("submit", rng.choice([0, 0, 0, 1]), rng.choice([None, "x", "y"]),
             rng.choice([None, *range(7)]), rng.randint(1, 3)),
            ("release", rng.choice([0, 1]), rng.randrange(50)),
            ("cancel", 0, rng.randrange(50)),
            ("apply", rng.choice([0, 0, 1]), rng.randrange(len(CONFIGS))),
            ("reconcile", 0),
            ("fail", rng.randint(1, 3), rng.randrange(7)),
        ]))
    loads = [0, 0]
    live = scheduling._Tx.live

    def counted(tx: Any) -> Any:
        loads[-1] += tx._live is None
        return live(tx)

    monkeypatch.setattr(scheduling._Tx, "live", counted)
    reused = replay(new_database(backend, migrated=True), ops, reuse=True)
    loads.append(0)
    afresh = replay(new_database(backend, migrated=True), ops, reuse=False)
    check_same(reused, afresh, ops)
    # Afresh, every pass loads; reused, only the first after another's or a failed write.
    assert loads[1] <= loads[2] // 2, loads
