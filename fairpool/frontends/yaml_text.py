"""YAML a user wrote, read one way everywhere: a tree document, one option's value, a mapping on
the command line (``load_yaml``), and the scheduler config (whose loader builds on ``UserLoader``).

PyYAML's safe loader (YAML 1.1), with these changes:

* a key given twice in a mapping is refused, with both lines (PyYAML keeps the last one
  without a word);
* JSON numbers with an exponent (``1e3``, ``1E-2``) are numbers, as in JSON (YAML 1.1 alone
  reads them as text), and JSON is YAML;
* plain scalars that look like dates stay text: nothing a user writes here is a date (it is
  stored and sent as JSON), and a name such as ``2024-01-01`` is text;
* ``010`` (octal in YAML 1.1: 8) and ``1:30`` (base 60: 90), which JSON refuses and YAML 1.2
  reads otherwise (10, text), are refused where a number is read (``number_problem``).

PyYAML fails in three ways, and ``load_yaml`` makes each one ``InvalidInput`` naming the field
(never a traceback, never an HTTP 500): a syntax error (``YAMLError``), nesting deep enough to
exhaust Python's stack (it composes recursively), and a scalar its constructors cannot build
(``ValueError``: an integer of more than 4,300 digits).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import ClassVar, Final, NamedTuple

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from fairpool.errors import InvalidInput, one_line

Path = tuple[object, ...]

#: The path of a whole document.
ROOT: Final = "(root)"

_TIMESTAMP_TAG: Final = "tag:yaml.org,2002:timestamp"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_FLOAT_TAG: Final = "tag:yaml.org,2002:float"
#: Scalars YAML reads as something else than they are written (``010`` is 8, ``1:30`` 90,
#: ``yes`` true): their text is kept.
_TYPED_TAGS: Final = frozenset((_FLOAT_TAG, "tag:yaml.org,2002:int", "tag:yaml.org,2002:bool"))
#: A JSON number with an exponent (``1e3``, ``1E-2``, ``1.5e3``): YAML 1.1 reads a float only
#: with a dot and a signed exponent, so these would be strings, yet JSON is YAML too.
JSON_EXPONENT: Final = re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?[eE][-+]?[0-9]+$")


class KeyGivenTwice(NamedTuple):
    path: Path
    #: ``duplicate key 'a' on line 7 (first on line 3)``
    message: str
    line: int


class UserLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, read as the module says. ``survey`` (before constructing) records
    every key given twice and the text of every number and boolean, per path."""

    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML's own class attribute)
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    #: A second merge key in one mapping is an error.
    one_merge: ClassVar[bool] = True

    def __init__(self, text: str) -> None:
        super().__init__(text)
        #: Per path, a typed scalar's value and its text.
        self.written: dict[Path, tuple[object, str]] = {}
        self.duplicates: list[KeyGivenTwice] = []
        #: Per key that only YAML 1.1 reads as a number (``1:30``, ``010``): its path, with
        #: the key as written, and what ``number_problem`` says of it.
        self.number_keys: list[tuple[Path, str]] = []

    def at_line(self, path: Path, line: int) -> None:
        """Where ``path`` starts, the first time the survey reaches it (the config records
        it: each of its errors names its line)."""

    def survey(self, node: Node, path: Path = (), seen: set[int] | None = None) -> None:
        """Visit each node once (an alias is not followed again, so alias bombs cost
        nothing)."""
        seen = set() if seen is None else seen
        if isinstance(node, ScalarNode) and node.tag in _TYPED_TAGS:
            # Before the check below: each alias of a scalar has its path (cheap, as it is
            # one per alias written, collections reached through an alias are not walked).
            self.written[path] = (self.construct_object(node), str(node.value))
        if id(node) in seen:
            return
        seen.add(id(node))
        self.at_line(path, node.start_mark.line + 1)
        if isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                self.survey(item, (*path, index), seen)
        elif isinstance(node, MappingNode):
            first_line: dict[object, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    continue  # non-scalar keys fail later
                line = key_node.start_mark.line + 1
                merge = key_node.tag == _MERGE_TAG
                if merge and not self.one_merge:
                    continue
                # The keys a merge brings may be overridden, but not the merge key itself.
                key = "<<" if merge else self.construct_object(key_node)
                child = (*path, key)
                if key in first_line:
                    self.duplicates.append(KeyGivenTwice(
                        child,
                        f"duplicate key {short(repr(key))} on line {line} "
                        f"(first on line {first_line[key]})",
                        line,
                    ))
                    self.written.pop(child, None)  # YAML keeps the last one's value
                    continue
                first_line[key] = line
                if key_node.tag in _TYPED_TAGS:
                    problem = number_problem(str(key_node.value), key, or_text=True)
                    if problem is not None:
                        self.number_keys.append(((*path, str(key_node.value)), problem))
                if not merge:
                    self.at_line(child, line)
                    self.survey(value_node, child, seen)


UserLoader.add_implicit_resolver(_FLOAT_TAG, JSON_EXPONENT, list("-0123456789"))


def beyond_float(text: str, value: float) -> bool:
    """Whether ``text``, a number in digits, is past a float's range: read as inf, or as 0.0
    though not zero (``1e-400``)."""
    digits = text.lstrip("+-").replace("_", "").lower()
    if math.isinf(value):
        return "inf" not in digits
    return value == 0 and any(d in "123456789" for d in digits.partition("e")[0])


def number_problem(text: str, value: object, *, or_text: bool = False) -> str | None:
    """Why ``text``, which YAML 1.1 read as the number ``value``, is to be written otherwise,
    and how (``or_text``: quoted, too); None if it reads alike in JSON or YAML 1.2 (or is
    ``0x10``, ``1_000``: plainly meant). A leading zero makes an integer octal in YAML 1.1
    only, and ``:`` makes base 60. A number past a float's range (``1e-400``, ``1e400``)
    is refused as written: a check of what it reads as would show 0.0 or inf."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    digits = text.lstrip("+-").replace("_", "")
    reading = short(int_text(value) if isinstance(value, int) else repr(value))
    if isinstance(value, float) and beyond_float(text, value):
        return f"{short(text)} is out of a number's range: it reads as {reading}"
    ways = [reading]
    if ":" in digits:
        kind = "base 60"
    elif isinstance(value, int) and len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        kind = "octal"
        decimal = short(("-" if text.startswith("-") else "") + (digits.lstrip("0") or "0"))
        if decimal != reading:  # 00 is 0 either way
            ways.append(f"{decimal} for decimal")
    else:
        return None
    if or_text:
        ways.append(f"'{short(text)}' for text")
    *first, last = ways
    write = f"{', '.join(first)}, or {last}" if first else last
    return f"{short(text)} is {kind} in YAML 1.1 ({reading}): write {write}"


def load_yaml(
    field_name: str, text: str, shown: object = "<yaml>", *, document: bool = False
) -> object:
    """``text`` as YAML; an error names ``field_name`` and shows ``shown`` as its value (a
    whole document is not worth repeating). A key given twice, or a number written as only
    YAML 1.1 reads it, is refused at its path: under ``field_name`` (``config.weight``), or,
    for a ``document``, its own (``pools.a``). Such a number is refused wherever it is read,
    not only where a number is expected: where text is (a name, a tag) a number was refused
    anyway, or, for ``parent``, taken as its decimal (``1:30`` moved a pool under ``90``);
    the message says to quote it."""
    loader: UserLoader | None = None
    try:
        loader = UserLoader(text)  # reads the characters first: not all are YAML's
        node = loader.get_single_node()
        if node is None:
            return None
        loader.survey(node)
        data = loader.construct_document(node)
    except yaml.YAMLError as error:
        problem = one_line(str(error))
    except RecursionError:
        problem = "nested too deeply"
    except ValueError as error:  # Python's advice on raising its digit limit is not the user's
        problem = one_line(str(error)).split("; use sys.")[0]
    else:
        refused = [(twice.path, twice.message) for twice in loader.duplicates]
        # A key as YAML 1.1 reads it named a pool `90` nobody wrote (helper-85). Not in the
        # scheduler config, whose stored documents are read again: one may hold such a key.
        refused += loader.number_keys
        for path, (value, written) in loader.written.items():
            number = number_problem(written, value, or_text=True)
            if number is not None:
                refused.append((path, number))
        if not refused:
            return data
        path, message = refused[0]  # duplicate keys first, as the config orders them
        where = format_path(path) if document else _under(field_name, path)
        raise InvalidInput.from_message(where, f"{where}: {message}")
    finally:
        if loader is not None:
            loader.dispose()
    raise InvalidInput(field_name, shown, f"is not valid YAML: {problem}")


def _under(field_name: str, path: Path) -> str:
    """``config`` and ``("weight",)`` -> ``config.weight``; ``[0]`` is joined as it is."""
    inner = format_path(path, root="")
    return f"{field_name}{'' if inner[:1] in ('', '[') else '.'}{inner}"


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def format_path(path: Sequence[object], root: str = ROOT) -> str:
    """``("resource_queues", 0, "name")`` -> ``resource_queues[0].name``; keys that are not
    identifiers are written as JSON in brackets (``advanced_instance_config["a.b/c"]``)."""
    if not path:
        return root
    parts: list[str] = []
    for segment in path:
        if isinstance(segment, int) and not isinstance(segment, bool):
            parts.append(f"[{segment}]")
        elif isinstance(segment, str) and _IDENTIFIER.match(segment):
            parts.append(f".{segment}" if parts else segment)
        else:
            parts.append(f"[{_key_text(segment)}]")
    return "".join(parts)


def _key_text(key: object) -> str:
    if isinstance(key, str | bool | float) or key is None:
        try:
            return json.dumps(key)
        except ValueError:  # nan/inf keys
            pass
    return short(repr(key))


def int_text(value: int) -> str:
    """An integer as a message shows it (``str()`` of one of more than 4,300 digits raises)."""
    return str(value) if value.bit_length() < 1000 else f"an integer of {value.bit_length()} bits"


def short(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters, ``...`` included."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "JSON_EXPONENT",
    "ROOT",
    "KeyGivenTwice",
    "Path",
    "UserLoader",
    "beyond_float",
    "format_path",
    "int_text",
    "load_yaml",
    "number_problem",
    "short",
]
