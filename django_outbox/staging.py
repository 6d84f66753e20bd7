"""Transactionally staged jobs: ``stage_task()`` now, django-q2 after the commit.

``stage_task()`` writes one row in the caller's transaction. The drainer takes due rows
with one ``DELETE … RETURNING`` statement and hands them to django-q2 inside the same
transaction:

* with django-q2's ORM broker on the same database the jobs are inserted into its queue
  table in that transaction, so each committed job reaches the queue exactly once;
* with another broker (Redis…) the jobs are pushed before the transaction commits; a
  crash in between leaves the rows in place and they are pushed again. Such jobs run
  through :func:`run_staged`, whose idempotency guard keyed on the staged job makes a
  duplicate delivery a no-op, so the effect happens once.

A job staged with ``idempotency_key=`` always runs through the guard, keyed on that key,
whatever the broker. With ``FORWARD_ON_COMMIT`` (the default) a job due now reaches
django-q2 without waiting for the drainer: with the ORM broker on the same database it is
written to django-q2's queue table inside the caller's transaction (one INSERT, the same
guarantee); with another broker it is staged and pushed right after the commit, and the
drainer (schedule or ``manage.py outbox_drain``) remains the guarantee.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import router, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_outbox import transport
from django_outbox.conf import outbox_settings
from django_outbox.db import staging as sql
from django_outbox.db.transient import retry_transient
from django_outbox.exceptions import StagingError
from django_outbox.jsondata import dumps
from django_outbox.signals import staged_jobs_forwarded

logger = logging.getLogger("django_outbox")

RUNNER = "django_outbox.tasks.run_staged"
GUARD_SCOPE = "django_outbox.staged"
#: django-q2 task options a staged job may carry (``q_options=``).
Q_OPTIONS = ("cluster", "timeout", "group", "hook", "save", "task_name", "ack_failure")
#: Keyword arguments of ``stage_task`` itself; any other keyword goes to the task.
RESERVED = ("q_options", "run_after", "idempotency_key", "using")
#: Ids remembered for the forward-on-commit path, per thread, at most (rolled-back ones
#: included: forwarding an id that never committed finds nothing).
MAX_PENDING = 10_000


def _alias(using: str | None = None) -> str:
    from django_outbox.models import StagedJob

    return using or router.db_for_write(StagedJob)


def task_path(func: str | Callable[..., Any]) -> str:
    """The dotted path of *func*, checked against ``STAGING["ALLOWED_MODULES"]``."""
    if callable(func):
        path = f"{func.__module__}.{func.__qualname__}"
    elif isinstance(func, str) and func:
        path = func
    else:
        raise StagingError(f"stage_task() needs a function or its dotted path, not {func!r}.")
    staging = outbox_settings().staging
    if not staging.allows(path):
        allowed = ", ".join(staging.allowed_modules) or "none"
        raise StagingError(
            f"{path!r} is not in an allowed module (allowed: {allowed}). Add its module to "
            "DJANGO_OUTBOX['STAGING']['ALLOWED_MODULES'] to stage it."
        )
    try:
        target = import_string(path)
    except ImportError as exc:
        raise StagingError(f"Cannot import the staged task {path!r}: {exc}") from exc
    if not callable(target):
        raise StagingError(f"The staged task {path!r} is not callable.")
    return path


def _dumps(what: str, value: Any) -> str:
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise StagingError(
            f"The {what} of a staged job must be JSON: {exc}. Pass ids, strings, numbers, "
            "booleans, None, lists and dicts of them, and load objects in the task."
        ) from exc


def stage_task(func: str | Callable[..., Any], *args: Any, **kwargs: Any) -> int | None:
    """Stage ``func(*args, **kwargs)`` in the current transaction.

    The job reaches django-q2 only if the transaction commits. Returns the staged row's
    id, or None when the job went straight into the queue table of django-q2's ORM
    broker on this database (``FORWARD_ON_COMMIT`` and due now), where it commits or
    rolls back with the transaction just the same. Keyword arguments of
    ``stage_task`` itself: ``q_options`` (django-q2 options: cluster, timeout, group,
    hook, save, task_name, ack_failure), ``run_after`` (an aware datetime or a timedelta
    from now: not forwarded before), ``idempotency_key`` (the effect happens once per key)
    and ``using`` (database alias). Any other keyword is passed to the task.
    """
    q_options = kwargs.pop("q_options", None) or {}
    run_after = kwargs.pop("run_after", None)
    idempotency_key = kwargs.pop("idempotency_key", None) or ""
    alias = _alias(kwargs.pop("using", None))
    path = task_path(func)
    unknown = sorted(set(q_options) - set(Q_OPTIONS))
    if unknown:
        raise StagingError(
            f"Unknown django-q2 options for a staged job: {', '.join(unknown)}. "
            f"Known: {', '.join(Q_OPTIONS)}."
        )
    if not isinstance(idempotency_key, str) or len(idempotency_key) > 255:
        raise StagingError("idempotency_key must be a string of at most 255 characters.")
    if isinstance(run_after, timedelta):
        run_after = timezone.now() + run_after
    if run_after is not None and not (
        isinstance(run_after, datetime) and timezone.is_aware(run_after)
    ):
        raise StagingError(
            f"run_after must be an aware datetime or a timedelta, not {run_after!r}."
        )
    args_json = _dumps("arguments", list(args))
    kwargs_json = _dumps("keyword arguments", kwargs)
    options_json = _dumps("q_options", q_options)
    forward = run_after is None and outbox_settings().staging.forward_on_commit
    if forward and transport.in_transaction_hand_off(alias):
        # The ORM broker's queue table commits or rolls back with this transaction: the
        # job is staged by writing it there directly, one INSERT and nothing to drain.
        row = sql.TakenJob(0, path, list(args), kwargs, q_options, idempotency_key, None, None)
        transport.submit([_job(row, guard_all=False)], alias=alias)
        return None
    staged_id = sql.insert(path, args_json, kwargs_json, options_json, idempotency_key, run_after)
    if forward:
        _forward_after_commit(staged_id, alias)
    return staged_id


# -- the low-latency path ------------------------------------------------------------

_pending = threading.local()


def _forward_after_commit(staged_id: int, alias: str) -> None:
    """Remember *staged_id*; the first callback after a commit forwards all remembered."""
    ids: list[int] = getattr(_pending, "ids", None) or []
    if len(ids) >= MAX_PENDING:
        ids.clear()
    ids.append(staged_id)
    _pending.ids = ids
    transaction.on_commit(lambda: _forward_pending(alias), using=alias, robust=True)


def _forward_pending(alias: str) -> None:
    ids: list[int] = getattr(_pending, "ids", None) or []
    _pending.ids = []
    if not ids:
        return
    try:
        drain(ids=ids, using=alias)
    except Exception:  # the drainer forwards them later; the commit has happened anyway
        logger.warning(
            "Forwarding %s staged job(s) after commit failed; the drainer will forward them.",
            len(ids),
            exc_info=True,
        )


# -- the drainer ---------------------------------------------------------------------


@dataclass(frozen=True)
class DrainResult:
    """One drained batch: jobs handed to django-q2 and rows kept with an error."""

    forwarded: int
    kept: int
    seconds: float


def drain(
    *, limit: int | None = None, ids: list[int] | None = None, using: str | None = None
) -> DrainResult:
    """Forward one batch of due staged jobs to django-q2 in one transaction."""
    alias = _alias(using)
    limit = limit or outbox_settings().staging.batch_size
    started = time.monotonic()

    def batch() -> tuple[int, int]:
        with transaction.atomic(using=alias):
            taken = sql.take_due(limit, ids)
            jobs, kept = [], 0
            guard_all = not transport.in_transaction_hand_off(alias)
            for row in taken:
                try:
                    jobs.append(_job(row, guard_all))
                except StagingError as exc:
                    sql.keep_with_error(row, str(exc))
                    kept += 1
                    logger.error(
                        "Staged job %s kept in the table: %s",
                        row.id,
                        exc,
                        extra={"staged_job": row.id, "func": row.func},
                    )
            transport.submit(jobs, alias=alias, send_now=True)
        return len(jobs), kept

    forwarded, kept = retry_transient(batch, alias, what="draining staged jobs")
    seconds = time.monotonic() - started
    if forwarded:
        logger.info(
            "Forwarded %s staged job(s) to django-q2.",
            forwarded,
            extra={"count": forwarded, "duration": seconds},
        )
        transaction.on_commit(
            lambda: staged_jobs_forwarded.send(
                sender=GUARD_SCOPE, count=forwarded, duration=seconds
            ),
            using=alias,
        )
    return DrainResult(forwarded, kept, seconds)


def _job(row: sql.TakenJob, guard_all: bool) -> transport.Job:
    """The django-q2 job for a taken row; raises StagingError for a row that cannot run."""
    task_path(row.func)
    options = dict(row.q_options)
    cluster = options.pop("cluster", None)
    save = options.pop("save", None)
    if guard_all or row.idempotency_key:
        key = row.idempotency_key or f"staged:{row.id}"
        return transport.Job(
            RUNNER, (key, row.func, row.args, row.kwargs), cluster, options=options, save=save
        )
    return transport.Job(
        row.func, tuple(row.args), cluster, kwargs=row.kwargs, options=options, save=save
    )


@dataclass(frozen=True)
class DrainReport:
    batches: int
    forwarded: int
    kept: int
    seconds: float
    empty: bool


def drain_until_empty(
    *, budget_seconds: float | None = None, limit: int | None = None
) -> DrainReport:
    """Drain batch after batch until no due job is left or *budget_seconds* ran out."""
    budget = (
        budget_seconds if budget_seconds is not None else outbox_settings().staging.drain_seconds
    )
    limit = limit or outbox_settings().staging.batch_size
    started = time.monotonic()
    batches = forwarded = kept = 0
    while True:
        result = drain(limit=limit)
        batches += 1
        forwarded += result.forwarded
        kept += result.kept
        empty = result.forwarded + result.kept < limit
        if empty or time.monotonic() - started >= budget:
            return DrainReport(batches, forwarded, kept, time.monotonic() - started, empty)


def run_staged(key: str, func: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run a forwarded staged job once per *key*, however often it is delivered."""
    from django_outbox.idempotency import idempotent

    target = import_string(task_path(func))
    with idempotent(key=key, scope=GUARD_SCOPE, store_result=False) as guard:
        if guard.done:
            logger.info("Staged job %s already ran; this delivery is skipped.", key)
            return None
        return target(*args, **kwargs)
