"""The ids fairpool makes for its rows (and the SDK for its idempotency keys).

An id is a UUID string of version 8, RFC 9562's version for a layout of one's own: 32 bits
of the time in microseconds, wrapping every 71.6 minutes, then 90 random bits.

Time first, so that the ids made in one moment sort together: every index keyed by an id (a
request's primary key, its resources', its allocation's, the event log's ``request_id``)
takes them on one page, where random ids (UUID 4) put each on a page of its own, and a
SQLite commit writes each such page to the WAL: ~12 pages per admission on a loaded server
against ~7 (docs/performance.md). Only 32 wrapping bits of it, so that the first
characters still change quickly, as short prefixes need (``fairpool resource-request describe
3f2a``, messages naming ids by 8 characters): within the 71.6 minutes, ids made 65 ms apart
differ in their first 4 characters, 256 µs apart in their first 6, and in different
microseconds in their first 8. UUID 7's first 12 characters are the millisecond. The random
bits keep ids made in the same microsecond (by other processes, or replicas) apart.
"""

from __future__ import annotations

import os
import time
import uuid

_TIME_BITS = 32
_RANDOM_BITS = 128 - _TIME_BITS
_VERSION = 8 << 76  # the high nibble of octet 6
_VARIANT = 0b10 << 62  # the top bits of octet 8: RFC 9562
_FORMAT = ~(0xF << 76) & ~(0b11 << 62)  # the bits the version and variant take


def new_id() -> str:
    return id_at(time.time_ns() // 1000, int.from_bytes(os.urandom(12), "big"))


def id_at(micros: int, random: int) -> str:
    """The id made at ``micros`` (microseconds since the epoch) from ``random`` (its low 96
    bits; 90 of them are kept)."""
    bits = (micros % (1 << _TIME_BITS)) << _RANDOM_BITS | random % (1 << _RANDOM_BITS)
    return str(uuid.UUID(int=bits & _FORMAT | _VERSION | _VARIANT))
