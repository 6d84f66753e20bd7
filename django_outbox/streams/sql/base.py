"""The interface of the per-vendor buffer operations, and the SQL they share."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from django.core.exceptions import FieldDoesNotExist
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.sql import DeleteQuery

from django_outbox.base.dialect import column_name, concrete_field, dialect_of
from django_outbox.models.archive import ArchivedEvent
from django_outbox.models.state import StreamState
from django_outbox.streams.sql import wake_guard

if TYPE_CHECKING:
    from django_outbox.streams.sql.ordered import OrderedSQL


def delete_sql(queryset: QuerySet) -> tuple[str, tuple[Any, ...]]:
    """The ``DELETE`` statement of *queryset* (no cascade, no signals: what Django runs
    for a model nothing refers to), to embed in a statement of ours."""
    query = queryset.query.chain(DeleteQuery)
    sql, params = query.get_compiler(queryset.db).as_sql()
    return sql, tuple(params)


def unpaused(connection: BaseDatabaseWrapper, stream: str) -> tuple[str, list[Any]]:
    """A condition that holds while *stream* is not paused, and its parameters.

    Paused: by an operator (``paused``) or by a handler's
    :class:`~django_outbox.exceptions.RetryAfter` that has not ended (``paused_until``,
    in the database's clock). One probe of the state row's primary key, uncorrelated:
    the statement that carries it (a claim, a lease's take) checks the pause at no
    extra round trip.
    """
    state = connection.ops.quote_name(StreamState._meta.db_table)
    return (
        f"NOT EXISTS (SELECT 1 FROM {state} WHERE stream = %s "
        f"AND (paused OR paused_until > {dialect_of(connection).now}))",
        [stream],
    )


class BufferOps:
    """Set-based statements over one buffer table (one instance per model and connection).

    Every method runs a constant number of statements whatever the group or backlog
    size. *stream* filters the shared ``OutboxEvent`` table; it is ``None`` for a
    custom buffer model bound to a single stream. The subclasses differ only in how a
    group moves into the archive.
    """

    def __init__(
        self, connection: BaseDatabaseWrapper, model: type[Model], stream: str | None = None
    ) -> None:
        self.connection = connection
        self.dialect = dialect_of(connection)
        self.model = model
        self.stream = stream
        qn = connection.ops.quote_name
        self.table = qn(model._meta.db_table)
        self.archive_table = qn(_archive_model()._meta.db_table)
        self.qn = qn
        self.group_field = concrete_field(model, "group_id")
        self._insert_sqls: dict[tuple[bool, bool, str], str] = {}

    # -- helpers ---------------------------------------------------------------------

    def group_param(self, group_id: uuid.UUID) -> Any:
        return self.group_field.get_db_prep_value(group_id, self.connection)

    def stream_clause(self) -> tuple[str, list[Any]]:
        return ("AND stream = %s", [self.stream]) if self.stream is not None else ("", [])

    def execute(self, sql: str, params: Iterable[Any]) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.rowcount

    def fetchone(self, sql: str, params: Iterable[Any]) -> tuple[Any, ...] | None:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchone()

    # -- the interface ---------------------------------------------------------------

    #: Whether claims start above the stream's claim floor
    #: (:mod:`django_outbox.streams.claim_floor`):
    #: where a claimed or deleted row's entry stays in the unclaimed index while any
    #: snapshot can see it (PostgreSQL), a claim from the index's oldest end would step
    #: over all of them. SQLite removes the entry with the row.
    keeps_claim_floor = False
    #: The stream whose claim floor's holes a claim reads (set by
    #: :func:`django_outbox.streams.sql.stream_buffer`), where :attr:`keeps_claim_floor`.
    floor_stream: str | None = None

    def floor_start(self, floor: int) -> tuple[str, list[Any]]:
        """The SQL of the id a claim starts above, and its parameters: *floor* here."""
        return "%s", [floor]

    #: The ordered statements of an ordered stream (``ORDER_KEY``), set by
    #: :func:`django_outbox.streams.sql.stream_buffer`; None: the claim takes rows in id order
    #: with no regard to keys.
    ordered: OrderedSQL | None = None

    #: The stream whose pause stops the claim (set by
    #: :func:`django_outbox.streams.sql.stream_buffer`): while it is paused the claim statement
    #: takes nothing (:func:`unpaused`). None: the claim does not look.
    paused_by: str | None = None

    def claim_sql(self, floor: int = 0) -> tuple[str, list[Any]]:
        """The single statement that stamps up to n unclaimed rows with a group.

        Its plan never scans the whole buffer: the ids are picked by the partial index of
        unclaimed rows and the rows found by primary key (:meth:`Dialect.id_pick`). For
        the shared table the pick orders by ``stream, id`` (the same order, the stream
        being fixed), which only the partial ``(stream, id)`` index provides without a
        sort. Rows another claim holds are skipped (PostgreSQL). Its parameters are the
        group id, the returned ones, and the limit. *floor* is used where
        :attr:`keeps_claim_floor`.
        """
        if self.ordered is not None:
            return self.ordered_claim_sql(floor)
        where, params = self.stream_clause()
        order = "stream, id" if self.stream is not None else "id"
        pick = self.dialect.id_pick(
            f"SELECT id FROM {self.table} WHERE group_id IS NULL {where} "
            f"ORDER BY {order} LIMIT %s{self.dialect.skip_locked}"
        )
        return self.claim_update(pick, params)

    def ordered_claim_sql(self, floor: int) -> tuple[str, list[Any]]:
        """:meth:`claim_sql` of an ordered stream (:meth:`OrderedSQL.pick`)."""
        assert self.ordered is not None
        start, start_params = self.floor_start(floor)
        pick = self.ordered.pick(start)
        params = self.ordered.pick_params(start_params, 0)[:-1]  # the limit comes last
        return self.claim_update(pick, params)

    def claim_update(self, pick: str, params: list[Any]) -> tuple[str, list[Any]]:
        """The claim's UPDATE of the ids *pick* matches (parameters *params*, then the
        limit): nothing while the stream :attr:`paused_by` is paused. The pause is
        tested first, once: a paused stream's claim picks and locks no row."""
        if self.paused_by is None:
            return f"UPDATE {self.table} SET group_id = %s WHERE {pick}", params
        gate, gate_params = unpaused(self.connection, self.paused_by)
        return (
            f"UPDATE {self.table} SET group_id = %s WHERE {gate} AND {pick}",
            [*gate_params, *params],
        )

    def claim(self, group_id: uuid.UUID, limit: int, floor: int = 0) -> Claimed:
        """Stamp up to *limit* unclaimed rows, oldest first, with *group_id*.

        Must run inside a transaction. Rows another transaction is claiming are skipped
        (PostgreSQL) or wait for it (SQLite, serialized by its write lock). Where
        :attr:`keeps_claim_floor`, only rows above *floor* are looked at.
        """
        sql, where_params = self.claim_sql(floor)
        return Claimed(self.execute(sql, [self.group_param(group_id), *where_params, limit]))

    def count_unclaimed(self, cap: int, floor: int = 0) -> int:
        """Count unclaimed rows, stopping at *cap*, so the cost never grows past it;
        where :attr:`keeps_claim_floor`, only rows above *floor* (the dead entries below
        it are not stepped over)."""
        where, params = self.stream_clause()
        if self.keeps_claim_floor and floor:
            where, params = f"{where} AND id > %s", [*params, floor]
        row = self.fetchone(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM {self.table} "
            f"WHERE group_id IS NULL {where} LIMIT %s) AS backlog",
            [*params, cap],
        )
        return int(row[0]) if row else 0

    def backlog(self, cap: int) -> Backlog:
        """Count unclaimed rows up to *cap*; where :attr:`keeps_claim_floor`, the lowest too."""
        return Backlog(self.count_unclaimed(cap))

    def group_rows(self, group_id: uuid.UUID, names: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Return the group's rows, in id order, as dicts of the named concrete fields.

        The values are converted as the ORM would convert them, with the converters
        looked up once per column instead of once per value.
        """
        opts = self.model._meta
        fields = [self._column_field(name) for name in names] or list(opts.concrete_fields)
        keys = list(names) or [field.attname for field in fields]  # as values() names them
        converters = []
        for index, field in enumerate(fields):
            column = field.get_col(opts.db_table)
            found = self.connection.ops.get_db_converters(column) + field.get_db_converters(
                self.connection
            )
            if found:
                converters.append((index, column, found))
        with self.connection.cursor() as cursor:
            cursor.execute(*self.group_fetch_sql(group_id, fields))
            records = cursor.fetchall()
        if converters:
            records = [list(record) for record in records]
            for record in records:
                for index, column, funcs in converters:
                    value = record[index]
                    for func in funcs:
                        value = func(value, column, self.connection)
                    record[index] = value
        return [dict(zip(keys, record, strict=True)) for record in records]

    def group_fetch_sql(
        self, group_id: uuid.UUID, fields: Iterable[Field] = ()
    ) -> tuple[str, list[Any]]:
        """The statement that reads a group's rows (all concrete columns by default)."""
        columns = ", ".join(
            self.qn(column_name(field))
            for field in (list(fields) or self.model._meta.concrete_fields)
        )
        return (
            f"SELECT {columns} FROM {self.table} WHERE group_id = %s ORDER BY id",
            [self.group_param(group_id)],
        )

    def _column_field(self, name: str) -> Field:
        opts = self.model._meta
        try:
            field = concrete_field(self.model, name)
        except FieldDoesNotExist:
            field = None
        if field is None or field not in opts.concrete_fields:
            raise ValueError(
                f"{name!r} is not a column of {opts.label}: use batch.events.values(...) "
                "to follow relations."
            )
        return field

    def insert_event(
        self,
        stream: str,
        payload_json: str,
        trace_context: str | None = None,
        order_key: str | None = None,
    ) -> int:
        """Insert one row into the generic buffer; return its id. One statement.

        *trace_context* (a ``traceparent``) and *order_key* (an ordered stream's key) are
        written only when given.
        """
        row = self.fetchone(
            self.insert_sql(trace_context is not None, order_key is not None),
            self.insert_params(stream, payload_json, trace_context, order_key),
        )
        assert row is not None
        return int(row[0])

    @property
    def wake_guarded(self) -> bool:
        """Whether :meth:`insert_event_guarded` asks the wake guard (PostgreSQL, the
        stream's state on the buffer's database): only then may it queue a wake."""
        return False

    def insert_event_guarded(
        self,
        stream: str,
        payload_json: str,
        trace_context: str | None = None,
        order_key: str | None = None,
        wake: tuple[str, str] | None = None,
    ) -> tuple[int, int]:
        """Insert one row into the generic buffer, in one statement; return its id and
        the wake guard's answer (:mod:`django_outbox.streams.sql.wake_guard`): ``SKIP``,
        ``WAKE_AFTER_COMMIT``, or the queue row id of the wake *wake* (a cluster key and
        a signed package) that the statement queued."""
        event_id = self.insert_event(stream, payload_json, trace_context, order_key)
        return event_id, wake_guard.WAKE_AFTER_COMMIT

    def insert_sql(self, traced: bool, keyed: bool, returning: str = "id") -> str:
        """The INSERT of one generic buffer row, with a trace context (*traced*) and an
        order key (*keyed*) or without, returning *returning*: built once per form
        (``publish()`` is a hot path); its parameters: :meth:`insert_params`."""
        form = (traced, keyed, returning)
        sql = self._insert_sqls.get(form)
        if sql is None:
            given = [name for name, on in (("trace_context", traced), ("order_key", keyed)) if on]
            sql = self._insert_sqls[form] = (
                f"INSERT INTO {self.table} (created_at, stream, payload"
                f"{''.join(f', {name}' for name in given)}) "
                f"VALUES ({self.dialect.now}, %s, %s{self.dialect.json_cast}"
                f"{', %s' * len(given)}) RETURNING {returning}"
            )
        return sql

    @staticmethod
    def insert_params(
        stream: str, payload_json: str, trace_context: str | None, order_key: str | None
    ) -> list[Any]:
        """The parameters of :meth:`insert_sql`'s statement."""
        params = [stream, payload_json]
        if trace_context is not None:
            params.append(trace_context)
        if order_key is not None:
            params.append(order_key)
        return params

    def archive_group(self, group_id: uuid.UUID, move: Move) -> int:
        """Archive (when ``move.archive``) and delete the group's rows but ``move.keep_ids``.

        Returns the number of rows deleted.
        """
        rows = 0
        for sql, params in self.move_statements(group_id, move):
            rows = self.execute(sql, params)  # the last statement deletes
        return rows

    def archive_group_fenced(self, group_id: uuid.UUID, move: Move, fence: QuerySet) -> int | None:
        """:meth:`archive_group` once *fence* (the group's row while this attempt holds its
        lease) is deleted; None, with nothing changed, when the fence matched no row."""
        if not fence.delete()[0]:
            return None
        return self.archive_group(group_id, move)

    def move_statements(self, group_id: uuid.UUID, move: Move) -> list[tuple[str, list[Any]]]:
        """The statements of :meth:`archive_group`, the DELETE last."""
        raise NotImplementedError

    def group_where(self, group_id: uuid.UUID, move: Move) -> tuple[str, list[Any]]:
        """The group's rows that leave the buffer: all but ``move.keep_ids``."""
        where, params = "group_id = %s", [self.group_param(group_id)]
        if move.keep_ids:
            keep, keep_params = self.dialect.in_ids(move.keep_ids, negate=True)
            where, params = f"{where} AND {keep}", [*params, *keep_params]
        return where, params


class Claimed(NamedTuple):
    """What a claim stamped: how many rows, and the highest id among them where known."""

    size: int
    highest_id: int | None = None


class Backlog(NamedTuple):
    """Unclaimed rows counted up to a cap, and the lowest unclaimed id where known."""

    rows: int
    lowest_id: int | None = None


@dataclass(frozen=True)
class Move:
    """How a group's rows leave the buffer: into the archive with this outcome, or not.

    Each archived row gets *error*, or its own entry in *row_errors* (keyed by the row
    id as a string); the rows of *keep_ids* stay in the group.
    """

    stream: str
    outcome: str
    attempts: int
    error: str = ""
    keep_ids: tuple[int, ...] = ()
    row_errors: Mapping[str, str] | None = None
    archive: bool = True

    def archive_params(self) -> list[Any]:
        """Parameters of the archive columns stream, outcome, attempts, row errors, error."""
        return [
            self.stream,
            self.outcome,
            self.attempts,
            json.dumps(dict(self.row_errors or {})),
            self.error,
        ]


def _archive_model() -> type[Model]:

    return ArchivedEvent


ARCHIVE_COLUMNS = (
    "stream, event_id, group_id, data, created_at, archived_at, outcome, attempts, error"
)
