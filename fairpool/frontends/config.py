"""Scheduler config (seed 004, Anyscale's scheduler config, modelled on Kueue): parse and validate.

This is scope item 1 of issue 4 -- the schema and its validation. ``load_config(text)`` turns a
YAML document into frozen, typed objects, or raises ``ConfigError`` listing *every* problem it
found, each with its path (``resource_queues[0].resource_groups[1].flavors[0].resources[2]
.nominal_quota``), a message and, when known, the line. ``validate_config(data)`` does the same
for an already parsed value (a JSON body). ``warnings(config)`` lists advisories that do not
make a config invalid (no catch-all rule, unreachable rules, unused flavors, ...).

Pure: no I/O besides parsing the given text, no clock, no randomness. Quotas become exact
integer milli-units (``0.5`` -> ``500``); no float survives validation. The decisions taken
where the seed is silent are listed in ``docs/config.md``.

The validator is hand-written rather than a pydantic model on purpose: it must report shape
errors *and* cross-field errors (unknown flavor, overlapping covered sets, duplicate names) in
one pass, even when some parts of the document are malformed, with the seed's paths and
messages. The real product's SDK does the same with frozen dataclasses and a ``_validate_*``
method per field.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, TypeVar

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import Node

from fairpool.errors import FairpoolError, InvalidInput, is_unicode, one_line
from fairpool.frontends.labels import RESERVED_LABEL_KEYS
from fairpool.frontends.names import (
    DOT_REASON,
    DOT_SEGMENTS,
    MAX_NAME,
    MAX_VERSION,
    SLASH_REASON,
    printing_problem,
)
from fairpool.frontends.yaml_text import (
    JSON_EXPONENT,
    ROOT,
    Path,
    UserLoader,
    format_path,
    number_problem,
)
from fairpool.frontends.yaml_text import int_text as _int_text
from fairpool.frontends.yaml_text import short as _short

__all__ = [
    "MAX_DOCUMENT",
    "MAX_NAME",
    "MAX_PRIORITY",
    "MAX_QUOTA",
    "MAX_VERSION",
    "RESERVED_LABEL_KEYS",
    "ROOT",
    "ConfigError",
    "ConfigIssue",
    "FlavorQuotas",
    "MatchExpression",
    "OnViolation",
    "Operator",
    "Preemption",
    "PreemptionPolicy",
    "PriorityPolicy",
    "Resource",
    "ResourceFlavor",
    "ResourceGroup",
    "ResourceQueue",
    "ResourceQuota",
    "SchedulerConfig",
    "SchedulingRule",
    "format_path",
    "load_config",
    "validate_config",
    "warnings",
]


# -- vocabulary ------------------------------------------------------------------------------


class Resource(StrEnum):
    """The closed, case-sensitive set of resource axes a queue may cover."""

    GPU = "gpu"
    CPU = "cpu"
    MEMORY_GB = "memory_gb"
    TPU = "tpu"


class Operator(StrEnum):
    """A match expression's operator."""

    IN = "in"
    NOT_IN = "not_in"
    EXISTS = "exists"
    DOES_NOT_EXIST = "does_not_exist"


#: Operators that compare against ``values`` (which are then required and non-empty).
VALUE_OPERATORS: Final = frozenset({Operator.IN, Operator.NOT_IN})


class PreemptionPolicy(StrEnum):
    """``preemption.within_resource_queue``."""

    NEVER = "never"
    LOWER_PRIORITY = "lower_priority"


class OnViolation(StrEnum):
    """``priority_policy.on_violation``."""

    REJECT = "reject"
    FORCE_UPDATE = "force_update"


#: ``nominal_quota`` upper bound: 10**12 units, so that milli-units fit a signed 64-bit integer.
MAX_QUOTA: Final = 10**12
#: Priorities are 32-bit signed integers in Kueue (``WorkloadPriorityClass.value``).
MAX_PRIORITY: Final = 2**31 - 1
#: Characters of one document: seed configs are a few KB; a stored version stays bounded.
MAX_DOCUMENT: Final = 60_000
#: At most this many values in all of a document's ``advanced_instance_config`` mappings, a
#: value counted each time an alias reaches it: what a document expands to (in memory, in
#: ``config get -o json``) stays bounded, however many flavors alias one large anchor.
MAX_OPAQUE_VALUES: Final = 100_000
#: Decimal places allowed in ``nominal_quota``; milli-units are then exact.
QUOTA_DECIMALS: Final = 3

_TOP_KEYS: Final = ("resource_flavors", "resource_queues", "scheduling_rules")
_FLAVOR_KEYS: Final = ("name", "selector", "advanced_instance_config")
_QUEUE_KEYS: Final = ("name", "preemption", "resource_groups")
_PREEMPTION_KEYS: Final = ("within_resource_queue",)
_GROUP_KEYS: Final = ("covered_resources", "flavors")
_FLAVOR_QUOTA_KEYS: Final = ("name", "resources")
_RESOURCE_KEYS: Final = ("name", "nominal_quota")
_RULE_KEYS: Final = ("selector", "resource_queue", "priority_policy")
_POLICY_KEYS: Final = ("default", "min", "max", "on_violation")
_EXPRESSION_KEYS: Final = ("key", "operator", "values")


# -- the typed result ------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchExpression:
    """``{key, operator, values}``: a Kubernetes-style label match."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"key": self.key, "operator": self.operator.value}
        if self.operator in VALUE_OPERATORS:
            result["values"] = list(self.values)
        return result


@dataclass(frozen=True)
class ResourceFlavor:
    """A named compute category. An empty selector matches every workload."""

    name: str
    selector: tuple[MatchExpression, ...] = ()
    #: Opaque, passed through verbatim (deep-frozen: mappings are read-only, lists tuples).
    advanced_instance_config: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"name": self.name}
        if self.selector:
            result["selector"] = [expression.to_dict() for expression in self.selector]
        if self.advanced_instance_config is not None:
            result["advanced_instance_config"] = _thaw(self.advanced_instance_config)
        return result


@dataclass(frozen=True)
class ResourceQuota:
    """One quota for one resource of one flavor, in exact milli-units (``None``: unlimited)."""

    name: Resource
    nominal_quota_milli: int | None = None

    @property
    def nominal_quota(self) -> Decimal | None:
        """The quota as written (exact), e.g. ``Decimal("0.5")``."""
        if self.nominal_quota_milli is None:
            return None
        return Decimal(self.nominal_quota_milli).scaleb(-QUOTA_DECIMALS)

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"name": self.name.value}
        if self.nominal_quota_milli is not None:
            whole, rest = divmod(self.nominal_quota_milli, 10**QUOTA_DECIMALS)
            # Integral quotas stay integers; others are at most 15 significant digits (<=
            # MAX_QUOTA with 3 decimals), which a float holds and prints back exactly.
            result["nominal_quota"] = whole if rest == 0 else float(self.nominal_quota or 0)
        return result


@dataclass(frozen=True)
class FlavorQuotas:
    """A flavor's entry in a resource group. A covered resource it omits is unlimited."""

    name: str
    resources: tuple[ResourceQuota, ...] = ()

    def quota_milli(self, resource: Resource | str) -> int | None:
        """The quota of one resource in milli-units, ``None`` when unlimited."""
        for quota in self.resources:
            if quota.name == resource:
                return quota.nominal_quota_milli
        return None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"name": self.name}
        if self.resources:
            result["resources"] = [quota.to_dict() for quota in self.resources]
        return result


@dataclass(frozen=True)
class ResourceGroup:
    """Resources governed together, with per-flavor quotas tried in listed order."""

    covered_resources: tuple[Resource, ...]
    flavors: tuple[FlavorQuotas, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "covered_resources": [resource.value for resource in self.covered_resources],
            "flavors": [flavor.to_dict() for flavor in self.flavors],
        }


@dataclass(frozen=True)
class Preemption:
    """``within_resource_queue``; ``None`` (unset) behaves as ``never``."""

    within_resource_queue: PreemptionPolicy | None = None

    @property
    def preempts_lower_priority(self) -> bool:
        return self.within_resource_queue is PreemptionPolicy.LOWER_PRIORITY

    def to_dict(self) -> dict[str, Any]:
        if self.within_resource_queue is None:
            return {}
        return {"within_resource_queue": self.within_resource_queue.value}


@dataclass(frozen=True)
class ResourceQueue:
    """A queue; without resource groups it is a passthrough (admits everything, no quota)."""

    name: str
    preemption: Preemption | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()

    @property
    def is_passthrough(self) -> bool:
        return not self.resource_groups

    def spec(self) -> dict[str, Any]:
        """What the queue does, however it is written (its immutability is of this), as JSON
        holds it (each version stores its queues' specs): unset ``preemption``, ``{}`` and
        ``never`` are one; covered resources are a set, sorted; a resource without
        ``nominal_quota`` is as unlisted (unlimited), and a flavor's quotas are a set, sorted.
        Groups and flavors keep their order: flavors are tried in it, and an admission
        records one flavor per group in it."""
        groups = [
            [
                sorted(set(group.covered_resources)),
                [
                    [flavor.name, sorted(
                        [quota.name, quota.nominal_quota_milli] for quota in flavor.resources
                        if quota.nominal_quota_milli is not None
                    )]
                    for flavor in group.flavors
                ],
            ]
            for group in self.resource_groups
        ]
        preempts = self.preemption is not None and self.preemption.preempts_lower_priority
        return {"preempts": preempts, "resource_groups": groups}

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"name": self.name}
        if self.preemption is not None:
            result["preemption"] = self.preemption.to_dict()
        if self.resource_groups:
            result["resource_groups"] = [group.to_dict() for group in self.resource_groups]
        return result


@dataclass(frozen=True)
class PriorityPolicy:
    """Bounds and default of the priority a rule assigns; every field optional."""

    default: int | None = None
    min: int | None = None
    max: int | None = None
    on_violation: OnViolation | None = None

    @property
    def effective_default(self) -> int:
        """The priority of a workload that requests none (seed: "If unset, 0")."""
        return 0 if self.default is None else self.default

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key in ("default", "min", "max"):
            value = getattr(self, key)
            if value is not None:
                result[key] = value
        if self.on_violation is not None:
            result["on_violation"] = self.on_violation.value
        return result


@dataclass(frozen=True)
class SchedulingRule:
    """Routes matching workloads to a queue. An empty selector is a catch-all."""

    resource_queue: str
    selector: tuple[MatchExpression, ...] = ()
    priority_policy: PriorityPolicy | None = None

    @property
    def is_catch_all(self) -> bool:
        return not self.selector

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if self.selector:
            result["selector"] = [expression.to_dict() for expression in self.selector]
        result["resource_queue"] = self.resource_queue
        if self.priority_policy is not None:
            result["priority_policy"] = self.priority_policy.to_dict()
        return result


@dataclass(frozen=True)
class SchedulerConfig:
    """A validated config. The empty config (no keys) is valid and admits everything."""

    resource_flavors: tuple[ResourceFlavor, ...] = ()
    resource_queues: tuple[ResourceQueue, ...] = ()
    scheduling_rules: tuple[SchedulingRule, ...] = ()

    def flavor(self, name: str) -> ResourceFlavor:
        for flavor in self.resource_flavors:
            if flavor.name == name:
                return flavor
        raise KeyError(name)

    def queue(self, name: str) -> ResourceQueue:
        for queue in self.resource_queues:
            if queue.name == name:
                return queue
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The canonical document: keys in the seed's order, empty lists and unset fields
        omitted (the product collapses an empty list to an absent key), quotas as numbers."""
        result: dict[str, Any] = {}
        if self.resource_flavors:
            result["resource_flavors"] = [flavor.to_dict() for flavor in self.resource_flavors]
        if self.resource_queues:
            result["resource_queues"] = [queue.to_dict() for queue in self.resource_queues]
        if self.scheduling_rules:
            result["scheduling_rules"] = [rule.to_dict() for rule in self.scheduling_rules]
        return result


# -- errors ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigIssue:
    """One problem (or advisory): where, what, and the line when the text is known."""

    path: str
    message: str
    line: int | None = field(default=None, compare=False)
    #: The document is well formed but names something that does not exist (or changes
    #: what an applied version fixed); the API answers 400 for these, 422 for shape errors.
    reference: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"path": self.path, "message": self.message}
        if self.line is not None:
            result["line"] = self.line
        return result


class ConfigError(FairpoolError, ValueError):
    """The config is invalid; ``errors`` holds every problem found, in document order."""

    def __init__(self, errors: Iterable[ConfigIssue]) -> None:
        self.errors: tuple[ConfigIssue, ...] = tuple(errors)
        details = "; ".join(str(issue) for issue in self.errors)
        super().__init__(f"{self.summary}: {details}")

    @property
    def summary(self) -> str:
        """``invalid scheduler config (N problems)``, without the problems."""
        count = len(self.errors)
        return f"invalid scheduler config ({count} {'problem' if count == 1 else 'problems'})"

    def pairs(self) -> list[tuple[str, str]]:
        """``(path, message)`` for each error."""
        return [(issue.path, issue.message) for issue in self.errors]


# -- YAML ------------------------------------------------------------------------------------


class _ConfigLoader(UserLoader):
    """User-written YAML as everywhere (``UserLoader``: duplicate keys recorded with both lines,
    ``1e3`` a number, dates text, the text of every number and boolean kept), plus what the
    config's messages need: every path's line, and any value YAML cannot build (``!!int abc``)
    an error at its line and column. The kept text makes ``nominal_quota`` exact (``Decimal``
    of the text, never of a binary float) and messages show a value as written (``010``, not
    YAML 1.1's 8)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.lines: dict[Path, int] = {}

    def at_line(self, path: Path, line: int) -> None:
        self.lines.setdefault(path, line)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """Any failure to build a value (``!!int abc``, an integer with too many digits)
        becomes a YAML error that points at the node."""
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as error:
            raise ConstructorError(
                None,
                None,
                f"cannot read {_short(str(node.value))!s} as {node.tag.rsplit(':', 1)[-1]}: "
                f"{_short(str(error), 80)}",
                node.start_mark,
            ) from error


class _StoredLoader(_ConfigLoader):
    """YAML as fairpool read it before 2026-11-29: ``1e3`` was a string and a second merge key
    won silently."""

    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML's own class attribute)
        first: [(tag, regexp) for tag, regexp in resolvers if regexp is not JSON_EXPONENT]
        for first, resolvers in _ConfigLoader.yaml_implicit_resolvers.items()
    }
    one_merge = False


def _parse(text: str, earlier: bool) -> tuple[Any, _ConfigLoader]:
    loader: _ConfigLoader | None = None
    try:
        # The reader checks that every character is one YAML allows.
        loader = made = (_StoredLoader if earlier else _ConfigLoader)(text)
        node = loader.get_single_node()
        if node is None:
            return None, made
        loader.survey(node)
        return made.construct_document(node), made
    except yaml.MarkedYAMLError as error:
        raise ConfigError([_yaml_issue(error)]) from error
    except yaml.YAMLError as error:
        raise ConfigError([ConfigIssue(ROOT, f"invalid YAML: {one_line(str(error))}")]) from error
    except RecursionError as error:
        raise ConfigError([ConfigIssue(ROOT, "invalid YAML: nested too deeply")]) from error
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_issue(error: yaml.MarkedYAMLError) -> ConfigIssue:
    mark = error.problem_mark or error.context_mark
    words = [part for part in (error.context, error.problem) if part]
    message = "invalid YAML: " + one_line(", ".join(words) or "syntax error")
    if mark is None:
        return ConfigIssue(ROOT, message)
    return ConfigIssue(
        ROOT, f"{message} (line {mark.line + 1}, column {mark.column + 1})", mark.line + 1
    )


# -- entry points ----------------------------------------------------------------------------


def load_config(text: str, *, stored: bool = False) -> SchedulerConfig:
    """Parse and validate a scheduler config document.

    Raises ``ConfigError`` with every problem found (``InvalidInput`` for a ``text`` that is
    no string, as the API refuses its body's: a TypeError embedded). An empty document,
    one holding only comments, ``null`` or ``{}`` is the empty config. ``stored``: a version
    already applied, read by today's rules, or, where they refuse it, by those before
    2026-11-29 (``earlier``), so that every version keeps loading (every pass reads the active
    one, every apply all of them): ``1e3`` was text then, and is a number in versions applied
    since; ``nominal_quota: 010`` was 8. Under either rules a stored version's flavors each
    have a budget of ``advanced_instance_config`` values of their own, as every version
    applied before the budget became the document's had (later in 2026-11-29).
    """
    if not isinstance(text, str):
        raise InvalidInput("document", text, "must be a string")
    if stored:
        try:
            return _load(text, earlier=False, stored=True)
        except ConfigError:
            pass  # applied under the earlier rules
    return _load(text, earlier=stored, stored=stored)


def _load(text: str, earlier: bool, stored: bool) -> SchedulerConfig:
    if len(text) > MAX_DOCUMENT:
        raise ConfigError([ConfigIssue(
            ROOT, f"the document has {len(text)} characters; at most {MAX_DOCUMENT} are read"
        )])
    data, loader = _parse(text, earlier)
    config, issues = _check(data, loader.lines, loader.written, earlier, stored)
    # The checker reports a mapping's own problems (unknown keys, cross-field rules) after
    # its fields': sorted by line (stably), they come in document order. Duplicate keys
    # first: the rest was checked on the value PyYAML kept (the last one).
    issues.sort(key=lambda issue: issue.line or 0)
    twice = [ConfigIssue(format_path(path), message, line)
             for path, message, line in loader.duplicates]
    if twice or issues or config is None:
        raise ConfigError([*twice, *issues])
    return config


def validate_config(
    data: object,
    *,
    lines: Mapping[Path, int] | None = None,
    written: Mapping[Path, tuple[object, str]] | None = None,
) -> SchedulerConfig:
    """Validate an already parsed document (e.g. a JSON body); ``None`` is the empty config.

    ``lines`` maps paths to source lines and ``written`` paths to a number's or boolean's
    value and its source    text; both come from the YAML loader and are optional.
    """
    config, issues = _check(data, lines or {}, written or {}, False, False)
    if issues or config is None:
        raise ConfigError(issues)
    return config


def _check(
    data: object, lines: Mapping[Path, int], written: Mapping[Path, tuple[object, str]],
    earlier: bool, stored: bool,
) -> tuple[SchedulerConfig | None, list[ConfigIssue]]:
    checker = _Checker(lines, written, earlier, stored)
    config = checker.config(data)
    return config, checker.issues


# -- the validator ---------------------------------------------------------------------------

_E = TypeVar("_E", bound=StrEnum)


class _Checker:
    """Walks a parsed document, collecting every issue; builds the typed objects of each part
    that is valid. The result is only used when no issue was found."""

    def __init__(
        self, lines: Mapping[Path, int], written: Mapping[Path, tuple[object, str]],
        earlier: bool, stored: bool,
    ) -> None:
        self.lines = lines
        self.written = written
        #: The rules before 2026-11-29, for a version applied then: YAML 1.1's numbers
        #: (``010``, ``1:30``) and non-printing characters in names let through.
        self.earlier = earlier
        #: A version already applied: each flavor's ``advanced_instance_config`` has a
        #: budget of its own, as it had when the version was applied.
        self.stored = stored
        self.issues: list[ConfigIssue] = []
        #: Values ``advanced_instance_config`` may still hold, across the whole document.
        self.opaque_budget = MAX_OPAQUE_VALUES

    def error(self, path: Path, message: str, *, reference: bool = False) -> None:
        line = None
        for cut in range(len(path), -1, -1):
            line = self.lines.get(path[:cut])
            if line is not None:
                break
        self.issues.append(ConfigIssue(format_path(path), message, line, reference))

    def as_written(self, value: object, path: Path) -> str | None:
        """The text ``value`` was written as at ``path``, when the document gave it there."""
        found = self.written.get(path)
        if found is None or type(found[0]) is not type(value):
            return None
        same = found[0] == value or (value != value and found[0] != found[0])  # NaN is NaN
        return found[1] if same else None

    def describe(self, value: object, path: Path) -> str:
        return _describe(value, self.as_written(value, path))

    def shown(self, value: int, path: Path) -> str:
        """An integer as a message shows it: as written (``0x10``), when known."""
        return _short(self.as_written(value, path) or _int_text(value))

    def yaml11(self, value: object, path: Path) -> bool:
        """Whether ``value``, where a number is expected, is refused as written in a form only
        YAML 1.1 reads so (``010`` is 8 there, 10 in YAML 1.2, an error in JSON)."""
        text = self.as_written(value, path)
        if text is None or self.earlier:
            return False
        problem = number_problem(text, value)
        if problem is not None:
            self.error(path, problem)
        return problem is not None

    # -- generic shapes ----------------------------------------------------------------------

    def fields(
        self, value: object, path: Path, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> dict[str, Any] | None:
        """A mapping with only ``allowed`` keys and all ``required`` ones; returns the allowed
        keys whose value is not null (an optional field set to null counts as omitted)."""
        if not isinstance(value, Mapping):
            self.error(path, f"must be a mapping (got {self.describe(value, path)})")
            return None
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or key not in allowed:
                self.error((*path, key), _unknown_key(key, allowed))
            elif item is not None:
                result[key] = item
        for key in required:
            if key not in value:
                self.error((*path, key), "is required")
            elif value[key] is None:
                self.error((*path, key), "is required (got null)")
        return result

    def items(self, value: object, path: Path, *, non_empty: bool = False) -> list[Any] | None:
        if not isinstance(value, list | tuple):
            self.error(path, f"must be a list (got {self.describe(value, path)})")
            return None
        if non_empty and not value:
            self.error(path, "must not be empty")
            return None
        return list(value)

    def text(
        self, value: object, path: Path, *, allow_empty: bool = False, max_length: int = 0,
        name: bool = False,
    ) -> str | None:
        """A string; ``name``: one that names something (a flavor, a queue, a label key),
        printed raw in diffs and tables, so every character of it prints."""
        if not isinstance(value, str):
            hint = "; quote it to make it a string" if _is_scalar(value) else ""
            self.error(path, f"must be a string (got {self.describe(value, path)}{hint})")
            return None
        if not value and not allow_empty:
            self.error(path, "must not be empty")
            return None
        problem = _text_problem(value)
        if problem:
            self.error(path, problem)
            return None
        if max_length and len(value) > max_length:
            self.error(path, f"must be at most {max_length} characters (got {len(value)})")
            return None
        unprinted = (printing_problem(value, _short(repr(value)))
                     if name and not self.earlier else None)
        if unprinted:
            self.error(path, unprinted)
            return None
        return value

    def choice(self, value: object, path: Path, kind: type[_E]) -> _E | None:
        allowed = [member.value for member in kind]
        expected = f"must be one of {', '.join(allowed)}"
        if not isinstance(value, str):
            self.error(path, f"{expected} (got {self.describe(value, path)})")
            return None
        try:
            return kind(value)
        except ValueError:
            pass
        suggestion = _suggest(value, allowed)
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        self.error(path, f"{expected} (got {_short(repr(value))}{hint})")
        return None

    def priority(self, value: object, path: Path) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"must be an integer >= 0 (got {self.describe(value, path)})")
            return None
        if self.yaml11(value, path):
            return None
        if value < 0:
            self.error(path, f"must be >= 0 (got {self.shown(value, path)})")
            return None
        if value > MAX_PRIORITY:
            self.error(path, f"must be at most {MAX_PRIORITY} (got {self.describe(value, path)})")
            return None
        return value

    def quota(self, value: object, path: Path) -> int | None:
        """``nominal_quota`` -> exact milli-units."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(path, f"must be a number (got {self.describe(value, path)})")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.error(path, f"must be a finite number (got {self.describe(value, path)})")
            return None
        if self.yaml11(value, path):
            return None
        exact = self.exact(value, path)
        shown = _short(str(exact) if isinstance(value, float) else _int_text(value))
        if exact < 0:
            self.error(path, f"must be >= 0 (got {shown})")
            return None
        _sign, digits, exponent = exact.as_tuple()
        assert isinstance(exponent, int)  # finite
        mantissa = int("".join(map(str, digits)) or "0")
        while exponent < 0 and mantissa and mantissa % 10 == 0:  # 1.500 has 1 decimal place
            mantissa //= 10
            exponent += 1
        if mantissa == 0:
            return 0
        if exponent < -QUOTA_DECIMALS:
            self.error(path, f"must have at most {QUOTA_DECIMALS} decimal places (got {shown})")
            return None
        if exact > MAX_QUOTA:
            self.error(path, f"must be at most {MAX_QUOTA} (got {shown})")
            return None
        return int(mantissa * 10 ** (exponent + QUOTA_DECIMALS))

    def exact(self, value: int | float, path: Path) -> Decimal:
        """The decimal the user wrote: the YAML text of a float when known, else its repr
        (the shortest text that reads back as the same float)."""
        if isinstance(value, int):
            return Decimal(value)
        text = self.as_written(value, path)
        if text is not None:
            try:
                written = Decimal(text.replace("_", ""))
            except InvalidOperation:  # YAML 1.1 base-60 floats (1:30.5)
                pass
            else:
                if written.is_finite() and float(written) == value:
                    return written
        return Decimal(repr(value))

    # -- the document ------------------------------------------------------------------------

    def config(self, data: object) -> SchedulerConfig | None:
        if data is None:
            return SchedulerConfig()
        if not isinstance(data, Mapping):
            self.error(
                (),
                "the config must be a mapping with the keys resource_flavors, resource_queues "
                f"and scheduling_rules (got {self.describe(data, ())})",
            )
            return None
        top = self.fields(data, (), _TOP_KEYS) or {}

        flavors: list[ResourceFlavor | None] = []
        flavor_names: set[str] | None = None  # None: unknown (the list itself is broken)
        if "resource_flavors" in top:
            path: Path = ("resource_flavors",)
            entries = self.items(top["resource_flavors"], path)
            if entries is not None:
                flavor_names = set()
                first: dict[str, Path] = {}
                for index, entry in enumerate(entries):
                    flavors.append(self.flavor(entry, (*path, index), first, flavor_names))
        else:
            flavor_names = set()

        queues: list[ResourceQueue | None] = []
        queue_names: set[str] | None = None
        if "resource_queues" in top:
            path = ("resource_queues",)
            entries = self.items(top["resource_queues"], path)
            if entries is not None:
                queue_names = set()
                first = {}
                for index, entry in enumerate(entries):
                    queues.append(
                        self.queue(entry, (*path, index), first, queue_names, flavor_names)
                    )
        else:
            queue_names = set()

        rules: list[SchedulingRule | None] = []
        if "scheduling_rules" in top:
            path = ("scheduling_rules",)
            entries = self.items(top["scheduling_rules"], path)
            for index, entry in enumerate(entries or ()):
                rules.append(self.rule(entry, (*path, index), queue_names))

        if self.issues:
            return None
        return SchedulerConfig(
            resource_flavors=tuple(_present(flavors)),
            resource_queues=tuple(_present(queues)),
            scheduling_rules=tuple(_present(rules)),
        )

    def unique_name(
        self,
        value: object,
        path: Path,
        kind: str,
        first: dict[str, Path],
        names: set[str],
    ) -> str | None:
        name = self.text(value, path, max_length=MAX_NAME, name=True)
        if name is None:
            return None
        if "/" in name:
            self.error(path, f"must not contain {SLASH_REASON}")
            return None
        if name in DOT_SEGMENTS and not self.stored:  # a version applied before 2026-12-02 loads
            self.error(path, DOT_REASON)
            return None
        if name in first:
            self.error(
                path,
                f"duplicate {kind} name {name!r} (first defined at {format_path(first[name])})",
            )
            return None
        first[name] = path[:-1]
        names.add(name)
        return name

    def flavor(
        self, value: object, path: Path, first: dict[str, Path], names: set[str]
    ) -> ResourceFlavor | None:
        spec = self.fields(value, path, _FLAVOR_KEYS, required=("name",))
        if spec is None:
            return None
        name = None
        if "name" in spec:
            name = self.unique_name(spec["name"], (*path, "name"), "flavor", first, names)
        selector = self.selector(spec.get("selector"), (*path, "selector"))
        config: Mapping[str, Any] | None = None
        config_ok = True
        if "advanced_instance_config" in spec:
            config_path = (*path, "advanced_instance_config")
            raw = spec["advanced_instance_config"]
            if isinstance(raw, Mapping):
                if self.stored:
                    self.opaque_budget = MAX_OPAQUE_VALUES
                frozen, config_ok = _Opaque(self).freeze(raw, config_path)
                config = frozen if isinstance(frozen, Mapping) else None
            else:
                shown = self.describe(raw, config_path)
                self.error(config_path, f"must be a mapping (got {shown})")
                config_ok = False
        if name is None or selector is None or not config_ok:
            return None
        return ResourceFlavor(name=name, selector=selector, advanced_instance_config=config)

    def selector(self, value: object, path: Path) -> tuple[MatchExpression, ...] | None:
        """A list of match expressions; omitted, null and ``[]`` all mean "match everything"."""
        if value is None:
            return ()
        entries = self.items(value, path)
        if entries is None:
            return None
        expressions = [self.expression(entry, (*path, i)) for i, entry in enumerate(entries)]
        present = list(_present(expressions))
        return tuple(present) if len(present) == len(expressions) else None

    def expression(self, value: object, path: Path) -> MatchExpression | None:
        spec = self.fields(value, path, _EXPRESSION_KEYS, required=("key", "operator"))
        if spec is None:
            return None
        key = self.text(spec["key"], (*path, "key"), name=True) if "key" in spec else None
        operator = None
        if "operator" in spec:
            operator = self.choice(spec["operator"], (*path, "operator"), Operator)
        values_path = (*path, "values")
        values: tuple[str, ...] | None = ()
        if "values" in spec:
            values = self.label_values(spec["values"], values_path)
        if operator in VALUE_OPERATORS:
            if "values" not in spec:
                self.error(values_path, f"is required for operator {operator.value!r}")
                values = None
            elif values == ():
                self.error(values_path, f"must not be empty for operator {operator.value!r}")
                values = None
        elif operator is not None and values:
            self.error(values_path, f"must be omitted for operator {operator.value!r}")
            values = None
        if key is None or operator is None or values is None:
            return None
        return MatchExpression(key=key, operator=operator, values=values)

    def label_values(self, value: object, path: Path) -> tuple[str, ...] | None:
        entries = self.items(value, path)
        if entries is None:
            return None
        texts = [self.text(entry, (*path, i), allow_empty=True) for i, entry in enumerate(entries)]
        if any(text is None for text in texts):
            return None
        return tuple(text for text in texts if text is not None)

    def queue(
        self,
        value: object,
        path: Path,
        first: dict[str, Path],
        names: set[str],
        flavor_names: set[str] | None,
    ) -> ResourceQueue | None:
        spec = self.fields(value, path, _QUEUE_KEYS, required=("name",))
        if spec is None:
            return None
        name = None
        if "name" in spec:
            name = self.unique_name(spec["name"], (*path, "name"), "queue", first, names)
        preemption: Preemption | None = None
        preemption_ok = True
        if "preemption" in spec:
            preemption = self.preemption(spec["preemption"], (*path, "preemption"))
            preemption_ok = preemption is not None
        groups: list[ResourceGroup | None] = []
        groups_ok = True
        if "resource_groups" in spec:
            groups_path = (*path, "resource_groups")
            entries = self.items(spec["resource_groups"], groups_path)
            groups_ok = entries is not None
            covered_by: dict[Resource, int] = {}
            flavor_group: dict[str, int] = {}
            for index, entry in enumerate(entries or ()):
                groups.append(
                    self.group(entry, (*groups_path, index), covered_by, flavor_group, flavor_names)
                )
        if name is None or not preemption_ok or not groups_ok or None in groups:
            return None
        return ResourceQueue(
            name=name, preemption=preemption, resource_groups=tuple(_present(groups))
        )

    def preemption(self, value: object, path: Path) -> Preemption | None:
        spec = self.fields(value, path, _PREEMPTION_KEYS)
        if spec is None:
            return None
        if "within_resource_queue" not in spec:
            return Preemption()
        policy = self.choice(
            spec["within_resource_queue"], (*path, "within_resource_queue"), PreemptionPolicy
        )
        return None if policy is None else Preemption(policy)

    def group(
        self,
        value: object,
        path: Path,
        covered_by: dict[Resource, int],
        flavor_group: dict[str, int],
        flavor_names: set[str] | None,
    ) -> ResourceGroup | None:
        spec = self.fields(value, path, _GROUP_KEYS, required=("covered_resources", "flavors"))
        if spec is None:
            return None
        group_index = path[-1]
        assert isinstance(group_index, int)
        covered: list[Resource] | None = None
        allowed: frozenset[Resource] | None = None
        if "covered_resources" in spec:
            covered, allowed = self.covered(spec["covered_resources"], path, covered_by,
                                            group_index)
        flavors: list[FlavorQuotas | None] | None = None
        if "flavors" in spec:
            flavors_path = (*path, "flavors")
            entries = self.items(spec["flavors"], flavors_path, non_empty=True)
            if entries is not None:
                flavors = []
                in_group: dict[str, int] = {}
                for index, entry in enumerate(entries):
                    flavors.append(
                        self.flavor_quotas(
                            entry,
                            (*flavors_path, index),
                            allowed,
                            in_group,
                            flavor_group,
                            flavor_names,
                        )
                    )
        if covered is None or flavors is None or None in flavors:
            return None
        return ResourceGroup(covered_resources=tuple(covered), flavors=tuple(_present(flavors)))

    def covered(
        self, value: object, group_path: Path, covered_by: dict[Resource, int], group_index: int
    ) -> tuple[list[Resource] | None, frozenset[Resource] | None]:
        """The group's covered resources (None when any entry is wrong), and the resources
        it names, for the flavors' subset check: one wrong entry (``memory``) hid what the
        flavors name outside the others (None: not a list, every valid name passes)."""
        path = (*group_path, "covered_resources")
        entries = self.items(value, path, non_empty=True)
        if entries is None:
            return None, None
        named: set[Resource] = set()
        result: list[Resource] = []
        ok = True
        seen: dict[Resource, int] = {}
        for index, entry in enumerate(entries):
            entry_path = (*path, index)
            resource = self.choice(entry, entry_path, Resource)
            if resource is not None:
                named.add(resource)
            if resource is None:
                ok = False
            elif resource in seen:
                self.error(
                    entry_path,
                    f"duplicate resource {resource.value!r} (also covered_resources"
                    f"[{seen[resource]}])",
                )
                ok = False
            elif resource in covered_by:
                self.error(
                    entry_path,
                    f"resource {resource.value!r} is already covered by resource_groups"
                    f"[{covered_by[resource]}] of this queue (covered sets must be disjoint)",
                )
                ok = False
            else:
                seen[resource] = index
                covered_by[resource] = group_index
                result.append(resource)
        return (result if ok else None), frozenset(named)

    def flavor_quotas(
        self,
        value: object,
        path: Path,
        covered: frozenset[Resource] | None,
        in_group: dict[str, int],
        flavor_group: dict[str, int],
        flavor_names: set[str] | None,
    ) -> FlavorQuotas | None:
        spec = self.fields(value, path, _FLAVOR_QUOTA_KEYS, required=("name",))
        if spec is None:
            return None
        name = self.flavor_reference(spec, path, in_group, flavor_group, flavor_names)
        resources: list[ResourceQuota | None] = []
        resources_ok = True
        if "resources" in spec:
            resources_path = (*path, "resources")
            entries = self.items(spec["resources"], resources_path)
            resources_ok = entries is not None
            seen: dict[Resource, int] = {}
            for index, entry in enumerate(entries or ()):
                resources.append(
                    self.resource_quota(entry, (*resources_path, index), covered, seen)
                )
        if name is None or not resources_ok or None in resources:
            return None
        return FlavorQuotas(name=name, resources=tuple(_present(resources)))

    def flavor_reference(
        self,
        spec: Mapping[str, Any],
        path: Path,
        in_group: dict[str, int],
        flavor_group: dict[str, int],
        flavor_names: set[str] | None,
    ) -> str | None:
        if "name" not in spec:
            return None
        name_path = (*path, "name")
        name = self.text(spec["name"], name_path, name=True)
        if name is None:
            return None
        ok = True
        if flavor_names is not None and name not in flavor_names:
            self.error(name_path, f"unknown flavor {name!r}; {_defined('flavors', flavor_names)}",
                       reference=True)
            ok = False
        index = path[-1]
        group_index = path[-3]
        assert isinstance(index, int) and isinstance(group_index, int)
        if name in in_group:
            self.error(
                name_path,
                f"flavor {name!r} appears more than once in this resource group "
                f"(also flavors[{in_group[name]}])",
            )
            return None
        if name in flavor_group:
            self.error(
                name_path,
                f"flavor {name!r} is already used by resource_groups[{flavor_group[name]}] of "
                "this queue (a flavor appears at most once across a queue's groups)",
            )
            return None
        in_group[name] = index
        flavor_group[name] = group_index
        return name if ok else None

    def resource_quota(
        self,
        value: object,
        path: Path,
        covered: frozenset[Resource] | None,
        seen: dict[Resource, int],
    ) -> ResourceQuota | None:
        spec = self.fields(value, path, _RESOURCE_KEYS, required=("name",))
        if spec is None:
            return None
        resource = None
        if "name" in spec:
            name_path = (*path, "name")
            resource = self.choice(spec["name"], name_path, Resource)
            if resource is not None and covered is not None and resource not in covered:
                listed = ", ".join(r.value for r in Resource if r in covered)
                self.error(
                    name_path,
                    f"resource {resource.value!r} is not in this group's covered_resources "
                    f"({listed})",
                )
                resource = None
            elif resource is not None and resource in seen:
                self.error(
                    name_path,
                    f"duplicate resource {resource.value!r} in this flavor "
                    f"(also resources[{seen[resource]}])",
                )
                resource = None
            elif resource is not None:
                index = path[-1]
                assert isinstance(index, int)
                seen[resource] = index
        quota: int | None = None
        quota_ok = True
        if "nominal_quota" in spec:
            quota = self.quota(spec["nominal_quota"], (*path, "nominal_quota"))
            quota_ok = quota is not None
        if resource is None or not quota_ok:
            return None
        return ResourceQuota(name=resource, nominal_quota_milli=quota)

    def rule(
        self, value: object, path: Path, queue_names: set[str] | None
    ) -> SchedulingRule | None:
        spec = self.fields(value, path, _RULE_KEYS, required=("resource_queue",))
        if spec is None:
            return None
        selector = self.selector(spec.get("selector"), (*path, "selector"))
        queue = None
        if "resource_queue" in spec:
            queue_path = (*path, "resource_queue")
            queue = self.text(spec["resource_queue"], queue_path, name=True)
            if queue is not None and queue_names is not None and queue not in queue_names:
                self.error(
                    queue_path, f"unknown queue {queue!r}; {_defined('queues', queue_names)}",
                    reference=True,
                )
                queue = None
        policy: PriorityPolicy | None = None
        policy_ok = True
        if "priority_policy" in spec:
            policy = self.priority_policy(spec["priority_policy"], (*path, "priority_policy"))
            policy_ok = policy is not None
        if queue is None or selector is None or not policy_ok:
            return None
        return SchedulingRule(resource_queue=queue, selector=selector, priority_policy=policy)

    def priority_policy(self, value: object, path: Path) -> PriorityPolicy | None:
        spec = self.fields(value, path, _POLICY_KEYS)
        if spec is None:
            return None
        numbers: dict[str, int | None] = {}
        ok = True
        for key in ("default", "min", "max"):
            numbers[key] = None
            if key in spec:
                numbers[key] = self.priority(spec[key], (*path, key))
                ok = ok and numbers[key] is not None
        on_violation = None
        if "on_violation" in spec:
            on_violation = self.choice(spec["on_violation"], (*path, "on_violation"), OnViolation)
            ok = ok and on_violation is not None
        default, low, high = numbers["default"], numbers["min"], numbers["max"]
        shown = {key: self.shown(number, (*path, key))
                 for key, number in numbers.items() if number is not None}
        # An unset default is 0 (the seed: "If unset, 0"; min "Must be ≤ max and ≤ default").
        if low is not None and high is not None and low > high:
            self.error((*path, "min"), f"min ({shown['min']}) must be <= max ({shown['max']})")
            ok = False
        if default is not None and low is not None and default < low:
            self.error((*path, "default"),
                       f"default ({shown['default']}) must be >= min ({shown['min']})")
            ok = False
        unset = "default" not in spec  # not one refused above (no cascade: helper-83)
        if unset and low and (high is None or low <= high) and not self.stored:
            # A warning until 2026-11-30, so a version applied before keeps loading.
            self.error((*path, "default"),
                       f"default (unset: 0) must be >= min ({shown['min']}): set one in range")
            ok = False
        if default is not None and high is not None and default > high:
            self.error((*path, "default"),
                       f"default ({shown['default']}) must be <= max ({shown['max']})")
            ok = False
        if not ok:
            return None
        return PriorityPolicy(default=default, min=low, max=high, on_violation=on_violation)


class _Opaque:
    """``advanced_instance_config``: any JSON-compatible mapping, kept verbatim (deep-frozen).

    It is sent on to a cloud provider as JSON, so keys must be strings and values strings,
    finite numbers, booleans, null, lists or mappings; a value that contains itself (a
    recursive YAML alias), or that takes the document past ``MAX_OPAQUE_VALUES`` values, is
    refused.
    """

    def __init__(self, checker: _Checker) -> None:
        self.checker = checker
        self.active: set[int] = set()
        self.ok = True

    def freeze(self, value: Mapping[Any, Any], path: Path) -> tuple[object, bool]:
        frozen = self.walk(value, path)
        return frozen, self.ok

    def fail(self, path: Path, message: str) -> None:
        self.checker.error(path, message)
        self.ok = False

    def walk(self, value: object, path: Path) -> object:
        self.checker.opaque_budget -= 1
        if self.checker.opaque_budget < 0:
            if self.checker.opaque_budget == -1:
                self.fail(path, f"too large: the document's advanced_instance_config values "
                                f"number more than {MAX_OPAQUE_VALUES}")
            else:
                self.ok = False
            return None
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int | float):
            # Sent on as the number YAML 1.1 reads (8 for 010): refused, as in a quota.
            if self.checker.yaml11(value, path):
                self.ok = False
            elif isinstance(value, float) and not math.isfinite(value):
                shown = self.checker.describe(value, path)
                self.fail(path, f"must be a finite number (got {shown})")
            return value
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                self.fail(path, problem)
            return value
        if not isinstance(value, list | tuple | Mapping):
            self.fail(path, f"must be JSON-compatible (got {_describe(value)})")
            return None
        if id(value) in self.active:
            self.fail(path, "must not contain itself (recursive YAML alias)")
            return None
        self.active.add(id(value))
        try:
            if isinstance(value, Mapping):
                result: dict[str, object] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        self.fail((*path, key), f"keys must be strings (got {_describe(key)})")
                        continue
                    problem = _text_problem(key)
                    if problem:
                        self.fail((*path, key), f"key {problem}")
                        continue
                    result[key] = self.walk(item, (*path, key))
                return MappingProxyType(result)
            return tuple(self.walk(item, (*path, index)) for index, item in enumerate(value))
        finally:
            self.active.discard(id(value))


# -- advisories ------------------------------------------------------------------------------


def warnings(config: SchedulerConfig) -> list[ConfigIssue]:
    """Advisories about a valid config; none of them makes it invalid."""
    result: list[ConfigIssue] = []
    rules = config.scheduling_rules

    if not rules:
        if config.resource_queues:
            result.append(
                ConfigIssue(
                    "scheduling_rules",
                    "no scheduling rules: every workload is admitted without quota and the "
                    "resource_queues are never used",
                )
            )
    elif not any(rule.is_catch_all for rule in rules):
        result.append(
            ConfigIssue(
                "scheduling_rules",
                "no catch-all rule (a rule without selector): workloads matching no rule fail",
            )
        )
    for index, rule in enumerate(rules[:-1]):
        if not rule.is_catch_all:
            continue
        if _always_accepts(rule.priority_policy):
            consequence = "rules after it never match"
        else:
            consequence = "rules after it only see workloads whose priority it rejects"
        result.append(
            ConfigIssue(
                f"scheduling_rules[{index}]",
                f"catch-all rule at index {index} is not last: {consequence}",
            )
        )

    used_flavors = {
        flavor.name
        for queue in config.resource_queues
        for group in queue.resource_groups
        for flavor in group.flavors
    }
    for index, flavor in enumerate(config.resource_flavors):
        if flavor.name not in used_flavors:
            result.append(
                ConfigIssue(
                    f"resource_flavors[{index}]",
                    f"flavor {flavor.name!r} is not used by any resource queue",
                )
            )
    routed = {rule.resource_queue for rule in rules}
    for index, queue in enumerate(config.resource_queues):
        path = f"resource_queues[{index}]"
        if rules and queue.name not in routed:
            result.append(
                ConfigIssue(path, f"queue {queue.name!r} is not the target of any scheduling rule")
            )
        if queue.is_passthrough and queue.preemption and queue.preemption.preempts_lower_priority:
            result.append(
                ConfigIssue(
                    f"{path}.preemption",
                    f"queue {queue.name!r} is a passthrough (no resource_groups): it admits "
                    "everything and never preempts",
                )
            )

    for path, expression in _expressions(config):
        near = _reserved_lookalike(expression.key)
        if near is not None:
            result.append(
                ConfigIssue(
                    f"{path}.key",
                    f"label key {expression.key!r} is not the reserved key {near!r}: keys are "
                    "case-sensitive and reserved keys are hyphenated",
                )
            )
    return result


def _always_accepts(policy: PriorityPolicy | None) -> bool:
    """Whether a rule's priority policy can never make it fall through."""
    if policy is None or policy.on_violation is OnViolation.FORCE_UPDATE:
        return True
    return policy.min in (None, 0) and policy.max is None


def _expressions(config: SchedulerConfig) -> Iterable[tuple[str, MatchExpression]]:
    for index, flavor in enumerate(config.resource_flavors):
        for position, expression in enumerate(flavor.selector):
            yield f"resource_flavors[{index}].selector[{position}]", expression
    for index, rule in enumerate(config.scheduling_rules):
        for position, expression in enumerate(rule.selector):
            yield f"scheduling_rules[{index}].selector[{position}]", expression


def _reserved_lookalike(key: str) -> str | None:
    if key in RESERVED_LABEL_KEYS:
        return None
    folded = key.lower().replace("_", "-").replace(" ", "-")
    return folded if folded in RESERVED_LABEL_KEYS else None


# -- small helpers ---------------------------------------------------------------------------

_T = TypeVar("_T")


def _present(values: Iterable[_T | None]) -> Iterable[_T]:
    return (value for value in values if value is not None)


def _is_scalar(value: object) -> bool:
    return isinstance(value, bool | int | float)


def _describe(value: object, written: str | None = None) -> str:
    """A value as a message shows it: its kind, and the value itself when short (as
    ``written`` in the document, when known)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {written or ('true' if value else 'false')}"
    if isinstance(value, int):
        return f"integer {_short(written or _int_text(value))}"
    if isinstance(value, float):
        return f"number {_short(written or repr(value))}"
    if isinstance(value, str):
        return f"string {_short(repr(value))}"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a value of type {type(value).__name__}"


def _text_problem(value: str) -> str | None:
    """Text every store and every JSON encoder accepts: no NUL, no lone surrogate."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if not is_unicode(value):
        return "must be valid Unicode text (got a lone surrogate)"
    return None


def _suggest(value: str, allowed: Sequence[str]) -> str | None:
    """``In`` -> ``in``, ``NotIn`` -> ``not_in``, ``memory`` -> ``memory_gb``."""

    def fold(text: str) -> str:
        return re.sub(r"[-_\s]", "", text.lower())

    for candidate in allowed:
        if fold(candidate) == fold(value):
            return candidate
    for candidate in allowed:  # priority -> priority_policy, maximum -> max
        short, long = sorted((fold(candidate), fold(value)), key=len)
        if len(short) >= 3 and long.startswith(short):
            return candidate
    close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.75)
    return close[0] if close else None


def _unknown_key(key: object, allowed: Sequence[str]) -> str:
    shown = _short(repr(key)) if isinstance(key, str) else _short(_describe(key))
    suggestion = _suggest(key, allowed) if isinstance(key, str) else None
    if suggestion:
        return f"unknown key {shown}; did you mean {suggestion!r}?"
    return f"unknown key {shown}; allowed keys: {', '.join(allowed)}"


def _defined(kind: str, names: set[str]) -> str:
    if not names:
        return f"no {kind} are defined"
    listed = sorted(names)
    more = f", ... ({len(listed)} in all)" if len(listed) > 10 else ""
    return f"defined {kind}: {', '.join(listed[:10])}{more}"


def _thaw(value: object) -> Any:
    """A deep-frozen opaque value back to plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value
