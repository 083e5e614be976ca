"""Capped exponential backoff with 'equal' jitter, for every wait that polls or retries."""

from __future__ import annotations

import random


def jittered(delay: float) -> float:
    """Somewhere in [delay/2, delay], so clients waiting together do not retry together."""
    return delay / 2 + random.uniform(0, delay / 2)
