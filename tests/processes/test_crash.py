"""Process tier, PostgreSQL: workers killed mid-handler lose and duplicate nothing."""

from __future__ import annotations

import random
import time

import pytest
from django.conf import settings
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.distribute import distribute_stream
from tests.procs import kill_one_in_handler, running

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

EVENTS = 20_000
KILLS = 8


def crash_settings():
    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "crash": settings.CRASH_STREAM}
    return override_settings(DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": streams})


def test_sigkilled_workers_lose_and_duplicate_nothing(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    with crash_settings():
        publish_many("crash", ({"n": i} for i in range(EVENTS)), chunk_size=5000)
        published = set(OutboxEvent.objects.values_list("id", flat=True))
        env = {
            "OUTBOX_TEST_CRASH": "1",
            "OUTBOX_TEST_BUSY_DIR": str(busy),
            "Q_CLUSTER_NAME": "crash",
        }
        started = time.monotonic()
        kills = 0
        rng = random.Random(7)
        with running(["-m", "django", "qcluster"], "crash-cluster", **env):
            while True:
                if not (OutboxEvent.objects.exists() or OutboxGroup.objects.exists()):
                    if kills == KILLS:
                        break
                    # Drained before every kill landed (a fast run): more events flow.
                    more = range(len(published), len(published) + EVENTS // 4)
                    rows = [OutboxEvent(stream="crash", payload={"n": i}) for i in more]
                    published |= {row.id for row in OutboxEvent.objects.bulk_create(rows)}
                assert time.monotonic() - started < 240, "the crash run did not drain"
                distribute_stream("crash")  # plays the schedule, fast: rescues expired leases
                if kills < KILLS:
                    kills += kill_one_in_handler(busy, rng, within=0.4) is not None
                else:
                    time.sleep(0.4)
        drained = time.monotonic() - started

    archived = list(ArchivedEvent.objects.filter(stream="crash").values_list("event_id", "outcome"))
    ids = [event_id for event_id, _ in archived]
    missing = published - set(ids)
    duplicated = len(ids) - len(set(ids))
    print(
        f"crash run: {len(published):,} events, {kills} workers killed mid-handler, "
        f"{len(missing)} missing, {duplicated} duplicated, drained in {drained:.1f}s"
    )
    assert kills == KILLS, "the test did not kill workers mid-handler"
    assert (len(missing), duplicated) == (0, 0)
    assert {outcome for _, outcome in archived} == {Outcome.DONE}
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()
