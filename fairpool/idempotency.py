"""Idempotent creates: a key the client chooses per create call (the remote client sends a
fresh one with each), so that a call sent again after its answer was lost answers what the
first made instead of making another. Requests compare what was asked field by field
(``service``); workloads and operations keep a digest of it beside the key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Table

from fairpool.errors import Conflict
from fairpool.frontends.pools import validate_name
from fairpool.store import repo

#: Characters of a key.
MAX_IDEMPOTENCY_KEY = 64


def validate_key(key: object, field: str = "idempotency_key") -> str | None:
    """None (no key), or non-empty text up to ``MAX_IDEMPOTENCY_KEY`` characters; an error
    names ``field`` (the API's ``Idempotency-Key`` header for one given there)."""
    if key is None:
        return None
    return validate_name(field, key, MAX_IDEMPOTENCY_KEY)


def digest(asked: Mapping[str, object]) -> str:
    """What a create asked, validated, as 64 hex digits: equal for equal asks."""
    text = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_repeat(kind: str, key: str, made: str, made_digest: str | None,
                 made_by: str | None, asked_digest: str, asked_by: str | None) -> None:
    """A create repeated with ``key``, which made ``made`` (``kind``: "a workload") already: it
    must come from the same token and ask the same, or it is a conflict rather than answered
    with another's."""
    if made_by != asked_by:  # another caller's: nothing about it is told
        raise Conflict(f"idempotency_key {key!r} is taken by {kind} another token made; "
                       "use a key of your own")
    if made_digest != asked_digest:
        raise Conflict(f"idempotency_key {key!r} already made {kind} `{made}`, which asked "
                       "otherwise: a create repeated with a key must ask the same")


@dataclass(frozen=True)
class Keyed:
    """A create's idempotency key (None: none) and the digest of what it asked."""

    key: str | None
    fingerprint: str

    @classmethod
    def of(cls, key: object, asked: Mapping[str, object]) -> Keyed:
        """``key`` validated, ``asked`` digested: before anything is written."""
        return cls(validate_key(key), digest(asked))

    @property
    def columns(self) -> tuple[str, str] | None:
        """What the insert stores (``repo.keyed``)."""
        return None if self.key is None else (self.key, self.fingerprint)

    def made(self, conn: Connection, table: Table, kind: str, by: str | None) -> str | None:
        """The id (or version) of the row of ``table`` this key made already, if the same
        token (``by``) asked the same (``check_repeat``); None if the key made nothing."""
        if self.key is None:
            return None
        found = repo.find_keyed(conn, table, self.key)
        if found is None:
            return None
        check_repeat(kind, self.key, *found, self.fingerprint, by)
        return found[0]
