"""transport: jobs reach django-q2 inside the caller's transaction with the ORM broker."""

from __future__ import annotations

import pytest
from django.db import transaction
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
