"""Process tier: a poison group is dead-lettered while healthy groups keep flowing."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db.models import Max, Min
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.distribute import distribute_stream
from tests.procs import running

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

BATCH = 500  # POISON_STREAM's BATCH_SIZE


def test_a_poison_group_is_dead_lettered_while_healthy_groups_flow():
    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "poison": settings.POISON_STREAM}
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        publish_many("poison", [{"n": i} for i in range(4 * BATCH)])
        publish_many("poison", [{"n": i, "poison": True} for i in range(BATCH)])
        publish_many("poison", [{"n": i} for i in range(4 * BATCH)])
        env = {"OUTBOX_TEST_CRASH": "1", "Q_CLUSTER_NAME": "crash"}
        started = time.monotonic()
        with running(["-m", "django", "qcluster"], "poison-cluster", **env):
            while OutboxEvent.objects.exists() or OutboxGroup.objects.exists():
                assert time.monotonic() - started < 120, "the poison run did not drain"
                distribute_stream("poison")  # plays the schedule, fast: enqueues due retries
                time.sleep(0.3)

    archived = ArchivedEvent.objects.filter(stream="poison")
    failed = archived.filter(outcome=Outcome.FAILED)
    done = archived.filter(outcome=Outcome.DONE)
    assert failed.count() == BATCH
    assert set(failed.values_list("data__payload__poison", flat=True)) == {True}
    assert set(failed.values_list("attempts", flat=True)) == {
        settings.POISON_STREAM["MAX_ATTEMPTS"]
    }
    assert all("poison pill" in error for error in failed.values_list("error", flat=True))
    assert done.count() == 8 * BATCH
    assert set(done.values_list("attempts", flat=True)) == {1}
    # The healthy groups did not wait for the poison group's retries.
    assert (
        done.aggregate(last=Max("archived_at"))["last"]
        < failed.aggregate(first=Min("archived_at"))["first"]
    )


def test_one_poison_row_in_a_group_of_1000_is_isolated_through_a_real_cluster():
    """The healthy 999 rows are delivered; only the poison row becomes a dead letter."""
    from django_outbox.models import StreamState

    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "poison": settings.POISON_STREAM}
    size, poison_at = 1000, 613
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        StreamState.objects.update_or_create(
            stream="poison", defaults={"batch_size_override": size}
        )
        env = {"OUTBOX_TEST_CRASH": "1", "Q_CLUSTER_NAME": "crash"}
        started = time.monotonic()
        with running(["-m", "django", "qcluster"], "isolation-cluster", **env):
            # One commit: its wake claims the 1,000 rows as one group.
            publish_many("poison", [{"n": n, "poison": n == poison_at} for n in range(size)])
            while OutboxEvent.objects.exists() or OutboxGroup.objects.exists():
                assert time.monotonic() - started < 120, "the poison row was not isolated"
                distribute_stream("poison")  # plays the schedule, fast: enqueues due retries
                time.sleep(0.3)

    archived = ArchivedEvent.objects.filter(stream="poison")
    [dead] = archived.filter(outcome=Outcome.FAILED)
    assert dead.data["payload"] == {"n": poison_at, "poison": True}
    assert "poison pill" in dead.error
    done = archived.filter(outcome=Outcome.DONE)
    assert done.count() == size - 1
    assert sorted(done.values_list("data__payload__n", flat=True)) == [
        n for n in range(size) if n != poison_at
    ]
