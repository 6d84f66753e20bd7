"""Row locks in a deterministic order, and transactions retried on deadlock.

Two jobs that move money between the same two accounts in opposite directions deadlock
if each locks "its" source first. :func:`lock_rows` always locks in primary-key order,
so they queue instead. :func:`retry_on_conflict` runs a function in its own transaction
and runs it again after a deadlock, a serialization failure or a dropped connection
(SQLite: "database is locked"), a bounded number of times, with jittered exponential
backoff.

On SQLite ``SELECT … FOR UPDATE`` does not exist: with ``"transaction_mode":
"IMMEDIATE"`` every writing transaction holds the database lock from its start, so the
rows are as good as locked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, models, transaction

from django_outbox.base.transient import retry_transient
from django_outbox.exceptions import NotInTransaction

__all__ = [
    "lock_rows",
    "retry_on_conflict",
]

F = TypeVar("F", bound=Callable[..., Any])


def lock_rows(
    model_or_queryset: type[models.Model] | models.QuerySet, pks: Iterable[Any]
) -> list[models.Model]:
    """Lock the rows with primary keys *pks* in primary-key order; return them in that order.

    Must run inside a transaction (the locks last until it ends). Missing keys are
    simply absent from the result.
    """
    queryset = (
        model_or_queryset._default_manager.all()
        if isinstance(model_or_queryset, type)
        else model_or_queryset
    )
    alias = queryset.db
    if not connections[alias].in_atomic_block:
        raise NotInTransaction(
            "lock_rows() must run inside transaction.atomic(): a lock outside a transaction "
            "is released at once."
        )
    return list(queryset.select_for_update().filter(pk__in=list(pks)).order_by("pk"))


def retry_on_conflict(
    func: F | None = None,
    *,
    attempts: int = 5,
    base_delay: float = 0.02,
    max_delay: float = 1.0,
    using: str | None = None,
) -> Any:
    """Run the decorated function in its own transaction, again after a transient conflict.

    Deadlocks (40P01), serialization failures (40001), a dropped connection and SQLite's
    "database is locked" are retried up to *attempts* times in all, sleeping a random
    50 to 100 % of ``min(max_delay, base_delay * 2 ** (try - 1))`` in between; any other
    error, or the last conflict, is raised. Called inside an outer transaction it refuses
    (a retry could not undo the outer transaction's part).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            alias = using or DEFAULT_DB_ALIAS
            if connections[alias].in_atomic_block:
                raise NotInTransaction(
                    f"{fn.__qualname__} retries its own transaction on conflict and cannot run "
                    "inside an outer transaction.atomic(); call it outside one."
                )

            def run() -> Any:
                with transaction.atomic(using=alias):
                    return fn(*args, **kwargs)

            return retry_transient(
                run,
                alias,
                what=fn.__qualname__,
                attempts=attempts,
                base_delay=base_delay,
                max_delay=max_delay,
            )

        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate
