"""The benchmarks' argument types: a bad value is argparse's one usage line, naming it."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """A positive integer (``--stream``, ``--runs``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def positive_list(text: str, problem: str = "not positive integers, comma-separated"
                  ) -> list[int]:
    """Positive integers, comma-separated (``--sizes``); else ``problem`` and the text."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{problem}: {text!r}")
    return values
