"""SQL of the lease engine: taking the lease of attempt n, in one statement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import Model

from django_outbox.base.dialect import column_name, dialect_of
from django_outbox.base.routing import connection_for


def take(
    model: type[Model],
    pk: Any,
    *,
    lease_seconds: float,
    worker: str,
    where: Mapping[str, Any],
    running: str | None = None,
    stamp: Sequence[str] = (),
    returning: Sequence[str] = (),
    condition: tuple[str, Sequence[Any]] | None = None,
) -> tuple[Any, ...] | None:
    """Lease the row *pk* to *worker* for *lease_seconds* if it matches *where*.

    With *running*, the row moves to that state at its next attempt (``attempt + 1``);
    without it, the row keeps the attempt a dispatcher gave it. Columns named in *stamp*
    get the database's now (``updated_at``, ``started_at``). *where* maps column names
    to values (``None``: ``IS NULL``), so a second delivery of the same work takes
    nothing; *condition* (SQL and its parameters) must hold too. Returns the attempt
    leased followed by the columns named in *returning*, or None.
    """
    connection = connection_for(model)
    dialect = dialect_of(connection)
    qn = connection.ops.quote_name
    expiry, params = dialect.seconds_from_now(lease_seconds)
    assignments = [f"lease_expires_at = {expiry}", "worker = %s"]
    params.append(worker)
    if running is not None:
        assignments[:0] = ["state = %s", "attempt = attempt + 1"]
        params[:0] = [running]
    assignments += [f"{qn(column)} = {dialect.now}" for column in stamp]
    conditions = [f"{qn(column_name(model._meta.pk))} = %s"]
    params.append(model._meta.pk.get_db_prep_value(pk, connection))
    for column, value in where.items():
        if value is None:
            conditions.append(f"{qn(column)} IS NULL")
        else:
            conditions.append(f"{qn(column)} = %s")
            params.append(value)
    if condition is not None:
        conditions.append(condition[0])
        params.extend(condition[1])
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(model._meta.db_table)} SET {', '.join(assignments)} "
            f"WHERE {' AND '.join(conditions)} "
            f"RETURNING {', '.join(['attempt', *(qn(column) for column in returning)])}",
            params,
        )
        row = cursor.fetchone()
    return (int(row[0]), *row[1:]) if row else None
