"""Per-step resource settings, byte-compatible with ZenML v1's ``ResourceSettings``.

Pipelines written for ZenML (0.95-0.96) pass the same keyword arguments here and
must get the same request map, so validation, unit parsing and rounding copy
ZenML's, quirks included (float arithmetic, ceil rounding, key order). ZenML's
deployer-only fields (replicas, autoscaling, concurrency) are left out: they
never reach a resource pool.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)

from fairpool.errors import InvalidInput, clipped

__all__ = ["MEMORY_REGEX", "ByteUnit", "ResourceSettings", "memory_problem", "request_map"]


class ByteUnit(Enum):
    """Memory units accepted in ``ResourceSettings.memory``.

    Names, values and definition order match ZenML's enum: ``get_memory`` finds
    the unit by suffix in this order, and ``ByteUnit("GiB")`` must keep working.
    There is deliberately no plain ``B``.
    """

    KB = "KB"
    KIB = "KiB"
    MB = "MB"
    MIB = "MiB"
    GB = "GB"
    GIB = "GiB"
    TB = "TB"
    TIB = "TiB"
    PB = "PB"
    PIB = "PiB"

    @property
    def byte_value(self) -> int:
        """Number of bytes in one of this unit."""
        return _BYTE_VALUES[self]


_BYTE_VALUES: dict[ByteUnit, int] = {
    ByteUnit.KB: 10**3,
    ByteUnit.KIB: 1 << 10,
    ByteUnit.MB: 10**6,
    ByteUnit.MIB: 1 << 20,
    ByteUnit.GB: 10**9,
    ByteUnit.GIB: 1 << 30,
    ByteUnit.TB: 10**12,
    ByteUnit.TIB: 1 << 40,
    ByteUnit.PB: 10**15,
    ByteUnit.PIB: 1 << 50,
}

# Integers only ("1.5GB" is rejected), no space, no plain "B". Pydantic runs this
# with Rust's regex engine, where "$" does not match before a trailing newline.
MEMORY_REGEX = r"^[0-9]+(" + "|".join(unit.value for unit in ByteUnit) + r")$"


def memory_problem(value: object) -> str:
    """What is wrong with a ``memory`` that ``MEMORY_REGEX`` refused, in words, and what was
    given (pydantic shows the pattern: ``String should match pattern '^[0-9]+(KB|...)$'``),
    with the spelling meant where it is plain: a unit in other case (``16gib``), without its
    ``B`` (``16G``), or none at all."""
    units = ", ".join(unit.value for unit in ByteUnit)
    text = value.strip() if isinstance(value, str) else ""
    digits = len(text) - len(text.lstrip("0123456789"))
    number, unit = text[:digits], text[digits:].strip()
    exact = [u.value for u in ByteUnit if u.value.lower() == unit.lower()]
    prefixed = [u.value for u in ByteUnit if unit and u.value.lower() in
                (unit.lower() + "b", unit.lower() + "ib")]
    meant = exact or prefixed or ([] if unit else ["GiB", "MiB"])
    hint = "; did you mean " + " or ".join(f"'{number}{u}'" for u in meant) + "?" if (
        number and meant) else ""
    return (f"must be a whole number and a unit, one of {units} (got {value!r}{hint})")


class ResourceSettings(BaseModel):
    """Hardware resources one step asks for.

    ``pool_resources`` names any pool resource directly (e.g. ``{"tpu": 4}``);
    the typed fields ``gpu_count``, ``cpu_count`` and ``memory`` override its
    ``gpu``, ``mcpu`` and ``memory_mb`` keys.
    """

    # Frozen and extra="ignore" as in ZenML: settings written for newer ZenML
    # (deployer fields, reclaim_tolerance, ...) still load here.
    model_config = ConfigDict(frozen=True, extra="ignore")

    cpu_count: PositiveFloat | None = None
    gpu_count: NonNegativeInt | None = None
    memory: str | None = Field(default=None, pattern=MEMORY_REGEX)
    pool_resources: dict[str, PositiveInt] | None = None
    preemptible: bool = True

    @property
    def empty(self) -> bool:
        """Whether no generic resource (cpu, gpu, memory) was set explicitly.

        ``preemptible`` and ``pool_resources`` only matter to pool scheduling,
        not to orchestrators, so ZenML leaves them out of this check.
        """
        dumped = self.model_dump(
            exclude_unset=True,
            exclude_none=True,
            exclude={"preemptible", "pool_resources"},
        )
        return len(dumped) == 0

    def get_memory(self, unit: str | ByteUnit = ByteUnit.GB) -> float | None:
        """Return ``memory`` converted to ``unit``, or None when memory is unset.

        Float division, as ZenML does; callers that need whole units round up.
        """
        if not self.memory:
            return None
        target = ByteUnit(unit) if isinstance(unit, str) else unit
        memory = self.memory
        # First suffix match in definition order. No unit string is a suffix of
        # another ("KiB" does not end with "KB"), so this always finds the
        # right unit.
        for memory_unit in ByteUnit:
            if memory.endswith(memory_unit.value):
                value = int(memory[: -len(memory_unit.value)])
                return value * memory_unit.byte_value / target.byte_value
        # Unreachable after MEMORY_REGEX validation; kept for parity with ZenML.
        raise ValueError(f"Unable to parse memory unit from '{memory}'.")

    def merged_requested_resources(self) -> dict[str, int]:
        """Resource map for pool allocation: pool keys, then gpu, mcpu, memory_mb.

        Same steps and rounding as ZenML, so ``cpu_count=2.007`` gives
        ``mcpu=2008`` (2.007 * 1000 == 2007.0000000000002).
        """
        merged: dict[str, int] = dict(self.pool_resources) if self.pool_resources else {}

        if self.gpu_count is not None:
            if self.gpu_count > 0:
                merged["gpu"] = self.gpu_count
            else:
                # gpu_count=0 is an explicit "no GPU", even if the map asks for one.
                merged.pop("gpu", None)

        if self.cpu_count is not None:
            merged["mcpu"] = math.ceil(self.cpu_count * 1000)

        memory_mb = self.get_memory(unit=ByteUnit.MB)
        if memory_mb is not None:
            merged["memory_mb"] = math.ceil(memory_mb)

        return merged

    def requested_resources(self) -> dict[str, int]:
        """The map a pool actually sees: ``merged_requested_resources`` plus ``step_run: 1``.

        The ZenML server adds one ``step_run`` to every request, so a pool can cap
        concurrent steps; it overrides any ``step_run`` in ``pool_resources``.
        """
        return {**self.merged_requested_resources(), "step_run": 1}


def request_map(settings: ResourceSettings) -> dict[str, int]:
    """``settings.requested_resources()``, for fairpool's front-ends: what ZenML's validation
    lets through but cannot count (an infinite ``cpu_count``, or one whose millis are, a
    ``memory`` beyond a float's range or of more digits than Python reads) is refused naming
    the field, where ZenML's rounding raises ``OverflowError`` and ``int`` ``ValueError``."""
    if settings.cpu_count is not None:
        if not math.isfinite(settings.cpu_count):
            raise InvalidInput("cpu_count", settings.cpu_count, "must be a finite number")
        if not math.isfinite(settings.cpu_count * 1000):
            raise InvalidInput("cpu_count", settings.cpu_count, "is too large to count")
    try:
        return settings.requested_resources()
    except (OverflowError, ValueError):
        raise InvalidInput("memory", clipped(settings.memory or ""),
                           "is too large to count") from None
