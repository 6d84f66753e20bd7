"""lock_rows() and retry_on_conflict(): ordered locks, bounded retries of real conflicts."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection, transaction

from django_outbox.exceptions import NotInTransaction
from django_outbox.jobs.locking import lock_rows, retry_on_conflict
from tests.testapp.models import JobEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_lock_rows_returns_the_rows_in_primary_key_order_without_missing_ones():
    rows = [JobEffect.objects.create(label=f"r{n}") for n in range(4)]

    with transaction.atomic():
        locked = lock_rows(JobEffect, [rows[3].pk, rows[0].pk, 999_999, rows[2].pk])

    assert [row.pk for row in locked] == [rows[0].pk, rows[2].pk, rows[3].pk]


def test_lock_rows_accepts_a_queryset():
    keep = JobEffect.objects.create(label="keep")
    JobEffect.objects.create(label="other")

    with transaction.atomic():
        locked = lock_rows(JobEffect.objects.filter(label="keep"), [keep.pk, keep.pk + 1])

    assert locked == [keep]


def test_lock_rows_outside_a_transaction_is_refused():
    with pytest.raises(NotInTransaction, match=r"must run inside transaction\.atomic"):
        lock_rows(JobEffect, [1])


def test_retry_on_conflict_refuses_to_run_inside_an_outer_transaction():
    @retry_on_conflict
    def work() -> None:
        JobEffect.objects.create(label="never")

    with pytest.raises(NotInTransaction, match="cannot run inside an outer"), transaction.atomic():
        work()
    assert JobEffect.objects.count() == 0


def fail_with(sqlstate: str) -> None:
    """Raise a real PostgreSQL error with *sqlstate*, as the server would."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$"
        )


@pytest.mark.postgres
def test_a_serialization_failure_is_retried_and_only_the_last_run_leaves_effects():
    calls = []

    @retry_on_conflict(attempts=4, base_delay=0.001)
    def transfer() -> str:
        calls.append(len(calls) + 1)
        JobEffect.objects.create(label=f"attempt {len(calls)}")
        if len(calls) < 3:
            fail_with("40001")
        return "done"

    assert transfer() == "done"
    assert calls == [1, 2, 3]
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["attempt 3"]


@pytest.mark.postgres
def test_a_deadlock_that_keeps_happening_is_raised_after_the_bound():
    calls = []

    @retry_on_conflict(attempts=3, base_delay=0.001)
    def doomed() -> None:
        calls.append(1)
        fail_with("40P01")

    with pytest.raises(OperationalError, match="injected"):
        doomed()
    assert len(calls) == 3


@pytest.mark.postgres
def test_any_other_error_is_raised_at_once():
    calls = []

    @retry_on_conflict(attempts=5)
    def broken() -> None:
        calls.append(1)
        fail_with("23505")  # unique_violation: retrying cannot help

    with pytest.raises(Exception, match="injected"):
        broken()
    assert calls == [1]
