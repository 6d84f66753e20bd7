"""Transactionally staged jobs: ``stage_task()`` now, django-q2 after the commit.

``stage_task()`` writes one row in the caller's transaction. The drainer takes due rows
with one ``DELETE … RETURNING`` statement and hands them to django-q2 inside the same
transaction:

* with django-q2's ORM broker on the same database the jobs are inserted into its queue
  table in that transaction, so each committed job reaches the queue exactly once;
* with another broker (Redis…) the jobs are pushed before the transaction commits, and
  the rows stay (stamped ``forwarded_at``, counted in ``forward_count``) until their job
  has run: a crash before the commit, or a job the broker loses afterwards (a restart, a
  cluster killed with jobs it had fetched), is pushed again after ``REDELIVER_SECONDS``,
  up to ``MAX_FORWARDS`` times; then the row is kept with an error for an operator. Such
  jobs run through :func:`run_staged`, which holds the row while the job runs (the
  drainer skips it, and a second delivery returns at once) and deletes it with the
  job's effects, behind an idempotency guard keyed on the staged job, so the effect
  happens once.

A job staged with ``idempotency_key=`` always runs through the guard, keyed on that key,
whatever the broker. With ``FORWARD_ON_COMMIT`` (the default) a job due now reaches
django-q2 without waiting for the drainer: with the ORM broker on the same database it is
written to django-q2's queue table inside the caller's transaction (one INSERT, the same
guarantee); with another broker it is staged and pushed right after the commit, and the
drainer (schedule or ``manage.py outbox_drain``) remains the guarantee.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import router, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_outbox.base import tracing
from django_outbox.base.jsondata import dumps_or
from django_outbox.base.oncommit import on_commit_once
from django_outbox.base.option_table import is_positive_int
from django_outbox.base.routing import connection_for, on_database
from django_outbox.base.transient import retry_transient
from django_outbox.conf import outbox_settings, stream_databases
from django_outbox.exceptions import StagingError
from django_outbox.jobs.idempotency import function_scope, idempotent
from django_outbox.jobs.sql import staging as sql
from django_outbox.models.staged import StagedJob
from django_outbox.signals import send_robust, staged_jobs_forwarded
from django_outbox.transport import handoff

__all__ = [
    "astage_task",
    "stage_task",
]

logger = logging.getLogger(__name__)

RUNNER = "django_outbox.tasks.run_staged"
#: Runs a job in a span that continues the trace of the code that staged it.
TRACED_RUNNER = "django_outbox.tasks.run_traced"
GUARD_SCOPE = "django_outbox.staged"
#: django-q2 task options a staged job may carry (``q_options=``).
_Q_OPTIONS = ("cluster", "timeout", "group", "hook", "save", "task_name", "ack_failure")
#: The test each option must pass and what it must be, for the message. ``timeout`` ends
#: in django-q2's ``signal.alarm``, which takes whole seconds (0 would mean no timeout).
_Q_OPTION_TESTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "cluster": (lambda value: isinstance(value, str), "str"),
    "timeout": (is_positive_int, "a positive int (whole seconds)"),
    "group": (lambda value: isinstance(value, str), "str"),
    "save": (lambda value: isinstance(value, bool), "bool"),
    "task_name": (lambda value: isinstance(value, str), "str"),
    "ack_failure": (lambda value: isinstance(value, bool), "bool"),
}
#: The form of the drainer's own guard keys; a caller's key may not take it.
_INTERNAL_KEY = re.compile(r"staged:[0-9]+\Z")


def _alias(using: str | None = None) -> str:
    """The database of staged jobs: *using*, else that of the work in hand, else the
    router's (:mod:`django_outbox.base.routing`)."""
    return using or connection_for(StagedJob).alias


def staging_databases() -> list[str]:
    """The databases the drainer reads: the router's for staged jobs, and every database
    that holds streams where django_outbox is migrated (a staged job commits with the
    write it belongs to, on that write's database)."""
    aliases = [router.db_for_write(StagedJob), *stream_databases()]
    return [
        alias
        for index, alias in enumerate(aliases)
        if alias not in aliases[:index] and router.allow_migrate_model(alias, StagedJob)
    ]


def task_path(func: str | Callable[..., Any], what: str = "staged task") -> str:
    """The dotted path of *func*, a plain function of a ``STAGING["ALLOWED_MODULES"]`` module.

    Both the path and the function's own ``__module__`` must be allowed: a function
    imported into an allowed module from elsewhere is refused, and so is anything that is
    not a plain function (``functools.partial``, classes, bound methods, builtins).
    """
    if inspect.isfunction(func):
        path = f"{func.__module__}.{func.__qualname__}"
    elif isinstance(func, str) and func:
        path = func
    elif callable(func):
        raise StagingError(
            f"A {what} must be a plain module-level function or its dotted path, not "
            f"{func!r}: wrap it in a function of an allowed module."
        )
    else:
        raise StagingError(f"A {what} needs a function or its dotted path, not {func!r}.")
    staging = outbox_settings().staging
    allowed = ", ".join(staging.allowed_modules) or "none"
    fix = "Add its module to DJANGO_OUTBOX['STAGING']['ALLOWED_MODULES'] to stage it."
    if not staging.allows(path):
        raise StagingError(f"{path!r} is not in an allowed module (allowed: {allowed}). {fix}")
    try:
        target = import_string(path)
    except ImportError as exc:
        raise StagingError(f"Cannot import the {what} {path!r}: {exc}") from exc
    if not inspect.isfunction(target):
        kind = "not callable" if not callable(target) else "not a plain function"
        raise StagingError(
            f"The {what} {path!r} is {kind}: stage a module-level function of an allowed module."
        )
    own = f"{target.__module__}.{target.__qualname__}"
    if not staging.allows(own):
        raise StagingError(
            f"The {what} {path!r} is {own!r}, defined outside the allowed modules "
            f"(allowed: {allowed}): importing a function into an allowed module does not "
            f"allow it. {fix}"
        )
    return path


def _check_options(q_options: Any) -> dict[str, Any]:
    """*q_options* if they are django-q2 options a staged job may carry; else StagingError.

    The ``hook`` runs in the worker like the task itself, so it passes the same
    allow-list as the task.
    """
    if not isinstance(q_options, dict):
        raise StagingError(f"q_options must be a dict of django-q2 options, not {q_options!r}.")
    unknown = sorted(str(name) for name in set(q_options) - set(_Q_OPTIONS))
    if unknown:
        raise StagingError(
            f"Unknown django-q2 options for a staged job: {', '.join(unknown)}. "
            f"Known: {', '.join(_Q_OPTIONS)}."
        )
    for name, (test, expected) in _Q_OPTION_TESTS.items():
        value = q_options.get(name)
        if value is not None and not test(value):
            raise StagingError(f"q_options[{name!r}] must be {expected}, not {value!r}.")
    if q_options.get("hook") is not None:
        q_options = {**q_options, "hook": task_path(q_options["hook"], what="hook")}
    return q_options


def _dumps(what: str, value: Any) -> str:
    return dumps_or(
        lambda exc: StagingError(
            f"The {what} of a staged job must be JSON: {exc}. Pass ids, strings, numbers, "
            "booleans, None, lists and dicts of them (datetimes, dates, times, timedeltas, "
            "Decimals, UUIDs and lazy strings become the strings DjangoJSONEncoder "
            "writes), and load objects in the task."
        ),
        value,
        cls=DjangoJSONEncoder,
    )


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

    Arguments are JSON, plus what Django's ``DjangoJSONEncoder`` encodes (``datetime``,
    ``date``, ``time``, ``timedelta``, ``Decimal``, ``UUID``, lazy strings): the task
    receives those as the strings that encoder writes, whichever way the job travels.
    """
    q_options = kwargs.pop("q_options", None) or {}
    run_after = kwargs.pop("run_after", None)
    idempotency_key = kwargs.pop("idempotency_key", None) or ""
    alias = _alias(kwargs.pop("using", None))
    path = task_path(func)
    q_options = _check_options(q_options)
    if not isinstance(idempotency_key, str) or len(idempotency_key) > 255:
        raise StagingError("idempotency_key must be a string of at most 255 characters.")
    if _INTERNAL_KEY.match(idempotency_key):
        raise StagingError(
            f"idempotency_key {idempotency_key!r} has the form of the drainer's own keys "
            "('staged:<id>'); choose another, such as 'charge:<order id>'."
        )
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
    traceparent = tracing.current_traceparent()
    forward = run_after is None and outbox_settings().staging.forward_on_commit
    if forward and handoff.in_transaction_hand_off(alias):
        # The ORM broker's queue table commits or rolls back with this transaction: the
        # job is staged by writing it there directly, one INSERT and nothing to drain.
        # The task gets its arguments as JSON gives them back, as from a staged row.
        row = sql.TakenJob(
            0,
            path,
            json.loads(args_json),
            json.loads(kwargs_json),
            q_options,
            idempotency_key,
            None,
            None,
            trace_context=traceparent,
        )
        handoff.submit([_job(row, kept=False)], alias=alias)
        return None
    with on_database(alias):
        staged_id = sql.insert(
            path, args_json, kwargs_json, options_json, idempotency_key, run_after, traceparent
        )
    if forward:
        _forward_after_commit(staged_id, alias)
    return staged_id


async def astage_task(func: str | Callable[..., Any], *args: Any, **kwargs: Any) -> int | None:
    """:func:`stage_task` from async code (an async view, say), with the same arguments.

    Runs ``stage_task()`` with ``sync_to_async(thread_sensitive=True)``, on the
    connection of the thread where the request's thread-sensitive work runs. Awaited on
    its own, the job is staged in autocommit: it commits at once and is forwarded. To
    stage a job with other writes in one transaction, put ``transaction.atomic()``, the
    writes and ``stage_task()`` in one sync function and await that through
    ``sync_to_async``.
    """
    return await sync_to_async(stage_task, thread_sensitive=True)(func, *args, **kwargs)


# -- the low-latency path ------------------------------------------------------------


def _forward_after_commit(staged_id: int, alias: str) -> None:
    """Forward *staged_id*, with the transaction's other staged jobs, after the commit."""
    on_commit_once(
        ("django_outbox.forward_staged", alias),
        partial(_forward, alias),
        using=alias,
        item=staged_id,
    )


def _forward(alias: str, ids: list[int]) -> None:
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
    staging = outbox_settings().staging
    limit = limit or staging.batch_size
    started = time.monotonic()

    def batch() -> tuple[int, int]:
        with on_database(alias), transaction.atomic(using=alias):
            # A broker outside this transaction (Redis…) can lose a job after the commit:
            # the rows stay until their job has run, and every job runs behind a guard.
            keep = not handoff.in_transaction_hand_off(alias)
            taken = sql.take_due(
                limit,
                ids,
                redeliver_seconds=staging.redeliver_seconds,
                keep=keep,
                max_forwards=staging.max_forwards,
                exhausted_error=exhausted_error(staging.max_forwards),
            )
            jobs, kept = [], 0
            for row in taken:
                if row.last_error:  # forwarded MAX_FORWARDS times: kept by take_due
                    kept += 1
                    _log_kept(row, row.last_error)
                    continue
                try:
                    jobs.append(_job(row, keep, alias))
                except Exception as exc:  # one bad row never holds back the others
                    error = str(exc) if isinstance(exc, StagingError) else repr(exc)
                    sql.keep_with_error(row, error)
                    kept += 1
                    _log_kept(row, error)
            handoff.submit(jobs, alias=alias, send_now=True)
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
            lambda: send_robust(
                staged_jobs_forwarded, GUARD_SCOPE, count=forwarded, duration=seconds
            ),
            using=alias,
        )
    return DrainResult(forwarded, kept, seconds)


def exhausted_error(max_forwards: int) -> str:
    """The ``last_error`` of a row forwarded ``MAX_FORWARDS`` times that is due again."""
    return (
        f"Forwarded {max_forwards} times (STAGING['MAX_FORWARDS']) and never ran to the "
        "end: each delivery was lost by the broker, killed its worker (a crash, django-q2's "
        "timeout) or did not reach run_staged. Kept and not forwarded again: fix the cause, "
        "then forward it again (admin: staged jobs, 'Forward now')."
    )


def _log_kept(row: sql.TakenJob, error: str) -> None:
    logger.error(
        "Staged job %s kept in the table: %s",
        row.id,
        error,
        extra={"staged_job": row.id, "func": row.func},
    )


def _job(row: sql.TakenJob, kept: bool, alias: str | None = None) -> handoff.Job:
    """The django-q2 job for a taken row; raises StagingError for a row that cannot run.

    The row is checked as ``stage_task`` checked it: someone with write access to the
    table must not reach a function (or a ``hook``) outside the allowed modules. A
    *kept* row (a broker that can lose jobs) runs behind a guard and carries its id, so
    that the job deletes it once it has run. A job staged inside a recording span runs
    through :data:`TRACED_RUNNER`, which continues that trace.
    """
    job = _untraced_job(row, kept, alias)
    if row.trace_context is None:
        return job
    args = (row.trace_context, job.func, list(job.args), job.kwargs)
    return handoff.Job(TRACED_RUNNER, args, job.cluster, options=job.options, save=job.save)


def _untraced_job(row: sql.TakenJob, kept: bool, alias: str | None = None) -> handoff.Job:
    task_path(row.func)
    if not isinstance(row.args, list):
        raise StagingError(f"The arguments of a staged job must be a JSON list, not {row.args!r}.")
    if not (isinstance(row.kwargs, dict) and all(isinstance(name, str) for name in row.kwargs)):
        raise StagingError(
            f"The keyword arguments of a staged job must be a JSON object, not {row.kwargs!r}."
        )
    options = dict(_check_options(row.q_options))
    cluster = options.pop("cluster", None)
    save = options.pop("save", None)
    # A kept row's job finds it again on its database (named when not the router's).
    staged_id: tuple[Any, ...] = (row.id,) if kept else ()
    if kept and alias is not None and alias != router.db_for_write(StagedJob):
        staged_id = (row.id, alias)
    if row.idempotency_key:
        key, scope = row.idempotency_key, _caller_scope(row.func)
        args = (key, row.func, row.args, row.kwargs, scope, *staged_id)
        return handoff.Job(RUNNER, args, cluster, options=options, save=save)
    if kept:
        args = (f"staged:{row.id}", row.func, row.args, row.kwargs, GUARD_SCOPE, *staged_id)
        return handoff.Job(RUNNER, args, cluster, options=options, save=save)
    return handoff.Job(
        row.func, tuple(row.args), cluster, kwargs=row.kwargs, options=options, save=save
    )


def run_traced_job(traceparent: str, func: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run a staged job (*func*: its function, or :data:`RUNNER` with its arguments) in
    the span ``django_outbox.staged <function>``, a child of the span that staged it."""
    target = import_string(RUNNER if func == RUNNER else task_path(func))
    function = args[1] if func == RUNNER else func
    with tracing.continued(
        f"django_outbox.staged {function}", traceparent, {"django_outbox.function": function}
    ):
        return target(*args, **kwargs)


def _caller_scope(func: str) -> str:
    """The idempotency scope of a caller's key: the drainer's scope and the function.

    The same key staged for two functions guards two effects, and no caller key can meet
    the drainer's own ``staged:<id>`` keys, which live in :data:`GUARD_SCOPE` itself.
    """
    return function_scope(func, GUARD_SCOPE)


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
    """Drain batch after batch until no due job is left or *budget_seconds* ran out, on
    each database of :func:`staging_databases` in turn."""
    budget = (
        budget_seconds if budget_seconds is not None else outbox_settings().staging.drain_seconds
    )
    limit = limit or outbox_settings().staging.batch_size
    started = time.monotonic()
    batches = forwarded = kept = 0
    empty = True
    for alias in staging_databases():
        while True:
            result = drain(limit=limit, using=alias)
            batches += 1
            forwarded += result.forwarded
            kept += result.kept
            drained = result.forwarded + result.kept < limit
            if drained or time.monotonic() - started >= budget:
                break
        empty = empty and drained
        if time.monotonic() - started >= budget:
            break
    return DrainReport(batches, forwarded, kept, time.monotonic() - started, empty)


def run_staged_job(
    key: str,
    func: str,
    args: list[Any],
    kwargs: dict[str, Any],
    scope: str = GUARD_SCOPE,
    staged_id: int | None = None,
    using: str | None = None,
) -> Any:
    """Run a forwarded staged job once per *key* in *scope*, however often it is delivered.

    With *staged_id* (a broker that can lose jobs), the job holds its staged row from
    start to end and deletes it in the same transaction, with the job's effects: until
    then the drainer hands the job over again every ``REDELIVER_SECONDS`` (at most
    ``MAX_FORWARDS`` times), but never while it runs. A delivery that finds the row gone
    (the job ran) or held (it runs now, elsewhere) returns at once, without waiting for
    any lock. A job that raises deletes its row too (it failed as a django-q2 task, as
    with any broker). Jobs forwarded before keys had scopes of their own carry four
    arguments and keep the scope they were guarded in.
    """

    target = import_string(task_path(func))
    if staged_id is None:
        return _guarded(target, key, scope, args, kwargs)
    failure: Exception | None = None
    alias = _alias(using)  # *using*: the row's database, when not the router's
    with on_database(alias), transaction.atomic(using=alias):
        if not sql.hold(staged_id):
            logger.info("Staged job %s ran already or runs now: delivery skipped.", staged_id)
            return None
        try:
            result = _guarded(target, key, scope, args, kwargs, using)
        except Exception as exc:  # its effects are rolled back; the row goes all the same
            failure = exc
        StagedJob.objects.using(alias).filter(id=staged_id).delete()
    if failure is not None:
        raise failure
    return result


def _guarded(
    target: Callable[..., Any],
    key: str,
    scope: str,
    args: list[Any],
    kwargs: dict[str, Any],
    using: str | None = None,
) -> Any:
    with idempotent(key=key, scope=scope, store_result=False, using=using) as guard:
        if guard.done:
            logger.info("Staged job %s already ran; this delivery is skipped.", key)
            return None
        return target(*args, **kwargs)


def requeue(ids: list[int]) -> DrainResult:
    """Forward the staged jobs *ids* now: due or not, kept with an error or not.

    Their error, forward count and delay are cleared first, so a row kept after
    ``MAX_FORWARDS`` forwards starts again from one; a row the drainer still cannot
    forward (a function gone from the allow-list…) is kept again with its error. A row
    whose job runs now is left alone (PostgreSQL: skipped, never waited for).
    """
    alias = _alias()
    with transaction.atomic(using=alias):
        rows = StagedJob.objects.using(alias).filter(id__in=ids)
        free = list(rows.select_for_update(skip_locked=True).values_list("id", flat=True))
        StagedJob.objects.using(alias).filter(id__in=free).update(
            run_after=None, forwarded_at=None, forward_count=0, last_error=""
        )
    if not free:
        return DrainResult(0, 0, 0.0)
    return drain(ids=free, limit=len(free), using=alias)
