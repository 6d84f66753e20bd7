"""The lease engine: everything that runs as attempt n under a lease uses it.

A leased row (a group of buffer rows, a unique job) has a ``state``, an ``attempt``
number and a ``lease_expires_at``. The worker that took attempt n changes the row only
through :meth:`LeaseTable.fenced`, which matches the row while it is still running that
attempt: a worker whose lease expired and was taken over (a rescue, a duplicate
delivery) changes nothing and gets :class:`~django_outbox.exceptions.LeaseLost`.

* :class:`LeaseTable` — taking the lease of attempt n, fenced updates, heartbeat, row
  lock and the expired leases of one table (the database's clock throughout);
* :class:`RetryPolicy` — after a failed or lost attempt: retry after a backoff, or
  exhaust (last attempt, or a permanent failure);
* :func:`describe`, :func:`clip`, :func:`last_line` — errors as they are stored, logged
  and shown: one truncation rule (the first line and the end are kept: a label such as
  ``finalize failed:`` heads the error, and a traceback's last line names the exception);
* :func:`worker_identity` — ``host:pid`` of this worker, stored on what it runs.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Model, Q, QuerySet
from django.db.models.functions import Now

from django_outbox.base.backoff import backoff_seconds
from django_outbox.base.dialect import column_name, concrete_field
from django_outbox.base.routing import connection_for
from django_outbox.exceptions import LeaseLost
from django_outbox.lease import sql as lease_sql

_identity = ""  # "host:pid", made once per process (forgotten in a forked child)


def worker_identity() -> str:
    """``host:pid`` of this process, made once per process: a task records it on every
    attempt, and reading the host name and the pid are system calls."""
    global _identity
    if not _identity:
        _identity = f"{socket.gethostname()}:{os.getpid()}"
    return _identity


def _forget_identity() -> None:
    global _identity
    _identity = ""


os.register_at_fork(after_in_child=_forget_identity)


@dataclass(frozen=True)
class RetryPolicy:
    """What follows a failed or lost attempt n of something with these options."""

    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float

    def exhausted(self, attempt: int, *, permanent: bool = False) -> bool:
        """Whether attempt *attempt* was the last one (or the failure is permanent)."""
        return permanent or attempt >= self.max_attempts

    def retry_in(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (jittered exponential backoff)."""
        return backoff_seconds(attempt, self.backoff_seconds, self.backoff_max_seconds)


class LeaseTable:
    """The fenced operations on one table of leased rows.

    *what* names a row in errors (``"group"``, ``"blogs.RebuildBlogFeed"``); *running*
    is the state value of a row under a lease; *fence* the column that fences a worker's
    changes (the attempt by default; unique jobs have a token of their own, fresh on
    every start, since a job may run the same attempt number twice).
    """

    def __init__(
        self,
        model: type[Model],
        *,
        what: str,
        lease_seconds: float,
        running: str = "running",
        touch: str | None = None,
        fence: str = "attempt",
    ) -> None:
        self.model = model
        self.what = what
        self.lease = timedelta(seconds=lease_seconds)
        self.running = running
        self.touch = touch  # a column stamped with the database's now on every change
        self.fence = fence  # the column of the fencing token: the attempt, or a token

    @property
    def alias(self) -> str:
        return connection_for(self.model).alias

    def objects(self) -> QuerySet:
        return self.model._default_manager.using(self.alias)

    def fenced(self, pk: Any, attempt: int) -> QuerySet:
        """The row, only while it is running attempt *attempt* (or, with another *fence*
        column, while it runs under that token)."""
        return self.objects().filter(pk=pk, state=self.running, **{self.fence: attempt})

    def update(self, pk: Any, attempt: int, **changes: Any) -> int:
        """Change the row while it runs attempt *attempt*; return 1, or 0 if the lease is lost."""
        if self.touch:
            changes.setdefault(self.touch, Now())
        return self.fenced(pk, attempt).update(**changes)

    def take(
        self,
        pk: Any,
        worker: str,
        *,
        where: dict[str, Any],
        next_attempt: bool = False,
        stamp: tuple[str, ...] = (),
    ) -> int | None:
        """Lease the row to *worker* if it matches *where*; the attempt leased, or None.

        With *next_attempt* the row starts running its next attempt (a group taken from
        the queue); without, it keeps the attempt a dispatcher gave it (a unique job).
        None means there is nothing to run: a duplicate delivery, work running elsewhere
        or already finished.
        """
        taken = self.take_row(pk, worker, where=where, next_attempt=next_attempt, stamp=stamp)
        return taken[0] if taken else None

    def take_row(
        self,
        pk: Any,
        worker: str,
        *,
        where: dict[str, Any],
        next_attempt: bool = False,
        stamp: tuple[str, ...] = (),
        returning: tuple[str, ...] = (),
        condition: tuple[str, list[Any]] | None = None,
    ) -> tuple[Any, ...] | None:
        """:meth:`take`, returning the attempt and the fields named in *returning*.

        The same one statement: the fields come back with the lease, at no extra cost.
        *condition* (SQL and its parameters) must hold too: the stream not paused, say.
        """
        fields = [concrete_field(self.model, name) for name in returning]
        taken = lease_sql.take(
            self.model,
            pk,
            lease_seconds=self.lease.total_seconds(),
            worker=worker,
            where=where,
            running=self.running if next_attempt else None,
            stamp=(*stamp, self.touch) if self.touch else stamp,
            returning=[column_name(field) for field in fields],
            condition=condition,
        )
        if taken is None:
            return None
        attempt, *values = taken
        return (attempt, *(f.to_python(v) for f, v in zip(fields, values, strict=True)))

    def lost(self, pk: Any, attempt: int) -> LeaseLost:
        return LeaseLost(pk, attempt, what=self.what)

    def heartbeat(self, pk: Any, attempt: int) -> None:
        """Extend the lease by its length from now; raise LeaseLost if it is gone."""
        if not self.update(pk, attempt, lease_expires_at=Now() + self.lease):
            raise self.lost(pk, attempt)

    def lock(self, pk: Any, attempt: int) -> None:
        """Lock the row for the current transaction; raise LeaseLost if it is not ours."""
        if not self.fenced(pk, attempt).select_for_update().exists():
            raise self.lost(pk, attempt)

    def expired(
        self,
        limit: int,
        *,
        due: Q | None = None,
        fields: tuple[str, ...] = (),
        running: bool = True,
        **filters: Any,
    ) -> list[dict]:
        """Rows under an expired lease (or matching *due*), oldest lease first, locked.

        Without *running*, only the rows matching *due*. Rows another transaction holds
        are skipped (PostgreSQL). Each is a dict of its ``pk``, ``state``, ``attempt`` and
        *fields*; must run inside a transaction.
        """
        expired = Q(state=self.running, lease_expires_at__lt=Now())
        if not running:
            expired = due if due is not None else Q(pk__in=[])
        elif due is not None:
            expired |= due
        return list(
            self.objects()
            .select_for_update(skip_locked=True)
            .filter(expired, **filters)
            .order_by("lease_expires_at")
            .values("pk", "state", "attempt", *fields)[:limit]
        )
