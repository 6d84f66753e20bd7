"""Dispatch: rescue expired leases, then start the next ready jobs of a kind in chunks.

One short transaction per kind: a per-kind lock (so the free concurrency slots are
counted once), the rescue of jobs whose worker died (looked for at most once a second
per process by the frequent dispatches below), a bounded count of running jobs,
and one statement that marks the next ready jobs running (attempt n + 1, a fresh lease)
with ``SKIP LOCKED``. The started jobs are split into *chunks* (:func:`chunk_length`),
and each chunk is handed to django-q2 as one task in the same transaction (with the ORM
broker on this database, the hand-off commits with it). A chunk's jobs run one after
another in one worker, each under its own lease and attempt (:mod:`.execute`).

Dispatch runs on a django-q2 schedule per kind, right after an enqueue commits (in the
committing thread, or with ``DISPATCH_ON_COMMIT = "thread"`` in the worker that takes
the commit's wake, :func:`wake_after_commit`), and right after a chunk finishes (its
slots are free): that dispatch keeps one chunk for the worker that just finished, which
runs it at once without a round trip through the broker (:func:`run_jobs`), for up to
``RUN_SECONDS`` before it hands over.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction

from django_outbox.base.transient import outlast_outage
from django_outbox.models.unique import all_kinds, get_kind
from django_outbox.streams.run import RUN_SECONDS, wait_for_publishers
from django_outbox.transport import handoff
from django_outbox.unique.execute import JobOutcome, execute_chunk, rescue_expired
from django_outbox.unique.options import KindOptions, kind_options
from django_outbox.unique.sql import JobTable

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

logger = logging.getLogger(__name__)

RUN = "django_outbox.tasks.run_unique_jobs"
DISPATCH = "django_outbox.tasks.dispatch_unique"
#: Expired leases rescued per dispatch at most (crashes are rare; the rest next time).
RESCUE_LIMIT = 100
#: The dispatches after a commit and after a chunk look for expired leases at most this
#: often per kind and process; a scheduled or explicit dispatch always looks.
RESCUE_EVERY_SECONDS = 1.0
_looked: dict[tuple[str, str], float] = {}  # (alias, kind) -> when this process last looked


@dataclass(frozen=True)
class DispatchResult:
    kind: str
    running: int = 0
    dispatched: int = 0
    rescued: int = 0
    exhausted: int = 0
    chunks: int = 0
    #: The chunk the caller runs itself, (id, attempt) pairs (``dispatch(keep=True)``).
    kept: tuple[tuple[int, int], ...] = ()


def chunk_length(options: KindOptions) -> int:
    """How many jobs one django-q2 task runs: the kind's ``chunk_size``, or fewer, so that
    ``concurrency`` jobs spread over every worker of the kind's cluster."""
    cluster = handoff.cluster_options(options.cluster) or {}
    workers = cluster.get("workers") or os.cpu_count() or 1
    return max(1, min(options.chunk_size, math.ceil(options.concurrency / workers)))


def chunked(jobs: Sequence[tuple[int, int]], length: int) -> list[list[tuple[int, int]]]:
    return [list(jobs[start : start + length]) for start in range(0, len(jobs), length)]


def dispatch(
    model: type[UniqueJob], *, keep: bool = False, rescue: bool = True, wait_seconds: float = 0
) -> DispatchResult:
    """Rescue the kind's expired leases and start as many ready jobs as slots are free.

    The started jobs go to django-q2 in chunks; with *keep*, the first chunk is returned
    in :attr:`DispatchResult.kept` instead, for the caller to run. Without *rescue*, the
    expired leases are looked for only if this process has not looked for a second
    (``RESCUE_EVERY_SECONDS``): the frequent dispatches after commits and chunks then
    save that query, and a dead worker's jobs still wait a second at most past their
    lease. A transient error runs the transaction again (a few quick tries); a database
    that went away is waited for up to *wait_seconds* (a worker between chunks).
    """
    table = JobTable(model)
    looked = (table.alias, model._meta.label)
    now = time.monotonic()
    if not rescue and now - _looked.get(looked, -math.inf) < RESCUE_EVERY_SECONDS:
        look = False
    else:
        look, _looked[looked] = True, now

    def dispatch_transaction(one_by_one: bool) -> DispatchResult:
        with transaction.atomic(using=table.alias):
            table.lock_dispatch()
            rescued, exhausted = rescue_expired(model, RESCUE_LIMIT) if look else (0, 0)
            concurrency = table.options.concurrency
            running = table.count_running(concurrency)
            slots = concurrency - running
            started = _start(table, slots, one_by_one) if slots > 0 else []
            chunks = chunked(started, chunk_length(table.options))
            kept = tuple(chunks.pop(0)) if keep and chunks else ()
            handoff.enqueue(
                RUN, [(model._meta.label, chunk) for chunk in chunks], cluster=table.options.cluster
            )
            return DispatchResult(
                model._meta.label,
                running + len(started),
                len(started),
                rescued,
                exhausted,
                len(chunks) + bool(kept),
                kept,
            )

    what = f"dispatch of {model._meta.label}"

    def outlasting(one_by_one: bool) -> DispatchResult:
        return outlast_outage(
            lambda: dispatch_transaction(one_by_one),
            table.alias,
            what=what,
            wait_seconds=wait_seconds,
        )

    try:
        result = outlasting(False)
    except IntegrityError:
        # The running-jobs index rejected a job of the one-statement start (it is the
        # final guard of a key): the whole transaction rolled back; start one by one.
        logger.warning(
            "Dispatch of %s hit its running-jobs index; starting jobs one by one.",
            model._meta.label,
        )
        result = outlasting(True)
    if result.dispatched or result.rescued:
        logger.info(
            "Dispatched %s job(s) of %s (%s rescued, %s exhausted).",
            result.dispatched,
            result.kind,
            result.rescued,
            result.exhausted,
        )
    return result


def dispatch_after_commit(model: type[UniqueJob]) -> DispatchResult | None:
    """The dispatch a commit that enqueued jobs of *model* asks for; None when skipped.

    Skipped while the kind is at its concurrency (one unlocked count, read after the
    commit): every chunk holding those jobs dispatches when it ends, which is after this
    commit, so this dispatch could start nothing and would only queue for the kind's
    dispatch lock. A chunk whose worker died is rescued by the schedule, as always.
    """
    table = JobTable(model)
    if _at_concurrency(table):
        return None
    return dispatch(model, rescue=False)


def wake_after_commit(model: type[UniqueJob]) -> bool:
    """Hand the dispatch a commit asked for to a worker of the kind's cluster; return
    whether it was handed (``DISPATCH_ON_COMMIT = "thread"``).

    One django-q2 task, ``run_unique_jobs`` with no jobs: the worker that takes it
    dispatches there, runs the chunk it keeps and goes on with the next ones
    (:func:`run_jobs`), as after any chunk. The committing process writes one queue
    row, not a dispatch transaction. Skipped, like :func:`dispatch_after_commit`, while
    the kind is at its concurrency.
    """
    table = JobTable(model)
    if _at_concurrency(table):
        return False
    handoff.enqueue(RUN, [(model._meta.label, [])], cluster=table.options.cluster)
    return True


def _at_concurrency(table: JobTable) -> bool:
    """Whether the kind has ``concurrency`` jobs running or queued (an unlocked count)."""
    concurrency = table.options.concurrency
    return table.count_running(concurrency) >= concurrency


def dispatch_all() -> list[DispatchResult]:
    """Dispatch every kind of the installed apps."""
    return [dispatch(model) for model in all_kinds()]


def _start(table: JobTable, slots: int, one_by_one: bool) -> list[tuple[int, int]]:
    """Start up to *slots* jobs in one statement, or *one_by_one*.

    The unique-while-executing index is the final guard: should a job of a running key
    slip through the query, the statement fails (and its transaction with it, no
    savepoint costs two round trips on every dispatch), and the dispatch is done again
    one job at a time, each in a savepoint, skipping the one the index rejects.
    """
    if not one_by_one:
        return table.start_next(slots)
    started = []
    for pk in table.next_ready_ids(slots):
        try:
            with transaction.atomic(using=table.alias):
                job = table.start_one(pk)
        except IntegrityError:
            continue  # a job of the same key is running: it waits for the next dispatch
        if job is not None:
            started.append(job)
    return started


def run_jobs(
    label: str, jobs: Sequence[Sequence[int]], *, budget: float = RUN_SECONDS
) -> list[JobOutcome]:
    """Run a chunk of jobs, (id, attempt) pairs, then go on with the kind's next chunk;
    always returns.

    After each chunk its slots are free: dispatch starts the next ready jobs and keeps a
    chunk for this worker, which runs it here, until *budget* seconds have passed (then
    every chunk goes to django-q2). No jobs (a commit's wake, :func:`wake_after_commit`):
    dispatch first. Those dispatches wait for a database that went away, as the chunk's
    statements do (the kind's ``outage_seconds``); a dispatch that fails all the same,
    or a chunk the database interrupted, leaves the kind to its schedule.
    """
    model = get_kind(label)
    deadline = time.monotonic() + budget
    outcomes: list[JobOutcome] = []
    chunk = [(int(pk), int(attempt)) for pk, attempt in jobs]
    if not chunk:
        chunk = _kept(model, keep=True, after="a commit's wake")
    while True:
        while chunk:
            outcomes += execute_chunk(model, chunk, deadline=deadline)
            if JobOutcome.INTERRUPTED in outcomes:
                return outcomes
            chunk = _kept(model, keep=time.monotonic() < deadline, after="a chunk finished")
        chunk = _last_kept(model)
        if not chunk:
            return outcomes


def _last_kept(model: type[UniqueJob]) -> list[tuple[int, int]]:
    """This worker's chunks are done: wait for the enqueues that relied on it, then
    dispatch once more; the chunk kept for this worker (none when nothing was ready).

    An ``enqueue()`` that found the kind at its concurrency skipped its dispatch
    (:mod:`django_outbox.streams.sql.wake_guard`): raising the kind's epoch makes later ones
    dispatch themselves; the ones before are waited for, and this dispatch sees
    their jobs.
    """
    table = JobTable(model)
    try:
        wait = kind_options(model).outage_seconds
        epoch = outlast_outage(
            table.raise_wake_epoch, table.alias, what="a worker's end", wait_seconds=wait
        )
    except Exception:
        logger.warning("A worker of %s could not end cleanly", model._meta.label, exc_info=True)
        return []
    if epoch is None:
        return []
    wait_for_publishers(partial(table.enqueuers_done, epoch), model._meta.label)
    return _kept(model, keep=True, after="a worker's chunks ended")


def _kept(model: type[UniqueJob], *, keep: bool, after: str) -> list[tuple[int, int]]:
    """Dispatch *model* in a worker; the chunk it keeps for that worker (none if failed)."""
    try:
        wait = kind_options(model).outage_seconds
        return list(dispatch(model, keep=keep, rescue=False, wait_seconds=wait).kept)
    except Exception:  # the outcomes are recorded; the schedule dispatches later
        logger.warning(
            "Dispatch of %s after %s failed; its schedule will dispatch.",
            model._meta.label,
            after,
            exc_info=True,
        )
        return []
