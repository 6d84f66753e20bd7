"""Run the pipeline inline, in this process, for operators and development."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db.models import Min

from django_outbox.base.dialect import database_now
from django_outbox.base.routing import connection_for
from django_outbox.conf import get_stream, on_stream_database, outbox_settings
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.state import StreamState
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.status import StreamStatus, stream_status
from django_outbox.transport import handoff

__all__ = [
    "RunReport",
    "run_inline",
]


@dataclass
class RunReport:
    rounds: int = 0
    #: Run jobs executed, by django-q2 task name.
    jobs: Counter = field(default_factory=Counter)
    #: Group attempts by outcome (done, partial, retrying, exhausted…).
    outcomes: Counter = field(default_factory=Counter)
    stopped_because: str = ""


def run_inline(
    streams: list[str] | None = None,
    *,
    until_empty: bool = False,
    max_wait_seconds: float = 300.0,
    on_round: Callable[[RunReport, list[StreamStatus]], None] | None = None,
    on_wait: Callable[[float, float], None] | None = None,
) -> RunReport:
    """Distribute and run the streams here, without a django-q2 cluster.

    One round distributes every stream and runs, here, the run jobs that result, the
    jobs those enqueue, and a run for each group queued for a cluster, to the end.
    With *until_empty*, rounds repeat until no stream has unclaimed rows or groups in
    flight, waiting for retries whose backoff has not passed yet, for at most
    *max_wait_seconds* in all. *on_round* is called after each round with the streams'
    status, *on_wait* before each wait with its length and the seconds waited so far.
    """
    names = streams or list(outbox_settings().streams)
    for name in names:
        get_stream(name)
    report = RunReport()
    waited = 0.0
    with handoff.capture() as queue:
        while True:
            report.rounds += 1
            queue.extend(job for name in names for job in _queued_groups(name))
            for name in names:
                distribute_stream(name)
            while queue:
                job = queue.popleft()
                result = job.run()
                report.jobs[job.func.rsplit(".", 1)[-1]] += 1
                if job.func == handoff.RUN:
                    report.outcomes.update(result)
            statuses = [stream_status(name) for name in names]
            if on_round:
                on_round(report, statuses)
            if not until_empty:
                report.stopped_because = "one round"
                return report
            pending = [s for s in statuses if s.backlog or _in_flight(s)]
            if not pending:
                report.stopped_because = "empty"
                return report
            if all(s.paused for s in pending):
                report.stopped_because = "paused"
                return report
            delay = _seconds_until_next_retry(names)
            if waited + delay > max_wait_seconds:
                report.stopped_because = "timeout"
                return report
            if on_wait:
                on_wait(delay, waited)
            time.sleep(delay)
            waited += delay


@on_stream_database
def _queued_groups(stream: str, limit: int = 500) -> list[handoff.Job]:
    """Run jobs for the stream's queued groups: their own jobs may wait for a cluster.

    Whichever job takes a group's lease first runs it; the other finds it taken and
    does nothing.
    """
    queued = OutboxGroup.objects.filter(stream=stream, state=GroupState.CLAIMED)
    ids = queued.order_by("created_at").values_list("id", flat=True)[:limit]
    return [handoff.Job(handoff.RUN, (stream, str(group_id))) for group_id in ids]


def _in_flight(status: StreamStatus) -> int:
    return status.groups_claimed + status.groups_running + status.groups_retrying


def _seconds_until_next_retry(names: list[str]) -> float:
    """How long until the earliest retry is due, between 0.05 and 1 second."""
    waits = [wait for name in names if (wait := _seconds_until_retry(name)) is not None]
    return min(waits, default=0.05)


@on_stream_database
def _seconds_until_retry(stream: str) -> float | None:
    """How long until the stream's earliest retry is due (its database's clock), between
    0.05 and 1 second; None without a retry."""
    due = (
        OutboxGroup.objects.filter(stream=stream, state=GroupState.RETRYING)
        .aggregate(first=Min("next_attempt_at"))
        .get("first")
    )
    if due is None:
        return None
    now = database_now(connection_for(StreamState).alias)
    return min(max((due - now).total_seconds(), 0.05), 1.0)
