"""transport: jobs reach django-q2 inside the caller's transaction with the ORM broker."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox.transport import handoff

pytestmark = pytest.mark.django_db


def test_jobs_are_bulk_inserted_into_the_orm_broker_as_django_q2_packages(
    django_assert_max_num_queries,
):
    with django_assert_max_num_queries(3):
        assert handoff.enqueue(handoff.RUN, [("audit",)] * 5) == 5

    rows = list(OrmQ.objects.all())
    assert len(rows) == 5
    task = SignedPackage.loads(rows[0].payload)
    assert (task["func"], task["args"], task["kwargs"]) == (handoff.RUN, ("audit",), {})
    assert task["save"] is False
    assert len({SignedPackage.loads(r.payload)["id"] for r in rows}) == 5
    assert {r.key for r in rows} == {"outbox-tests"}


def test_jobs_enqueued_in_a_rolled_back_transaction_never_reach_the_queue():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        handoff.enqueue(handoff.RUN, [("audit", "00000000-0000-0000-0000-000000000000")])
        raise Rollback

    assert not OrmQ.objects.exists()


def test_a_stream_cluster_is_the_broker_queue_of_its_jobs():
    handoff.enqueue(handoff.RUN, [("audit",)], cluster="bulk")

    row = OrmQ.objects.get()
    assert row.key == "bulk"
    assert SignedPackage.loads(row.payload)["cluster"] == "bulk"


def test_capture_keeps_jobs_in_memory_and_sends_nothing():
    with handoff.capture() as jobs:
        handoff.enqueue(handoff.RUN, [("audit",), ("audit",)])

    assert [job.args for job in jobs] == [("audit",), ("audit",)]
    assert not OrmQ.objects.exists()


def later_job(seconds: float) -> handoff.Job:
    return handoff.Job(
        handoff.RETRY, ("audit", "g"), not_before=timezone.now() + timedelta(seconds=seconds)
    )


def test_a_job_due_later_is_queued_for_then_in_the_orm_broker():
    """django-q2's ORM broker takes a queue row only once its lock has passed: a row
    locked until the job is due is delivered then, and commits with the transaction."""
    job = later_job(30)
    with transaction.atomic():
        assert handoff.submit([job]) == 0  # not handed over now
        row = OrmQ.objects.get()
    assert row.lock == job.not_before
    assert SignedPackage.loads(row.payload)["func"] == handoff.RETRY


def test_a_job_due_later_in_a_rolled_back_transaction_is_not_queued():
    with pytest.raises(RuntimeError), transaction.atomic():
        handoff.submit([later_job(30)])
        raise RuntimeError("the attempt's transaction failed")
    assert not OrmQ.objects.exists()


def test_a_job_due_later_is_dropped_by_a_capture_unless_asked_for():
    with handoff.capture() as jobs:
        handoff.submit([later_job(30), handoff.Job(handoff.RUN, ("audit",))])
    assert [job.func for job in jobs] == [handoff.RUN]
    with handoff.capture(delayed=True) as jobs:
        handoff.submit([later_job(30)])
    assert [job.func for job in jobs] == [handoff.RETRY]


def test_a_job_due_later_is_dropped_by_a_broker_that_cannot_hold_it_back():
    """Redis and the other brokers deliver what they get at once: the job is not sent
    (the schedule's distribute takes the work when it is due)."""
    with mock.patch.object(handoff, "_orm_broker_alias", return_value=None):
        with mock.patch.object(handoff, "_send") as send:
            handoff.submit([later_job(30)])
    send.assert_not_called()
    assert not OrmQ.objects.exists()


def test_jobs_sent_after_commit_reuse_one_broker_client_per_process(
    monkeypatch, django_capture_on_commit_callbacks
):
    """A broker that is not the ORM (Redis) gets every push through one client per
    process and cluster, not a new connection per commit; a forked worker opens its own."""
    built: list[str | None] = []

    class Broker:
        def __init__(self, cluster: str | None) -> None:
            self.pushed: list[str] = []

        def enqueue(self, package: str) -> None:
            self.pushed.append(package)

    def get_broker(cluster: str | None = None) -> Broker:
        built.append(cluster)
        return Broker(cluster)

    monkeypatch.setattr(handoff, "get_broker", get_broker)
    monkeypatch.setattr(handoff, "_brokers", {})
    with mock.patch.object(handoff, "_orm_broker_alias", return_value=None):
        for _ in range(3):
            with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
                handoff.submit([handoff.Job("django_outbox.tasks.distribute", ())])
        assert built == ["outbox-tests"]  # one client for three commits (the cluster's queue)
        with mock.patch.object(handoff.os, "getpid", return_value=-1):  # a forked child
            with django_capture_on_commit_callbacks(execute=True):
                handoff.submit([handoff.Job("django_outbox.tasks.distribute", ())])
    assert built == ["outbox-tests", "outbox-tests"]
    assert [len(b.pushed) for b in handoff._brokers.values()] == [3, 1]
