"""Process tier: a poison group is dead-lettered while healthy groups keep flowing."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db.models import Max, Min
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.distribute import distribute
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
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
                distribute("poison")  # plays the schedule, fast: enqueues due retries
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
