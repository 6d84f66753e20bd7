"""Unique jobs through real processes on PostgreSQL: qclusters, concurrent enqueuers, a zombie.

Every run records its attempts in ``JobRun`` rows, timed by the database clock, and the
assertions are about those intervals. Where a test needs the dispatch schedule (a retry
or a rescue that is due), it plays it by calling ``dispatch`` in a loop.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now

from django_outbox.base.dialect import database_now
from django_outbox.models import JobState
from django_outbox.transport import handoff
from django_outbox.unique.dispatch import dispatch
from django_outbox.unique.execute import JobOutcome, finish, take_job_lease
from tests.procs import fail_on_queue_failures, log_problems, qcluster, running, wait_until
from tests.uniqueapp.models import (
    BeatingJob,
    JobRun,
    KeyedJob,
    OrderedJob,
    ReadyJob,
    ThrottledJob,
)

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


@contextlib.contextmanager
def four_workers() -> Iterator[list]:
    """Two qclusters of two workers each on the test database."""
    with qcluster("unique-cluster-a") as a, qcluster("unique-cluster-b") as b:
        yield [a, b]
    for cluster in (a, b):
        assert log_problems(cluster) == []


def intervals(model) -> dict[str, list[tuple]]:
    """Each key's runs as (started, ended, seq), in start order."""
    runs = defaultdict(list)
    for run in JobRun.objects.filter(kind=model._meta.label).order_by("started_at", "id"):
        assert run.ended_at is not None, f"run {run} did not end"
        runs[run.key].append((run.started_at, run.ended_at, run.seq))
    return runs


def most_at_once(model) -> int:
    """The largest number of runs of *model* that overlapped in time."""
    edges = []
    for run in JobRun.objects.filter(kind=model._meta.label):
        edges += [(run.started_at, 1), (run.ended_at, -1)]
    current = peak = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        current += step
        peak = max(peak, current)
    return peak


def all_processed(model, count: int):
    return lambda: model.objects.filter(state=JobState.PROCESSED).count() == count


def states(model):
    return lambda: dict(
        (state, model.objects.filter(state=state).count()) for state in JobState.values
    )


def test_concurrent_enqueues_of_one_key_leave_one_pending_job(tmp_path):
    """100 enqueues of one key from 20 connections in 4 processes, released at once."""
    start = tmp_path / "start"
    code = (
        "from tests.uniqueapp.workers import enqueue_burst; "
        f"enqueue_burst({str(start)!r}, threads=5, per_thread=5)"
    )
    with contextlib.ExitStack() as stack:
        children = [
            stack.enter_context(running(["-c", code], f"enqueuer-{n}", log=tmp_path / f"{n}.out"))
            for n in range(4)
        ]
        wait_until(
            lambda: all("ready" in (tmp_path / f"{n}.out").read_text() for n in range(4)),
            timeout=60,
            watch=children,
        )
        start.touch()
        wait_until(lambda: all(child.poll() is not None for child in children), timeout=120)
    results = [
        pair
        for n in range(4)
        for pair in json.loads((tmp_path / f"{n}.out").read_text().strip().splitlines()[-1])
    ]

    assert len(results) == 100
    assert [created for _, created in results].count(True) == 1
    assert len({pk for pk, _ in results}) == 1
    assert list(KeyedJob.objects.values_list("key", "state")) == [("burst", JobState.PENDING)]


def test_four_workers_never_run_two_jobs_of_a_key_at_once():
    keys, per_key = 4, 8
    with four_workers() as clusters:
        with transaction.atomic():
            for seq in range(per_key):
                for k in range(keys):
                    OrderedJob.enqueue(key=f"k{k}", seq=seq, work_seconds=0.1)
        wait_until(
            all_processed(OrderedJob, keys * per_key),
            timeout=120,
            describe=states(OrderedJob),
            watch=clusters,
            check=fail_on_queue_failures,
        )

    runs = intervals(OrderedJob)
    assert sorted(runs) == [f"k{k}" for k in range(keys)]
    for key, key_runs in runs.items():
        assert len(key_runs) == per_key
        for (_, ended, _), (next_start, _, _) in itertools.pairwise(key_runs):
            assert ended <= next_start, f"two jobs of {key} overlapped"
        assert [seq for _, _, seq in key_runs] == list(range(per_key)), "created order"
    assert most_at_once(OrderedJob) >= 2, "jobs of different keys must have run in parallel"


@pytest.mark.parametrize(
    ("model", "expected"),
    [(OrderedJob, [1, 2, 3, 4]), (ReadyJob, [4, 3, 2, 1])],
    ids=["created", "ready"],
)
def test_orderings_through_the_cluster(model, expected):
    """Jobs created 1..4 but ready 4..1: created order runs 1..4, ready order 4..1."""
    now = database_now()
    with qcluster("unique-ordering") as cluster:
        with transaction.atomic():
            for seq in (1, 2, 3, 4):
                for key in ("a", "b"):
                    model.enqueue(
                        key=key,
                        seq=seq,
                        work_seconds=0.05,
                        process_after=now - timedelta(seconds=seq),
                    )
        wait_until(
            all_processed(model, 8),
            timeout=120,
            describe=states(model),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
    assert log_problems(cluster) == []

    for key, key_runs in intervals(model).items():
        assert [seq for _, _, seq in key_runs] == expected, key


def test_commits_handed_to_the_cluster_by_the_dispatcher_thread_all_run(settings):
    """DISPATCH_ON_COMMIT = "thread": 60 enqueues, one transaction each, one in four rolled
    back; the workers dispatch from the hand-offs and run every committed job once."""
    from django_outbox.unique.background import DISPATCHER

    settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "DISPATCH_ON_COMMIT": "thread"}
    committed = []
    with qcluster("unique-thread") as cluster:
        for n in range(60):
            with transaction.atomic():
                job, _ = KeyedJob.enqueue(key=f"k{n}")
                if n % 4 == 3:
                    transaction.set_rollback(True)
                    continue
            committed.append(job.pk)
        wait_until(
            all_processed(KeyedJob, len(committed)),
            timeout=120,
            describe=states(KeyedJob),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
        assert DISPATCHER.idle.wait(30)
    assert log_problems(cluster) == []
    assert sorted(KeyedJob.objects.values_list("pk", flat=True)) == sorted(committed)
    assert sorted(JobRun.objects.values_list("job_id", flat=True)) == sorted(committed)


def test_the_concurrency_limit_holds_under_load():
    jobs = 24
    seen_running = []
    with four_workers() as clusters:
        with transaction.atomic():
            for n in range(jobs):
                ThrottledJob.enqueue(key=f"k{n}", work_seconds=0.15)

        def done() -> bool:
            seen_running.append(ThrottledJob.objects.filter(state=JobState.RUNNING).count())
            return ThrottledJob.objects.filter(state=JobState.PROCESSED).count() == jobs

        wait_until(
            done,
            timeout=120,
            interval=0.02,
            describe=states(ThrottledJob),
            watch=clusters,
            check=fail_on_queue_failures,
        )

    assert max(seen_running) <= 2
    assert most_at_once(ThrottledJob) == 2, "four workers, a limit of two: two ran at once"
    assert JobRun.objects.filter(kind="uniqueapp.ThrottledJob").count() == jobs


def run_a_chunk_that_kills_its_worker(
    name: str, **env: str
) -> tuple[KeyedJob, KeyedJob, list[KeyedJob]]:
    """Eight keyed jobs through a real qcluster (with *env*): the first of the first chunk
    SIGKILLs its worker on attempt 1, the second waits behind it in that chunk. Waits
    until all eight are processed; returns (the crashing job, the one behind, the rest)."""
    with qcluster(name, **env) as cluster:
        with transaction.atomic():  # concurrency 4 over 2 workers: chunks of 2
            crash, _ = KeyedJob.enqueue(key="crash", note="crash")
            behind, _ = KeyedJob.enqueue(key="behind")
            others = [KeyedJob.enqueue(key=f"k{n}")[0] for n in range(6)]

        def settled() -> bool:
            dispatch(KeyedJob)  # plays the schedule: rescues the dead worker's leases
            return KeyedJob.objects.filter(state=JobState.PROCESSED).count() == 8

        wait_until(settled, timeout=90, interval=0.2, watch=[cluster], describe=states(KeyedJob))
    return crash, behind, others


def test_a_worker_killed_mid_chunk_costs_only_the_attempt_it_was_running():
    """One job per statement: SIGKILL of the worker running the first job of a chunk:
    that job's attempt is lost (it runs again as attempt 2); the job waiting behind it
    in the chunk goes back unstarted and runs once, as attempt 1; every other job runs
    once."""
    options = json.dumps({"uniqueapp.KeyedJob": {"jobs_per_statement": 1}})
    crash, behind, others = run_a_chunk_that_kills_its_worker(
        "unique-chunk-crash", OUTBOX_TEST_KIND_OPTIONS=options
    )
    runs = sorted(JobRun.objects.values_list("job_id", "attempt"))
    assert runs == sorted(
        [(crash.pk, 1), (crash.pk, 2), (behind.pk, 1), *((job.pk, 1) for job in others)]
    )
    attempts = dict(KeyedJob.objects.values_list("pk", "attempt"))
    assert attempts[crash.pk] == 2
    assert attempts[behind.pk] == 1, "the job behind the crash did not lose an attempt"
    assert all(attempts[job.pk] == 1 for job in others)


def test_a_worker_killed_mid_group_at_the_default_costs_its_mates_no_attempt():
    """At the default ``jobs_per_statement`` (8) a chunk of two starts both jobs in one
    statement. SIGKILL of the worker during the first: which of them ran cannot be
    known, so neither loses attempt 1, and each runs again alone: the crashing job kills
    its worker again, alone, and that attempt counts (it succeeds as attempt 2); the job
    behind it runs once, as attempt 1; every other job runs once."""
    assert KeyedJob.job_options().jobs_per_statement == 8
    crash, behind, others = run_a_chunk_that_kills_its_worker("unique-group-crash")
    runs = sorted(JobRun.objects.values_list("job_id", "attempt"))
    assert runs == sorted(
        [
            (crash.pk, 1),
            (crash.pk, 1),
            (crash.pk, 2),
            (behind.pk, 1),
            *((job.pk, 1) for job in others),
        ]
    )
    attempts = dict(KeyedJob.objects.values_list("pk", "attempt"))
    assert attempts[crash.pk] == 2
    assert attempts[behind.pk] == 1, "the job started with the crash lost an attempt"
    assert all(attempts[job.pk] == 1 for job in others)


@pytest.mark.parametrize("beats", [10, 0], ids=["heartbeat", "no-heartbeat"])
def test_a_heartbeat_keeps_a_long_job_alive_past_its_lease(beats):
    """A 5 s job with a 2 s lease: with heartbeats it runs once; without, it is rescued."""
    with qcluster("unique-heartbeat") as cluster:
        job, _ = BeatingJob.enqueue(key="long", work_seconds=5, beats=beats)

        def settled() -> bool:
            dispatch(BeatingJob)  # plays the schedule: rescues expired leases
            return BeatingJob.objects.filter(
                pk=job.pk, state__in=[JobState.PROCESSED, JobState.FAILED]
            ).exists()

        wait_until(settled, timeout=60, interval=0.2, watch=[cluster], describe=states(BeatingJob))
    job.refresh_from_db()
    runs = list(JobRun.objects.filter(job_id=job.pk).order_by("attempt"))

    if beats:
        assert (job.state, job.attempt) == (JobState.PROCESSED, 1)
        assert len(runs) == 1
        assert runs[0].ended_at - runs[0].started_at > timedelta(seconds=2)
    else:
        assert (job.state, job.attempt) == (JobState.FAILED, 2)
        assert job.last_error.startswith("The lease of attempt 2 expired")
        assert [run.attempt for run in runs] == [1, 2]


@pytest.mark.parametrize("heartbeat", [False, True], ids=["finish", "heartbeat"])
def test_a_zombie_worker_cannot_finish_a_job_it_lost(tmp_path, heartbeat):
    """SIGSTOP a worker mid-job past its lease; the job is taken over; SIGCONT changes nothing."""
    with handoff.capture() as queue:
        job, _ = KeyedJob.enqueue(key="zombie", beats=1 if heartbeat else 0)
    assert queue[0].args == ("uniqueapp.KeyedJob", [(job.pk, 1)])
    out = tmp_path / "zombie.out"
    code = (
        "from tests.uniqueapp.workers import execute_once; "
        f"execute_once('uniqueapp.KeyedJob', {job.pk}, 1)"
    )
    with running(["-c", code], "zombie", log=out, OUTBOX_TEST_STALL_DIR=str(tmp_path)) as zombie:
        wait_until(lambda: (tmp_path / "started").exists(), timeout=60, watch=[zombie])
        os.kill(zombie.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: KeyedJob.objects.filter(pk=job.pk, lease_expires_at__lt=Now()).exists(),
                timeout=30,
            )
            with handoff.capture() as queue:
                assert dispatch(KeyedJob).rescued == 1
            assert queue[0].args == ("uniqueapp.KeyedJob", [(job.pk, 2)])
            # The fresh attempt is still running when the zombie wakes up.
            token = take_job_lease(KeyedJob, job.pk, 2, "fresh worker")
            assert token
        finally:
            (tmp_path / "go").touch()
            os.kill(zombie.pid, signal.SIGCONT)
        wait_until(lambda: zombie.poll() is not None, timeout=60)
    job.refresh_from_db()

    assert zombie.returncode == 0
    assert out.read_text().strip().splitlines()[-1] == JobOutcome.LEASE_LOST.value
    assert (job.state, job.attempt, job.worker) == (JobState.RUNNING, 2, "fresh worker")
    assert finish(KeyedJob, job.pk, token) is JobOutcome.PROCESSED


def test_failed_attempts_back_off_then_succeed_or_fail_for_good():
    """Base 1 s, cap 2 s, 3 attempts: retried after >= 0.8 s, then >= 1.6 s."""
    with qcluster("unique-backoff") as cluster:
        with transaction.atomic():
            recovers, _ = KeyedJob.enqueue(key="recovers", fail_attempts=2)
            exhausts, _ = KeyedJob.enqueue(key="exhausts", fail_attempts=9)

        def settled() -> bool:
            dispatch(KeyedJob)  # plays the schedule: starts retries that are due
            return not KeyedJob.objects.exclude(
                state__in=[JobState.PROCESSED, JobState.FAILED]
            ).exists()

        wait_until(settled, timeout=60, interval=0.2, watch=[cluster], describe=states(KeyedJob))
    expected = f"#{exhausts.pk} attempt 3 of 3 failed (failed): RuntimeError: planned failure"
    assert [line for line in log_problems(cluster) if expected not in line] == []
    recovers.refresh_from_db()
    exhausts.refresh_from_db()

    assert (recovers.state, recovers.attempt, recovers.last_error) == (JobState.PROCESSED, 3, "")
    assert (exhausts.state, exhausts.attempt) == (JobState.FAILED, 3)
    assert "planned failure of attempt 3" in exhausts.last_error
    for job in (recovers, exhausts):
        runs = list(JobRun.objects.filter(job_id=job.pk, kind="uniqueapp.KeyedJob").order_by("id"))
        assert [run.attempt for run in runs] == [1, 2, 3]
        gaps = [later.started_at - earlier.ended_at for earlier, later in itertools.pairwise(runs)]
        assert gaps[0] >= timedelta(seconds=0.8) and gaps[1] >= timedelta(seconds=1.6), gaps
