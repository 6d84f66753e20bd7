"""SQL of the rate budget: reserving a stream's next handler call, in one statement."""

from __future__ import annotations

import uuid
from typing import Any

from django_outbox.base.dialect import dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.models.groups import OutboxGroup
from django_outbox.models.state import StreamState


def reserve_call(
    stream: str,
    interval: float,
    horizon: float,
    *,
    group_id: uuid.UUID | None = None,
    seconds_per_row: float = 0.0,
) -> float | None:
    """Reserve the stream's next call slot; return the seconds to wait for it, or None.

    The slot starts at the stream's ``next_call_at`` or now, whichever is later, and
    pushes ``next_call_at`` past it (and counts the call in ``budget_calls``, its rows in
    ``budget_rows``), in one statement on the stream's state row: concurrent workers,
    of any process or machine, get slots apart, in the database's clock. How far apart:
    *interval* seconds (``1 / CALLS_PER_SECOND``, 0 without), or the rows of group
    *group_id* times *seconds_per_row* (``1 / ROWS_PER_SECOND``) when that is longer:
    a group larger than one second's rows still goes, and the calls after it wait for
    its whole weight. The group's size is read in the same statement.
    A slot further than *horizon* seconds away is not reserved (None): nor is one of a
    stream without a state row.

    Its commit does not wait for the write-ahead log (``no_flush_wait``): the call that
    follows must not wait for a disk flush. A server crash can lose the last
    reservations, so the calls right after a crash may come closer than the budget.
    """
    connection = connection_for(StreamState)
    qn = connection.ops.quote_name
    table = qn(StreamState._meta.db_table)
    groups = qn(OutboxGroup._meta.db_table)
    params: list[Any] = []
    rows = "0"
    if group_id is not None:
        rows = f"COALESCE((SELECT size FROM {groups} WHERE id = %s), 1)"
        params.append(OutboxGroup._meta.pk.get_db_prep_value(group_id, connection))
    if connection.vendor == "postgresql":
        now = "statement_timestamp()"
        step = f"GREATEST(%s::float8, {rows} * %s::float8)"
        sql = (
            f"UPDATE {table} SET next_call_at = GREATEST(next_call_at, {now}) "
            f"+ {step} * interval '1 second', budget_calls = budget_calls + 1, "
            f"budget_rows = budget_rows + {rows} "
            f"WHERE stream = %s AND (next_call_at IS NULL "
            f"OR next_call_at <= {now} + %s * interval '1 second') "
            f"RETURNING EXTRACT(EPOCH FROM next_call_at - {now}), {step}"
            f"{dialect_of(connection).no_flush_wait}"
        )
    else:
        now = "JULIANDAY('now')"
        step = f"MAX(%s, {rows} * %s)"
        sql = (
            f"UPDATE {table} SET next_call_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', "
            f"MAX(JULIANDAY(COALESCE(next_call_at, 'now')), {now}) + {step} / 86400.0), "
            f"budget_calls = budget_calls + 1, budget_rows = budget_rows + {rows} "
            f"WHERE stream = %s AND (next_call_at IS NULL "
            f"OR JULIANDAY(next_call_at) <= {now} + %s / 86400.0) "
            f"RETURNING (JULIANDAY(next_call_at) - {now}) * 86400.0, {step}"
        )
    step_params = [interval, *params, seconds_per_row]
    # SET: step, rows; WHERE: stream, horizon; RETURNING: step.
    args = [*step_params, *params, stream, horizon, *step_params]
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        row = cursor.fetchone()
    if row is None:
        return None
    return max(float(row[0]) - float(row[1]), 0.0)
