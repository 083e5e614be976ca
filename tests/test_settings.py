"""ResourceSettings must give the same request maps as ZenML v1 (0.95-0.96).

Expected values were checked against zenml.config.ResourceSettings 0.96.4.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fairpool.errors import InvalidInput
from fairpool.settings import MEMORY_REGEX, ByteUnit, ResourceSettings, request_map

# (unit string, byte value) in ZenML's definition order.
UNITS = [
    ("KB", 10**3),
    ("KiB", 2**10),
    ("MB", 10**6),
    ("MiB", 2**20),
    ("GB", 10**9),
    ("GiB", 2**30),
    ("TB", 10**12),
    ("TiB", 2**40),
    ("PB", 10**15),
    ("PiB", 2**50),
]


def test_byte_units_match_zenml() -> None:
    assert [(u.value, u.byte_value) for u in ByteUnit] == UNITS
    assert ByteUnit("GiB") is ByteUnit.GIB


def test_memory_regex_is_zenmls() -> None:
    assert MEMORY_REGEX == r"^[0-9]+(KB|KiB|MB|MiB|GB|GiB|TB|TiB|PB|PiB)$"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param(
            {
                "gpu_count": 2,
                "cpu_count": 4,
                "memory": "16GiB",
                "pool_resources": {"tensorrt_sessions": 1},
            },
            {"tensorrt_sessions": 1, "gpu": 2, "mcpu": 4000, "memory_mb": 17180},
            id="all-fields",
        ),
        pytest.param(
            {"cpu_count": 0.5, "memory": "512MiB"},
            {"mcpu": 500, "memory_mb": 537},
            id="half-cpu-512MiB",
        ),
        pytest.param({"memory": "1GiB"}, {"memory_mb": 1074}, id="1GiB-rounds-up"),
        pytest.param({"memory": "1KB"}, {"memory_mb": 1}, id="1KB-rounds-up-to-1"),
        pytest.param({"memory": "0GB"}, {"memory_mb": 0}, id="zero-memory-kept"),
        pytest.param(
            {"pool_resources": {"mcpu": 5, "memory_mb": 7}},
            {"mcpu": 5, "memory_mb": 7},
            id="pool-only-unchanged",
        ),
        pytest.param(
            {"pool_resources": {"tpu": 2, "widgets": 3}},
            {"tpu": 2, "widgets": 3},
            id="custom-keys-pass-through",
        ),
        pytest.param(
            {"gpu_count": 0, "pool_resources": {"gpu": 3}},
            {},
            id="gpu-count-zero-drops-pool-gpu",
        ),
        pytest.param({"gpu_count": 0}, {}, id="gpu-count-zero-alone"),
        pytest.param(
            {
                "pool_resources": {"gpu": 9, "mcpu": 1, "memory_mb": 1, "tpu": 4},
                "gpu_count": 2,
                "cpu_count": 1.0,
                "memory": "512MB",
            },
            # Overridden keys keep their place in the pool map.
            {"gpu": 2, "mcpu": 1000, "memory_mb": 512, "tpu": 4},
            id="typed-fields-override-pool-keys",
        ),
        pytest.param({"cpu_count": 2.007}, {"mcpu": 2008}, id="float-quirk-2.007"),
        pytest.param({"cpu_count": 2.5}, {"mcpu": 2500}, id="cpu-2.5"),
        pytest.param({"cpu_count": 1e-9}, {"mcpu": 1}, id="tiny-cpu-rounds-up"),
        pytest.param({"pool_resources": {}}, {}, id="empty-pool-map"),
        pytest.param({}, {}, id="nothing"),
    ],
)
def test_merged_requested_resources(kwargs: dict[str, Any], expected: dict[str, int]) -> None:
    merged = ResourceSettings(**kwargs).merged_requested_resources()
    assert merged == expected
    assert list(merged) == list(expected)  # key order too


@pytest.mark.parametrize(
    ("memory", "memory_mb"),
    [
        ("1KB", 1),
        ("1KiB", 1),
        ("1MB", 1),
        ("1MiB", 2),
        ("1GB", 1000),
        ("1GiB", 1074),
        ("1TB", 1_000_000),
        ("1TiB", 1_099_512),
        ("1PB", 1_000_000_000),
        ("1PiB", 1_125_899_907),
        ("16MB", 16),
        ("16MiB", 17),
        ("007GB", 7000),
    ],
)
def test_every_memory_unit(memory: str, memory_mb: int) -> None:
    assert ResourceSettings(memory=memory).merged_requested_resources() == {"memory_mb": memory_mb}


@pytest.mark.parametrize(
    ("memory", "unit", "expected"),
    [
        ("1KB", "KB", 1),
        ("1KB", "MB", 1 / 1000),
        ("1000MB", "KB", 1000 * 1000),
        ("1000MB", ByteUnit.GB, 1),
        ("11GiB", "KiB", 11 * 1024 * 1024),
        ("11GiB", "MiB", 11 * 1024),
        ("11GiB", ByteUnit.GIB, 11),
        ("1TB", None, 1000),  # default unit is GB
    ],
)
def test_get_memory(memory: str, unit: str | ByteUnit | None, expected: float) -> None:
    settings = ResourceSettings(memory=memory)
    got = settings.get_memory() if unit is None else settings.get_memory(unit=unit)
    assert got == expected


def test_get_memory_unset_is_none() -> None:
    assert ResourceSettings().get_memory() is None


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"memory": "1.5GB"}, id="fractional-memory"),
        pytest.param({"memory": "16B"}, id="plain-bytes"),
        pytest.param({"memory": "16 GiB"}, id="space"),
        pytest.param({"memory": "16gib"}, id="lowercase"),
        pytest.param({"memory": "-1KB"}, id="negative-memory"),
        pytest.param({"memory": "KB"}, id="no-number"),
        pytest.param({"memory": "16GB\n"}, id="trailing-newline"),
        pytest.param({"memory": ""}, id="empty-memory"),
        pytest.param({"pool_resources": {"gpu": 0}}, id="pool-value-zero"),
        pytest.param({"pool_resources": {"gpu": -1}}, id="pool-value-negative"),
        pytest.param({"pool_resources": {"gpu": 1.5}}, id="pool-value-fraction"),
        pytest.param({"gpu_count": -1}, id="negative-gpu"),
        pytest.param({"gpu_count": 1.5}, id="fractional-gpu"),
        pytest.param({"cpu_count": 0}, id="zero-cpu"),
        pytest.param({"cpu_count": -0.5}, id="negative-cpu"),
        pytest.param({"cpu_count": float("nan")}, id="nan-cpu"),
        pytest.param({"preemptible": "maybe"}, id="bad-preemptible"),
    ],
)
def test_invalid_values_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ResourceSettings(**kwargs)


def test_frozen() -> None:
    settings = ResourceSettings(gpu_count=1)
    with pytest.raises(ValidationError):
        settings.gpu_count = 2
    assert settings.gpu_count == 1


def test_extra_keys_ignored() -> None:
    # Keys from newer ZenML (or typos) load without error and are dropped.
    settings = ResourceSettings.model_validate(
        {"gpu_count": 1, "min_replicas": 2, "reclaim_tolerance": "none", "gpu_typo": 3}
    )
    assert settings.model_dump() == {
        "cpu_count": None,
        "gpu_count": 1,
        "memory": None,
        "pool_resources": None,
        "preemptible": True,
    }


def test_preemptible_defaults_true() -> None:
    assert ResourceSettings().preemptible is True
    assert ResourceSettings(preemptible=False).preemptible is False


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, {"step_run": 1}, id="nothing"),
        pytest.param(
            {"gpu_count": 2, "memory": "1GB"},
            {"gpu": 2, "memory_mb": 1000, "step_run": 1},
            id="appended-last",
        ),
        pytest.param(
            {"pool_resources": {"step_run": 5, "tpu": 1}},
            {"step_run": 1, "tpu": 1},
            id="overrides-pool-step-run",
        ),
    ],
)
def test_requested_resources_adds_step_run(
    kwargs: dict[str, Any], expected: dict[str, int]
) -> None:
    requested = ResourceSettings(**kwargs).requested_resources()
    assert requested == expected
    assert list(requested) == list(expected)


@pytest.mark.parametrize(
    ("kwargs", "empty"),
    [
        ({}, True),
        ({"cpu_count": None, "gpu_count": None, "memory": None}, True),
        ({"pool_resources": {"x": 1}}, True),
        ({"preemptible": False}, True),
        ({"pool_resources": {"gpu": 4}, "preemptible": True}, True),
        ({"gpu_count": 1}, False),
        ({"gpu_count": 0}, False),  # explicitly set, even to zero
        ({"cpu_count": 1}, False),
        ({"memory": "1KB"}, False),
    ],
)
def test_empty(kwargs: dict[str, Any], empty: bool) -> None:
    assert ResourceSettings(**kwargs).empty is empty


# ZenML parity quirks: validation accepts these, but the request map cannot be
# built. Pinned so a change here is a deliberate break from ZenML.
@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"cpu_count": float("inf")}, id="infinite-cpu"),
        pytest.param({"cpu_count": 1e308}, id="cpu-millis-overflow"),  # was blamed on memory
        pytest.param({"memory": "1" + "0" * 400 + "PB"}, id="memory-overflows-float"),
        pytest.param({"memory": "9" * 5000 + "GiB"}, id="memory-past-int-digits"),  # ValueError
    ],
)
def test_accepted_but_unmergeable(kwargs: dict[str, Any]) -> None:
    settings = ResourceSettings(**kwargs)
    with pytest.raises((OverflowError, ValueError)):
        settings.merged_requested_resources()
    # fairpool's front-ends (CLI, SDK) refuse them naming the field instead.
    with pytest.raises(InvalidInput, match=f"^{next(iter(kwargs))}: "):
        request_map(settings)


def test_request_map_is_the_request_zenml_sends() -> None:
    settings = ResourceSettings(gpu_count=2, cpu_count=1.5, memory="1GiB")
    assert request_map(settings) == settings.requested_resources() == {
        "gpu": 2, "mcpu": 1500, "memory_mb": 1074, "step_run": 1,
    }


units = st.sampled_from(list(ByteUnit))


@given(n=st.integers(min_value=0, max_value=10**200), unit=units)
def test_memory_mb_follows_zenml_float_path(n: int, unit: ByteUnit) -> None:
    # ZenML: int * byte_value / 10**6 as a float, then ceil.
    settings = ResourceSettings(memory=f"{n}{unit.value}")
    expected = math.ceil(n * unit.byte_value / ByteUnit.MB.byte_value)
    assert settings.merged_requested_resources() == {"memory_mb": expected}


def _exact_ceil_mb(n: int, unit: ByteUnit) -> int:
    return -(-n * unit.byte_value // 10**6)


@given(
    n=st.integers(min_value=0, max_value=10**6 - 1),
    unit=st.sampled_from([ByteUnit.KB, ByteUnit.MB, ByteUnit.GB]),
)
def test_memory_mb_exact_for_decimal_units(n: int, unit: ByteUnit) -> None:
    settings = ResourceSettings(memory=f"{n}{unit.value}")
    assert settings.merged_requested_resources()["memory_mb"] == _exact_ceil_mb(n, unit)


# Below 2**32 MB (~4.3 PB) the float error is under the 1e-6 gap between a
# non-integer MB count and the next integer, so ZenML's float path is exact.
_EXACT_LIMIT_BYTES = 2**32 * 10**6
below_exact_limit = units.flatmap(
    lambda u: st.tuples(
        st.integers(min_value=0, max_value=(_EXACT_LIMIT_BYTES - 1) // u.byte_value),
        st.just(u),
    )
)


@given(case=below_exact_limit)
def test_memory_mb_exact_below_4_pb(case: tuple[int, ByteUnit]) -> None:
    n, unit = case
    settings = ResourceSettings(memory=f"{n}{unit.value}")
    assert settings.merged_requested_resources()["memory_mb"] == _exact_ceil_mb(n, unit)


@pytest.mark.parametrize(
    ("memory", "float_mb", "exact_mb"),
    [
        # Where ZenML's float path and exact arithmetic part ways: ~10 PiB and up.
        ("10000001PiB", 11_259_000_194_326_146, 11_259_000_194_326_147),
        ("10000000000000001MB", 10_000_000_000_000_000, 10_000_000_000_000_001),
    ],
)
def test_float_path_kept_where_it_differs(memory: str, float_mb: int, exact_mb: int) -> None:
    settings = ResourceSettings(memory=memory)
    assert settings.merged_requested_resources()["memory_mb"] == float_mb
    assert float_mb != exact_mb
