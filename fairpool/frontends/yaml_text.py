"""YAML a user wrote (a tree file, one option's value, a mapping on the command line).

PyYAML's safe loader fails in three ways, and each is one ``InvalidInput`` naming the field
(never a traceback, never an HTTP 500): a syntax error (``YAMLError``), nesting deep enough to
exhaust Python's stack (it composes recursively), and a scalar its constructors cannot build
(``ValueError``: the date ``2024-13-45``, an integer of more than 4,300 digits).
"""

from __future__ import annotations

import yaml

from fairpool.errors import InvalidInput, one_line


def load_yaml(field_name: str, text: str, shown: object = "<yaml>") -> object:
    """``text`` as YAML; an error names ``field_name`` and shows ``shown`` as its value (a
    whole document is not worth repeating)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        problem = one_line(str(error))
    except RecursionError:
        problem = "nested too deeply"
    except ValueError as error:  # Python's advice on raising its digit limit is not the user's
        problem = one_line(str(error)).split("; use sys.")[0]
    raise InvalidInput(field_name, shown, f"is not valid YAML: {problem}")
