"""Process tier: several clusters on one database, as several machines would run them.

Three qclusters on the Redis broker (one queue, each its own process tree, as on three
machines) and one on the ORM broker share one PostgreSQL. 100,000 events of two streams
(a ``TRANSACTIONAL`` and a plain one, 90,000 preloaded and the rest a steady inflow
of single transactions), staged jobs and unique jobs flow at once, from
publishers of both kinds; one whole Redis cluster is SIGKILLed mid-run. Every event is
delivered once, every staged job and unique job is done, every cluster took part, and
the others finished the killed cluster's work. A child plays the schedules every second
(distribute, the unique-job dispatch and the staged-job drainer), as django-q2's
scheduler would every minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections import Counter

import pytest

from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome, StagedJob
from tests.procs import qcluster, running, wait_until
from tests.testapp.models import HandledCall, JobEffect
from tests.uniqueapp.models import KeyedJob

pytestmark = [pytest.mark.process, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STREAMS = ["outage_tx", "outage_plain"]
PRELOAD = {"redis": (0, 35_000), "orm": (35_000, 45_000)}  # per stream: 90,000 in all
INFLOW = {"redis": 1_000_000, "orm": 2_000_000}  # first numbers: up to 10,000 each
INFLOW_SECONDS = 25.0
STAGED, UNIQUE = 1_000, 300

SCHEDULE = """
import time, django; django.setup()
from django_outbox.streams.distribute import distribute_all
from django_outbox.jobs.staging import drain_until_empty
from tests.uniqueapp.models import KeyedJob
while True:
    distribute_all(); KeyedJob.dispatch(); drain_until_empty(); time.sleep(1)
"""


def preload(first: int, last: int) -> list[str]:
    code = "; ".join(
        [
            "import django; django.setup()",
            "from django_outbox import publish_many",
            *(
                f"publish_many({stream!r}, [{{'n': k}} for k in range({first}, {last})])"
                for stream in STREAMS
            ),
        ]
    )
    return ["-c", code]


def inflow(report, first: int) -> list[str]:
    return [
        "-c",
        "from tests.outage import publish_steadily; publish_steadily("
        f"{STREAMS!r}, 400.0, 4, {INFLOW_SECONDS}, {first}, {str(report)!r})",
    ]


UNIQUE_JOBS = f"""
import django; django.setup()
from tests.uniqueapp.models import KeyedJob
for n in range({UNIQUE}):
    KeyedJob.enqueue(key=f"k{{n}}")
"""


def state() -> str:
    groups = Counter(OutboxGroup.objects.values_list("state", flat=True))
    jobs = Counter(KeyedJob.objects.values_list("state", flat=True))
    return (
        f"buffer {OutboxEvent.objects.count()}, groups {dict(groups)}, staged "
        f"{StagedJob.objects.count()}, effects {JobEffect.objects.count()}, unique {dict(jobs)}"
    )


def test_four_clusters_share_the_work_and_finish_a_killed_clusters_work(redis_url, tmp_path):
    common = {
        "OUTBOX_TEST_OUTAGE": "1",
        "OUTBOX_TEST_LEASE": "5",
        "OUTBOX_TEST_HANDOFF": "4",
        # Above the clusters' timeout (60 s), as check E057 asks: a delivery may still
        # be running until then.
        "OUTBOX_TEST_REDELIVER": "61",
    }
    queue = f"outbox-clusters-{uuid.uuid4().hex[:8]}"
    env = {
        "redis": {**common, "OUTBOX_TEST_REDIS_URL": redis_url, "OUTBOX_TEST_Q_NAME": queue},
        "orm": common,
    }
    labels = {"redis-1": "redis", "redis-2": "redis", "redis-3": "redis", "orm": "orm"}
    reports = {kind: tmp_path / f"{kind}.json" for kind in env}
    with contextlib.ExitStack() as stack:
        clusters = {
            label: stack.enter_context(
                qcluster(f"cluster-{label}", OUTBOX_TEST_CLUSTER_LABEL=label, **env[kind])
            )
            for label, kind in labels.items()
        }
        # The ORM broker's backlog first, to idle streams: its commit queues the streams'
        # wakes for the ORM cluster. (Written beside the Redis backlog, it found runs of
        # the Redis clusters in flight as often as not, which took its rows: the ORM
        # cluster then had no stream work at all.)
        orm_preload = stack.enter_context(
            running(preload(*PRELOAD["orm"]), "preload-orm", **env["orm"])
        )
        assert orm_preload.wait(180) == 0, orm_preload.args
        stack.enter_context(running(["-c", SCHEDULE], "schedules", **env["redis"]))
        children = [
            stack.enter_context(
                running(preload(*PRELOAD["redis"]), "preload-redis", **env["redis"])
            )
        ]
        children += [
            stack.enter_context(
                running(inflow(reports[kind], INFLOW[kind]), f"inflow-{kind}", **env[kind])
            )
            for kind in env
        ]
        code = f"from tests.testapp.workers import stage_jobs; stage_jobs('job', {STAGED})"
        # Staged jobs through Redis: one fetched by the cluster that dies is lost with it
        # (no acknowledgement); its row stays until a job has run, and the drainer hands
        # it over again after REDELIVER_SECONDS.
        children.append(stack.enter_context(running(["-c", code], "stager", **env["redis"])))
        children.append(stack.enter_context(running(["-c", UNIQUE_JOBS], "unique", **env["orm"])))

        # Mid-run, one whole Redis cluster dies (its jobs in flight and fetched with it).
        alive = [clusters[label] for label in ("redis-2", "redis-3", "orm")]
        wait_until(lambda: ArchivedEvent.objects.count() > 30_000, 120, watch=alive)
        killed_with = ArchivedEvent.objects.count()
        os.killpg(clusters["redis-1"].pid, signal.SIGKILL)

        for child in children:
            assert child.wait(180) == 0, child.args
        wait_until(
            lambda: (
                not OutboxEvent.objects.exists()
                and not OutboxGroup.objects.exists()
                and not StagedJob.objects.exists()
                and JobEffect.objects.count() >= STAGED
                and KeyedJob.objects.filter(state="processed").count() == UNIQUE
            ),
            180,
            1.0,
            watch=alive,
            describe=state,
        )

    expected = 0
    for stream in STREAMS:
        numbers = set()
        for first, last in PRELOAD.values():
            numbers.update(range(first, last))
        for kind in env:
            for name, first, last in json.loads(reports[kind].read_text())["committed"]:
                if name == stream:
                    numbers.update(range(first, last + 1))
        done = ArchivedEvent.objects.filter(stream=stream, outcome=Outcome.DONE)
        got = list(done.values_list("data__payload__n", flat=True))
        assert len(got) == len(set(got)), f"{stream}: archived twice"
        assert set(got) >= numbers, f"{stream}: {len(numbers - set(got))} events missing"
        expected += len(numbers)
    effects = Counter(JobEffect.objects.values_list("label", flat=True))
    assert set(effects) == {f"job-{n}" for n in range(STAGED)}
    assert set(effects.values()) == {1}
    by_cluster = Counter(HandledCall.objects.values_list("cluster", flat=True))
    assert set(by_cluster) == set(labels), by_cluster
    total = ArchivedEvent.objects.filter(outcome=Outcome.DONE).count()
    assert total == expected > 90_000, "every event archived once, the inflow's too"
    print(
        f"\n{total:,} events, {STAGED} staged and {UNIQUE} unique jobs; groups per cluster "
        f"{dict(by_cluster)}; redis-1 killed at {killed_with:,} archived; staged effects "
        f"run twice: {sum(1 for c in effects.values() if c > 1)}"
    )
