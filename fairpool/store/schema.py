"""The tables, as SQLAlchemy Core metadata. Invariants are constraints, not application code.

Every change here needs a migration in ``migrations/versions`` (the tests check both agree).
The SQL stays portable between SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    DateTime,
    Dialect,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.event import listens_for
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

from fairpool.store.records import (
    WORKLOAD_RESOURCES,
    ComponentType,
    RequestStatus,
    TokenRole,
    WorkloadStatus,
)
from fairpool.store.tree_records import JobStatus, OperationStatus

# Constraints get deterministic names so that migrations can refer to them and both SQLite
# and PostgreSQL report the same names as this metadata.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _named_by(column: str) -> Index:
    """An index of the rows whose ``column`` (a nullable foreign key) names one: what its
    ON DELETE action looks up, partial because most rows name none."""
    where = text(f"{column} IS NOT NULL")
    return Index(None, column, sqlite_where=where, postgresql_where=where)


class by_code_point(FunctionElement[str]):  # lower case: a SQL function, as func.*
    """A text column to ORDER BY in code point order on every database, SQLite's own:
    PostgreSQL orders by the database's collation, and an en-US one put ``_x, a, a_b, a-b,
    A:1`` where SQLite has ``A:1, _x, a, a-b, a_b``, so lists differed with the store."""

    inherit_cache = True
    type = String()


@compiles(by_code_point)
def _as_it_is(element: by_code_point, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(by_code_point, "postgresql")
def _collate_c(element: by_code_point, compiler: SQLCompiler, **kw: Any) -> str:
    return f'{compiler.process(element.clauses, **kw)} COLLATE "C"'


def as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, as the store gives it back; a naive one is refused, its zone unknown."""
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment.isoformat()}: pass an aware one")
    return moment.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware datetime in, an aware UTC datetime out, on every backend.

    SQLite keeps no offset, so values are stored as UTC and tagged UTC again when read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)

    def bind_processor(self, dialect: Dialect) -> Callable[[datetime | None], Any] | None:
        """On SQLite, the text SQLAlchemy's ``DATETIME`` writes ("2025-01-02 03:04:05.000006"),
        formatted from a tuple rather than from a dict of the fields: 0.88 µs against 1.56 a
        time with the conversion to UTC (an f-string: 1.60), and a create + release binds a
        dozen."""
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        def process(value: datetime | None) -> str | None:
            if value is None:
                return None
            t = as_utc(value)
            return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 (the fastest)
                t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond
            )

        return process

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _one_of(column: str, values: Iterable[StrEnum]) -> str:
    quoted = ", ".join(f"'{v.value}'" for v in values)
    return f"{column} IN ({quoted})"


#: Characters of an id (``fairpool.ids``: a UUID's text).
ID_LENGTH: Final = 36


def _id() -> Column[str]:
    return Column("id", String(ID_LENGTH), primary_key=True)


def _time(name: str, *, nullable: bool = False) -> Column[datetime]:
    return Column(name, UTCDateTime(), nullable=nullable)


def _idempotency() -> tuple[Column[str], Column[str], CheckConstraint]:
    """The key a create was made with (``fairpool.idempotency``) and the digest of what it
    asked, both or neither."""
    return (
        Column("idempotency_key", String(64), nullable=True, unique=True),
        Column("idempotency_digest", String(64), nullable=True),
        CheckConstraint("(idempotency_key IS NULL) = (idempotency_digest IS NULL)",
                        name="idempotency_keyed"),
    )


def _created_by() -> Column[str]:
    """The API token a row was submitted with: a submitter sees and ends its own rows only.
    NULL: not through an authenticated API call (embedded, or auth off)."""
    return Column(
        "created_by_token_id",
        String(36),
        ForeignKey("api_token.id", ondelete="SET NULL"),
        nullable=True,
    )


component = Table(
    "component",
    metadata,
    _id(),
    Column("name", String(255), nullable=False),
    Column("type", String(32), nullable=False),
    _time("created_at"),
    UniqueConstraint("name", "type"),
    CheckConstraint(_one_of("type", ComponentType), name="type"),
)

pool = Table(
    "pool",
    metadata,
    _id(),
    Column("name", String(255), nullable=False, unique=True),
    Column("description", Text, nullable=True),
    _time("created_at"),
    _time("updated_at"),
)

pool_resource = Table(
    "pool_resource",
    metadata,
    Column("pool_id", String(36), ForeignKey("pool.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(255), nullable=False),
    Column("total", BigInteger, nullable=False),
    PrimaryKeyConstraint("pool_id", "key"),
    CheckConstraint("total > 0", name="total_positive"),
)

policy = Table(
    "policy",
    metadata,
    _id(),
    Column("pool_id", String(36), ForeignKey("pool.id", ondelete="CASCADE"), nullable=False),
    Column(
        "component_id",
        String(36),
        ForeignKey("component.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("priority", Integer, nullable=False),
    _time("created_at"),
    _time("updated_at"),
    # One policy per (component, pool): the engine looks a grant's policy up by that pair.
    UniqueConstraint("component_id", "pool_id"),
    CheckConstraint("priority >= 0", name="priority_non_negative"),
)

policy_resource = Table(
    "policy_resource",
    metadata,
    Column("policy_id", String(36), ForeignKey("policy.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(255), nullable=False),
    Column("reserved", BigInteger, nullable=False, server_default=text("0")),
    # NULL: no cap on this key. "limit" is reserved in SQL, hence the quotes below.
    Column("limit", BigInteger, nullable=True),
    PrimaryKeyConstraint("policy_id", "key"),
    CheckConstraint("reserved >= 0", name="reserved_non_negative"),
    CheckConstraint('"limit" IS NULL OR "limit" >= reserved', name="limit_covers_reserved"),
)

api_token = Table(
    "api_token",
    metadata,
    _id(),
    Column("name", String(255), nullable=True),
    Column("role", String(16), nullable=False),
    # Component names (a JSON list) a submitter may create requests for.
    Column("components", JSON, nullable=False),
    # Never the secret: its first characters, to recognize it, and its SHA-256 (hex), to
    # look it up. High-entropy secrets need no salt or slow hash.
    Column("prefix", String(16), nullable=False),
    Column("secret_hash", String(64), nullable=False, unique=True),
    _time("created_at"),
    _time("revoked_at", nullable=True),
    CheckConstraint(_one_of("role", TokenRole), name="role"),
)

request = Table(
    "request",
    metadata,
    _id(),
    # RESTRICT: a component with history cannot vanish from under its requests.
    Column(
        "component_id",
        String(36),
        ForeignKey("component.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    Column("status", String(16), nullable=False),
    Column("status_reason", Text, nullable=True),
    Column("preemptible", Boolean, nullable=False),
    Column("max_retries", Integer, nullable=False, server_default=text("0")),
    Column("attempt", Integer, nullable=False, server_default=text("1")),
    # UNIQUE: a preempted attempt is retried at most once.
    Column(
        "previous_attempt_id",
        String(36),
        ForeignKey("request.id", ondelete="SET NULL"),
        nullable=True,
        unique=True,
    ),
    Column(
        "preempted_by_id",
        String(36),
        ForeignKey("request.id", ondelete="SET NULL"),
        nullable=True,
    ),
    Column("labels", JSON, nullable=False),
    _time("created_at"),
    _time("updated_at"),
    _time("finished_at", nullable=True),
    # Seconds an allocation stays held without a heartbeat; NULL: until released.
    Column("lease_ttl", Integer, nullable=True),
    _created_by(),
    # Chosen by the client per create call: a create retried after its answer was lost
    # finds the request it already made instead of making a second one.
    Column("idempotency_key", String(64), nullable=True, unique=True),
    CheckConstraint(_one_of("status", RequestStatus), name="status"),
    CheckConstraint("lease_ttl IS NULL OR lease_ttl > 0", name="lease_ttl_positive"),
    CheckConstraint("max_retries >= 0", name="max_retries_non_negative"),
    CheckConstraint("attempt >= 1", name="attempt_positive"),
    # The queue is read as status = 'queued' ORDER BY created_at, id.
    Index(None, "status", "created_at", "id"),
    # A submitter's own requests.
    Index(None, "created_by_token_id"),
    # What a deleted preemptor's ON DELETE SET NULL looks up: without it, each deleted
    # request scanned the table (a prune of 50,000 took minutes). Partial: only preempted
    # requests name one, so a submit pays nothing.
    _named_by("preempted_by_id"),
)

request_resource = Table(
    "request_resource",
    metadata,
    Column("request_id", String(36), ForeignKey("request.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(255), nullable=False),
    Column("amount", BigInteger, nullable=False),
    PrimaryKeyConstraint("request_id", "key"),
    CheckConstraint("amount > 0", name="amount_positive"),
)

allocation = Table(
    "allocation",
    metadata,
    # The primary key is the invariant: a request holds at most one allocation, ever.
    Column(
        "request_id",
        String(36),
        ForeignKey("request.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("pool_id", String(36), ForeignKey("pool.id", ondelete="SET NULL"), nullable=True),
    Column("policy_id", String(36), ForeignKey("policy.id", ondelete="SET NULL"), nullable=True),
    # Copied so the history still names the pool after it is deleted.
    Column("pool_name", String(255), nullable=False),
    Column("priority", Integer, nullable=False),
    _time("allocated_at"),
    _time("released_at", nullable=True),
    # When the holder's lease runs out unless a heartbeat renews it; NULL: no lease.
    _time("lease_expires_at", nullable=True),
    # Live allocations of a pool: pool_id = ? AND released_at IS NULL.
    Index(None, "pool_id", "released_at"),
)

event = Table(
    "event",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    _time("at"),
    Column("kind", String(32), nullable=False),
    # No foreign keys: the log outlives the requests and pools it mentions.
    Column("request_id", String(36), nullable=True),
    Column("pool_id", String(36), nullable=True),
    Column("message", Text, nullable=False),
    Column("data", JSON, nullable=False, server_default=text("'{}'")),
    Index(None, "request_id"),  # not "at": the log is read by id (migration 0011)
)

# -- the scheduler config (seed 004) ---------------------------------------------------------

config_version = Table(
    "config_version",
    metadata,
    # Numbered 1, 2, ... under the write lock; rows are never deleted, and updated only to
    # record a summary a version applied before migration 0015 lacks.
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("document", Text, nullable=False),
    _time("applied_at"),
    Column(
        "rolled_back_from",
        Integer,
        ForeignKey("config_version.version", ondelete="RESTRICT"),
        nullable=True,
    ),
    CheckConstraint("version >= 1", name="version_positive"),
    CheckConstraint(
        "rolled_back_from IS NULL OR rolled_back_from < version", name="rollback_to_older"
    ),
    *_idempotency(),
    # ``config_diff.summary`` of the document: its counts and queue specs (migration 0015).
    Column("summary", JSON, nullable=True),
)

workload = Table(
    "workload",
    metadata,
    _id(),
    Column("status", String(16), nullable=False),
    Column("status_reason", Text, nullable=True),
    Column("labels", JSON, nullable=False),
    Column("requested_priority", Integer, nullable=True),
    # Demand in exact milli-units, one column per resource axis of the seed.
    *(Column(key, BigInteger, nullable=False, server_default=text("0"))
      for key in WORKLOAD_RESOURCES),
    _time("submitted_at"),
    _time("updated_at"),
    Column("queue", String(255), nullable=True),
    Column("priority", Integer, nullable=True),
    Column(
        "config_version",
        Integer,
        ForeignKey("config_version.version", ondelete="RESTRICT"),
        nullable=True,
    ),
    Column("flavors", JSON(none_as_null=True), nullable=True),
    _time("admitted_at", nullable=True),
    _time("finished_at", nullable=True),
    Column("preemptions", Integer, nullable=False, server_default=text("0")),
    # When it was last preempted and queued again: it waits from then (NULL: never).
    _time("requeued_at", nullable=True),
    _created_by(),
    *_idempotency(),
    # Why earlier rules and other flavors did not apply, as the pass that decided it said
    # (a queued one's are the live pass's).
    Column("status_notes", JSON, nullable=False, server_default=text("'[]'")),
    CheckConstraint(_one_of("status", WorkloadStatus), name="status"),
    *(CheckConstraint(f"{key} >= 0", name=f"{key}_non_negative") for key in WORKLOAD_RESOURCES),
    CheckConstraint("requested_priority IS NULL OR requested_priority >= 0",
                    name="requested_priority_non_negative"),
    # Admitted means a priority and a flavor per resource group (the queue is NULL when
    # no scheduling rules exist: admitted with no quota).
    CheckConstraint(
        "status != 'admitted' OR (priority IS NOT NULL AND flavors IS NOT NULL "
        "AND admitted_at IS NOT NULL)",
        name="admitted_is_placed",
    ),
    CheckConstraint("preemptions >= 0", name="preemptions_non_negative"),
    # Live workloads, in queue order: status IN (...) ORDER BY submitted_at, id.
    Index(None, "status", "submitted_at", "id"),
    Index(None, "created_by_token_id"),
)

# -- pool trees (seed 003) ---------------------------------------------------------------------

cluster_node = Table(
    "cluster_node",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("tags", JSON, nullable=False),
    # Exact integers per resource key (memory in bytes).
    Column("resources", JSON, nullable=False),
    _time("created_at"),
    _time("last_preemption_at", nullable=True),
)

# One row: incremented by every write transaction (``Database.write``), so a process can
# tell whether anyone wrote since its own last commit.
store_generation = Table(
    "store_generation",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("value", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)


@listens_for(store_generation, "after_create")
def _first_generation(table: Table, connection: Connection, **_: Any) -> None:
    """Its one row, which migration 0009 inserts, in a store made from this metadata too."""
    connection.execute(table.insert().values(id=1, value=0))


pool_tree = Table(
    "pool_tree",
    metadata,
    Column("name", String(255), primary_key=True),
    # The explicit options, as PoolTreeConfig.from_mapping reads them.
    Column("config", JSON, nullable=False),
    _time("created_at"),
    _time("updated_at"),
)

# //sys/pool_trees/@default_tree: at most one row, so at most one default.
pool_tree_default = Table(
    "pool_tree_default",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("tree", String(255), ForeignKey("pool_tree.name", ondelete="CASCADE"), nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

tree_pool = Table(
    "tree_pool",
    metadata,
    Column("tree", String(255), ForeignKey("pool_tree.name", ondelete="CASCADE"), nullable=False),
    Column("name", String(255), nullable=False),
    # NULL: a child of the tree's root.
    Column("parent", String(255), nullable=True),
    Column("config", JSON, nullable=False),
    # Set for an ephemeral pool: the user it was made for.
    Column("ephemeral_user", String(255), nullable=True),
    _time("below_fair_share_since", nullable=True),
    _time("created_at"),
    _time("updated_at"),
    # Integral guarantees: the accumulated volume (resource -> resource-seconds, exact text
    # such as "2000" or "3/4"), the integral share ratio held since then (exact text) and when
    # the fair-share update computed them. All three NULL: no state yet.
    Column("integral_volume", JSON(none_as_null=True), nullable=True),
    Column("integral_share_ratio", String(255), nullable=True),
    _time("integral_updated_at", nullable=True),
    PrimaryKeyConstraint("tree", "name"),
    # RESTRICT: a pool with children cannot be deleted from under them.
    ForeignKeyConstraint(
        ["tree", "parent"], ["tree_pool.tree", "tree_pool.name"], ondelete="RESTRICT"
    ),
    CheckConstraint("parent IS NULL OR parent != name", name="not_its_own_parent"),
    CheckConstraint(
        "(integral_volume IS NULL) = (integral_updated_at IS NULL) "
        "AND (integral_share_ratio IS NULL) = (integral_updated_at IS NULL)",
        name="integral_state_whole",
    ),
)

_FINAL_OPERATION = ", ".join(
    f"'{status.value}'" for status in OperationStatus if status.is_final
)

tree_operation = Table(
    "tree_operation",
    metadata,
    _id(),
    Column("user_name", String(255), nullable=False),
    Column("job_resources", JSON, nullable=False),
    Column("job_count", Integer, nullable=False),
    Column("gang", Boolean, nullable=False),
    Column("status", String(16), nullable=False),
    # Why it ended; a live operation's reasons are per tree (tree_operation_placement).
    Column("status_reason", Text, nullable=True),
    _time("created_at"),
    _time("started_at", nullable=True),
    _time("finished_at", nullable=True),
    _time("updated_at"),
    # Its jobs, when preempted, are interrupted first (allocation_preemption_timeout).
    Column("interruptible", Boolean, nullable=False),
    _created_by(),
    *_idempotency(),
    CheckConstraint(_one_of("status", OperationStatus), name="status"),
    CheckConstraint("job_count >= 1", name="job_count_positive"),
    CheckConstraint(
        f"(status IN ({_FINAL_OPERATION})) = (finished_at IS NOT NULL)",
        name="finished_iff_final",
    ),
    CheckConstraint("status != 'running' OR started_at IS NOT NULL", name="running_is_started"),
    CheckConstraint(
        f"status_reason IS NULL OR status IN ({_FINAL_OPERATION})", name="reason_only_if_final"
    ),
    # Live operations in start order: status IN (...) ORDER BY created_at, id.
    Index(None, "status", "created_at", "id"),
    Index(None, "created_by_token_id"),
)

# YTsaurus pool_trees + scheduling_options_per_pool_tree: an operation's pool, weight and
# resource_limits in each of its trees, and its state there (running or pending, why it waits,
# its starvation clock).
tree_operation_placement = Table(
    "tree_operation_placement",
    metadata,
    Column(
        "operation_id",
        String(36),
        ForeignKey("tree_operation.id", ondelete="CASCADE"),
        nullable=False,
    ),
    # RESTRICT: a tree with operations cannot vanish from under them.
    Column("tree", String(255), ForeignKey("pool_tree.name", ondelete="RESTRICT"), nullable=False),
    # The trees' order as given (the first one is shown first).
    Column("position", Integer, nullable=False),
    # A name, not a key: ephemeral pools go away with their last operation, history stays.
    Column("pool", String(255), nullable=False),
    Column("weight", String(64), nullable=False),
    Column("resource_limits", JSON, nullable=False),
    # Admitted by max_running_operation_count in this tree (else pending here).
    Column("running", Boolean, nullable=False),
    Column("reason", Text, nullable=True),
    _time("below_fair_share_since", nullable=True),
    PrimaryKeyConstraint("operation_id", "tree"),
    UniqueConstraint("operation_id", "position"),
    CheckConstraint("position >= 0", name="position_non_negative"),
    # Started operations per pool of a tree: tree = ? GROUP BY pool.
    Index(None, "tree", "pool"),
)

tree_job = Table(
    "tree_job",
    metadata,
    _id(),
    Column(
        "operation_id",
        String(36),
        ForeignKey("tree_operation.id", ondelete="CASCADE"),
        nullable=False,
    ),
    # A name, not a key: the history outlives removed nodes (a node with running jobs stays).
    Column("node", String(255), nullable=False),
    Column("status", String(16), nullable=False),
    _time("started_at"),
    _time("finished_at", nullable=True),
    Column(
        "preempted_by",
        String(36),
        ForeignKey("tree_operation.id", ondelete="SET NULL"),
        nullable=True,
    ),
    Column("reason", Text, nullable=True),
    # allocation_preemption_timeout: when an interrupted job's units are taken.
    _time("interrupt_deadline", nullable=True),
    # The tree it runs in: one of its operation's.
    Column("tree", String(255), nullable=False),
    ForeignKeyConstraint(
        ["operation_id", "tree"],
        ["tree_operation_placement.operation_id", "tree_operation_placement.tree"],
        ondelete="CASCADE",
    ),
    CheckConstraint(_one_of("status", JobStatus), name="status"),
    CheckConstraint(
        "(status IN ('running', 'interrupting')) = (finished_at IS NULL)",
        name="finished_iff_not_live",
    ),
    CheckConstraint(
        "status != 'interrupting' OR interrupt_deadline IS NOT NULL",
        name="interrupting_has_deadline",
    ),
    CheckConstraint(
        "status != 'running' OR interrupt_deadline IS NULL", name="running_not_interrupted"
    ),
    # Only a job chosen for preemption names its preemptor (preempted at once, or interrupted).
    CheckConstraint(
        "preempted_by IS NULL OR status = 'preempted' OR interrupt_deadline IS NOT NULL",
        name="preemptor_only_if_preempted",
    ),
    Index(None, "operation_id", "status"),
    Index(None, "node", "status"),
    # As request.preempted_by_id's: a deleted operation's preempted jobs, found at once.
    _named_by("preempted_by"),
)
