"""The fast paths of the fair-share update: the float backend (compiled, and its pure-Python
fallback) against the exact one, the ``numeric`` switch, and the lazily described result maps
(``docs/trees.md``, "Speed")."""

from __future__ import annotations

import importlib.util
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from fractions import Fraction as F
from pathlib import Path

import pytest
from hypothesis import given, settings

from fairpool.engine import fairshare
from fairpool.engine.fairshare import (
    EXACT_ELEMENT_LIMIT,
    SNAP_EPSILON,
    FairShareResult,
    IntegralGuarantees,
    IntegralGuaranteeType,
    IntegralState,
    OperationSnapshot,
    PoolSnapshot,
    TreeSnapshot,
    compute_fair_share,
)
from tests.test_fairshare import CASES
from tests.test_fairshare_properties import integral_snapshots, snapshots

# Loaded from its file: with benchmarks/ on sys.path, benchmarks/http.py would shadow the
# standard library's http.
_SPEC = importlib.util.spec_from_file_location(
    "fairshare_benchmark", Path(__file__).resolve().parents[1] / "benchmarks" / "fairshare.py"
)
assert _SPEC is not None and _SPEC.loader is not None
benchmark = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(benchmark)


@contextmanager
def python_float_backend() -> Iterator[None]:
    """The float backend without the compiled kernel, as where it could not be built."""
    kernel, fairshare.kernel = fairshare.kernel, None
    try:
        yield
    finally:
        fairshare.kernel = kernel


def test_the_compiled_kernel_is_built_and_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install -e .`` builds ``_hdrf.c`` (optional for users without a compiler, never
    silently missing here), and the float backend goes through it."""
    assert fairshare.kernel is not None, "fairpool/engine/_hdrf.c was not built"

    def python_functions(*_: object) -> None:
        raise AssertionError("the float backend ran in Python")

    monkeypatch.setattr(fairshare._Update, "_functions", python_functions)
    result = compute_fair_share(benchmark.build(10, 100), numeric="float")
    assert any(result.root.fair_share.total.values())


def test_the_kernel_rejects_a_malformed_flattening() -> None:
    """Children must come after their parent (the kernel fits bottom-up by index)."""
    assert fairshare.kernel is not None, "fairpool/engine/_hdrf.c was not built"
    # (child_start, child_count, children): the root holding one operation, or the reverse.
    fits = (array("i", [0, 0]), array("i", [1, 0]), array("i", [1]))
    backwards = (array("i", [0, 0]), array("i", [0, 1]), array("i", [0]))
    rows = [[(0,), (1,)], [(0,), (1,)], [(1.0,), (1.0,)], [(1.0,), (0.0,)]]
    weights = array("d", [1.0, 1.0])
    shares = fairshare.kernel.update(1, bytes([1, 0]), *fits, weights, *rows, (2,))
    assert array("d", shares).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="after its parent"):
        fairshare.kernel.update(1, bytes([1, 0]), *backwards, weights, *rows, (2,))


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
    exact = compute_fair_share(snapshot, numeric="exact")
    compiled = compute_fair_share(snapshot, numeric="float")
    assert_close(exact, compiled, SNAP_EPSILON)
    with python_float_backend():
        fallback = compute_fair_share(snapshot, numeric="float")
    assert_close(exact, fallback, SNAP_EPSILON)
    # The kernel mirrors the Python code operation for operation: the same floats.
    assert compiled == fallback


@settings(max_examples=200, deadline=None)
@given(integral_snapshots())
def test_float_backends_agree_with_integral_pools(snapshot: TreeSnapshot) -> None:
    """Integral shares enter the kernel as part of the guarantees: compiled and Python floats
    stay bit-identical, and both agree with the exact backend (integral shares and new
    volumes included)."""
    exact = compute_fair_share(snapshot, numeric="exact")
    compiled = compute_fair_share(snapshot, numeric="float")
    assert_close(exact, compiled, SNAP_EPSILON)
    with python_float_backend():
        fallback = compute_fair_share(snapshot, numeric="float")
    assert compiled == fallback
    for name, pool in exact.pools.items():
        fast = compiled.pools[name]
        for resource, share in pool.proposed_integral_share.items():
            assert abs(share - fast.proposed_integral_share[resource]) <= SNAP_EPSILON, name
        if pool.integral is not None:
            assert fast.integral is not None
            # Volumes are refilled exactly in both (from the exact previous state).
            assert pool.integral.state.accumulated_volume == fast.integral.state.accumulated_volume


@pytest.mark.parametrize("size", [(40, 400), (300, 3000)])
def test_compiled_and_python_float_backends_agree_on_generated_trees(
    size: tuple[int, int],
) -> None:
    snapshot = benchmark.build(*size)
    compiled = compute_fair_share(snapshot, numeric="float", now=5.0)
    with python_float_backend():
        fallback = compute_fair_share(snapshot, numeric="float", now=5.0)
    assert compiled == fallback


def test_compiled_and_python_float_backends_agree_on_a_generated_tree_with_integral_pools(
) -> None:
    """A generated tree whose first top-level pools are a burst and a relaxed pool."""
    snapshot = benchmark.build(40, 400)
    tops = [pool.name for pool in snapshot.pools if pool.parent is None][:2]
    cpu = snapshot.total_resources["cpu"]
    kinds = dict(zip(tops, (IntegralGuaranteeType.BURST, IntegralGuaranteeType.RELAXED),
                     strict=True))
    pools = tuple(
        replace(
            pool,
            integral_guarantees=IntegralGuarantees(
                kinds[pool.name], {"cpu": cpu // 4}, {"cpu": cpu // 20}
            ),
            # 30 share-seconds in every resource (the volume's ratio is the least over them).
            integral_state=IntegralState(
                {r: F(total * 30) for r, total in snapshot.total_resources.items()},
                F(1, 10),
                F(7),
            ),
        )
        if pool.name in kinds else pool
        for pool in snapshot.pools
    )
    snapshot = replace(snapshot, pools=pools)
    compiled = compute_fair_share(snapshot, numeric="float", now=5.0)
    with python_float_backend():
        fallback = compute_fair_share(snapshot, numeric="float", now=5.0)
    assert compiled == fallback
    assert any(compiled.pools[name].proposed_integral_share["cpu"] for name in tops)
    assert_close(compute_fair_share(snapshot, numeric="exact", now=5.0), compiled, 1e-9)


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
    snapshot = TreeSnapshot({"cpu": EXACT_ELEMENT_LIMIT // 2}, pools, operations)
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
