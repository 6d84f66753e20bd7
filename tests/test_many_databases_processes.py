"""Process tier, PostgreSQL: one cluster serves streams on two databases; a worker
SIGKILLed mid-handler on each loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.conf import settings
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.distribute import distribute
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from tests.procs import running

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.process,
    pytest.mark.django_db(transaction=True, databases=["default", "other"]),
]

#: The crash stream on the default database and its twin on ``other``.
STREAMS = {"crash": "default", "crash_other": "other"}
EVENTS = 3000


def many_database_settings():
    streams = {
        **settings.DJANGO_OUTBOX["STREAMS"],
        "crash": settings.CRASH_STREAM,
        "crash_other": settings.CRASH_OTHER_STREAM,
    }
    return override_settings(DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": streams})


def publish(stream: str, start: int, count: int) -> set[int]:
    """Publish *count* events to *stream*; return their ids (on the stream's database)."""
    alias = STREAMS[stream]
    before = set(OutboxEvent.objects.using(alias).values_list("id", flat=True))
    publish_many(stream, ({"n": n} for n in range(start, start + count)), batch_size=1000)
    return set(OutboxEvent.objects.using(alias).values_list("id", flat=True)) - before


def left(alias: str) -> bool:
    return OutboxEvent.objects.using(alias).exists() or OutboxGroup.objects.using(alias).exists()


def test_one_cluster_delivers_streams_of_two_databases_once_with_workers_killed(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    killed = {stream: 0 for stream in STREAMS}
    with many_database_settings():
        published = {stream: publish(stream, 0, EVENTS) for stream in STREAMS}
        env = {
            "OUTBOX_TEST_CRASH": "1",
            "OUTBOX_TEST_MANY_DATABASES": "1",
            "OUTBOX_TEST_BUSY_DIR": str(busy),
            "Q_CLUSTER_NAME": "crash",
        }
        started = time.monotonic()
        with running(["-m", "django", "qcluster"], "many-databases-cluster", **env):
            while True:
                for stream, alias in STREAMS.items():
                    if not left(alias) and not killed[stream]:
                        # Drained before a worker was killed on it: more events flow.
                        published[stream] |= publish(stream, len(published[stream]), EVENTS)
                if all(killed.values()) and not any(left(alias) for alias in STREAMS.values()):
                    break
                assert time.monotonic() - started < 120, f"not drained: killed {killed}"
                for stream in STREAMS:
                    distribute(stream)  # plays the schedule, fast: rescues expired leases
                for marker in sorted(busy.iterdir()):
                    try:
                        stream = marker.read_text().split()[3]
                    except (FileNotFoundError, IndexError):
                        continue  # the handler ended meanwhile (or is writing it)
                    if killed[stream]:
                        continue
                    marker.unlink(missing_ok=True)  # a killed worker cannot remove it
                    try:
                        os.kill(int(marker.name), signal.SIGKILL)
                    except ProcessLookupError:
                        continue  # it finished and was recycled in between
                    killed[stream] += 1
                time.sleep(0.2)
        drained = time.monotonic() - started

    for stream, alias in STREAMS.items():
        archived = list(
            ArchivedEvent.objects.using(alias)
            .filter(stream=stream)
            .values_list("event_id", "outcome")
        )
        ids = [event_id for event_id, _ in archived]
        missing = published[stream] - set(ids)
        duplicated = len(ids) - len(set(ids))
        print(
            f"{stream} on {alias}: {len(published[stream]):,} events, {len(missing)} missing, "
            f"{duplicated} duplicated, drained in {drained:.1f}s"
        )
        assert (len(missing), duplicated) == (0, 0)
        assert {outcome for _, outcome in archived} == {Outcome.DONE}
        assert not left(alias)
        other = "other" if alias == "default" else "default"
        assert not ArchivedEvent.objects.using(other).filter(stream=stream).exists()
    assert killed == {"crash": 1, "crash_other": 1}
