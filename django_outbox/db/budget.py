"""SQL of the rate budget: reserving a stream's next handler call, in one statement."""

from __future__ import annotations

from django_outbox.db import connection_for
from django_outbox.db.dialect import dialect_of
from django_outbox.models import StreamState


def reserve_call(stream: str, interval: float, horizon: float) -> float | None:
    """Reserve the stream's next call slot; return the seconds to wait for it, or None.

    The slot starts at the stream's ``next_call_at`` or now, whichever is later, and
    pushes ``next_call_at`` *interval* seconds past it (and counts the call in
    ``budget_calls``), in one statement on the stream's state row: concurrent workers,
    of any process or machine, get slots *interval* apart, in the database's clock.
    A slot further than *horizon* seconds away is not reserved (None): nor is one of a
    stream without a state row.

    Its commit does not wait for the write-ahead log (``no_flush_wait``): the call that
    follows must not wait for a disk flush. A server crash can lose the last
    reservations, so the calls right after a crash may come closer than the budget.
    """
    connection = connection_for(StreamState)
    qn = connection.ops.quote_name
    table = qn(StreamState._meta.db_table)
    if connection.vendor == "postgresql":
        now = "statement_timestamp()"
        sql = (
            f"UPDATE {table} SET next_call_at = GREATEST(next_call_at, {now}) "
            "+ %s * interval '1 second', budget_calls = budget_calls + 1 "
            f"WHERE stream = %s AND (next_call_at IS NULL "
            f"OR next_call_at <= {now} + %s * interval '1 second') "
            f"RETURNING EXTRACT(EPOCH FROM next_call_at - {now})"
            f"{dialect_of(connection).no_flush_wait}"
        )
    else:
        now = "JULIANDAY('now')"
        sql = (
            f"UPDATE {table} SET next_call_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', "
            f"MAX(JULIANDAY(COALESCE(next_call_at, 'now')), {now}) + %s / 86400.0), "
            "budget_calls = budget_calls + 1 "
            f"WHERE stream = %s AND (next_call_at IS NULL "
            f"OR JULIANDAY(next_call_at) <= {now} + %s / 86400.0) "
            f"RETURNING (JULIANDAY(next_call_at) - {now}) * 86400.0"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, [interval, stream, horizon])
        row = cursor.fetchone()
    if row is None:
        return None
    return max(float(row[0]) - interval, 0.0)
