"""SQL of staged jobs: one INSERT to stage, one DELETE (or UPDATE) … RETURNING to take a batch.

The same statements serve PostgreSQL and SQLite; only the clock expression and the
``SKIP LOCKED`` clause (PostgreSQL: concurrent drainers take disjoint rows, and skip the
row a running job holds; SQLite: writers are serialized by the database lock) differ.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_outbox.base.dialect import dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.models.staged import StagedJob

COLUMNS = (
    "id",
    "func",
    "args",
    "kwargs",
    "q_options",
    "idempotency_key",
    "created_at",
    "run_after",
    "forward_count",
    "last_error",
    "trace_context",
)


@dataclass(frozen=True)
class TakenJob:
    """A staged row as the drainer took it from the table."""

    id: int
    func: str
    args: list[Any]
    kwargs: dict[str, Any]
    q_options: dict[str, Any]
    idempotency_key: str
    created_at: datetime | None  # None: not staged, handed to the broker at once
    run_after: datetime | None
    #: Forwards to a broker that can lose jobs, this one included.
    forward_count: int = 0
    #: Set when the row was due again after ``max_forwards`` forwards: kept, not forwarded.
    last_error: str = ""
    #: The ``traceparent`` of the span that staged the job (OpenTelemetry), if any.
    trace_context: str | None = None


def _model() -> type[StagedJob]:

    return StagedJob


def insert(
    func: str,
    args_json: str,
    kwargs_json: str,
    options_json: str,
    idempotency_key: str,
    run_after: datetime | None,
    trace_context: str | None = None,
) -> int:
    """Insert one staged job in the current transaction; return its id.

    *trace_context* (a ``traceparent``) is written only when given.
    """
    model = _model()
    connection = connection_for(model)
    dialect = dialect_of(connection)
    table = connection.ops.quote_name(model._meta.db_table)
    cast = dialect.json_cast
    run_after_value = (
        model._meta.get_field("run_after").get_db_prep_value(run_after, connection)
        if run_after is not None
        else None
    )
    traced = (", trace_context", ", %s", [trace_context]) if trace_context else ("", "", [])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (func, args, kwargs, q_options, idempotency_key, "
            f"created_at, run_after, last_error{traced[0]}) VALUES (%s, %s{cast}, %s{cast}, "
            f"%s{cast}, %s, {dialect.now}, %s, ''{traced[1]}) RETURNING id",
            [
                func,
                args_json,
                kwargs_json,
                options_json,
                idempotency_key,
                run_after_value,
                *traced[2],
            ],
        )
        return int(cursor.fetchone()[0])


def take_due(
    limit: int,
    ids: Sequence[int] | None = None,
    *,
    redeliver_seconds: float,
    keep: bool = False,
    max_forwards: int,
    exhausted_error: str,
) -> list[TakenJob]:
    """Take up to *limit* due rows in id order and return them, in one statement.

    Without *keep* the rows are deleted (the broker's queue commits with this
    transaction). With *keep* they stay, stamped ``forwarded_at`` and counted in
    ``forward_count``: the job deletes its row once it has run, and a row forwarded more
    than *redeliver_seconds* ago is due again (its job may have been lost). A due row
    forwarded *max_forwards* times already is not forwarded again: it keeps its
    ``forwarded_at`` and count and gets *exhausted_error* as its ``last_error`` (it is
    returned with it). Rows another drainer or a running job holds are skipped
    (PostgreSQL), rows the drainer could not forward before (``last_error`` set) and rows
    not yet due are left alone. With *ids*, only those rows are considered (the
    low-latency forward after a commit).
    """
    model = _model()
    connection = connection_for(model)
    dialect = dialect_of(connection)
    table = connection.ops.quote_name(model._meta.db_table)
    lost_since, params = dialect.seconds_from_now(-redeliver_seconds)
    only_ids = ""
    if ids is not None:
        clause, id_params = dialect.in_ids(ids)
        only_ids = f" AND {clause}"
        params += id_params
    params.append(limit)
    where = dialect.id_pick(
        f"SELECT id FROM {table} "
        f"WHERE last_error = '' AND (run_after IS NULL OR run_after <= {dialect.now}) "
        f"AND (forwarded_at IS NULL OR forwarded_at < {lost_since})"
        f"{only_ids} ORDER BY id LIMIT %s{dialect.skip_locked}"
    )
    change_params: list[Any]
    if not keep:
        change, change_params = f"DELETE FROM {table}", []
    else:
        # Every SET expression reads the row as it was: the three agree on its fate.
        fresh = "forward_count < %s"
        change = (
            f"UPDATE {table} SET "
            f"forwarded_at = CASE WHEN {fresh} THEN {dialect.now} ELSE forwarded_at END, "
            f"last_error = CASE WHEN {fresh} THEN '' ELSE %s END, "
            f"forward_count = CASE WHEN {fresh} THEN forward_count + 1 ELSE forward_count END"
        )
        change_params = [max_forwards, max_forwards, exhausted_error, max_forwards]
    with connection.cursor() as cursor:
        cursor.execute(
            f"{change} WHERE {where} RETURNING {', '.join(COLUMNS)}", change_params + params
        )
        rows = cursor.fetchall()
    return sorted((_taken(row) for row in rows), key=lambda job: job.id)


def hold(staged_id: int) -> bool:
    """Lock the row of the staged job about to run, in the current transaction.

    False when there is no row to run: the job ran already (its row went with its
    effects), or a delivery running now holds it (PostgreSQL: skipped at once, never
    waited for). On SQLite the database lock serializes the runs instead.
    """
    model = _model()
    connection = connection_for(model)
    dialect = dialect_of(connection)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s{dialect.skip_locked}", [staged_id])
        return cursor.fetchone() is not None


def keep_with_error(job: TakenJob, error: str) -> None:
    """Put a taken row back, unchanged but for *error*, so an operator can fix it."""
    model = _model()
    rows = model.objects.using(connection_for(model).alias)
    # A kept row (taken with keep) is still there: its forward did not happen.
    if rows.filter(id=job.id).update(
        last_error=error, forwarded_at=None, forward_count=max(job.forward_count - 1, 0)
    ):
        return
    rows.create(
        id=job.id,
        func=job.func,
        args=job.args,
        kwargs=job.kwargs,
        q_options=job.q_options,
        idempotency_key=job.idempotency_key,
        run_after=job.run_after,
        forward_count=job.forward_count,
        last_error=error,
        # A row taken from the table has its time; one never staged gets the database's.
        **({} if job.created_at is None else {"created_at": job.created_at}),
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _datetime(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_datetime(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def _taken(row: Sequence[Any]) -> TakenJob:
    id_, func, args, kwargs, options, key, created_at, run_after, forwards, error, trace = row
    return TakenJob(
        id=int(id_),
        func=func,
        args=_json(args),
        kwargs=_json(kwargs),
        q_options=_json(options),
        idempotency_key=key or "",
        created_at=_datetime(created_at),
        run_after=_datetime(run_after),
        forward_count=int(forwards or 0),
        last_error=error or "",
        trace_context=trace or None,
    )
