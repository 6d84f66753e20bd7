"""distribute_stream(), the safety net: due groups re-enqueued, runs started for a backlog."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox import publish_many
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams.attempt import AttemptOutcome
from django_outbox.streams.distribute import distribute_stream, retry_group
from django_outbox.streams.run import claim_group
from django_outbox.streams.steer import set_paused
from django_outbox.transport import handoff

pytestmark = pytest.mark.django_db

SMALL = {
    "DJANGO_OUTBOX": {
        "STREAMS": {
            "audit": {
                "HANDLER": "tests.testapp.handlers.record",
                "BATCH_SIZE": 10,
                "RUNS": 3,
                "MAX_ATTEMPTS": 2,
                "LEASE_SECONDS": 60,
            }
        }
    }
}


def runs(jobs) -> int:
    return sum(1 for job in jobs if job.func == handoff.RUN)


@override_settings(**SMALL)
def test_the_backlog_count_stops_at_chains_times_the_batch_size():
    publish_many("audit", [{"n": i} for i in range(100)])

    with handoff.capture() as jobs:
        result = distribute_stream("audit")

    assert (result.backlog, result.backlog_capped, result.runs_started) == (30, True, 3)
    assert runs(jobs) == 3
    assert OutboxGroup.objects.filter(state=GroupState.CLAIMED).count() == 3


@override_settings(**SMALL)
def test_a_small_backlog_gets_as_many_runs_as_it_fills_batches():
    publish_many("audit", [{"n": i} for i in range(15)])

    with handoff.capture() as jobs:
        result = distribute_stream("audit")

    assert (result.backlog, result.backlog_capped, result.runs_started) == (15, False, 2)
    assert runs(jobs) == 2


@override_settings(**SMALL)
def test_distribute_starts_no_run_beyond_chains_in_flight():
    publish_many("audit", [{"n": i} for i in range(100)])
    with handoff.capture() as jobs:
        distribute_stream("audit")
        second = distribute_stream("audit")

    assert second.runs_started == 0
    assert runs(jobs) == 3
    # The runs in flight are asked to claim again before they end.
    assert StreamState.objects.get(stream="audit").wanted


@override_settings(**SMALL)
def test_the_runs_of_one_distribute_drain_the_whole_backlog(inline):
    publish_many("audit", [{"n": i} for i in range(95)])

    inline.distribute("audit")

    assert not OutboxEvent.objects.exists()
    assert ArchivedEvent.objects.count() == 95
    assert sum(1 for job in inline.ran if job.func == handoff.DISTRIBUTE) == 1
    assert sum(1 for job in inline.ran if job.func == handoff.RUN) == 3
    assert not OutboxGroup.objects.exists()


@override_settings(**SMALL)
def test_a_paused_stream_is_skipped():
    publish_many("audit", [{"n": i} for i in range(30)])
    set_paused("audit", True)

    with handoff.capture() as jobs:
        result = distribute_stream("audit")

    assert result.paused and not jobs


@override_settings(**SMALL)
def test_a_due_retry_is_enqueued_again_and_a_future_one_waits():
    publish_many("audit", [{"n": i} for i in range(20)])
    with handoff.capture():
        due, later = claim_group("audit"), claim_group("audit")
    OutboxGroup.objects.filter(pk=due.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() - timedelta(seconds=1)
    )
    OutboxGroup.objects.filter(pk=later.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() + timedelta(seconds=60)
    )

    with handoff.capture() as jobs:
        result = distribute_stream("audit")

    assert result.groups_enqueued == 1
    assert [j.args for j in jobs if j.func == handoff.RUN] == [("audit", str(due.group_id))]
    assert OutboxGroup.objects.get(pk=due.group_id).state == GroupState.CLAIMED
    assert OutboxGroup.objects.get(pk=later.group_id).state == GroupState.RETRYING


@override_settings(**SMALL)
def test_an_expired_lease_is_rescued_and_counts_as_an_attempt():
    publish_many("audit", [{"n": i} for i in range(20)])
    with handoff.capture():
        crashed, spent = claim_group("audit"), claim_group("audit")
    expired = Now() - timedelta(seconds=1)
    OutboxGroup.objects.filter(pk=crashed.group_id).update(
        state=GroupState.RUNNING, attempt=1, lease_expires_at=expired
    )
    OutboxGroup.objects.filter(pk=spent.group_id).update(
        state=GroupState.RUNNING, attempt=2, lease_expires_at=expired
    )

    with handoff.capture() as jobs:
        result = distribute_stream("audit")

    assert (result.groups_enqueued, result.groups_exhausted) == (1, 1)
    assert [j.args for j in jobs if j.func == handoff.RUN] == [("audit", str(crashed.group_id))]
    assert OutboxGroup.objects.get(pk=crashed.group_id).state == GroupState.CLAIMED
    assert not OutboxGroup.objects.filter(pk=spent.group_id).exists()
    dead = ArchivedEvent.objects.filter(group_id=spent.group_id)
    assert dead.count() == 10
    assert set(dead.values_list("outcome", "error")) == {
        ("failed", "lease expired on the last attempt")
    }


def test_distribute_costs_the_same_number_of_queries_whatever_the_backlog_beyond_chains():
    def queries_for(rows: int) -> int:
        OutboxEvent.objects.all().delete()
        StreamState.objects.all().delete()
        OutboxGroup.objects.all().delete()
        publish_many("audit", [{"n": i} for i in range(rows)])
        with handoff.capture(), CaptureQueriesContext(connection) as captured:
            distribute_stream("audit")
        return len(captured.captured_queries)

    # 40 rows fill RUNS (4) batches of 10: from there on, the backlog changes nothing.
    assert queries_for(40) == queries_for(4000)


# A retry handed over for when it falls due ----------------------------------------------


@override_settings(**SMALL)
def test_a_failed_attempt_hands_over_its_retry_for_when_it_is_due(handler_mode):
    handler_mode("raise")
    publish_many("audit", [{"n": i} for i in range(5)])
    with handoff.capture(delayed=True) as jobs:
        claim = claim_group("audit")
        [job] = [j for j in jobs if j.func == handoff.RUN]
        jobs.clear()
        job.run()  # attempt 1 fails
    group = OutboxGroup.objects.get(pk=claim.group_id)
    assert group.state == GroupState.RETRYING
    [retry] = jobs
    assert (retry.func, retry.args) == (handoff.RETRY, ("audit", str(claim.group_id)))
    assert abs((retry.not_before - group.next_attempt_at).total_seconds()) < 1


@override_settings(**SMALL)
def test_a_retry_that_is_due_runs_its_group_at_once():
    publish_many("audit", [{"n": i} for i in range(5)])
    with handoff.capture():
        claim = claim_group("audit")
    OutboxGroup.objects.filter(pk=claim.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() - timedelta(seconds=1)
    )
    with handoff.capture() as jobs:
        assert retry_group("audit", str(claim.group_id)) == [AttemptOutcome.DONE]
    assert not [j for j in jobs if j.func == handoff.RUN]  # run here, not handed over
    assert ArchivedEvent.objects.filter(stream="audit", attempts=2).count() == 5


@override_settings(**SMALL)
def test_a_retry_delivered_early_is_handed_over_again_for_its_time():
    publish_many("audit", [{"n": i} for i in range(5)])
    with handoff.capture():
        claim = claim_group("audit")
    OutboxGroup.objects.filter(pk=claim.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() + timedelta(seconds=30)
    )
    with handoff.capture(delayed=True) as jobs:
        assert retry_group("audit", str(claim.group_id)) == []
    [again] = jobs
    group = OutboxGroup.objects.get(pk=claim.group_id)
    assert group.state == GroupState.RETRYING and again.not_before == group.next_attempt_at


@override_settings(**SMALL)
def test_a_retry_of_a_group_no_longer_waiting_does_nothing():
    publish_many("audit", [{"n": i} for i in range(5)])
    with handoff.capture() as jobs:
        claim = claim_group("audit")
        [job] = jobs
        job.run()  # delivered
    with handoff.capture(delayed=True) as jobs:
        assert retry_group("audit", str(claim.group_id)) == []
    assert list(jobs) == []
