"""Pool trees (seed 003, YTsaurus): the configuration model, its validation and inheritance.

Pure values, no storage. The pieces, with YTsaurus's names and defaults:

* :class:`ClusterNode` -- a node with ``tags`` and exact integer ``resources`` (cpu, memory in
  bytes, gpu, user_slots, custom keys). A tree's capacity is the sum over the nodes its
  ``node_tag_filter`` selects (:func:`tree_resources`).
* :class:`PoolTreeConfig` -- every tree option of the seed (plus ``enable_pool_starvation``,
  which the fair-share update reads), with YTsaurus's defaults.
* :class:`PoolConfig` -- every pool option of the seed plus the inheritable starvation options;
  unset options are None and resolve pool -> parent -> tree (:class:`EffectivePool`).
* :class:`PoolTree` -- a validated tree: ``PoolTree.build(name, config, pools)`` checks every
  rule and raises :class:`fairpool.errors.InvalidInput` naming the field and the value.
  ``with_pool`` / ``without_pool`` return new validated trees.
* :func:`load_pool_tree` -- a whole tree from YAML (nested ``pools:`` mappings), for
  idempotent apply; :meth:`PoolConfig.from_mapping` / :meth:`PoolTreeConfig.from_mapping` parse
  single objects (unknown option names are rejected, YTsaurus aliases accepted).
* :meth:`PoolTree.fair_share_snapshot` -- compiles the tree and its operations into the
  input of :func:`fairpool.engine.fairshare.compute_fair_share`.

Decisions where the seed is silent are listed in ``docs/trees.md``.
"""

from __future__ import annotations

import contextvars
import difflib
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from types import MappingProxyType
from typing import Any, TypeVar

from fairpool.engine.fairshare import (
    ROOT,
    FifoSortParameter,
    IntegralGuarantees,
    IntegralGuaranteeType,
    IntegralSettings,
    IntegralState,
    OperationSnapshot,
    PoolSnapshot,
    SchedulingMode,
    StarvationSettings,
    TreeSnapshot,
)
from fairpool.errors import InvalidInput, clipped, listed, mapping, string
from fairpool.frontends.names import MAX_KEYS, MAX_NAME, bounded_text, check_key_count
from fairpool.frontends.yaml_text import load_yaml

__all__ = [
    "ROOT",
    "ClusterNode",
    "EffectivePool",
    "EphemeralSubpoolConfig",
    "IntegralGuaranteesSettings",
    "Pool",
    "PoolConfig",
    "PoolIntegralGuarantees",
    "PoolTree",
    "PoolTreeConfig",
    "load_pool_tree",
    "matches_tag_filter",
    "number",
    "parse_resources",
    "tree_document",
    "tree_option_name",
    "tree_resources",
]

Resources = Mapping[str, int]
T = TypeVar("T")

#: Pool and user names (YTsaurus's ``ephemeral_pool_name_regex``); ``$`` joins a pool and a
#: user in an ephemeral subpool name and is reserved for it.
NAME_PATTERN = re.compile(r"[-_a-zA-Z0-9:]+")
EPHEMERAL_DELIMITER = "$"
RESOURCE_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
TAG_PATTERN = re.compile(r"[-_a-zA-Z0-9:./]+")
#: Levels of pools below the root: the fair-share pass recurses once per level, and no
#: organisation's tree is near this deep.
MAX_POOL_DEPTH = 32
_TOO_DEEP = f"nests the pool deeper than {MAX_POOL_DEPTH} levels below the root"
#: Characters of a whole-tree document (``pool-tree apply``).
MAX_TREE_DOCUMENT = 60_000
#: Tags of one node, each as long as a name at most.
MAX_TAGS = 64
#: Characters of one option's value as the command line gives it (``pool set``), and of any
#: text inside an option's value (a tag filter, a mode, a size).
MAX_OPTION_TEXT = 4096
MAX_AMOUNT = 10**18

_MEMORY_UNITS = {
    "": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
_MEMORY = re.compile(r"\s*(\d+)\s*(|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)B?\s*")


# -- value parsers: each takes (field path, raw value) and returns the typed value ---------------


def _integer(field_name: str, value: object, low: int = 0, high: int = MAX_AMOUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field_name, value, "must be an integer")
    if not low <= value <= high:
        raise InvalidInput(field_name, value, f"must be between {low} and {high}")
    return value


def _count(field_name: str, value: object) -> int:
    return _integer(field_name, value)


def _milliseconds(field_name: str, value: object) -> int:
    return _integer(field_name, value)


#: Numbers are taken between 1e-30 and 1e30 in magnitude (or 0): "1e999999999" as an exact
#: rational would be a billion-digit integer, and no option needs more.
MAX_EXPONENT = 30


#: Set while stored configs are read (``stored_configs``).
_STORED = contextvars.ContextVar("stored_configs", default=False)


@contextmanager
def stored_configs() -> Iterator[None]:
    """Read stored options as written: versions before 2026-12-01 kept a number quoted in
    YAML or JSON as its text, which ``number`` refuses in what is given now; a tree holding
    one still loads."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def number(field_name: str, value: object, zero: bool = True, text: bool = False) -> Fraction:
    """An exact rational from an int, a float (its shortest decimal form), or with ``text``
    a decimal string (a command-line flag's, as given); ``zero``: whether the field takes 0,
    which its bounds' words then say. Elsewhere (a document, a mapping, an option's YAML, a
    JSON body) a string is text, as the doc says of '0100': it was read as the number, and an
    option kept and served it as text (helper-85)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str) or (
            isinstance(value, str) and not (text or _STORED.get())):
        raise InvalidInput(field_name, value, "must be a number")
    written = repr(value) if isinstance(value, float) else value
    if isinstance(written, str) and len(written) > 64:  # Decimal's work grows with its digits
        raise InvalidInput(field_name, clipped(written), "must be a number written in at most "
                           "64 characters")
    try:
        decimal = Decimal(written)
    except InvalidOperation:
        raise InvalidInput(field_name, value, "must be a finite number") from None
    if not decimal.is_finite() or (decimal and abs(decimal.adjusted()) > MAX_EXPONENT):
        raise InvalidInput(
            field_name, value, f"must be a finite number between 1e-{MAX_EXPONENT} and "
            f"1e{MAX_EXPONENT} in magnitude{' (or 0)' if zero else ''}"
        )
    return Fraction(decimal)


def _shown(value: object, amount: Fraction) -> object:
    """A number given as text (a command-line flag) shown as the number: ``(got 0)``, as
    the same number given in YAML or JSON, not ``(got '0')``."""
    if not isinstance(value, str):
        return value
    return int(amount) if amount.denominator == 1 else float(amount)


def positive(field_name: str, value: object, text: bool = False) -> Fraction:
    amount = number(field_name, value, zero=False, text=text)
    if amount <= 0:
        raise InvalidInput(field_name, _shown(value, amount), "must be positive")
    return amount


def _unit_interval(field_name: str, value: object) -> Fraction:
    amount = number(field_name, value)
    if not 0 <= amount <= 1:
        raise InvalidInput(field_name, _shown(value, amount), "must be between 0 and 1")
    return amount


def _at_least_one(field_name: str, value: object) -> Fraction:
    amount = number(field_name, value)
    if amount < 1:
        raise InvalidInput(field_name, _shown(value, amount), "must be at least 1")
    return amount


def _boolean(field_name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(field_name, value, "must be true or false")
    return value


def _name(field_name: str, value: object) -> str:
    name = string(field_name, value)
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(field_name, name, f"must match {NAME_PATTERN.pattern}")
    if len(name) > MAX_NAME:  # as every name (the API's paths, the store's columns)
        raise InvalidInput(field_name, clipped(name), f"must be at most {MAX_NAME} characters")
    return name


def _mode(field_name: str, value: object) -> SchedulingMode:
    try:
        return SchedulingMode(str(value))
    except ValueError:
        raise InvalidInput(field_name, value, "must be fair_share or fifo") from None


def _resource_key(field_name: str, value: object) -> str:
    if not isinstance(value, str) or not RESOURCE_KEY_PATTERN.fullmatch(value):
        raise InvalidInput(
            field_name, value, f"must be a resource name ({RESOURCE_KEY_PATTERN.pattern})"
        )
    return bounded_text(field_name, value, MAX_NAME)


def parse_resources(field_name: str, value: object) -> dict[str, int]:
    """A resource dictionary: non-negative integers; ``memory`` (bytes) may also be written with
    a unit, ``"512GiB"`` or ``"4G"``."""
    resources: dict[str, int] = {}
    given = mapping(field_name, value)
    check_key_count(field_name, given, MAX_KEYS)
    for key, amount in given.items():
        path = f"{field_name}.{key}"
        _resource_key(f"{field_name} key", key)
        if key == "memory" and isinstance(amount, str):
            match = _MEMORY.fullmatch(amount)
            if match is None:
                raise InvalidInput(path, amount, "must be bytes or a size such as 512GiB")
            if len(match[1]) > 30:  # beyond any amount, and int() reads at most 4,300 digits
                raise InvalidInput(path, clipped(amount), f"must be between 0 and {MAX_AMOUNT}")
            amount = int(match[1]) * _MEMORY_UNITS[match[2]]
        resources[key] = _integer(path, amount)
    return resources


def _fifo_sort_parameters(field_name: str, value: object) -> tuple[FifoSortParameter, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInput(field_name, value, "must be a non-empty list")
    parameters = []
    for item in value:
        # pending_allocation_count is YTsaurus's newer name for pending_job_count.
        item = "pending_job_count" if item == "pending_allocation_count" else item
        try:
            parameters.append(FifoSortParameter(item))
        except ValueError:
            raise InvalidInput(
                field_name, value, "entries must be start_time, weight or pending_job_count"
            ) from None
    if len(set(parameters)) != len(parameters):
        raise InvalidInput(field_name, value, "must not repeat a parameter")
    return tuple(parameters)


def _names(field_name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidInput(field_name, value, "must be a list of names")
    return tuple(_name(field_name, item) for item in value)


def _offloading_settings(field_name: str, value: object) -> Mapping[str, Mapping[str, str]]:
    """``{<tree>: {pool: <pool>}}``: kept and shown; offloading itself is not implemented.
    Kept in that shape, which ``to_mapping`` writes back (a flat {tree: pool} did not load)."""
    settings: dict[str, Mapping[str, str]] = {}
    for tree, target in mapping(field_name, value).items():
        target_map = mapping(f"{field_name}.{tree}", target)
        if set(target_map) != {"pool"}:
            raise InvalidInput(f"{field_name}.{tree}", dict(target_map), "must be {pool: <name>}")
        settings[_name(f"{field_name} tree", tree)] = MappingProxyType(
            {"pool": _name(f"{field_name}.{tree}.pool", target_map["pool"])}
        )
    return MappingProxyType(settings)


def _tag_filter(field_name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field_name, value, "must be a tag expression")
    _TagFilterParser(value, field_name).parse()
    return value


def _options(
    cls: type[Any],
    raw: object,
    path: str,
    parsers: Mapping[str, Callable[[str, object], object]],
    aliases: Mapping[str, str],
    what: str,
) -> dict[str, Any]:
    """Parses a mapping of options: canonical names, aliases, unknown names rejected."""
    values: dict[str, Any] = {}
    where = path.rstrip(".") or what
    for key, value in mapping(where, raw).items():
        name = _option_name(key, value, path, parsers, aliases, what)
        if name in values:
            raise InvalidInput(f"{path}{key}", value, f"{name} is given twice (through an alias)")
        _bounded_texts(f"{path}{key}", value)
        values[name] = parsers[name](f"{path}{name}", value)
    known = {f.name for f in fields(cls)}
    assert set(values) <= known
    return values


def _option_name(
    key: object,
    value: object,
    path: str,
    parsers: Mapping[str, object],
    aliases: Mapping[str, str],
    what: str,
) -> str:
    """An option's own name (an alias resolved); an unknown one is refused, with a hint."""
    field = f"{path.rstrip('.') or what} key"
    bounded_text(field, str(key), MAX_NAME)
    name = aliases.get(str(key), str(key))
    if not name:  # named as its mapping's key: ": unknown pool option" named nothing
        raise InvalidInput(field, key, f"an empty name is no {what} option")
    if name not in parsers:
        close = difflib.get_close_matches(str(key), [*parsers, *aliases], n=1)
        if close:
            hint = f"; did you mean {close[0]!r}?"
        else:  # the names themselves, where they are few enough for one line
            hint = f"; one of {', '.join(parsers)}" if len(parsers) <= 6 else ""
        raise InvalidInput(f"{path}{key}", value, f"unknown {what} option{hint}")
    return name


def _bounded_texts(field_name: str, value: object) -> None:
    """Text anywhere in an option's value is at most ``MAX_OPTION_TEXT`` characters, and its
    keys at most a name's: the service's limits, so that a command says the same embedded and
    over HTTP (where the body's size is the only other bound). Walked without recursion:
    YAML nests as deep as it likes."""
    pending = [(field_name, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            bounded_text(where, item, MAX_OPTION_TEXT)
        elif isinstance(item, Mapping):
            for key in item:
                bounded_text(f"{where} key", str(key), MAX_NAME)
            pending.extend((f"{where}.{key}", inner) for key, inner in item.items())
        elif isinstance(item, list):
            pending.extend((f"{where}.{index}", inner) for index, inner in enumerate(item))


# -- node tag filter ---------------------------------------------------------------------------


class _TagFilterParser:
    """YTsaurus boolean tag formulas: tags joined by ``&``, ``|``, ``!`` and parentheses;
    the empty filter selects every node."""

    TOKEN = re.compile(r"\s*(?:([&|!()])|([-_a-zA-Z0-9:./]+))")
    #: Parentheses and negations nested deeper are refused: the parser recurses, and a
    #: formula's 1,024 characters would otherwise exhaust Python's stack.
    MAX_DEPTH = 64

    def __init__(self, text: str, field_name: str, tags: frozenset[str] = frozenset()) -> None:
        self.text, self.field_name, self.tags = text, field_name, tags
        self.tokens: list[str] = []
        position = 0
        while position < len(text.rstrip()):
            match = self.TOKEN.match(text, position)
            if match is None:
                raise InvalidInput(field_name, text, f"unexpected character at {position}")
            self.tokens.append(match[1] or match[2])
            position = match.end()
        self.index = 0
        self.depth = 0

    def parse(self) -> bool:
        if not self.tokens:
            return True
        result = self._or()
        if self.index != len(self.tokens):
            raise InvalidInput(
                self.field_name, self.text, f"unexpected {self.tokens[self.index]!r}"
            )
        return result

    def _next(self) -> str:
        if self.index == len(self.tokens):
            raise InvalidInput(self.field_name, self.text, "ends too early")
        token = self.tokens[self.index]
        self.index += 1
        return token

    def _peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _or(self) -> bool:
        result = self._and()
        while self._peek() == "|":
            self._next()
            result = self._and() or result
        return result

    def _and(self) -> bool:
        result = self._not()
        while self._peek() == "&":
            self._next()
            result = self._not() and result
        return result

    def _not(self) -> bool:
        token = self._next()
        if token in "!(":
            self.depth += 1
            if self.depth > self.MAX_DEPTH:
                raise InvalidInput(self.field_name, clipped(self.text),
                                   f"nests ! and ( deeper than {self.MAX_DEPTH}")
            result = not self._not() if token == "!" else self._group()
            self.depth -= 1
            return result
        if token in "&|)":
            raise InvalidInput(self.field_name, self.text, f"unexpected {token!r}")
        return token in self.tags

    def _group(self) -> bool:
        result = self._or()
        if self._next() != ")":
            raise InvalidInput(self.field_name, self.text, "missing ')'")
        return result


def matches_tag_filter(tag_filter: str, tags: Iterable[str]) -> bool:
    return _TagFilterParser(tag_filter, "node_tag_filter", frozenset(tags)).parse()


@dataclass(frozen=True, slots=True)
class ClusterNode:
    name: str
    tags: frozenset[str] = frozenset()
    resources: Resources = field(default_factory=dict)

    @classmethod
    def create(cls, name: str, tags: Iterable[str], resources: object) -> ClusterNode:
        """A validated node (the CLI's ``node add``)."""
        given = listed("tags", tags)
        if len(given) > MAX_TAGS:
            raise InvalidInput("tags", len(given), f"must have at most {MAX_TAGS} items")
        checked = []
        for index, tag in enumerate(given):
            string(f"tags.{index}", tag)  # as the API locates it
            if len(tag) > MAX_NAME:
                raise InvalidInput("tags", clipped(tag), f"must be at most {MAX_NAME} characters")
            if not TAG_PATTERN.fullmatch(tag):
                raise InvalidInput("tags", tag, f"must match {TAG_PATTERN.pattern}")
            checked.append(tag)
        amounts = parse_resources("resources", resources)
        if not any(amounts.values()):  # no tree could place a job there
            raise InvalidInput("resources", resources, "must give the node some resource above 0")
        return cls(_name("name", name), frozenset(checked), MappingProxyType(amounts))


# -- configuration objects -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntegralGuaranteesSettings:
    """Tree ``integral_guarantees``: how fast volume turns into share (``smooth_period``), how
    much a pool may hoard (``pool_capacity_saturation_period`` of its flow), and the default
    cap on a relaxed pool's share (``relaxed_share_multiplier_limit`` times its flow)."""

    smooth_period: int = 60_000
    pool_capacity_saturation_period: int = 86_400_000
    relaxed_share_multiplier_limit: Fraction = Fraction(3)

    @classmethod
    def from_mapping(cls, field_name: str, raw: object) -> IntegralGuaranteesSettings:
        parsers = {
            # Volume / smooth_period is a share: 0 would divide by zero.
            "smooth_period": lambda f, v: _integer(f, v, low=1),
            "pool_capacity_saturation_period": _milliseconds,
            "relaxed_share_multiplier_limit": _at_least_one,
        }
        return cls(**_options(cls, raw, f"{field_name}.", parsers, {}, "integral_guarantees"))

    def snapshot(self) -> IntegralSettings:
        return IntegralSettings(
            self.smooth_period,
            self.pool_capacity_saturation_period,
            self.relaxed_share_multiplier_limit,
        )


def _guarantee_type(field_name: str, value: object) -> IntegralGuaranteeType:
    try:
        return IntegralGuaranteeType(str(value))
    except ValueError:
        raise InvalidInput(field_name, value, "must be none, burst or relaxed") from None


def _multiplier_limit(field_name: str, value: object) -> Fraction:
    amount = number(field_name, value)
    if not 1 <= amount <= 10:
        raise InvalidInput(field_name, value, "must be between 1 and 10")
    return amount


@dataclass(frozen=True, slots=True)
class PoolIntegralGuarantees:
    """A pool's ``integral_guarantees`` (YTsaurus ``TPoolIntegralGuaranteesConfig``). A burst
    pool is guaranteed up to ``burst_guarantee_resources`` while its volume, filled at
    ``resource_flow``, lasts; a relaxed pool gets a share of what is left in proportion to its
    volume. A pool without a type may still name both, as the sum its integral children may
    use. The free-volume options are kept and shown; free volume is not redistributed."""

    guarantee_type: IntegralGuaranteeType = IntegralGuaranteeType.NONE
    burst_guarantee_resources: Resources = field(default_factory=dict)
    resource_flow: Resources = field(default_factory=dict)
    #: None: the tree's ``integral_guarantees.relaxed_share_multiplier_limit``.
    relaxed_share_multiplier_limit: Fraction | None = None
    can_accept_free_volume: bool = True
    should_distribute_free_volume_among_children: bool | None = None

    @classmethod
    def from_mapping(cls, field_name: str, raw: object) -> PoolIntegralGuarantees:
        parsers = {
            "guarantee_type": _guarantee_type,
            "burst_guarantee_resources": parse_resources,
            "resource_flow": parse_resources,
            "relaxed_share_multiplier_limit": _multiplier_limit,
            "can_accept_free_volume": _boolean,
            "should_distribute_free_volume_among_children": _boolean,
        }
        values = _options(cls, raw, f"{field_name}.", parsers, {}, "integral_guarantees")
        return cls(**values)

    @property
    def is_integral(self) -> bool:
        return self.guarantee_type is not IntegralGuaranteeType.NONE

    def snapshot(self) -> IntegralGuarantees:
        return IntegralGuarantees(
            self.guarantee_type,
            self.burst_guarantee_resources,
            self.resource_flow,
            self.relaxed_share_multiplier_limit,
        )


@dataclass(frozen=True, slots=True)
class EphemeralSubpoolConfig:
    """What a ``pool$user`` subpool gets: the seed names exactly these four options."""

    mode: SchedulingMode = SchedulingMode.FAIR_SHARE
    max_running_operation_count: int | None = None
    max_operation_count: int | None = None
    resource_limits: Resources = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, field_name: str, raw: object) -> EphemeralSubpoolConfig:
        parsers = {
            "mode": _mode,
            "max_running_operation_count": _count,
            "max_operation_count": _count,
            "resource_limits": parse_resources,
        }
        values = _options(cls, raw, f"{field_name}.", parsers, {}, "ephemeral_subpool_config")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A pool's own options; None (and empty) means "not set here"."""

    weight: Fraction | None = None
    strong_guarantee_resources: Resources = field(default_factory=dict)
    resource_limits: Resources = field(default_factory=dict)
    mode: SchedulingMode | None = None
    max_running_operation_count: int | None = None
    max_operation_count: int | None = None
    fifo_sort_parameters: tuple[FifoSortParameter, ...] | None = None
    forbid_immediate_operations: bool | None = None
    create_ephemeral_subpools: bool | None = None
    ephemeral_subpool_config: EphemeralSubpoolConfig | None = None
    offloading_settings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    config_presets: tuple[str, ...] = ()
    #: Inherited starvation options (YTsaurus pool preemption settings).
    fair_share_starvation_timeout: int | None = None
    fair_share_starvation_tolerance: Fraction | None = None
    non_preemptible_resource_usage_threshold: Resources | None = None
    integral_guarantees: PoolIntegralGuarantees | None = None
    #: The options given explicitly, so presets and updates merge field by field. Left empty
    #: (a config built in code), every option that differs from its default counts as given.
    specified: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.specified:
            given = frozenset(
                f.name
                for f in fields(self)
                if f.name != "specified" and getattr(self, f.name) != _default(f)
            )
            object.__setattr__(self, "specified", given)

    @classmethod
    def from_mapping(cls, raw: object, path: str = "") -> PoolConfig:
        values = _options(cls, raw, path, _POOL_PARSERS, _POOL_ALIASES, "pool")
        return cls(**values, specified=frozenset(values))

    def to_mapping(self) -> dict[str, object]:
        """The options given explicitly, in their YAML form (the inverse of ``from_mapping``)."""
        return {name: _plain(getattr(self, name)) for name in sorted(self.specified)}

    def without(self, option: str) -> PoolConfig:
        """This config with ``option`` (or its alias) unset: inherited or default again."""
        name = _option_name(option, None, "", _POOL_PARSERS, _POOL_ALIASES, "pool")
        unset: dict[str, Any] = {name: _default(next(f for f in fields(self) if f.name == name))}
        return replace(self, **unset, specified=self.specified - {name})

    def updated(self, other: PoolConfig) -> PoolConfig:
        """This config with every option ``other`` specifies replaced."""
        changes = {name: getattr(other, name) for name in other.specified}
        return replace(self, **changes, specified=self.specified | other.specified)


def _default(option: Field[Any]) -> object:
    if option.default_factory is not MISSING:
        return option.default_factory()
    return option.default


def _plain(value: object) -> object:
    if isinstance(value, Fraction):
        return int(value) if value.denominator == 1 else float(value)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, EphemeralSubpoolConfig | PoolIntegralGuarantees):
        # The options that differ from their defaults: what a user would have written (and
        # what loads again: an unset count is None, which no count option takes).
        defaults = type(value)()
        return {
            f.name: _plain(getattr(value, f.name))
            for f in fields(value)
            if getattr(value, f.name) != getattr(defaults, f.name)
        }
    if isinstance(value, SchedulingMode | FifoSortParameter | IntegralGuaranteeType):
        return value.value
    return value


def _ephemeral(field_name: str, value: object) -> EphemeralSubpoolConfig:
    return EphemeralSubpoolConfig.from_mapping(field_name, value)


def _integral(field_name: str, value: object) -> PoolIntegralGuarantees:
    return PoolIntegralGuarantees.from_mapping(field_name, value)


_POOL_PARSERS: dict[str, Callable[[str, object], object]] = {
    "weight": positive,
    "strong_guarantee_resources": parse_resources,
    "resource_limits": parse_resources,
    "mode": _mode,
    "max_running_operation_count": _count,
    "max_operation_count": _count,
    "fifo_sort_parameters": _fifo_sort_parameters,
    "forbid_immediate_operations": _boolean,
    "create_ephemeral_subpools": _boolean,
    "ephemeral_subpool_config": _ephemeral,
    "offloading_settings": _offloading_settings,
    "config_presets": _names,
    "fair_share_starvation_timeout": _milliseconds,
    "fair_share_starvation_tolerance": _unit_interval,
    "non_preemptible_resource_usage_threshold": parse_resources,
    "integral_guarantees": _integral,
}
_POOL_ALIASES = {
    "min_share_resources": "strong_guarantee_resources",
    "fair_share_preemption_timeout": "fair_share_starvation_timeout",
    "fair_share_preemption_tolerance": "fair_share_starvation_tolerance",
}


@dataclass(frozen=True, slots=True)
class PoolTreeConfig:
    """A tree's ``config`` attribute. Durations are milliseconds, as YTsaurus writes them."""

    node_tag_filter: str = ""
    main_resource: str = "cpu"
    max_operation_count: int = 50_000
    max_operation_count_per_pool: int = 50
    max_running_operation_count: int = 2_000
    max_running_operation_count_per_pool: int = 50
    default_parent_pool: str = ROOT
    forbid_immediate_operations_in_root: bool = True
    max_ephemeral_pool_per_user: int = 1
    infer_weight_from_guarantees_share_multiplier: Fraction | None = None
    integral_guarantees: IntegralGuaranteesSettings = IntegralGuaranteesSettings()
    pool_config_presets: Mapping[str, PoolConfig] = field(default_factory=dict)
    preemptive_scheduling_backoff: int = 5_000
    fair_share_starvation_timeout: int = 30_000
    fair_share_starvation_tolerance: Fraction = Fraction(4, 5)
    preemption_satisfaction_threshold: Fraction = Fraction(1)
    non_preemptible_resource_usage_threshold: Resources = field(default_factory=dict)
    allocation_preemption_timeout: int = 10_000
    enable_pool_starvation: bool = True

    @classmethod
    def from_mapping(cls, raw: object, path: str = "config.") -> PoolTreeConfig:
        given = _options(cls, raw, path, _TREE_PARSERS, _TREE_ALIASES, "pool tree")
        config = cls(**given)
        for suffix in ("", "_per_pool"):
            running, total = f"max_running_operation_count{suffix}", f"max_operation_count{suffix}"
            if getattr(config, running) <= getattr(config, total):
                continue
            # The option given is at fault: a total set below the default running count.
            if total in given and running not in given:
                raise InvalidInput(f"{path}{total}", getattr(config, total),
                                   f"must be at least {running} {getattr(config, running)}")
            raise InvalidInput(f"{path}{running}", getattr(config, running),
                               f"must not exceed {total} {getattr(config, total)}")
        return config


def _presets(field_name: str, value: object) -> Mapping[str, PoolConfig]:
    presets: dict[str, PoolConfig] = {}
    for name, raw in mapping(field_name, value).items():
        preset = PoolConfig.from_mapping(raw, f"{field_name}.{_name(field_name, name)}.")
        if "config_presets" in preset.specified:
            raise InvalidInput(
                f"{field_name}.{name}.config_presets", preset.config_presets, "presets do not nest"
            )
        presets[name] = preset
    return MappingProxyType(presets)


def _default_parent(field_name: str, value: object) -> str:
    return ROOT if value == ROOT else _name(field_name, value)


_TREE_PARSERS: dict[str, Callable[[str, object], object]] = {
    "node_tag_filter": _tag_filter,
    "main_resource": _resource_key,
    "max_operation_count": _count,
    "max_operation_count_per_pool": _count,
    "max_running_operation_count": _count,
    "max_running_operation_count_per_pool": _count,
    "default_parent_pool": _default_parent,
    "forbid_immediate_operations_in_root": _boolean,
    "max_ephemeral_pool_per_user": lambda f, v: _integer(f, v, low=1),
    "infer_weight_from_guarantees_share_multiplier": _at_least_one,
    "integral_guarantees": IntegralGuaranteesSettings.from_mapping,
    "pool_config_presets": _presets,
    "preemptive_scheduling_backoff": _milliseconds,
    "fair_share_starvation_timeout": _milliseconds,
    "fair_share_starvation_tolerance": _unit_interval,
    "preemption_satisfaction_threshold": positive,
    "non_preemptible_resource_usage_threshold": parse_resources,
    "allocation_preemption_timeout": _milliseconds,
    "enable_pool_starvation": _boolean,
}
_TREE_ALIASES = {
    "nodes_filter": "node_tag_filter",
    "max_ephemeral_pools_per_user": "max_ephemeral_pool_per_user",
    "infer_weight_from_strong_guarantee_share_multiplier": (
        "infer_weight_from_guarantees_share_multiplier"
    ),
    "infer_weight_from_min_share_ratio_multiplier": "infer_weight_from_guarantees_share_multiplier",
    "fair_share_preemption_timeout": "fair_share_starvation_timeout",
    "fair_share_preemption_tolerance": "fair_share_starvation_tolerance",
    "job_interrupt_timeout": "allocation_preemption_timeout",
}


def tree_option_name(option: str) -> str:
    """A tree option's own name (an alias resolved); an unknown one is refused."""
    return _option_name(option, None, "config.", _TREE_PARSERS, _TREE_ALIASES, "pool tree")


def canonical_tree_options(raw: Mapping[str, object]) -> dict[str, object]:
    """Tree options under their own names, not YTsaurus's aliases: one option set once by
    an alias and again by its name is the same option, changed."""
    return {_TREE_ALIASES.get(str(key), str(key)): value for key, value in raw.items()}




# -- pools and trees ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pool:
    """A pool: ``parent`` None means a child of the root."""

    name: str
    parent: str | None = None
    config: PoolConfig = PoolConfig()
    is_ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class EffectivePool:
    """A pool's resolved options: presets applied, inherited values filled in (``effective_*``
    in YTsaurus's Orchid). The root has one too, built from the tree config."""

    name: str
    parent: str | None
    #: Pool names from the root's child down to this pool.
    path: tuple[str, ...]
    #: The pool's options after its presets (explicit options win over presets).
    config: PoolConfig
    is_ephemeral: bool
    mode: SchedulingMode
    fifo_sort_parameters: tuple[FifoSortParameter, ...]
    forbid_immediate_operations: bool
    create_ephemeral_subpools: bool
    effective_max_operation_count: int
    effective_max_running_operation_count: int
    effective_fair_share_starvation_timeout: int
    effective_fair_share_starvation_tolerance: Fraction
    effective_non_preemptible_resource_usage_threshold: Resources


@dataclass(frozen=True, slots=True)
class PoolTree:
    """A validated pool tree. Build it with :meth:`build`; never mutated."""

    name: str
    config: PoolTreeConfig
    pools: Mapping[str, Pool]
    effective: Mapping[str, EffectivePool]

    @classmethod
    def build(
        cls, name: str, config: PoolTreeConfig, pools: Iterable[Pool], changed: str | None = None
    ) -> PoolTree:
        """Validates every rule and resolves inheritance; raises ``InvalidInput``. A cycle
        is blamed on ``changed`` (the pool being set) when it is part of it."""
        _name("tree", name)
        by_name: dict[str, Pool] = {}
        for pool in pools:
            _check_pool_name(pool)
            if pool.name in by_name:
                raise InvalidInput("pool", pool.name, f"pool names must be unique in tree {name!r}")
            by_name[pool.name] = pool
        order = _topological(by_name, changed)
        effective: dict[str, EffectivePool] = {}
        depth: dict[str | None, int] = {None: 0}
        for pool_name in order:
            pool = by_name[pool_name]
            depth[pool_name] = depth[pool.parent] + 1
            if depth[pool_name] > MAX_POOL_DEPTH:
                raise InvalidInput(f"pool {pool_name}: parent", pool.parent, _TOO_DEEP)
            effective[pool_name] = _resolve(pool, config, effective)
        tree = cls(name, config, MappingProxyType(by_name), MappingProxyType(effective))
        tree._check_guarantees()
        return tree

    # -- navigation -----------------------------------------------------------------------

    def children(self, pool: str | None) -> list[str]:
        """Child pools of ``pool`` (None or ``ROOT``: of the root), by name."""
        parent = None if pool == ROOT else pool
        return sorted(p.name for p in self.pools.values() if p.parent == parent)

    def ancestors(self, pool: str) -> list[str]:
        """``pool`` and its ancestors up to, not including, the root."""
        chain = []
        current: str | None = pool
        while current is not None:
            chain.append(current)
            current = self.pools[current].parent
        return chain

    def late_rule_problems(self) -> list[InvalidInput]:
        """What rules added after trees were stored refuse (a change may not bring one; a
        stored tree holding one still loads):

        * settings under which operations would make ephemeral pools where none may be:
          under a fifo pool (it holds operations only), or under an ephemeral pool (the child
          would keep it alive after its last operation, counted against its user's
          ``max_ephemeral_pool_per_user``);
        * a child's strong guarantee of a resource its parent guarantees none of, as
          YTsaurus's master refuses it (2026-11-30): the parent's inferred share of it
          scaled the child's whole guarantee down, main resource too;
        * an ``ephemeral_subpool_config`` whose max_running_operation_count exceeds its
          max_operation_count, as a pool's may not (2026-11-30): every operation started in
          the pool failed, naming a ``pool$user`` that did not exist."""
        problems = []
        keep = "gone with its last operation; name it in the tree's document (pool-tree " \
            "apply) to keep it"
        parent = self.config.default_parent_pool
        if parent in self.pools and self.pools[parent].is_ephemeral:
            problems.append(InvalidInput("config.default_parent_pool", parent,
                                         f"is an ephemeral pool, {keep}"))
        elif parent in self.pools and self.effective[parent].mode is SchedulingMode.FIFO:
            problems.append(InvalidInput("config.default_parent_pool", parent,
                                         "is a fifo pool, which holds operations only"))
        for name in sorted(self.pools):
            if self.pools[name].is_ephemeral and self.effective[name].create_ephemeral_subpools:
                problems.append(InvalidInput(f"pool {name}: create_ephemeral_subpools", True,
                                             f"pool {name} is ephemeral, {keep}"))
            template = self.effective[name].config.ephemeral_subpool_config
            running, total = (
                (None, None) if template is None
                else (template.max_running_operation_count, template.max_operation_count)
            )
            if running is not None and total is not None and running > total:
                problems.append(InvalidInput(
                    f"pool {name}: ephemeral_subpool_config.max_running_operation_count",
                    running, f"must not exceed max_operation_count {total}"))
            above = self.pools[name].parent
            if above is None:  # the root's guarantee is the whole tree
                continue
            own = self.effective[above].config.strong_guarantee_resources
            for resource, amount in sorted(
                self.effective[name].config.strong_guarantee_resources.items()
            ):
                if amount and resource not in own:
                    problems.append(InvalidInput(
                        f"pool {name}: strong_guarantee_resources.{resource}", amount,
                        f"its parent {above} guarantees no {resource}: give it one"))
        return problems

    def parents_first(self) -> list[str]:
        """The pools, each after its parent (by depth, then name)."""
        return sorted(self.pools, key=lambda name: (len(self.ancestors(name)), name))

    # -- changes --------------------------------------------------------------------------

    def with_pool(self, pool: Pool) -> PoolTree:
        """The tree with ``pool`` added or replaced, validated."""
        return PoolTree.build(self.name, self.config, {**self.pools, pool.name: pool}.values(),
                              changed=pool.name)

    def without_pool(self, name: str) -> PoolTree:
        if self.children(name):
            raise InvalidInput("pool", name, "has child pools; remove them first")
        return PoolTree.build(
            self.name, self.config, (p for p in self.pools.values() if p.name != name)
        )

    def with_config(self, config: PoolTreeConfig) -> PoolTree:
        return PoolTree.build(self.name, config, self.pools.values())

    def ephemeral_pool(self, name: str) -> Pool:
        """The pool made for an operation whose pool does not exist: under the tree's
        default_parent_pool. Named as a pool one creates: a ``$`` in it would read as
        another pool's ephemeral subpool (``pool$user``)."""
        _name("pool", name)
        parent = self.config.default_parent_pool
        # One that names no pool (never made, or deleted since) means the root, as in
        # YTsaurus: every operation into a new pool failed, on an option the user never gave.
        # So does an ephemeral pool (made by an operation into a pool of that name, or stored
        # before 2026-11-29): a pool under it would keep it alive.
        if parent == ROOT or parent not in self.pools or self.pools[parent].is_ephemeral:
            return Pool(name, None, PoolConfig(), True)
        return Pool(name, parent, PoolConfig(), True)

    def ephemeral_subpool(self, pool: str, user: str) -> Pool:
        """The ``pool$user`` subpool a ``create_ephemeral_subpools`` pool starts operations in,
        configured from its ``ephemeral_subpool_config``."""
        _name("user", user)
        resolved = self.effective[pool]
        if not resolved.create_ephemeral_subpools:
            raise InvalidInput("pool", pool, "does not have create_ephemeral_subpools")
        template = resolved.config.ephemeral_subpool_config or EphemeralSubpoolConfig()
        options: dict[str, Any] = {"mode": template.mode}
        if template.max_running_operation_count is not None:
            options["max_running_operation_count"] = template.max_running_operation_count
        if template.max_operation_count is not None:
            options["max_operation_count"] = template.max_operation_count
        if template.resource_limits:
            options["resource_limits"] = template.resource_limits
        return Pool(
            f"{pool}{EPHEMERAL_DELIMITER}{user}",
            pool,
            PoolConfig(**options, specified=frozenset(options)),
            is_ephemeral=True,
        )

    # -- compilation ----------------------------------------------------------------------

    def fair_share_snapshot(
        self,
        total_resources: Resources,
        operations: Sequence[OperationSnapshot] = (),
        integral_states: Mapping[str, IntegralState] | None = None,
    ) -> TreeSnapshot:
        """The fair-share input: every pool with its effective attributes; an integral pool
        with its state from ``integral_states`` (none: an empty volume)."""
        states = integral_states or {}
        pools = []
        for pool_name in self.effective:
            resolved = self.effective[pool_name]
            integral = resolved.config.integral_guarantees
            pools.append(
                PoolSnapshot(
                    name=pool_name,
                    parent=resolved.parent,
                    mode=resolved.mode,
                    weight=resolved.config.weight,
                    strong_guarantee_resources=resolved.config.strong_guarantee_resources,
                    resource_limits=resolved.config.resource_limits,
                    fifo_sort_parameters=resolved.fifo_sort_parameters,
                    starvation=StarvationSettings(
                        resolved.effective_fair_share_starvation_tolerance,
                        resolved.effective_fair_share_starvation_timeout,
                    ),
                    integral_guarantees=(
                        IntegralGuarantees() if integral is None else integral.snapshot()
                    ),
                    integral_state=states.get(pool_name, IntegralState()),
                )
            )
        return TreeSnapshot(
            total_resources=total_resources,
            pools=tuple(pools),
            operations=tuple(operations),
            main_resource=self.config.main_resource,
            infer_weight_from_guarantees_share_multiplier=(
                self.config.infer_weight_from_guarantees_share_multiplier
            ),
            starvation=StarvationSettings(
                self.config.fair_share_starvation_tolerance,
                self.config.fair_share_starvation_timeout,
            ),
            enable_pool_starvation=self.config.enable_pool_starvation,
            integral_guarantees=self.config.integral_guarantees.snapshot(),
        )

    def to_mapping(self) -> dict[str, object]:
        """The YAML shape :func:`load_pool_tree` reads (explicit options only)."""

        def subtree(parent: str | None) -> dict[str, object]:
            result: dict[str, object] = {}
            for child in self.children(parent):
                body = self.pools[child].config.to_mapping()
                nested = subtree(child)
                if nested:
                    body["pools"] = nested
                result[child] = body
            return result

        defaults = PoolTreeConfig()
        config = {
            f.name: _plain(getattr(self.config, f.name))
            for f in fields(self.config)
            if f.name != "pool_config_presets"
            and getattr(self.config, f.name) != getattr(defaults, f.name)
        }
        if self.config.pool_config_presets:
            config["pool_config_presets"] = {
                name: preset.to_mapping()
                for name, preset in self.config.pool_config_presets.items()
            }
        return {"name": self.name, "config": config, "pools": subtree(None)}

    # -- validation -----------------------------------------------------------------------

    def _check_guarantees(self) -> None:
        """Guarantees name ``main_resource``; children's guarantees fit in the parent's
        (compared on the main resource and on every resource the parent names)."""
        main = self.config.main_resource
        for resolved in self.effective.values():
            guarantee = resolved.config.strong_guarantee_resources
            if guarantee and main not in guarantee:
                raise InvalidInput(
                    f"pool {resolved.name}: strong_guarantee_resources",
                    dict(guarantee),
                    f"must contain the tree's main_resource {main!r}",
                )
        for parent in self.effective.values():
            children = [self.effective[c] for c in self.children(parent.name)]
            own = parent.config.strong_guarantee_resources
            for resource in sorted({main, *own}):
                wanted = sum(c.config.strong_guarantee_resources.get(resource, 0) for c in children)
                if wanted > own.get(resource, 0):
                    raise InvalidInput(
                        f"pool {parent.name}: strong_guarantee_resources.{resource}",
                        own.get(resource, 0),
                        f"is less than its children's sum {wanted}",
                    )
            _check_integral_children(parent, children)


def _integral_amounts(pool: EffectivePool) -> tuple[Resources, Resources]:
    integral = pool.config.integral_guarantees or PoolIntegralGuarantees()
    return integral.burst_guarantee_resources, integral.resource_flow


def _check_integral_children(parent: EffectivePool, children: Sequence[EffectivePool]) -> None:
    """As YTsaurus's master: an integral pool has no children with burst guarantees or
    resource flows, and children's burst guarantees and flows fit in the parent's (a resource
    a child names, the parent names too)."""
    integral = parent.config.integral_guarantees
    if integral is not None and integral.is_integral:
        for child in children:
            burst, flow = _integral_amounts(child)
            if any(burst.values()) or any(flow.values()):
                raise InvalidInput(
                    f"pool {child.name}: integral_guarantees",
                    _plain(child.config.integral_guarantees),
                    f"integral pool {parent.name} cannot have children with integral resources",
                )
    for index, option in enumerate(("burst_guarantee_resources", "resource_flow")):
        own = _integral_amounts(parent)[index]
        named = {r for child in children for r in _integral_amounts(child)[index]}
        for resource in sorted(named):
            wanted = sum(_integral_amounts(c)[index].get(resource, 0) for c in children)
            if wanted > own.get(resource, 0):
                raise InvalidInput(
                    f"pool {parent.name}: integral_guarantees.{option}.{resource}",
                    own.get(resource, 0),
                    f"is less than its children's sum {wanted}",
                )


def _check_pool_name(pool: Pool) -> None:
    if pool.name == ROOT:
        raise InvalidInput("pool", pool.name, "is the root's reserved name")
    plain = pool.name.split(EPHEMERAL_DELIMITER, 1) if pool.is_ephemeral else [pool.name]
    for part in plain:
        _name("pool", part)
    if pool.parent is not None:
        _name(f"pool {pool.name}: parent", pool.parent)


def _topological(pools: Mapping[str, Pool], first: str | None = None) -> list[str]:
    """Parents before children; unknown parents and cycles are errors. The walk starts at
    ``first``, so a cycle through it names it (``pool p: parent: makes a cycle (got 'c')``
    for the pool whose parent was set), not whichever of the cycle sorts first."""
    order: list[str] = []
    state: dict[str, bool] = {}  # False: being visited, True: done
    for start in [*([first] if first in pools else []), *sorted(pools)]:
        chain = []
        current: str | None = start
        while current is not None and current not in state:
            state[current] = False
            chain.append(current)
            parent = pools[current].parent
            if parent is not None and parent not in pools:
                raise InvalidInput(f"pool {current}: parent", parent, "no such pool in the tree")
            current = parent
        if current is not None and not state[current]:
            raise InvalidInput(f"pool {current}: parent", pools[current].parent, "makes a cycle")
        for name in reversed(chain):
            state[name] = True
            order.append(name)
    return order


def _resolve(
    pool: Pool, tree: PoolTreeConfig, resolved: Mapping[str, EffectivePool]
) -> EffectivePool:
    config = PoolConfig()
    for preset in pool.config.config_presets:
        if preset not in tree.pool_config_presets:
            raise InvalidInput(
                f"pool {pool.name}: config_presets", preset, "no such preset in the tree"
            )
        config = config.updated(tree.pool_config_presets[preset])
    config = config.updated(pool.config)
    parent = resolved[pool.parent] if pool.parent is not None else None
    mode = config.mode or SchedulingMode.FAIR_SHARE
    if mode is SchedulingMode.FIFO and config.create_ephemeral_subpools:
        # Each operation would make a subpool it cannot hold: every start would fail.
        raise InvalidInput(f"pool {pool.name}: create_ephemeral_subpools", True,
                           "a fifo pool holds operations only, not subpools")
    if parent is not None and parent.mode is SchedulingMode.FIFO:
        raise InvalidInput(
            f"pool {pool.name}: parent", pool.parent, "is a fifo pool, which holds operations only"
        )
    max_operations = (
        config.max_operation_count
        if config.max_operation_count is not None
        else tree.max_operation_count_per_pool
    )
    max_running = (
        config.max_running_operation_count
        if config.max_running_operation_count is not None
        else tree.max_running_operation_count_per_pool
    )
    if config.max_running_operation_count is not None and config.max_operation_count is not None:
        # Like YTsaurus, only two explicit values are compared: a default never makes a pool
        # invalid (oversubscription is allowed; the lower limit simply binds first).
        if max_running > max_operations:
            raise InvalidInput(f"pool {pool.name}: max_running_operation_count", max_running,
                               f"must not exceed max_operation_count {max_operations}")
    if config.weight is not None and config.weight <= 0:
        # Pools built in code skip the option parser, which checks this too.
        raise InvalidInput(f"pool {pool.name}: weight", config.weight, "must be positive")
    return EffectivePool(
        name=pool.name,
        parent=pool.parent,
        path=(*(parent.path if parent else ()), pool.name),
        config=config,
        is_ephemeral=pool.is_ephemeral,
        mode=mode,
        fifo_sort_parameters=config.fifo_sort_parameters
        or (FifoSortParameter.WEIGHT, FifoSortParameter.START_TIME),
        forbid_immediate_operations=bool(config.forbid_immediate_operations),
        create_ephemeral_subpools=bool(config.create_ephemeral_subpools),
        effective_max_operation_count=max_operations,
        effective_max_running_operation_count=max_running,
        effective_fair_share_starvation_timeout=_inherit(
            config.fair_share_starvation_timeout,
            parent.effective_fair_share_starvation_timeout if parent else None,
            tree.fair_share_starvation_timeout,
        ),
        effective_fair_share_starvation_tolerance=_inherit(
            config.fair_share_starvation_tolerance,
            parent.effective_fair_share_starvation_tolerance if parent else None,
            tree.fair_share_starvation_tolerance,
        ),
        effective_non_preemptible_resource_usage_threshold=_inherit(
            config.non_preemptible_resource_usage_threshold,
            parent.effective_non_preemptible_resource_usage_threshold if parent else None,
            tree.non_preemptible_resource_usage_threshold,
        ),
    )


def _inherit(own: T | None, parents: T | None, trees: T) -> T:
    """Pool value, else the parent's effective value, else the tree's."""
    if own is not None:
        return own
    return parents if parents is not None else trees


def tree_resources(config: PoolTreeConfig, nodes: Iterable[ClusterNode]) -> dict[str, int]:
    """A tree's capacity: the summed resources of the nodes its ``node_tag_filter`` selects."""
    totals: dict[str, int] = {}
    for node in nodes:
        if matches_tag_filter(config.node_tag_filter, node.tags):
            for key, amount in node.resources.items():
                totals[key] = totals.get(key, 0) + amount
    return totals


def tree_document(text: str) -> Mapping[str, Any]:
    """A whole-tree document as YAML, read as the scheduler config is (``load_yaml``): a key
    given twice in any mapping is refused, with both lines (PyYAML kept the last one without
    a word: a pool named twice lost its first definition, and its subtree was deleted)."""
    bounded = bounded_text("tree", text, MAX_TREE_DOCUMENT)
    return mapping("tree", load_yaml("tree", bounded, document=True))


def pool_tree_document(
    tree: PoolTree, config: Mapping[str, object], leave_out: Collection[str] = ()
) -> dict[str, object]:
    """The document of :func:`load_pool_tree` for ``tree``: its ``config`` as stored, and its
    pools nested, each with the options given explicitly. Loading it gives ``tree`` back,
    and applying it to ``tree`` changes nothing. ``leave_out``: pools not declared (a
    tree's ephemeral pools, which an apply keeps anyway)."""
    children: dict[str | None, list[Pool]] = {}
    for pool in sorted(tree.pools.values(), key=lambda p: p.name):
        if pool.name not in leave_out:
            children.setdefault(pool.parent, []).append(pool)

    def nested(parent: str | None) -> dict[str, object]:
        return {
            pool.name: {**pool.config.to_mapping(),
                        **({"pools": nested(pool.name)} if pool.name in children else {})}
            for pool in children.get(parent, ())
        }

    return {"name": tree.name, **({"config": dict(config)} if config else {}),
            "pools": nested(None)}


def load_pool_tree(text: str, name: str | None = None) -> PoolTree:
    """A whole tree from YAML::

        name: physical
        config: {node_tag_filter: gpu, main_resource: cpu}
        pools:
          project-root:
            strong_guarantee_resources: {cpu: 100}
            pools:
              project-adhoc: {strong_guarantee_resources: {cpu: 80}}

    Every pool's options sit next to its ``pools:`` (its children). Loading the same text twice
    gives equal trees, so an apply can diff the result against the stored tree. A text
    without ``name:`` is the tree ``name``, when given.
    """
    data = tree_document(text)
    unknown = set(data) - {"name", "config", "pools"}
    if unknown:
        key = sorted(unknown)[0]
        raise InvalidInput(key, data[key], "unknown tree key (expected name, config, pools)")
    if "name" not in data:
        if name is None:
            raise InvalidInput("name", None, "a tree needs a name")
        data = {**data, "name": name}  # `pool-tree create NAME --config-file` names it
    string("name", data["name"])  # the tree's name rules are PoolTree.build's
    config = PoolTreeConfig.from_mapping(data.get("config") or {})
    pools: dict[str, Pool] = {}

    # Checked while walking, not after: a YAML alias repeats a subtree without its text, so a
    # few lines could otherwise make this walk (and Python's stack) exponentially long.
    def collect(raw: object, parent: str | None, path: str, depth: int) -> None:
        for name, body in mapping(path.rstrip(".") or "pools", raw or {}).items():
            if name in pools:
                raise InvalidInput(f"{path}{name}", name,
                                   f"pool names must be unique in tree {data['name']!r}")
            if depth > MAX_POOL_DEPTH:
                raise InvalidInput(f"{path}{name}", name, _TOO_DEEP)
            options = dict(mapping(f"{path}{name}", body or {}))
            children = options.pop("pools", None)
            pools[name] = Pool(
                _name(f"{path}{name}", name),
                parent,
                PoolConfig.from_mapping(options, f"{path}{name}."),
            )
            collect(children, name, f"{path}{name}.pools.", depth + 1)

    collect(data.get("pools"), None, "pools.", 1)
    return PoolTree.build(str(data["name"]), config, pools.values())
