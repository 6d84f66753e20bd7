"""Transient database errors in claim and finalize: retried a bounded number of times."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import IntegrityError, OperationalError

from django_outbox.base.errors import ERROR_LIMIT
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup
from django_outbox.streams.attempt import AttemptOutcome, process_group
from django_outbox.streams.run import claim_group
from django_outbox.streams.sql import buffer_ops
from django_outbox.transport import handoff
from tests.conftest import publish_unwoken

# Retries only happen at the top level, outside any transaction: no test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


class SerializationFailure(Exception):
    sqlstate = "40001"


class DeadlockDetected(Exception):
    sqlstate = "40P01"


def transient(cause: type[Exception], detail: str = "") -> OperationalError:
    error = OperationalError("could not serialize access due to concurrent update")
    error.__cause__ = cause(detail)
    return error


def ops_class():
    from django_outbox.models import OutboxEvent

    return type(buffer_ops(OutboxEvent))


def claimed_group():
    publish_unwoken("audit", [{"n": i} for i in range(5)])
    with handoff.capture():
        return claim_group("audit").group_id


def test_finalize_runs_again_after_a_serialization_failure():
    group_id = claimed_group()
    real = ops_class().archive_group_fenced
    calls = []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise transient(SerializationFailure)
        return real(self, *args, **kwargs)

    with mock.patch.object(ops_class(), "archive_group_fenced", flaky):
        assert process_group("audit", group_id) is AttemptOutcome.DONE

    assert len(calls) == 2
    assert ArchivedEvent.objects.count() == 5
    assert not OutboxEvent.objects.exists()


def test_a_finalize_that_keeps_failing_counts_as_a_failed_attempt_and_keeps_the_rows():
    group_id = claimed_group()
    # A traceback longer than the stored error in any checkout (its file paths alone do
    # not decide whether it is cut).
    failure = transient(SerializationFailure, "detail " * ERROR_LIMIT)

    with mock.patch.object(ops_class(), "archive_group_fenced", side_effect=failure) as archive:
        assert process_group("audit", group_id) is AttemptOutcome.RETRYING

    assert archive.call_count == 3
    group = OutboxGroup.objects.get(pk=group_id)
    assert group.state == GroupState.RETRYING and group.attempt == 1
    assert group.last_error.startswith("finalize failed: ")
    assert "characters cut" in group.last_error
    assert group.last_error.endswith("could not serialize access due to concurrent update")
    assert len(group.last_error) <= ERROR_LIMIT
    assert OutboxEvent.objects.filter(group_id=group_id).count() == 5
    assert not ArchivedEvent.objects.exists()


def test_a_claim_runs_again_after_a_deadlock():
    publish_unwoken("audit", [{"n": i} for i in range(5)])
    real = ops_class().claim
    calls = []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise transient(DeadlockDetected)
        return real(self, *args, **kwargs)

    with mock.patch.object(ops_class(), "claim", flaky), handoff.capture():
        assert claim_group("audit").size == 5
    assert len(calls) == 2
    assert OutboxGroup.objects.count() == 1


def test_other_database_errors_are_raised_at_once_and_change_nothing():
    publish_unwoken("audit", [{"n": i} for i in range(5)])

    with (
        mock.patch.object(ops_class(), "claim", side_effect=IntegrityError("nope")) as claim,
        handoff.capture(),
        pytest.raises(IntegrityError),
    ):
        claim_group("audit")

    assert claim.call_count == 1
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5
    assert not OutboxGroup.objects.exists()


def test_a_transactional_handler_whose_finalize_fails_leaves_no_database_effect():
    from django.test import override_settings

    from tests.testapp.models import HandledCall

    streams = {"audit": {"HANDLER": "tests.testapp.handlers.record", "TRANSACTIONAL": True}}
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        group_id = claimed_group()
        with mock.patch.object(
            ops_class(), "archive_group_fenced", side_effect=IntegrityError("archive insert failed")
        ):
            assert process_group("audit", group_id) is AttemptOutcome.RETRYING

    assert not HandledCall.objects.exists(), "the handler's write survived a failed finalize"
    assert OutboxEvent.objects.filter(group_id=group_id).count() == 5
    assert not ArchivedEvent.objects.exists()
    assert "archive insert failed" in OutboxGroup.objects.get(pk=group_id).last_error


@pytest.mark.postgres
def test_a_connection_dropped_during_finalize_is_reopened_and_the_group_finishes():
    import psycopg
    from django.db import connection

    group_id = claimed_group()
    real = ops_class().archive_group_fenced
    calls = []

    def drop_then_archive(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            # Another session kills this one, as a failover or a restarted pooler would.
            params = {
                k: v
                for k, v in connection.get_connection_params().items()
                if k in ("dbname", "user", "password", "host", "port")
            }
            with psycopg.connect(**params, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid]
                )
        return real(self, *args, **kwargs)

    with mock.patch.object(ops_class(), "archive_group_fenced", drop_then_archive):
        assert process_group("audit", group_id) is AttemptOutcome.DONE

    assert len(calls) == 2
    assert ArchivedEvent.objects.count() == 5
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()
