"""Enqueue: one ``INSERT … ON CONFLICT DO NOTHING`` against the unstarted-jobs unique index.

Never check-then-insert: the partial unique index over the unique fields among jobs no
worker started (pending, or dispatched and waiting for its worker) decides, so
concurrent enqueues and dispatches of the same key leave exactly one job waiting to
start.
The dispatch of the kind is kicked once right after the caller's transaction commits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from django_outbox.base import tracing
from django_outbox.base.dialect import concrete_field
from django_outbox.base.durations import validate_duration
from django_outbox.base.jsondata import dumps, storable_text
from django_outbox.base.oncommit import on_commit_once
from django_outbox.conf import outbox_settings
from django_outbox.exceptions import JobError
from django_outbox.models.unique import BOOKKEEPING_FIELDS, UNSTARTED, get_kind
from django_outbox.streams.sql.wake_guard import LONG_TRANSACTION_SECONDS, relied_on_recently
from django_outbox.transport import handoff
from django_outbox.unique.dispatch import RUN, dispatch_after_commit
from django_outbox.unique.sql import JobTable

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

#: Enqueuing loops at most this many times when the twin it conflicted with was started
#: by a worker before it could be read (each round trip means the key had a job that
#: just started, so the next insert normally succeeds).
MAX_ROUNDS = 5


#: Rows of one ``enqueue_many`` statement at most (the parameters of a statement are
#: bounded: SQLite allows 32,766).
MANY_ROWS = 1000

T = TypeVar("T")


def enqueue(
    model: type[UniqueJob],
    fields: dict[str, Any],
    *,
    process_after: datetime | timedelta | None = None,
) -> tuple[UniqueJob, bool]:
    """Create a job of *model* unless one with the same unique key has not started."""
    after = _process_after(model, process_after)
    table = JobTable(model)
    draft = _draft(model, fields, "enqueue")
    values = [*_payload_values(draft, table), *_traced(table)]
    unique = {
        attname: getattr(draft, attname)
        for attname in (concrete_field(model, name).attname for name in table.options.unique_fields)
    }

    def insert() -> UniqueJob | None:
        started = time.monotonic()
        job = table.insert_pending(values, after, wake=_wake(table))
        if job is not None and not table.woke:
            kick_after_commit(model, table.alias, guarded_since=_since(table, started))
        return job

    return created_or_unstarted(model, insert, unique, table.alias)


def created_or_unstarted(
    model: type[UniqueJob], insert: Callable[[], T | None], key: dict[str, Any], alias: str
) -> tuple[T | UniqueJob, bool]:
    """``(insert(), True)``, or ``(the unstarted job of *key*, False)`` when *insert*
    found one (it returns None when the unique index refused the row): pending, or
    dispatched to a worker that has not started it.

    Never check-then-insert: the insert runs first. A twin that a worker started before
    it could be read frees the key, so the insert is tried again, ``MAX_ROUNDS`` times
    at most.
    """
    for _ in range(MAX_ROUNDS):
        created = insert()
        if created is not None:
            return created, True
        manager = model._default_manager.using(alias)
        existing = manager.filter(UNSTARTED, **key).first()
        if existing is not None:
            return existing, False
    raise JobError(
        f"{model._meta.label}.enqueue() kept conflicting with a job that a worker started "
        f"before it could be read ({MAX_ROUNDS} times); try again."
    )


def enqueue_many(
    model: type[UniqueJob],
    items: Iterable[dict[str, Any]],
    *,
    process_after: datetime | timedelta | None = None,
) -> list[UniqueJob]:
    """Create a job of *model* for each dict of fields, in statements of up to
    ``MANY_ROWS`` rows, skipping each whose unique key has a job not started (an earlier
    item included); return the jobs created. Every item is checked before anything is
    written. Dispatch is kicked once, after the caller's transaction commits."""
    table = JobTable(model)
    rows = [_payload_values(_draft(model, fields, "enqueue_many"), table) for fields in items]
    return insert_many(model, rows, process_after=process_after)


def insert_many(
    model: type[UniqueJob],
    rows: Iterable[list[tuple[models.Field, Any]]],
    *,
    process_after: datetime | timedelta | None = None,
    returning: Sequence[str] | None = None,
    common: Sequence[tuple[models.Field, Any]] = (),
) -> list[Any]:
    """Insert prepared rows, lists of (field, database value) pairs (see
    :func:`storable`), in statements of up to ``MANY_ROWS`` rows, skipping each whose
    unique key has a job not started; kick the dispatch once after the commit. *common*
    pairs are the same for every row (sent once per statement); the enqueuer's trace
    context joins them while a span records (:func:`_traced`).

    Returns the jobs created, in order: instances, or with *returning* (field names,
    ``id`` first) tuples of their values.
    """
    after = _process_after(model, process_after)
    table = JobTable(model)
    common = [*common, *_traced(table)]
    groups: dict[tuple[str, ...], list[list[tuple[Any, Any]]]] = {}
    for values in rows:
        groups.setdefault(tuple(field.name for field, _ in values), []).append(values)
    created: list[Any] = []
    started = time.monotonic()
    one = len(groups) == 1 and len(next(iter(groups.values()))) == 1
    wake = _wake(table) if one else None
    for group in groups.values():
        for start in range(0, len(group), MANY_ROWS):
            created += table.insert_pending_many(
                group[start : start + MANY_ROWS], after, returning, common, wake
            )
    if created and not (one and table.woke):
        # One row (the tasks backend's enqueue()) may have found the kind at its
        # concurrency under the wake guard; more rows always kick.
        since = _since(table, started) if len(created) == 1 else None
        kick_after_commit(model, table.alias, guarded_since=since)
    if returning is not None:
        return sorted(created, key=lambda row: row[0])
    return sorted(created, key=lambda job: job.pk)


def storable(table: JobTable, values: Iterable[tuple[str, Any]]) -> list[tuple[models.Field, Any]]:
    """(field name, Python value) pairs of the table's kind as :func:`insert_many` takes
    them, each checked as ``enqueue`` checks it (:class:`JobError` for a value a
    database would refuse or change)."""
    model = table.model
    return [_prepared(table, concrete_field(model, name), value) for name, value in values]


def _traced(table: JobTable) -> list[tuple[models.Field, Any]]:
    """The ``trace_context`` column's (field, value) pair while a span records (the job
    then runs in a child of it), else nothing: the INSERT is the same without one."""
    traceparent = tracing.current_traceparent()
    if traceparent is None:
        return []
    return [(concrete_field(table.model, "trace_context"), traceparent)]


def _draft(model: type[UniqueJob], fields: dict[str, Any], call: str) -> UniqueJob:
    reserved = sorted(set(fields) & set(BOOKKEEPING_FIELDS))
    if reserved:
        raise JobError(
            f"{model._meta.label}.{call}() got {', '.join(reserved)}: these fields are "
            "managed by django_outbox. Pass only the kind's own fields (and process_after)."
        )
    try:
        return model(**fields)
    except TypeError as exc:
        raise JobError(f"{model._meta.label}.{call}(): {exc}") from exc


def _process_after(
    model: type[UniqueJob], value: datetime | timedelta | None
) -> datetime | float | None:
    if value is None or (isinstance(value, datetime) and timezone.is_aware(value)):
        return value
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            return None  # a time in the past: ready now
        return validate_duration(f"{model._meta.label}.enqueue(process_after=...)", value)
    raise JobError(
        f"{model._meta.label}.enqueue(process_after=...) takes an aware datetime or a "
        f"timedelta from now, not {value!r}."
    )


def _payload_values(draft: UniqueJob, table: JobTable) -> list[tuple[Any, Any]]:
    """The (field, database value) pairs of the draft's payload fields, as save() would.

    A value the database would refuse or change is refused here with :class:`JobError`,
    the same on every database, instead of failing (or not) inside the INSERT.
    """
    values = []
    for field in type(draft)._meta.concrete_fields:
        if field.name in BOOKKEEPING_FIELDS:
            continue
        value = field.pre_save(draft, add=True)
        if not isinstance(value, DatabaseDefault):
            values.append(_prepared(table, field, value))
    return values


def _prepared(table: JobTable, field: models.Field, value: Any) -> tuple[models.Field, Any]:
    """(field, the database value), or :class:`JobError` for a value that one of the
    supported databases would refuse or change."""
    try:
        _check_storable(field, value, table)
        return field, field.get_db_prep_save(value, table.connection)
    except (TypeError, ValueError, OverflowError) as exc:
        raise JobError(
            f"{table.model._meta.label}.enqueue(): the value of {field.name} cannot be "
            f"stored: {exc}."
        ) from exc


def _check_storable(field: models.Field, value: Any, table: JobTable) -> None:
    """Raise ValueError for a value one of the supported databases cannot store as given."""
    if isinstance(field, models.JSONField):
        dumps(value, cls=field.encoder)
    elif isinstance(value, str):
        if not storable_text(value):
            raise ValueError(
                "it holds a NUL character or a lone surrogate, which PostgreSQL cannot store"
            )
        if field.max_length is not None and len(value) > field.max_length:
            raise ValueError(f"it is longer than {field.max_length} characters")
    elif isinstance(value, float) and math.isnan(value):
        raise ValueError("it is NaN, which SQLite stores as NULL")
    elif isinstance(field, models.IntegerField) and isinstance(value, int):
        low, high = table.connection.ops.integer_field_range(field.get_internal_type())
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"it is outside the column's range {low} to {high}")


# -- the kick after commit -------------------------------------------------------------


def kick_after_commit(
    model: type[UniqueJob], alias: str, *, guarded_since: float | None = None
) -> None:
    """Dispatch *model* right after the current transaction commits (once per commit).

    *guarded_since*: the insert found the kind at its concurrency under the wake guard
    at that ``time.monotonic()`` (PostgreSQL, :mod:`django_outbox.streams.sql.wake_guard`): a
    worker in flight dispatches after this commit, so the commit needs no dispatch,
    unless every insert of the transaction was guarded and it outlasted
    ``LONG_TRANSACTION_SECONDS``.
    """
    label = model._meta.label
    on_commit_once(
        ("django_outbox.dispatch", alias, label),
        partial(_dispatch, label),
        using=alias,
        item=guarded_since,
    )


def _since(table: JobTable, started: float) -> float | None:
    return started if table.guarded else None


def _wake(table: JobTable) -> tuple[str, str] | None:
    """The kind's wake, a django-q2 task that dispatches in a worker, for a one-row
    insert to queue in its own statement (PostgreSQL, ORM broker on the kind's
    database); None where the commit dispatches (or ``DISPATCH_ON_COMMIT = "thread"``
    hands it to the dispatcher thread). Signed once and offered again for a while
    (:func:`~django_outbox.transport.handoff.queue_row`)."""
    if outbox_settings().dispatch_on_commit == "thread" or not table.guards():
        return None
    return handoff.queue_row(_wake_job(table), table.alias)


def _wake_job(table: JobTable) -> handoff.Job:
    return handoff.Job(RUN, (table.model._meta.label, []), table.options.cluster)


def _dispatch(label: str, guarded_since: list[float | None]) -> None:
    """Dispatch a kind after an enqueue committed: here, or handed to a worker by the
    process's dispatcher thread (``DISPATCH_ON_COMMIT``); a failure leaves it to the
    schedule. Nothing when a worker in flight waits for every insert of the commit."""
    if relied_on_recently(guarded_since, LONG_TRANSACTION_SECONDS):
        return
    if outbox_settings().dispatch_on_commit == "thread":
        from django_outbox.unique.background import DISPATCHER

        DISPATCHER.kick(label)
    else:
        dispatch_after_commit(get_kind(label))
