"""The scheduler config as a service (seed 004): versions, workloads and queues on a real
database, SQLite and PostgreSQL. The routing and flavor rules themselves are tested pure in
``test_config_scenarios.py``; here: that the store keeps what the passes decide."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import func, null, select

from fairpool.errors import Conflict, InvalidInput, NotFound
from fairpool.frontends.config import ConfigError
from fairpool.scheduling import SchedulingService
from fairpool.service import Service
from fairpool.store import schema
from fairpool.store.db import Database
from fairpool.views import WORKLOAD_STATUSES
from tests.conftest import walked_pages
from tests.test_config_scenarios import SPOT_THEN_ANY
from tests.test_service import Clock

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scheduler"
COMPLETE = (EXAMPLES / "complete.yaml").read_text()
M5_CAP = (EXAMPLES / "m5-cap.yaml").read_text()
RESERVATION = (EXAMPLES / "reservation.yaml").read_text()
M5 = {"instance_type": "m5.2xlarge", "demand": {"cpu": 8, "memory_gb": 32}}


@pytest.fixture
def sched(database_url: str) -> Iterator[SchedulingService]:
    db = Database.open(database_url)
    yield SchedulingService(db, Clock())
    db.close()


def rows(sched: SchedulingService, table: str) -> int:
    with sched.db.read() as conn:
        return int(conn.execute(
            select(func.count()).select_from(schema.metadata.tables[table])
        ).scalar_one())


# -- versions --------------------------------------------------------------------------------


def test_versions_are_appended_and_rollback_applies_an_old_one_again(
    sched: SchedulingService,
) -> None:
    assert sched.get_config() is None
    assert sched.list_configs() == []
    first = sched.apply_config(M5_CAP)
    assert first.version.version == 1 and first.version.active
    again = sched.apply_config(M5_CAP)  # identical content: a new version all the same
    assert again.version.version == 2 and again.changes == ()
    sched.apply_config(RESERVATION)
    assert [v.version for v in sched.list_configs()] == [3, 2, 1]
    assert [v.active for v in sched.list_configs()] == [True, False, False]
    # A listing leaves the documents out (a long history's are megabytes); get_config has one.
    assert [v.as_dict()["document"] for v in sched.list_configs()] == [None, None, None]
    assert "+ queue q-m5-2xlarge-cap3: added" in sched.diff_config(1)
    back = sched.rollback_config(1)
    assert (back.version.version, back.version.rolled_back_from) == (4, 1)
    active = sched.get_config()
    assert active is not None and active.document == M5_CAP
    old = sched.get_config(3)
    assert old is not None and old.document == RESERVATION and not old.active
    assert sched.diff_config(4) == ()
    with pytest.raises(NotFound, match="no scheduler config version 9"):
        sched.get_config(9)
    # Refused as the API refuses them; beyond 32 bits SQLite could not even look one up.
    for call, message in (
        (lambda: sched.get_config(0), "version: must be a positive integer (got 0)"),
        (lambda: sched.diff_config(-1), "version: must be a positive integer (got -1)"),
        (lambda: sched.rollback_config(2**64), f"version: must be at most {2**31 - 1} (got"),
    ):
        with pytest.raises(InvalidInput, match=re.escape(message)):
            call()
    assert rows(sched, "config_version") == 4


def test_an_invalid_config_writes_nothing(sched: SchedulingService) -> None:
    with pytest.raises(ConfigError) as caught:
        sched.apply_config("resource_queues: [{name: q, colour: red}]\nextra: 1\n")
    assert {issue.path for issue in caught.value.errors} == {
        "extra", "resource_queues[0].colour"
    }
    assert rows(sched, "config_version") == 0


def test_a_queue_spec_cannot_change_under_the_same_name(sched: SchedulingService) -> None:
    sched.apply_config(M5_CAP)
    sched.apply_config("resource_queues: [{name: other}]\n")  # the cap queue is gone ...
    changed = M5_CAP.replace("nominal_quota: 24", "nominal_quota: 32")
    with pytest.raises(ConfigError) as caught:  # ... but its name stays bound to its spec
        sched.apply_config(changed)
    (issue,) = caught.value.errors
    assert issue.path == "resource_queues[0].resource_groups" and issue.reference
    assert "version 1" in issue.message and "new name" in issue.message
    assert rows(sched, "config_version") == 2
    sched.apply_config(changed.replace("q-m5-2xlarge-cap3", "q-m5-2xlarge-cap4"))


def test_a_version_applied_before_summaries_were_kept_is_summarised_by_the_next_apply(
    sched: SchedulingService,
) -> None:
    """Versions keep their counts and queue specs (migration 0015); one applied before has
    none, and is read from its document: listed, then checked and recorded by an apply."""
    sched.apply_config(M5_CAP)
    sched.apply_config("resource_queues: [{name: other}]\n")
    table = schema.config_version
    with sched.db.write() as conn:
        conn.execute(table.update().values(summary=null()))  # as migration 0015 leaves them
    assert [(v.version, v.flavors, v.queues, v.rules) for v in sched.list_configs()] == [
        (2, 0, 1, 0), (1, 1, 2, 2)]
    changed = M5_CAP.replace("nominal_quota: 24", "nominal_quota: 32")
    with pytest.raises(ConfigError, match="differs from its spec in version 1"):
        sched.preview_config(changed)
    with pytest.raises(ConfigError, match="differs from its spec in version 1"):
        sched.apply_config(changed)
    with sched.db.read() as conn:  # the failed apply's transaction recorded nothing
        assert conn.scalar(select(func.count()).where(table.c.summary.is_not(None))) == 0
    sched.apply_config(changed.replace("q-m5-2xlarge-cap3", "q-m5-2xlarge-cap4"))
    with sched.db.read() as conn:
        recorded = dict(conn.execute(select(table.c.version, table.c.summary)).all())
    assert recorded[1]["queue_specs"].keys() == {"q-m5-2xlarge-cap3", "default"}
    assert recorded[2] == {"flavors": 0, "queues": 1, "rules": 0,
                           "queue_specs": {"other": {"preempts": False, "resource_groups": []}}}
    assert recorded[3]["queue_specs"].keys() == {"q-m5-2xlarge-cap4", "default"}


def test_a_preview_says_what_an_apply_would_change_and_writes_nothing(
    sched: SchedulingService,
) -> None:
    empty = sched.preview_config(M5_CAP)
    assert empty.based_on == 0 and "+ queue q-m5-2xlarge-cap3: added" in empty.changes
    sched.apply_config(M5_CAP)
    before = rows(sched, "config_version")
    preview = sched.preview_config(RESERVATION)
    applied = sched.apply_config(RESERVATION, based_on=preview.based_on)
    assert preview.based_on == 1 and before == 1
    assert preview.changes == applied.changes and preview.warnings == applied.warnings
    assert sched.preview_config(RESERVATION).changes == ()
    with pytest.raises(ConfigError):
        sched.preview_config("resource_queues: [{name: q, colour: red}]\n")
    assert rows(sched, "config_version") == 2


CHANGED = "the active scheduler config changed meanwhile: "


@pytest.mark.parametrize(("versions", "based_on", "expected"), [
    (1, 0, Conflict(f"{CHANGED}it is version 1, where there was none (based_on); nothing "
                    "applied: look at it again and re-apply")),
    (2, 1, Conflict(f"{CHANGED}it is version 2, not version 1 (based_on); nothing applied: "
                    "look at it again and re-apply")),
    # A version that never was: no change meanwhile, as it said (helper-101).
    (1, 2, InvalidInput("based_on", 2, "no scheduler config version 2; the active one is "
                        "version 1")),
    # None yet: it said "it is version 0", a version nobody applied (helper-83).
    (0, 1, InvalidInput("based_on", 1, "no scheduler config version 1; none is applied yet")),
])
def test_an_apply_based_on_another_version_is_refused_naming_both(
    sched: SchedulingService, versions: int, based_on: int, expected: Exception
) -> None:
    for document in (M5_CAP, RESERVATION)[:versions]:
        sched.apply_config(document)
    for apply in (lambda: sched.apply_config(RESERVATION + "\n# again\n", based_on=based_on),
                  lambda: sched.rollback_config(1, based_on=based_on)):
        with pytest.raises(type(expected)) as refused:
            apply()
        assert str(refused.value) == str(expected)
    assert rows(sched, "config_version") == versions


# -- workloads -------------------------------------------------------------------------------


def test_without_a_config_every_workload_passes_through(sched: SchedulingService) -> None:
    view = sched.submit_workload(demand={"gpu": 8})
    assert (view.status, view.queue, view.config_version) == ("admitted", None, None)


def test_the_m5_cap_admits_three_and_queues_the_fourth(sched: SchedulingService) -> None:
    sched.apply_config(M5_CAP)
    views = [sched.submit_workload(**M5) for _ in range(4)]  # type: ignore[arg-type]
    assert [v.status for v in views] == ["admitted"] * 3 + ["queued"]
    assert views[0].flavors == ("m5-2xlarge",) and views[0].priority == 50
    assert views[3].position == 1 and "free 0 of nominal_quota 24" in (views[3].reason or "")
    other = sched.submit_workload(instance_type="p4d.24xlarge", demand={"gpu": 8})
    assert (other.status, other.queue) == ("admitted", "default")
    (queue,) = [q for q in sched.list_queues() if q.name == "q-m5-2xlarge-cap3"]
    assert (queue.admitted, queue.queued) == (3, 1)
    assert {(u.resource, u.used_milli) for u in queue.usage} == {("cpu", 24_000),
                                                                ("memory_gb", 96_000)}
    released = sched.release_workload(views[0].id)
    assert released.status == "finished" and released.finished_at is not None
    assert sched.get_workload(views[3].id).status == "admitted"
    with pytest.raises(Conflict, match="is finished"):
        sched.release_workload(views[0].id)
    cancelled = sched.cancel_workload(views[1].id[:8])  # by id prefix
    assert cancelled.status == "cancelled"


def test_a_queue_filter_must_name_a_queue_of_some_version(sched: SchedulingService) -> None:
    """Not an empty list for a typo; a queue a newer version dropped still lists what it
    holds."""
    def unknown(queue: str) -> str:
        return f"^no resource queue '{queue}' in any scheduler config version$"

    with pytest.raises(NotFound, match=unknown("default")):
        sched.list_workloads(queue="default")  # no version yet
    sched.apply_config(M5_CAP)
    running = sched.submit_workload(**M5)  # type: ignore[arg-type]
    sched.apply_config(RESERVATION)
    assert [w.id for w in sched.list_workloads(queue="q-m5-2xlarge-cap3")] == [running.id]
    with pytest.raises(NotFound, match=r"^no resource queue 'q-m5-2xlarge-cap3' in the active "
                                       r"scheduler config$"):
        sched.describe_queue("q-m5-2xlarge-cap3")  # describes the active config's queues
    assert sched.list_workloads(queue="reservation") == []
    with pytest.raises(NotFound, match=unknown("q-m5-2xlarge-cap")):
        sched.list_workloads(status="admitted", queue="q-m5-2xlarge-cap")


def test_reservation_rejects_what_no_flavor_matches(sched: SchedulingService) -> None:
    sched.apply_config(RESERVATION)
    wrong = sched.submit_workload(labels={"use-reservation": "true"}, instance_type="n2",
                                  demand={"gpu": 8})
    assert wrong.status == "rejected" and "no flavor matched" in (wrong.reason or "")
    right = [sched.submit_workload(labels={"use-reservation": "true"},
                                   instance_type="a4-highgpu-8g", demand={"gpu": 8})
             for _ in range(11)]
    assert [v.status for v in right].count("admitted") == 10  # 80 GPUs of quota
    assert right[-1].status == "queued"


def test_routing_fails_a_workload_no_rule_takes(sched: SchedulingService) -> None:
    sched.apply_config(
        "resource_queues: [{name: q}]\n"
        "scheduling_rules:\n"
        "  - {selector: [{key: team, operator: in, values: [a]}], resource_queue: q,\n"
        "     priority_policy: {min: 0, max: 10, on_violation: reject}}\n"
    )
    # explain says what submit will do (it said "rejected").
    explained = sched.explain(labels={"team": "b"})
    assert (explained.status, explained.reason) == ("failed", "no scheduling rule matched")
    failed = sched.submit_workload(labels={"team": "b"})
    assert failed.status == "failed" and "no scheduling rule matched" in (failed.reason or "")
    refused = sched.submit_workload(labels={"team": "a"}, priority=11)
    assert refused.status == "failed"
    assert refused.notes == (
        "scheduling_rules[0]: priority 11 is outside [0, 10] (on_violation: reject), "
        "falls through",
    )


def test_a_decided_workload_keeps_the_notes_of_the_pass_that_decided_it(
    sched: SchedulingService,
) -> None:
    """Notes were worked out only while a workload waited: once admitted, rejected or failed,
    even by a config apply, nothing said which rule fell through (found by helper-69)."""
    sched.apply_config(COMPLETE)
    admitted = sched.submit_workload(labels={"team": "research"}, priority=150,
                                     demand={"gpu": 1})
    assert admitted.status == "admitted"
    assert any("priority 150 is outside" in note for note in admitted.notes), admitted.notes
    assert sched.get_workload(admitted.id).notes == admitted.notes
    assert [w.notes for w in sched.list_workloads() if w.id == admitted.id] == [admitted.notes]
    sched.apply_config("resource_queues: [{name: q, resource_groups: [{covered_resources: "
                       "[gpu], flavors: [{name: f, resources: [{name: gpu, nominal_quota: 1}]}]}]}]"
                       "\nresource_flavors: [{name: f}]\n"
                       "scheduling_rules: [{resource_queue: q}]\n")
    sched.submit_workload(demand={"gpu": 1})
    waiting = sched.submit_workload(priority=5, demand={"gpu": 1})
    assert waiting.status == "queued"
    sched.apply_config("resource_queues: [{name: q, resource_groups: [{covered_resources: "
                       "[gpu], flavors: [{name: f, resources: [{name: gpu, nominal_quota: 1}]}]}]}]"
                       "\nresource_flavors: [{name: f}]\n"
                       "scheduling_rules: [{resource_queue: q, priority_policy: "
                       "{max: 1, on_violation: reject}}]\n")
    failed = sched.get_workload(waiting.id)
    assert (failed.status, failed.reason) == ("failed", "no scheduling rule matched")
    assert failed.notes == (
        "scheduling_rules[0]: priority 5 is outside [0, 1] (on_violation: reject), falls through",)


def test_lower_priority_workloads_are_preempted_and_requeued(sched: SchedulingService) -> None:
    sched.apply_config(COMPLETE)
    research = {"labels": {"team": "research"}, "demand": {"gpu": 8, "cpu": 64}}
    low = [sched.submit_workload(priority=10, **research) for _ in range(2)]  # 16 of 16 GPUs
    assert [v.flavors for v in low] == [("research_gpu_pool",)] * 2
    high = sched.submit_workload(priority=90, **research)
    assert high.status == "admitted", high.reason
    victim = sched.get_workload(low[1].id)  # the most recently admitted goes first
    assert victim.status == "queued" and victim.preemptions == 1
    assert high.id in (victim.reason or "")
    assert sched.get_workload(low[0].id).status == "admitted"



def test_the_preempted_are_decided_again_in_the_same_pass(sched: SchedulingService) -> None:
    """One that fits another flavor is admitted there at once (it waited, with quota idle,
    until the next pass: embedded, the next command; served, the tick), and a second pass
    changes nothing."""
    sched.apply_config(SPOT_THEN_ANY)
    one, two = (sched.submit_workload(priority=p, market_type="SPOT", demand={"gpu": 1})
                for p in (1, 2))
    high = sched.submit_workload(priority=5, market_type="SPOT", demand={"gpu": 2})
    assert (high.status, high.flavors) == ("admitted", ("spot",))
    moved, waits = sched.get_workload(two.id), sched.get_workload(one.id)
    assert (moved.status, moved.flavors, moved.preemptions) == ("admitted", ("any",), 1)
    assert moved.reason == (f"preempted by workload {high.id} in queue q (priority 5 > 2); "
                            "requeued: admitted to queue q with flavor any at priority 2")
    assert (waits.status, waits.position, waits.preemptions) == ("queued", 1, 1)
    assert waits.reason == (
        f"preempted by workload {high.id} in queue q (priority 5 > 1); requeued: queued in "
        "queue q: flavor spot: gpu requested 1, free 0 of nominal_quota 2")
    before = sched.list_workloads()
    sched.reconcile()
    assert sched.list_workloads() == before
    # Cancelled, it shows no flavor: it holds none since it was preempted.
    assert sched.cancel_workload(one.id).flavors == ()


def test_a_running_workload_competes_at_the_priority_the_config_in_force_gives_it(
    sched: SchedulingService,
) -> None:
    """Admitted at its rule's 10, which is now 50: a 30 does not preempt it (it was
    preempted, then routed again at 50 and admitted in its place: restarted for nothing)."""
    config = ("resource_flavors: [{name: x}]\n"
              "resource_queues: [{name: q, preemption: {within_resource_queue: lower_priority},\n"
              "  resource_groups: [{covered_resources: [gpu],\n"
              "    flavors: [{name: x, resources: [{name: gpu, nominal_quota: 8}]}]}]}]\n"
              "scheduling_rules: [{resource_queue: q, priority_policy: {default: %d}}]\n")
    sched.apply_config(config % 10)
    running = sched.submit_workload(demand={"gpu": 8})
    assert (running.status, running.priority) == ("admitted", 10)
    sched.apply_config(config % 50)
    repriced = sched.get_workload(running.id)  # as the pass of the apply found it
    # Its reason told the 10 it was admitted at beside the 50 it has (helper-58).
    assert (repriced.priority, repriced.reason) == (50, "admitted to queue q with flavor x at "
                                                    "priority 50 (was 10 before config version 2)")
    waiting = sched.submit_workload(priority=30, demand={"gpu": 8})
    assert waiting.status == "queued"
    kept = sched.get_workload(running.id)
    assert (kept.status, kept.preemptions, kept.admitted_at) == (
        "admitted", 0, running.admitted_at)


def test_explain_answers_what_a_submit_gets_behind_those_that_wait(
    sched: SchedulingService,
) -> None:
    """Explain took no account of waiting workloads: it said "admitted" for a workload a
    submit queued, the free quota held for one that had waited 300 s (helper-69)."""
    clock = sched.clock
    assert isinstance(clock, Clock)
    sched.apply_config(
        "resource_flavors: [{name: f}]\n"
        "resource_queues: [{name: q, resource_groups: [{covered_resources: [gpu],\n"
        "  flavors: [{name: f, resources: [{name: gpu, nominal_quota: 4}]}]}]}]\n"
        "scheduling_rules: [{resource_queue: q}]\n")
    sched.submit_workload(demand={"gpu": 3})
    big = sched.submit_workload(demand={"gpu": 4})
    assert sched.explain(demand={"gpu": 1}).status == "admitted"  # it may pass big, for now
    clock.now += timedelta(seconds=301)
    explained = sched.explain(demand={"gpu": 1})
    submitted = sched.submit_workload(demand={"gpu": 1})
    assert (explained.status, explained.position) == ("queued", 2) == (
        submitted.status, submitted.position)
    assert explained.reason == submitted.reason and big.id[:8] in explained.reason


def test_a_preempted_workload_waits_from_its_requeue_not_its_submission(
    sched: SchedulingService,
) -> None:
    """Counted from its submission, one that had run past backfill_after (300 s) held the
    free quota back from a smaller workload the moment it was requeued."""
    clock = sched.clock
    assert isinstance(clock, Clock)
    sched.apply_config(
        "resource_flavors: [{name: x}]\n"
        "resource_queues: [{name: q, preemption: {within_resource_queue: lower_priority},\n"
        "  resource_groups: [{covered_resources: [gpu],\n"
        "    flavors: [{name: x, resources: [{name: gpu, nominal_quota: 8}]}]}]}]\n"
        "scheduling_rules: [{resource_queue: q}]\n")
    big = sched.submit_workload(priority=10, demand={"gpu": 6})
    other = sched.submit_workload(priority=50, demand={"gpu": 2})
    clock.now += timedelta(seconds=1000)
    sched.submit_workload(priority=20, demand={"gpu": 6})  # preempts big
    assert sched.get_workload(big.id).status == "queued"
    clock.now += timedelta(seconds=1)
    small = sched.submit_workload(priority=10, demand={"gpu": 2})
    assert small.status == "queued"
    clock.now += timedelta(seconds=1)
    sched.release_workload(other.id)
    assert sched.get_workload(small.id).status == "admitted"


def test_an_apply_names_the_running_workloads_its_pass_preempted(
    sched: SchedulingService,
) -> None:
    """They were listed as queued workloads failed under it, or not at all."""
    queue = ("resource_flavors: [{name: x}]\n"
             "resource_queues: [{name: q, preemption: {within_resource_queue: lower_priority},\n"
             "  resource_groups: [{covered_resources: [gpu],\n"
             "    flavors: [{name: x, resources: [{name: gpu, nominal_quota: 8}]}]}]}]\n")
    b_rule = ("  - {selector: [{key: team, operator: in, values: [b]}], resource_queue: q,\n"
              "     priority_policy: {default: %d}}\n")
    sched.apply_config(queue + "scheduling_rules:\n" + b_rule % 5 +
                       "  - {selector: [{key: team, operator: in, values: [a]}], "
                       "resource_queue: q, priority_policy: {default: 10}}\n")
    a = sched.submit_workload(labels={"team": "a"}, demand={"gpu": 8})
    b = sched.submit_workload(labels={"team": "b"}, demand={"gpu": 8})
    assert (a.status, b.status) == ("admitted", "queued")
    # No rule for team a any more: preempted by b, a is routed again and fails.
    applied = sched.apply_config(queue + "scheduling_rules:\n" + b_rule % 50)
    assert (applied.admitted, applied.failed, applied.preempted) == ((b.id,), (), (a.id,))
    assert sched.get_workload(a.id).status == "failed"


def test_applying_a_config_without_a_queue_keeps_its_workloads_running(
    sched: SchedulingService,
) -> None:
    sched.apply_config(M5_CAP)
    views = [sched.submit_workload(**M5) for _ in range(4)]  # type: ignore[arg-type]
    # Its memory is short too, and said (the first key alone was, helper-89).
    assert views[3].reason == ("queued in queue q-m5-2xlarge-cap3: flavor m5-2xlarge: cpu "
                               "requested 8, free 0 of nominal_quota 24 (also short of "
                               "memory_gb)")
    passthrough = ("resource_queues: [{name: default}]\n"
                   "scheduling_rules: [{resource_queue: default}]\n")
    applied = sched.apply_config(passthrough)
    assert set(applied.orphaned) == {v.id for v in views[:3]}
    assert applied.admitted == (views[3].id,)  # routed again: now to the passthrough queue
    orphan = sched.get_workload(views[0].id)
    # Its reason said it was admitted to its queue, a queue no version had any more.
    # What the version lacks, named (it said "no such queue or flavor", helper-89).
    assert (orphan.status, orphan.reason) == ("admitted", f"{views[0].reason}; config version "
                                              "2 has no queue q-m5-2xlarge-cap3: it runs on, "
                                              "charged to no quota")
    # The next version did not remove their queue: it was gone already.
    assert sched.apply_config(passthrough).orphaned == ()
    assert sched.get_workload(views[0].id).reason == orphan.reason
    sched.rollback_config(1)  # the queue is back: they count against its quota again
    assert sched.get_workload(views[0].id).reason == views[0].reason


def test_bad_workloads_are_refused_before_anything_is_written(sched: SchedulingService) -> None:
    with pytest.raises(InvalidInput, match=r"labels\.instance-type"):
        sched.submit_workload(labels={"instance-type": "m5.2xlarge"})
    with pytest.raises(InvalidInput, match=r"demand\.gpu"):
        sched.submit_workload(demand={"gpu": "0.0001"})
    # Text is a plain decimal; Decimal alone took these (and -0 made a demand of nothing).
    for text in ("1_000", "+1", " 1", "\u0663", "\uff11", "-0"):
        with pytest.raises(InvalidInput, match=r"demand\.gpu: must be (a number|>= 0)"):
            sched.submit_workload(demand={"gpu": text})
    assert sched.explain(demand={"gpu": "1e1"}).status == "admitted"  # an exponent is a number
    with pytest.raises(InvalidInput, match="status"):
        sched.list_workloads(status="bogus")
    assert rows(sched, "workload") == 0


def test_a_page_of_workloads_is_its_slice_of_every_workload_the_filters_match(
    sched: SchedulingService,
) -> None:
    """``workload_page`` filters, counts and pages in the database: against the whole list,
    filtered as its reader would (a status, a queue, a token's own), for pages within,
    across and past the end."""
    token, _ = Service(sched.db, Clock()).create_token("submitter", ["a"])
    sched.apply_config(COMPLETE)
    rng = random.Random(7)
    made: list[tuple[str, str | None]] = []
    for _ in range(30):
        team = rng.choice(["research", "infra"])
        view = sched.submit_workload(  # research to ml_training (16 GPUs), infra to default
            labels={"team": team}, demand={"gpu": rng.choice([4, 8])},
            created_by=rng.choice([token.id, None]),
        )
        made.append((view.id, view.queue))
        if view.status == "admitted" and rng.random() < 0.3:
            sched.release_workload(view.id)
        elif view.status in ("queued", "admitted") and rng.random() < 0.2:
            sched.cancel_workload(view.id)
    every = sched.list_workloads()
    assert [w.id for w in every] == [ref for ref, _ in made]  # submission order
    with sched.db.read() as conn:
        own = set(conn.scalars(select(schema.workload.c.id).where(
            schema.workload.c.created_by_token_id == token.id)))
    assert 0 < len(own) < len(every)
    assert {w.status for w in every} == {"admitted", "queued", "finished", "cancelled"}
    queues = sorted({w.queue for w in every if w.queue is not None})
    assert len(queues) > 1
    for status, queue, created_by in itertools.product(
        (None, *WORKLOAD_STATUSES), (None, *queues), (None, token.id)
    ):
        expected = [w for w in every if status in (None, w.status) and queue in (None, w.queue)
                    and (created_by is None or w.id in own)]
        for limit, offset in ((None, 0), (3, 2), (None, 5), (4, 40)):
            page = sched.workload_page(status, queue, limit=limit, offset=offset,
                                       created_by=created_by)
            end = None if limit is None else offset + limit
            assert ([w.id for w in page.items], page.total) == (
                [w.id for w in expected[offset:end]], len(expected)
            ), (status, queue, created_by, limit, offset)
        assert [w.id for w in walked_pages(partial(
            sched.workload_page, status, queue, limit=3, created_by=created_by
        ), len(expected))] == [w.id for w in expected]
    with pytest.raises(InvalidInput, match=r"^limit: must be at most 10000 \(got 10001\)$"):
        sched.workload_page(limit=10_001)
    with pytest.raises(InvalidInput, match=r"^offset: must be an integer \(got 1.0\)$"):
        sched.workload_page(offset=1.0)  # type: ignore[arg-type]


def test_admitted_usage_never_exceeds_a_quota(sched: SchedulingService) -> None:
    """Random submits, releases and cancels (seeded); after each, every quota holds."""
    sched.apply_config(COMPLETE)
    rng = random.Random(4)
    live: list[str] = []
    for _ in range(40):
        roll = rng.random()
        if roll < 0.6 or not live:
            labels = {"team": rng.choice(["research", "infra"])}
            spot = rng.random() < 0.5
            view = sched.submit_workload(
                labels=labels, priority=rng.randrange(0, 101) if labels["team"] == "research"
                else None, accelerator_type="A100" if spot else None,
                market_type="SPOT" if spot else None,
                demand={"gpu": rng.choice([1, 4, 8]), "cpu": rng.choice([8, 32])},
            )
            live.append(view.id)
        else:
            ref = live.pop(rng.randrange(len(live)))
            if sched.get_workload(ref).status == "admitted":
                sched.release_workload(ref)
            else:
                sched.cancel_workload(ref)
        for queue in sched.list_queues():
            for usage in queue.usage:
                if usage.nominal_quota_milli is not None:
                    assert usage.used_milli <= usage.nominal_quota_milli, usage
    admitted = sched.list_workloads(status="admitted", queue="ml_training")
    gpus = sum(Decimal(v.demand.get("gpu", "0")) for v in admitted)
    assert gpus <= 64 + 16


# -- the CLI, in a subprocess ----------------------------------------------------------------


def test_cli_refuses_bad_input_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    from tests.test_cli import assert_one_error, db_dump, fairpool

    home = tmp_path / "home"
    fairpool(home, "config", "apply", "-f", str(EXAMPLES / "m5-cap.yaml"), "--yes").ok()
    before = db_dump(home)
    aborted = fairpool(home, "config", "apply", "-f", str(EXAMPLES / "complete.yaml"), input="n\n")
    assert aborted.code == 1 and "Aborted" in aborted.err
    assert_one_error(fairpool(home, "workload", "submit", "--label", "market-type=SPOT"),
                     "labels.market-type", "reserved")
    assert_one_error(fairpool(home, "workload", "submit", "--gpu", "-1"), "demand.gpu", "-1")
    assert_one_error(fairpool(home, "workload", "submit", "--label", "novalue"), "label",
                     "KEY=VALUE")
    assert_one_error(fairpool(home, "config", "rollback", "--version", "5", "--yes"),
                     "version 5")
    invalid = fairpool(home, "config", "apply", "-f", "-", "--yes",
                       input="resource_queues: [{name: q, resource_groups: [{}]}]\nx: 1\n")
    assert invalid.code == 1 and invalid.out == ""
    assert invalid.err_lines[0].startswith("Error: stdin is not a valid scheduler config (")
    assert "x: unknown key" in invalid.err
    assert "resource_queues[0].resource_groups[0].covered_resources" in invalid.err
    assert db_dump(home) == before
    failed = fairpool(home, "config", "apply", "-f", "-", "--yes",
                      input="resource_queues: [{name: q}]\nscheduling_rules:\n"
                      "  - {selector: [{key: team, operator: exists}], resource_queue: q}\n")
    assert failed.code == 0, failed.err
    result = fairpool(home, "workload", "submit", "--gpu", "1", "-o", "json")
    assert result.code == 1 and result.json["status"] == "failed"


def test_apply_and_rollback_show_the_change_and_each_warning_once(tmp_path: Path) -> None:
    """Asked, the change and the warnings come before the question; with --yes, with the
    result. Either way once."""
    from tests.test_cli import fairpool

    home = tmp_path / "home"
    # No version yet: an empty config changes nothing, but there is no "active version".
    empty = fairpool(home, "config", "apply", "-f", "-", "--yes", input="").ok()
    assert "No change from the config in force" in empty.err
    no_catch_all = "scheduling_rules: no catch-all rule"
    one = tmp_path / "one.yaml"
    one.write_text("resource_queues: [{name: q}]\nscheduling_rules:\n"
                   "  - {selector: [{key: team, operator: exists}], resource_queue: q}\n")
    two = tmp_path / "two.yaml"
    two.write_text(one.read_text().replace("[{name: q}]", "[{name: q}, {name: r}]"))

    applied = fairpool(home, "config", "apply", "-f", str(one), "--yes").ok()
    assert applied.err.count(no_catch_all) == 1
    assert "This changed:\n  + passthrough queue q: added\n" in applied.err
    assert "would change" not in applied.err
    assert "version 2 is active" in applied.out

    asked = fairpool(home, "config", "apply", "-f", str(two), input="y\n").ok()
    assert asked.err.count(no_catch_all) == 1
    assert asked.err.count("queue 'r' is not the target of any scheduling rule") == 1
    assert asked.err.index("This would change:\n  + passthrough queue r: added\n") \
        < asked.err.index("Apply it as a new version?")
    assert "This changed" not in asked.err
    assert "version 3 is active" in asked.out

    back = fairpool(home, "config", "rollback", "--version", "2", "--yes").ok()
    assert back.err.count(no_catch_all) == 1
    assert "This changed:\n  - queue r: removed" in back.err
    asked_back = fairpool(home, "config", "rollback", "--version", "3", input="y\n").ok()
    assert asked_back.err.count("queue 'r' is not the target") == 1
    assert "This would change:\n  + passthrough queue r: added\n" in asked_back.err
    assert "This changed" not in asked_back.err


@pytest.mark.long
def test_the_seed_examples_behave_as_the_seed_says_through_the_cli(tmp_path: Path) -> None:
    from tests.test_cli import fairpool

    home = tmp_path / "home"

    def submit(*args: str) -> dict[str, object]:
        result = fairpool(home, "workload", "submit", *args, "-o", "json")
        data: dict[str, object] = result.json
        return data

    # m5.2xlarge capped at three; everything else uncapped.
    fairpool(home, "config", "apply", "-f", str(EXAMPLES / "m5-cap.yaml"), "--yes").ok()
    m5 = ("--instance-type", "m5.2xlarge", "--cpu", "8", "--memory-gb", "32")
    assert [submit(*m5)["status"] for _ in range(4)] == ["admitted"] * 3 + ["queued"]
    other = submit("--instance-type", "c5.large", "--cpu", "512")
    assert (other["status"], other["queue"]) == ("admitted", "default")
    # The capacity reservation: a4 only, 80 GPUs; a non-a4 opt-in matches no flavor.
    fairpool(home, "config", "apply", "-f", str(EXAMPLES / "reservation.yaml"), "--yes").ok()
    opt_in = ("--label", "use-reservation=true", "--gpu", "8")
    wrong = fairpool(home, "workload", "submit", *opt_in, "--instance-type", "n2", "-o", "json")
    assert wrong.code == 1 and wrong.json["status"] == "rejected"
    assert "no flavor matched" in wrong.json["reason"]
    a4 = [submit(*opt_in, "--instance-type", "a4-highgpu-8g") for _ in range(11)]
    assert [w["status"] for w in a4] == ["admitted"] * 10 + ["queued"]
    assert {w["queue"] for w in a4} == {"reservation"}
    assert submit("--gpu", "64")["queue"] == "default"
    # The complete example: research routes to ml_training at its default priority 50.
    fairpool(home, "config", "apply", "-f", str(EXAMPLES / "complete.yaml"), "--yes").ok()
    research = submit("--label", "team=research", "--accelerator-type", "A100",
                      "--market-type", "SPOT", "--gpu", "8", "--cpu", "32")
    assert (research["queue"], research["priority"], research["flavors"]) == (
        "ml_training", 50, ["gpu_a100_spot"])
    assert submit("--label", "team=infra", "--gpu", "8")["queue"] == "default"
    # A label key given twice keeps its last value (docs/config.md).
    twice = submit("--label", "team=research", "--label", "team=infra", "--gpu", "8")
    assert (twice["queue"], twice["labels"]) == ("default", {"team": "infra"})


def test_the_ticks_pass_runs_only_when_a_workload_waits(sched: SchedulingService) -> None:
    sched.apply_config(M5_CAP)
    assert sched.reconcile_waiting() is None
    views = [sched.submit_workload(**M5) for _ in range(4)]  # type: ignore[arg-type]
    outcome = sched.reconcile_waiting()
    assert outcome is not None and outcome.decisions[views[3].id].status.value == "queued"


def test_a_version_with_an_exponent_number_schedules_and_is_applied_over(
    sched: SchedulingService
) -> None:
    """Stored, ``nominal_quota: 1e1`` is read again by every pass and apply, as applied."""
    document = ("resource_flavors: [{name: f}]\nresource_queues:\n  - name: q\n"
                "    resource_groups: [{covered_resources: [gpu], flavors: [{name: f, resources:"
                " [{name: gpu, nominal_quota: 1e1}]}]}]\nscheduling_rules: [{resource_queue: q}]\n")
    sched.apply_config(document)
    assert sched.submit_workload(demand={"gpu": 10}).status == "admitted"
    assert sched.submit_workload(demand={"gpu": 1}).status == "queued"
    assert sched.apply_config(document + "# again\n").version.version == 2
