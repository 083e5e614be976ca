"""Request bodies: strict pydantic models with bounded sizes.

Strict: 8 is an integer, "8", 8.0 and true are not. Unknown keys are refused. Sizes are bounded
so that no input can make the server do unbounded work or overflow a database column; signs
are in the schema too. Rules that depend on the state (policy keys are pool keys, reserved ≤
limit, the reserved total fits the pool) are the service's, which names the field in its
error just as these models do.
"""

from __future__ import annotations

import re
from contextlib import suppress
from typing import Annotated, Literal

from fastapi import Header, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from fairpool.errors import InvalidInput, is_unicode, shown
from fairpool.frontends.names import MAX_KEYS, MAX_LABEL_VALUE, MAX_LABELS, MAX_NAME, MAX_VERSION
from fairpool.frontends.pools import MAX_AMOUNT, MAX_DESCRIPTION, MAX_PRIORITY, MAX_REASON
from fairpool.idempotency import MAX_IDEMPOTENCY_KEY, validate_key
from fairpool.leases import MAX_LEASE_TTL, MAX_RETRIES
from fairpool.paging import MAX_OFFSET, MAX_PAGE_SIZE
from fairpool.views import MAX_RETENTION

#: Request bodies larger than this are refused with 413: room for the widest valid body of
#: any route, every character written as a 12-byte JSON escape (64 labels of 255-character
#: keys and values, 64 resource keys: 587 kB). Config documents have limits of their own.
MAX_BODY_BYTES = 1024 * 1024


def text(value: str) -> str:
    """Text every database stores as it is: no NUL characters, no lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not is_unicode(value):
        raise ValueError("must be valid Unicode text")
    return value


#: What JSON writes for an integer, and for a number.
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _written(pattern: re.Pattern[str], what: str) -> BeforeValidator:
    """A number in a URL is written as JSON writes it: pydantic alone would also take "+4",
    " 4", "04", "4_000", "4.0" for an integer, "inf" and "1_0" for a number, which the
    schema does not allow."""

    def check(value: object) -> object:
        if isinstance(value, str) and not pattern.fullmatch(value):
            raise ValueError(f"must be {what}")
        return value

    return BeforeValidator(check)


_AS_INTEGER = _written(_INTEGER, "an integer in decimal digits")
_AS_NUMBER = _written(_NUMBER, "a number in decimal digits")
#: Integers and numbers in a query or a path, their bounds given before the check of their
#: writing: so the schema states them as JSON Schema does (``minimum``, ``maximum``). Given
#: after it (``Query(ge=...)``), FastAPI wrote them as ``ge`` and ``le``, which no validator
#: or generator reads (helper-96).
Version = Annotated[int, Field(ge=1, le=MAX_VERSION), _AS_INTEGER]
WaitSeconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False), _AS_NUMBER]

#: A list's page (``paging.page_dict``): how many items, from which (0-based), in its order,
#: after which cursor (a page's ``next``; the service says what is not one).
DEFAULT_PAGE_SIZE = 100
#: The most transactions (``retention.BATCH`` rows each) one ``POST /prune`` takes.
PRUNE_BATCHES_PER_CALL = 20
PageLimit = Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE), _AS_INTEGER, Query()]
PageOffset = Annotated[int, Field(ge=0, le=MAX_OFFSET), _AS_INTEGER, Query()]
PageAfter = Annotated[str, Query(
    max_length=MAX_NAME,
    description="A page's `pagination.next`: the items after that page's last, wherever "
    "deletes since have moved it (an offset moves with them).",
)]

#: Patterns in the schema, so that clients and fuzzers know: no NUL characters anywhere,
#: and names hold at least one non-space character.
TEXT_PATTERN = r"^[^\x00]*$"
NAME_PATTERN = r"^[^\x00]*\S[^\x00]*$"
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN),
    AfterValidator(text),
]
Key = Name
#: A name or id in a URL's path: only looked up, so any text a path segment carries; one that
#: names nothing (blank, longer than any name) is not found, in the service's words, as the
#: embedded store answers it.
PathText = Annotated[
    str, StringConstraints(min_length=1, pattern=TEXT_PATTERN), AfterValidator(text)
]
Description = Annotated[
    str, StringConstraints(max_length=MAX_DESCRIPTION, pattern=TEXT_PATTERN), AfterValidator(text)
]
LabelValue = Annotated[
    str, StringConstraints(max_length=MAX_LABEL_VALUE, pattern=TEXT_PATTERN), AfterValidator(text)
]
#: A filter in a query: text of a name's length, empty allowed.
QueryText = Annotated[
    str, StringConstraints(max_length=MAX_NAME, pattern=TEXT_PATTERN), AfterValidator(text)
]
#: Capacity on creation and request demands: positive.
Positive = Annotated[int, Field(ge=1, le=MAX_AMOUNT)]
#: Capacity updates (0 removes a key), reserved and limit: non-negative.
NonNegative = Annotated[int, Field(ge=0, le=MAX_AMOUNT)]
#: At least one key, as the service says it (in its words, the same embedded).
PositiveAmounts = Annotated[dict[Key, Positive], Field(max_length=MAX_KEYS)]
Amounts = Annotated[dict[Key, NonNegative], Field(max_length=MAX_KEYS)]
ComponentType = Literal["orchestrator", "step_operator"]


_Key = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_IDEMPOTENCY_KEY, pattern=NAME_PATTERN),
    AfterValidator(text),
]
_KEY_DESCRIPTION = ("Chosen by the client per create; a retry with the same key answers what "
                    "the first made instead of making another.")
#: Chosen by the client per create (``fairpool.idempotency``).
IdempotencyKey = Annotated[_Key | None, Field(description=_KEY_DESCRIPTION)]

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: An sf-string (RFC 8941 3.3.3), as draft-ietf-httpapi-idempotency-key-header writes the key.
_SF_STRING = re.compile(r'"((?:[^"\\]|\\["\\])*)"')


def _header_key(value: object) -> object:
    """The key an ``Idempotency-Key`` header holds: as it is (Stripe's form), or the draft's
    quoted string without its quotes and escapes. Bytes beyond ASCII are read as UTF-8, as a
    body's are (the server hands a header over as Latin-1)."""
    if not isinstance(value, str):
        return value
    if not value.isascii():
        with suppress(UnicodeError):
            value = value.encode("latin-1").decode("utf-8")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        quoted = _SF_STRING.fullmatch(value)
        if quoted is None:
            raise ValueError('must be a key, or one in quotes with only \\" and \\\\ escaped')
        value = re.sub(r'\\(.)', r"\1", quoted[1])
    return value


#: The body's ``idempotency_key`` given as the ``Idempotency-Key`` header (``one_key``).
IdempotencyHeader = Annotated[
    Annotated[_Key, BeforeValidator(_header_key)] | None,
    Header(alias=IDEMPOTENCY_HEADER, description="The body's `idempotency_key` as a header "
           "(draft-ietf-httpapi-idempotency-key-header), as it is or in double quotes; if "
           "both are given they must be the same."),
]


def one_key(header: str | None, body: str | None) -> str | None:
    """A create's idempotency key: its ``Idempotency-Key`` header's, or its body's, or both
    if they are the same. Two that differ are refused (a retry could mean either), and the
    header's is checked as the service checks the body's, naming the header."""
    if header is None:
        return body
    validate_key(header, IDEMPOTENCY_HEADER)
    if body is not None and body != header:
        raise InvalidInput(IDEMPOTENCY_HEADER, header,
                           f"differs from the body's idempotency_key {shown(body)}: give the "
                           "key once, or the same in both")
    return header


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class PoolCreate(Strict):
    name: Name
    capacity: PositiveAmounts = Field(description="Units per resource key, e.g. {\"gpu\": 8}.")
    description: Description | None = None


class PoolUpdate(Strict):
    capacity: Amounts | None = Field(
        default=None, description="New totals per key; 0 removes a key."
    )
    description: Description | None = None


class PolicyCreate(Strict):
    component: Name
    component_type: ComponentType = "orchestrator"
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY)] = Field(
        default=0, description="Higher is preferred."
    )
    reserved: Amounts = Field(default_factory=dict)
    limit: Amounts = Field(default_factory=dict)


class PolicyUpdate(Strict):
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY)] | None = Field(
        default=None, description="Higher is preferred; absent: kept."
    )
    reserved: Amounts | None = Field(default=None, description="Replaces the whole map.")
    limit: Amounts | None = Field(default=None, description="Replaces the whole map.")


class RequestCreate(Strict):
    component: Name
    component_type: ComponentType = "orchestrator"
    resources: PositiveAmounts = Field(description="Units per resource key, e.g. {\"gpu\": 2}.")
    preemptible: bool = True
    max_retries: Annotated[int, Field(ge=0, le=MAX_RETRIES)] = 0
    labels: Annotated[dict[Key, LabelValue], Field(max_length=MAX_LABELS)] = Field(
        default_factory=dict
    )
    lease_ttl: Annotated[int, Field(ge=1, le=MAX_LEASE_TTL)] | None = Field(
        default=None,
        description="Seconds: the allocation is released when no heartbeat renews it in time.",
    )
    idempotency_key: IdempotencyKey = None


class Cancel(Strict):
    reason: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_REASON, pattern=NAME_PATTERN),
        AfterValidator(text),
    ] | None = Field(
        default=None,
        description="Why: kept as the reason, `cancelled: <reason>` (else `cancelled by user`).",
    )


class Prune(Strict):
    older_than: int = Field(
        ge=0, le=MAX_RETENTION,
        description="Seconds: what ended (a final status) longer ago than this is deleted.",
    )
    dry_run: bool = Field(default=False, description="Only count what would be deleted.")
    batches: int = Field(
        default=PRUNE_BATCHES_PER_CALL, ge=1, le=PRUNE_BATCHES_PER_CALL,
        description="At most this many transactions of 1,000 rows each, so that a call "
        "takes seconds however much is due: `complete` false says more is, for the next call.",
    )


class ErrorBody(BaseModel):
    """Every error response."""

    detail: str = Field(description="One line saying what is wrong.")
    field: str | None = Field(description="The offending field's path, e.g. resources.gpu.")
