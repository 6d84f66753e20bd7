"""distribute(): bounded backlog estimate, claim chains topped up, due groups re-enqueued."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox import publish_many, transport
from django_outbox.claim import claim_group
from django_outbox.distribute import distribute
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams import set_paused

pytestmark = pytest.mark.django_db

SMALL = {
    "DJANGO_OUTBOX": {
        "STREAMS": {
            "audit": {
                "HANDLER": "tests.testapp.handlers.record",
                "BATCH_SIZE": 10,
                "MAX_BATCHES": 3,
                "MAX_ATTEMPTS": 2,
                "LEASE_SECONDS": 60,
            }
        }
    }
}


def claims(jobs) -> int:
    return sum(1 for job in jobs if job.func == transport.CLAIM)


@override_settings(**SMALL)
def test_the_backlog_count_stops_at_max_batches_times_the_batch_size():
    publish_many("audit", [{"n": i} for i in range(100)])

    with transport.capture() as jobs:
        result = distribute("audit")

    assert (result.backlog, result.backlog_capped, result.claims_enqueued) == (30, True, 3)
    assert claims(jobs) == 3
    assert StreamState.objects.get(stream="audit").claims_in_flight == 3


@override_settings(**SMALL)
def test_a_small_backlog_gets_as_many_claims_as_it_needs():
    publish_many("audit", [{"n": i} for i in range(15)])

    with transport.capture() as jobs:
        result = distribute("audit")

    assert (result.backlog, result.backlog_capped, result.claims_enqueued) == (15, False, 2)
    assert claims(jobs) == 2


@override_settings(**SMALL)
def test_distribute_only_tops_up_the_claims_in_flight():
    publish_many("audit", [{"n": i} for i in range(100)])
    with transport.capture() as jobs:
        distribute("audit")
        second = distribute("audit")

    assert second.claims_enqueued == 0
    assert claims(jobs) == 3


@override_settings(**SMALL)
def test_chains_drain_the_whole_backlog_from_one_distribute(inline):
    publish_many("audit", [{"n": i} for i in range(95)])

    inline.distribute("audit")

    assert not OutboxEvent.objects.exists()
    assert ArchivedEvent.objects.count() == 95
    assert sum(1 for job in inline.ran if job.func == transport.DISTRIBUTE) == 1
    assert StreamState.objects.get(stream="audit").claims_in_flight == 0


@override_settings(**SMALL)
def test_claims_that_show_no_sign_of_life_for_a_lease_are_replaced():
    publish_many("audit", [{"n": i} for i in range(30)])
    StreamState.objects.create(
        stream="audit", claims_in_flight=3, claims_touched_at=Now() - timedelta(seconds=61)
    )

    with transport.capture() as jobs:
        result = distribute("audit")

    assert result.claims_enqueued == 3 and claims(jobs) == 3


@override_settings(**SMALL)
def test_a_paused_stream_is_skipped():
    publish_many("audit", [{"n": i} for i in range(30)])
    set_paused("audit", True)

    with transport.capture() as jobs:
        result = distribute("audit")

    assert result.paused and not jobs


@override_settings(**SMALL)
def test_a_due_retry_is_enqueued_again_and_a_future_one_waits():
    publish_many("audit", [{"n": i} for i in range(20)])
    with transport.capture():
        due, later = claim_group("audit"), claim_group("audit")
    OutboxGroup.objects.filter(pk=due.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() - timedelta(seconds=1)
    )
    OutboxGroup.objects.filter(pk=later.group_id).update(
        state=GroupState.RETRYING, attempt=1, next_attempt_at=Now() + timedelta(seconds=60)
    )

    with transport.capture() as jobs:
        result = distribute("audit")

    assert result.groups_enqueued == 1
    assert [j.args for j in jobs if j.func == transport.PROCESS] == [("audit", str(due.group_id))]
    assert OutboxGroup.objects.get(pk=due.group_id).state == GroupState.CLAIMED
    assert OutboxGroup.objects.get(pk=later.group_id).state == GroupState.RETRYING


@override_settings(**SMALL)
def test_an_expired_lease_is_rescued_and_counts_as_an_attempt():
    publish_many("audit", [{"n": i} for i in range(20)])
    with transport.capture():
        crashed, spent = claim_group("audit"), claim_group("audit")
    expired = Now() - timedelta(seconds=1)
    OutboxGroup.objects.filter(pk=crashed.group_id).update(
        state=GroupState.RUNNING, attempt=1, lease_expires_at=expired
    )
    OutboxGroup.objects.filter(pk=spent.group_id).update(
        state=GroupState.RUNNING, attempt=2, lease_expires_at=expired
    )

    with transport.capture() as jobs:
        result = distribute("audit")

    assert (result.groups_enqueued, result.groups_exhausted) == (1, 1)
    assert [j.args for j in jobs if j.func == transport.PROCESS] == [
        ("audit", str(crashed.group_id))
    ]
    assert OutboxGroup.objects.get(pk=crashed.group_id).state == GroupState.CLAIMED
    assert not OutboxGroup.objects.filter(pk=spent.group_id).exists()
    dead = ArchivedEvent.objects.filter(group_id=spent.group_id)
    assert dead.count() == 10
    assert set(dead.values_list("outcome", "error")) == {
        ("failed", "lease expired on the last attempt")
    }


def test_distribute_costs_the_same_number_of_queries_whatever_the_backlog():
    def queries_for(rows: int) -> int:
        OutboxEvent.objects.all().delete()
        StreamState.objects.all().delete()
        publish_many("audit", [{"n": i} for i in range(rows)])
        with transport.capture(), CaptureQueriesContext(connection) as captured:
            distribute("audit")
        return len(captured.captured_queries)

    assert queries_for(20) == queries_for(2000)
