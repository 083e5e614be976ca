"""The fast paths of the fair-share update: the float backend against the exact one, the
``numeric`` switch, and the lazily described result maps (``docs/trees.md``, "Speed")."""

from __future__ import annotations

import importlib.util
from fractions import Fraction as F
from pathlib import Path

import pytest
from hypothesis import given, settings

from fairpool.engine.fairshare import (
    EXACT_ELEMENT_LIMIT,
    SNAP_EPSILON,
    FairShareResult,
    OperationSnapshot,
    PoolSnapshot,
    TreeSnapshot,
    compute_fair_share,
)
from tests.test_fairshare import CASES
from tests.test_fairshare_properties import snapshots

# Loaded from its file: with benchmarks/ on sys.path, benchmarks/http.py would shadow the
# standard library's http.
_SPEC = importlib.util.spec_from_file_location(
    "fairshare_benchmark", Path(__file__).resolve().parents[1] / "benchmarks" / "fairshare.py"
)
assert _SPEC is not None and _SPEC.loader is not None
benchmark = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(benchmark)


def assert_close(exact: FairShareResult, fast: FairShareResult, tolerance: float) -> None:
    assert list(exact.pools) == list(fast.pools)
    assert list(exact.operations) == list(fast.operations)
    pairs = [(exact.root, fast.root)]
    pairs += [(exact.pools[name], fast.pools[name]) for name in exact.pools]
    pairs += [(exact.operations[name], fast.operations[name]) for name in exact.operations]
    for a, b in pairs:
        assert a.usage_share == b.usage_share and a.demand_share == b.demand_share, a.name
        assert a.limits_share == b.limits_share, a.name
        assert a.strong_guarantee_share == b.strong_guarantee_share, a.name
        assert a.dominant_resource == b.dominant_resource, a.name
        assert a.fifo_index == b.fifo_index, a.name
        for resource, share in a.fair_share.total.items():
            assert isinstance(b.fair_share.total[resource], F)
            assert abs(share - b.fair_share.total[resource]) <= tolerance, (a.name, resource)


@pytest.mark.parametrize(
    ("snapshot", "_expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_float_backend_gives_the_reference_numbers_exactly(
    snapshot: TreeSnapshot, _expected: object
) -> None:
    """Every published case has shares the float result snaps back to (demand, usage,
    limits, guarantee or 0) or floats within the epsilon."""
    exact = compute_fair_share(snapshot, numeric="exact")
    assert_close(exact, compute_fair_share(snapshot, numeric="float"), SNAP_EPSILON)
    assert compute_fair_share(snapshot) == exact  # small trees: auto is exact


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_float_backend_agrees_with_the_exact_one(snapshot: TreeSnapshot) -> None:
    assert_close(
        compute_fair_share(snapshot, numeric="exact"),
        compute_fair_share(snapshot, numeric="float"),
        SNAP_EPSILON,
    )


def test_float_backend_snaps_satisfied_demand_to_the_exact_value() -> None:
    """A satisfied operation's fair share is its demand exactly, so the starvation rule
    "fair share == demand -> tolerance 1" still sees the tie."""
    snapshot = TreeSnapshot(
        {"cpu": 3, "memory": 7},
        (PoolSnapshot("a"),),
        (OperationSnapshot("x", "a", {"cpu": 1, "memory": 2}, running_job_count=1),),
    )
    result = compute_fair_share(snapshot, numeric="float", now=0.0)
    x = result.operations["x"]
    assert dict(x.fair_share.total) == {"cpu": F(1, 3), "memory": F(2, 7)}
    assert x.fair_share.total == x.demand_share
    assert x.starvation is not None and not x.starvation.below_fair_share


def test_a_generated_tree_agrees_and_keeps_the_invariants_within_epsilon() -> None:
    snapshot = benchmark.build(40, 400)
    exact = compute_fair_share(snapshot, numeric="exact", now=5.0)
    fast = compute_fair_share(snapshot, numeric="float", now=5.0)
    assert_close(exact, fast, 1e-9)
    for resource in fast.resources:
        assert sum(o.fair_share.total[resource] for o in fast.operations.values()) <= 1 + 1e-9
    statuses = [o.starvation.status for o in fast.operations.values() if o.starvation]
    assert statuses == [o.starvation.status for o in exact.operations.values() if o.starvation]


def test_auto_switches_to_floats_above_the_limit() -> None:
    pools = (PoolSnapshot("a"),)
    operations = tuple(
        OperationSnapshot(f"o{i}", "a", {"cpu": 1}, pending_job_count=1 + i % 3)
        for i in range(EXACT_ELEMENT_LIMIT)
    )
    snapshot = TreeSnapshot({"cpu": 1000}, pools, operations)
    auto = compute_fair_share(snapshot)
    exact = compute_fair_share(snapshot, numeric="exact")
    assert_close(exact, auto, SNAP_EPSILON)
    # The cluster is overloaded: no share is a demand, usage or limit, so the float backend
    # reports the float's own (dyadic) value, within the epsilon of the exact one.
    assert exact.operations["o0"].fair_share.total["cpu"].denominator < 10**6
    assert auto.operations["o0"].fair_share.total["cpu"].denominator > 10**6


def test_result_maps_are_read_only_mappings_in_tree_order() -> None:
    snapshot = CASES[0][1]
    result = compute_fair_share(snapshot)
    assert list(result.pools) == ["A", "B"] and len(result.operations) == 1
    assert "x" in result.operations and "nope" not in result.operations
    assert result.operations["x"] is result.operations["x"]
    assert dict(result.pools) == {name: result.pools[name] for name in ("A", "B")}
    with pytest.raises(KeyError):
        result.operations["nope"]
    with pytest.raises(ValueError, match="numeric"):
        compute_fair_share(snapshot, numeric="decimal")  # type: ignore[arg-type]
