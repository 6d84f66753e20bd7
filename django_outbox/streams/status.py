"""A snapshot of each stream's health, with every count bounded."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from django_outbox.base.dialect import database_now
from django_outbox.conf import get_stream, on_stream_database, outbox_settings
from django_outbox.jobs.staging import staging_databases
from django_outbox.models.archive import ArchivedEvent, Outcome
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.staged import StagedJob
from django_outbox.models.state import StreamState
from django_outbox.models.unique import STAGES, all_kinds
from django_outbox.streams import claim_floor
from django_outbox.streams.ordering import held_keys
from django_outbox.streams.run import effective_batch_size
from django_outbox.streams.sql import stream_buffer
from django_outbox.streams.sql.run import runs_in_flight

#: Counts stop here, so a status query never scans a huge table.
COUNT_CAP = 1_000_000
#: The status names at most this many staged jobs kept with an error.
KEPT_SHOWN = 10


@dataclass(frozen=True)
class StreamStatus:
    stream: str
    paused: bool
    batch_size: int
    backlog: int
    backlog_capped: bool
    oldest_unclaimed_at: datetime | None
    lag_seconds: float | None
    groups_claimed: int
    groups_running: int
    groups_retrying: int
    groups_dead_lettering: int
    groups_isolating: int  # groups made by failure isolation (split from a failed group)
    archived_last_hour: int
    failed_last_hour: int
    runs_in_flight: int
    held_keys: int = 0  # keys of an ordered stream held back by a dead letter
    calls_per_second: float | None = None  # the stream's rate budget (CALLS_PER_SECOND)
    budget_calls: int = 0  # handler calls made under the budget so far (a counter)
    rows_per_second: float | None = None  # the stream's row budget (ROWS_PER_SECOND)
    budget_rows: int = 0  # rows handed to the handler under the row budget (a counter)
    paused_until: datetime | None = None  # a handler's RetryAfter, while it lasts
    pause_seconds: float = 0.0  # what is left of the pause
    claim_floor_off: str = ""  # why the stream keeps no claim floor on PostgreSQL, if so

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("oldest_unclaimed_at", "paused_until"):
            if data[name] is not None:
                data[name] = data[name].isoformat()
        return data


@on_stream_database
def stream_status(stream: str, *, cap: int = COUNT_CAP) -> StreamStatus:
    """Return the status of *stream*."""
    config = get_stream(stream)
    model = config.model_class
    state = StreamState.objects.filter(stream=stream).first()
    now = database_now(config.alias)
    buffer = stream_buffer(config)
    # Above the claim floor, as claims read (PostgreSQL): a held snapshot leaves dead
    # entries below it that a count from the oldest end would step over, every scrape.
    # A row written below the floor is counted once the claims have taken it.
    floor = claim_floor.claim_start(config, state, buffer)
    backlog = buffer.count_unclaimed(cap, floor)
    unclaimed = model._default_manager.using(config.alias).filter(
        group_id__isnull=True, id__gt=floor
    )
    if buffer.stream is not None:
        unclaimed = unclaimed.filter(stream=stream)
    oldest = unclaimed.order_by("id").values_list("created_at", flat=True).first()
    groups = dict(
        OutboxGroup.objects.filter(stream=stream)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    paused_until = state.paused_until if state and state.paused_until else None
    if paused_until is not None and paused_until <= now:
        paused_until = None  # over: cleared by the stream's next claim
    recent = ArchivedEvent.objects.filter(stream=stream, archived_at__gte=now - timedelta(hours=1))
    return StreamStatus(
        stream=stream,
        paused=bool(state and state.paused),
        batch_size=effective_batch_size(config, state),
        backlog=backlog,
        backlog_capped=backlog >= cap,
        oldest_unclaimed_at=oldest,
        lag_seconds=(now - oldest).total_seconds() if oldest else None,
        groups_claimed=groups.get(GroupState.CLAIMED, 0),
        groups_running=groups.get(GroupState.RUNNING, 0),
        groups_retrying=groups.get(GroupState.RETRYING, 0),
        groups_dead_lettering=groups.get(GroupState.DEAD_LETTERING, 0),
        groups_isolating=OutboxGroup.objects.filter(stream=stream, split_depth__gt=0)[:cap].count(),
        archived_last_hour=recent.filter(outcome=Outcome.DONE)[:cap].count(),
        failed_last_hour=recent.filter(outcome=Outcome.FAILED)[:cap].count(),
        runs_in_flight=runs_in_flight(stream),
        held_keys=held_keys(stream, cap) if config.ordered else 0,
        calls_per_second=config.calls_per_second,
        budget_calls=state.budget_calls if state else 0,
        rows_per_second=config.rows_per_second,
        budget_rows=state.budget_rows if state else 0,
        paused_until=paused_until,
        pause_seconds=(paused_until - now).total_seconds() if paused_until else 0.0,
        claim_floor_off=claim_floor.off_reason(config),
    )


def all_statuses(streams: list[str] | None = None) -> list[StreamStatus]:
    return [stream_status(name) for name in (streams or list(outbox_settings().streams))]


def staged_counts(cap: int = COUNT_CAP) -> dict[str, int]:
    """Staged jobs waiting for the drainer, forwarded and not yet run (a broker that can
    lose jobs: Redis), and kept with an error; each count bounded."""
    counts = {"waiting": 0, "forwarded": 0, "kept": 0}
    for alias in staging_databases():  # each count bounded per database
        jobs = StagedJob.objects.using(alias)
        pending = jobs.filter(last_error="")
        counts["waiting"] += pending.filter(forwarded_at__isnull=True).values("id")[:cap].count()
        counts["forwarded"] += pending.filter(forwarded_at__isnull=False).values("id")[:cap].count()
        counts["kept"] += jobs.exclude(last_error="").values("id")[:cap].count()
    return counts


@dataclass(frozen=True)
class KeptStagedJob:
    """A staged job kept with an error and not forwarded, as the status names it."""

    id: int
    func: str
    database: str
    error: str  # the first line of its last_error


def kept_staged_jobs(limit: int = KEPT_SHOWN) -> list[KeptStagedJob]:
    """The staged jobs kept with an error, oldest first on each database (in the order of
    :func:`~django_outbox.jobs.staging.staging_databases`), at most *limit* in all."""
    kept: list[KeptStagedJob] = []
    for alias in staging_databases():
        rows = StagedJob.objects.using(alias).exclude(last_error="").order_by("id")
        for pk, func, error in rows.values_list("id", "func", "last_error")[: limit - len(kept)]:
            first = next(iter(error.strip().splitlines()), "")
            kept.append(KeptStagedJob(pk, func, alias, first))
        if len(kept) >= limit:
            break
    return kept


def staged_status(cap: int = COUNT_CAP, shown: int = KEPT_SHOWN) -> dict[str, Any]:
    """:func:`staged_counts` and the first *shown* kept jobs (``kept_jobs``)."""
    return {**staged_counts(cap), "kept_jobs": [asdict(job) for job in kept_staged_jobs(shown)]}


def unique_job_counts(cap: int = COUNT_CAP) -> Iterator[tuple[str, str, int]]:
    """(kind label, stage, count stopping at *cap*) for every unique-job kind and stage:
    its states, with the dispatched jobs no worker started apart from the running ones."""
    for kind in all_kinds():
        for stage, match in STAGES.items():
            rows = kind._default_manager.filter(match).values("id")[:cap]
            yield kind._meta.label, stage, rows.count()
