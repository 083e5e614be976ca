"""What every command shares: the service handle, input parsing, error lines."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fairpool import backends
from fairpool.errors import InvalidInput, clipped

if TYPE_CHECKING:
    from fairpool.remote import RemoteScheduling, RemoteService, RemoteTrees
    from fairpool.scheduling import SchedulingService
    from fairpool.service import Service
    from fairpool.trees_service import TreesService

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    _IntType = click.ParamType[int]
else:  # generic from click 8.3 only: ZenML pins click <= 8.2.1, where a subscript raises
    _IntType = click.ParamType


class Seconds(click.FloatRange):
    """A finite number of seconds from ``min`` up: click's ``FloatRange`` lets NaN through (it
    compares false with any bound), and a deadline NaN or infinitely far never comes."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{seconds} is not a finite number of seconds.", param, ctx)
        return seconds


#: Seconds per unit of a ``Duration``.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Duration(_IntType):
    """A duration, to whole seconds: a number with ``s``, ``m``, ``h`` or ``d`` (``30d``,
    ``12h``; ``0`` alone needs none), from ``low`` to ``high`` seconds."""

    name = "duration"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return duration_seconds(str(value), self.low, self.high)
        except ValueError as error:
            self.fail(str(error), param, ctx)


def duration_seconds(text: str, low: int, high: int) -> int:
    """``text``, a ``Duration``, in seconds; else ``ValueError`` saying why."""
    written = text.strip().lower()
    unit = _UNITS.get(written[-1:], 1) if written else 1
    number = written[:-1] if written[-1:] in _UNITS else written
    # ASCII digits only: str.isdigit() takes other scripts' (٣), which no one means here.
    if not (number.isascii() and number.isdigit()):
        raise ValueError(f"{text!r} is not a duration: a whole number with s, m, h or d "
                         "(30d, 12h).")
    if number == written and number.strip("0"):
        # Read as seconds, `prune --older-than 30` meant for days deleted all but the last
        # 30 s of history (helper-83).
        raise ValueError(f"{text!r} has no unit: a whole number with s, m, h or d (30d, 12h; "
                         "0 alone needs none).")
    seconds = int(number) * unit if len(number) <= 15 else high + 1  # int() caps digits
    if seconds > high:
        raise ValueError(f"{text!r} is longer than {high // 86400} days.")
    if seconds < low:
        raise ValueError(f"{text!r} is shorter than {_spoken(low)}.")
    return seconds


def _spoken(seconds: int) -> str:
    """``seconds`` in its largest whole unit: ``1h``, ``90m``."""
    unit = next(u for u in ("d", "h", "m", "s") if seconds % _UNITS[u] == 0)
    return f"{seconds // _UNITS[unit]}{unit}"


def database_url_option(help: str, envvar: str | None = None) -> Callable[[F], F]:
    """``--database-url``, worded for its command."""
    return click.option("--database-url", envvar=envvar, default=None, metavar="URL",
                        help=f"postgresql+psycopg://... or sqlite:///PATH. {help}")


def service(ctx: click.Context | None = None) -> Service | RemoteService:
    """The service: the server at ``--url`` when one is given, else the database at
    ``--database-url``, else the embedded store under ``--home``; opened once per invocation
    and closed when it ends."""
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    root.ensure_object(dict)
    svc: Service | RemoteService | None = root.obj.get("service")
    if svc is None:
        svc = backends.open_service(root.obj.get("url"), root.obj.get("token"),
                                    root.obj.get("home"), root.obj.get("database_url"))
        root.obj["service"] = svc
        root.call_on_close(svc.close)
    return svc


def scheduling(ctx: click.Context | None = None) -> SchedulingService | RemoteScheduling:
    """The scheduler config service (seed 004), on the same store or server as ``service``."""
    ctx = ctx or click.get_current_context()
    svc = service(ctx)
    root = ctx.find_root()
    found: SchedulingService | RemoteScheduling | None = root.obj.get("scheduling")
    if found is None:
        found = backends.scheduling_of(svc)
        root.obj["scheduling"] = found
    return found


def trees(ctx: click.Context | None = None) -> TreesService | RemoteTrees:
    """The pool-tree service (seed 003), on the same store or server as ``service``."""
    ctx = ctx or click.get_current_context()
    svc = service(ctx)
    root = ctx.find_root()
    found: TreesService | RemoteTrees | None = root.obj.get("trees")
    if found is None:
        found = backends.trees_of(svc)
        root.obj["trees"] = found
    return found


def parse_mapping(field: str, text: str | None) -> dict[str, Any] | None:
    """A JSON or YAML mapping given on the command line (ZenML's
    ``convert_structured_str_to_dict``: JSON first, then YAML). Values are passed on as parsed;
    the service checks them and names the offending key."""
    if text is None:
        return None
    try:
        parsed: Any = json.loads(text, object_pairs_hook=_once_each, parse_float=_in_range)
    except RecursionError:  # it recurses per level (so does YAML's)
        raise InvalidInput(field, clipped(text), "nested too deeply") from None
    except ValueError:  # not JSON, or a key given twice: YAML's reading says where
        from fairpool.frontends.yaml_text import load_yaml

        parsed = load_yaml(field, text, text)
    if not isinstance(parsed, dict):
        raise InvalidInput(field, text, "must be a JSON or YAML mapping, e.g. '{\"gpu\": 8}'")
    return parsed


def _in_range(text: str) -> float:
    """A JSON number a float holds; past its range (``1e-400`` reads as 0.0), YAML's reading
    refuses it at its path, as written (``number_problem``)."""
    value = float(text)
    if math.isinf(value) or value == 0:
        from fairpool.frontends.yaml_text import beyond_float

        if beyond_float(text, value):
            raise ValueError(text)
    return value


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are given once each (``json`` keeps the last one)."""
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("a key given twice")
    return result


def parse_pairs(field: str, pairs: Iterable[str]) -> dict[str, str]:
    """Repeated ``KEY=VALUE`` options; a repeated key keeps its last value."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidInput(field, pair, "expected KEY=VALUE")
        result[key] = value.strip()
    return result




#: A cancel's ``--reason``: kept as the request's or workload's reason.
reason_option = click.option(
    "--reason", default=None, help="Why (shown as `cancelled: REASON`; default: cancelled by user)."
)
