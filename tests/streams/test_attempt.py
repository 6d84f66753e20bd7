"""process_group(): lease, handler, finalize; failures, fencing and heartbeats."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox import BatchResult, LeaseLost, publish_many
from django_outbox.conf import get_stream
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.attempt import AttemptOutcome, finalize, process_group, take_group_lease
from django_outbox.streams.batch import Batch
from django_outbox.streams.run import claim_group
from django_outbox.transport import handoff
from tests.testapp.models import HandledCall

pytestmark = pytest.mark.django_db

AUDIT = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": 10,
    "MAX_ATTEMPTS": 3,
    "ISOLATE_FAILURES": False,  # one group's retries (test_isolate.py splits groups)
}


def claim(stream: str = "audit"):
    with handoff.capture():
        return claim_group(stream)


def make_due(group_id) -> None:
    OutboxGroup.objects.filter(pk=group_id).update(
        state=GroupState.CLAIMED, next_attempt_at=None, lease_expires_at=Now()
    )


def test_success_archives_and_deletes_exactly_the_group_rows():
    publish_many("audit", [{"n": i} for i in range(25)])
    first, second = claim(), claim()
    first_ids = set(
        OutboxEvent.objects.filter(group_id=first.group_id).values_list("id", flat=True)
    )

    assert process_group("audit", first.group_id) is AttemptOutcome.DONE

    assert not OutboxEvent.objects.filter(id__in=first_ids).exists()
    assert OutboxEvent.objects.filter(group_id=second.group_id).count() == 10
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5
    assert not OutboxGroup.objects.filter(pk=first.group_id).exists()
    archived = ArchivedEvent.objects.filter(group_id=first.group_id)
    assert set(archived.values_list("event_id", flat=True)) == first_ids
    assert set(archived.values_list("outcome", "attempts")) == {(Outcome.DONE, 1)}
    call = HandledCall.objects.get()
    assert (call.group_id, call.attempt, set(call.event_ids)) == (first.group_id, 1, first_ids)


def test_the_archive_keeps_a_snapshot_of_custom_buffer_rows(inline):
    from marketing.models import ContactActivity, ContactActivityEvent, Lead

    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    event = ContactActivityEvent.objects.create(activity=activity)

    inline.distribute("marketing")

    snapshot = ArchivedEvent.objects.get(stream="marketing", event_id=event.pk)
    assert snapshot.data["activity_id"] == activity.pk
    assert snapshot.data["id"] == event.pk
    assert snapshot.outcome == Outcome.DONE
    assert not ContactActivityEvent.objects.exists()


def test_a_partial_result_keeps_only_the_failed_rows_for_the_next_attempt(handler_mode):
    publish_many("audit", [{"n": i, "fail": i in (2, 5)} for i in range(10)])
    result = claim()
    failed_ids = set(OutboxEvent.objects.filter(payload__fail=True).values_list("id", flat=True))
    handler_mode("fail-marked")

    assert process_group("audit", result.group_id) is AttemptOutcome.PARTIAL

    group = OutboxGroup.objects.get(pk=result.group_id)
    assert (group.state, group.attempt, group.size) == (GroupState.RETRYING, 1, 2)
    assert group.row_errors == {str(pk): "marked" for pk in failed_ids}
    assert set(OutboxEvent.objects.values_list("id", flat=True)) == failed_ids
    assert ArchivedEvent.objects.filter(outcome=Outcome.DONE).count() == 8

    handler_mode("ok")
    make_due(result.group_id)
    assert process_group("audit", result.group_id) is AttemptOutcome.DONE

    second_call = HandledCall.objects.get(attempt=2)
    assert set(second_call.event_ids) == failed_ids
    retried = ArchivedEvent.objects.filter(event_id__in=failed_ids)
    assert set(retried.values_list("outcome", "attempts")) == {(Outcome.DONE, 2)}
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()


def test_a_raising_handler_makes_the_group_retry_later_by_the_database_clock(handler_mode):
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()
    handler_mode("raise")

    assert process_group("audit", result.group_id) is AttemptOutcome.RETRYING

    group = OutboxGroup.objects.get(pk=result.group_id)
    assert group.state == GroupState.RETRYING and group.attempt == 1
    assert "RuntimeError: handler exploded" in group.last_error
    assert OutboxGroup.objects.filter(pk=group.pk, next_attempt_at__gt=Now()).exists()
    assert OutboxEvent.objects.filter(group_id=result.group_id).count() == 3
    assert not ArchivedEvent.objects.exists()


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": AUDIT}})
def test_the_last_failed_attempt_dead_letters_the_rows(handler_mode):
    publish_many("audit", [{"n": i} for i in range(4)])
    result = claim()
    handler_mode("raise")

    outcomes = []
    for _ in range(3):
        outcomes.append(process_group("audit", result.group_id))
        make_due(result.group_id)

    assert outcomes == [AttemptOutcome.RETRYING, AttemptOutcome.RETRYING, AttemptOutcome.EXHAUSTED]
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()
    archived = ArchivedEvent.objects.all()
    assert archived.count() == 4
    assert set(archived.values_list("outcome", "attempts")) == {(Outcome.FAILED, 3)}
    assert all("handler exploded" in error for error in archived.values_list("error", flat=True))


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": AUDIT}})
def test_dead_letters_of_a_partial_result_carry_their_own_errors(handler_mode):
    publish_many("audit", [{"n": i} for i in range(10)])
    result = claim()
    handler_mode("fail-odd")
    for _ in range(3):
        process_group("audit", result.group_id)
        make_due(result.group_id)

    failed = ArchivedEvent.objects.filter(outcome=Outcome.FAILED)
    assert failed.count() == 5
    assert set(failed.values_list("error", flat=True)) == {"odd id rejected"}
    assert all(pk % 2 for pk in failed.values_list("event_id", flat=True))
    assert ArchivedEvent.objects.filter(outcome=Outcome.DONE).count() == 5


def test_a_handler_returning_something_else_fails_the_group_with_a_clear_error(handler_mode):
    publish_many("audit", [{"n": 1}])
    result = claim()
    handler_mode("bad-return")

    assert process_group("audit", result.group_id) is AttemptOutcome.RETRYING
    error = OutboxGroup.objects.get(pk=result.group_id).last_error
    assert "returned str; return None when every row is done or a BatchResult" in error
    assert OutboxEvent.objects.count() == 1


def test_a_batch_result_naming_rows_outside_the_group_is_a_failed_attempt(handler_mode):
    publish_many("audit", [{"n": n} for n in range(3)])
    result = claim()
    handler_mode("bad-keys")

    assert process_group("audit", result.group_id) is AttemptOutcome.RETRYING

    group = OutboxGroup.objects.get(pk=result.group_id)
    assert (group.state, group.attempt) == (GroupState.RETRYING, 1)
    assert "names 2 key(s) that are not ids of the group's rows: 'first', 1000000000000" in (
        group.last_error
    )
    assert OutboxEvent.objects.filter(group_id=result.group_id).count() == 3
    assert not ArchivedEvent.objects.exists()


@override_settings(
    DJANGO_OUTBOX={"STREAMS": {"audit": {**AUDIT, "ON_EXHAUSTED": "tests.testapp.gone.hook"}}}
)
def test_an_on_exhausted_hook_that_cannot_be_imported_is_logged_and_the_rows_dead_lettered(
    handler_mode, caplog
):
    publish_many("audit", [{"n": n} for n in range(2)])
    result = claim()
    handler_mode("permanent")

    assert process_group("audit", result.group_id) is AttemptOutcome.EXHAUSTED

    assert ArchivedEvent.objects.filter(outcome=Outcome.FAILED).count() == 2
    assert not OutboxGroup.objects.exists()
    assert "ON_EXHAUSTED hook of stream audit failed" in caplog.text


def test_a_duplicate_delivery_of_the_process_job_is_a_no_op():
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()

    assert process_group("audit", result.group_id) is AttemptOutcome.DONE
    assert process_group("audit", result.group_id) is AttemptOutcome.SKIPPED
    assert HandledCall.objects.count() == 1
    assert ArchivedEvent.objects.count() == 3


def test_a_group_that_is_running_elsewhere_is_not_taken_twice():
    publish_many("audit", [{"n": 1}])
    result = claim()
    config = get_stream("audit")

    assert take_group_lease(config, result.group_id) == 1
    assert process_group("audit", result.group_id) is AttemptOutcome.SKIPPED
    assert not HandledCall.objects.exists()


def test_a_stale_worker_can_neither_finalize_nor_heartbeat():
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()
    config = get_stream("audit")
    stale = Batch(config, result.group_id, take_group_lease(config, result.group_id))
    # The lease expires and the group is rescued and taken by another worker.
    make_due(result.group_id)
    fresh = Batch(config, result.group_id, take_group_lease(config, result.group_id))
    assert (stale.attempt, fresh.attempt) == (1, 2)

    with pytest.raises(LeaseLost):
        stale.heartbeat()
    with pytest.raises(LeaseLost):
        finalize(stale, None)
    assert OutboxEvent.objects.filter(group_id=result.group_id).count() == 3
    assert not ArchivedEvent.objects.exists()

    assert finalize(fresh, None) is AttemptOutcome.DONE
    assert set(ArchivedEvent.objects.values_list("attempts", flat=True)) == {2}


def test_heartbeat_extends_the_lease():
    publish_many("audit", [{"n": 1}])
    result = claim()
    config = get_stream("audit")
    batch = Batch(config, result.group_id, take_group_lease(config, result.group_id))
    OutboxGroup.objects.filter(pk=result.group_id).update(lease_expires_at=Now())

    batch.heartbeat()

    window = Now() + timedelta(seconds=config.lease_seconds - 60)
    assert OutboxGroup.objects.filter(pk=result.group_id, lease_expires_at__gt=window).exists()


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": {**AUDIT, "TRANSACTIONAL": True}}})
def test_a_transactional_handler_that_fails_leaves_no_database_effect(handler_mode):
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()
    handler_mode("raise")

    assert process_group("audit", result.group_id) is AttemptOutcome.RETRYING

    assert not HandledCall.objects.exists(), "the handler's write was rolled back"
    assert OutboxEvent.objects.filter(group_id=result.group_id).count() == 3
    assert not ArchivedEvent.objects.exists()


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": {**AUDIT, "TRANSACTIONAL": True}}})
def test_a_transactional_handler_commits_its_writes_with_the_archive():
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()

    assert process_group("audit", result.group_id) is AttemptOutcome.DONE

    assert HandledCall.objects.count() == 1
    assert ArchivedEvent.objects.count() == 3


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": {**AUDIT, "ARCHIVE": False}}})
def test_without_archive_done_rows_are_deleted_but_dead_letters_are_kept(handler_mode):
    publish_many("audit", [{"n": i, "fail": i == 0} for i in range(4)])
    result = claim()
    handler_mode("fail-marked")
    for _ in range(3):
        process_group("audit", result.group_id)
        make_due(result.group_id)

    assert not OutboxEvent.objects.exists()
    assert list(ArchivedEvent.objects.values_list("outcome", flat=True)) == [Outcome.FAILED]


def test_batch_result_failures_names_rows_with_one_error():
    assert BatchResult.failures([3, "4"], "boom").failed == {3: "boom", 4: "boom"}


def test_processing_costs_the_same_number_of_queries_for_10_or_1000_rows():
    streams = {"audit": {**AUDIT, "BATCH_SIZE": 1000, "HANDLER": "tests.streams.test_attempt.noop"}}

    def queries_for(rows: int) -> int:
        publish_many("audit", [{"n": i} for i in range(rows)])
        result = claim()
        with CaptureQueriesContext(connection) as captured:
            assert process_group("audit", result.group_id) is AttemptOutcome.DONE
        return len(captured.captured_queries)

    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        assert queries_for(10) == queries_for(1000)


def noop(batch: Batch) -> None:
    batch.rows()


def test_batch_rows_match_what_the_orm_returns():
    from marketing.models import ContactActivity, ContactActivityEvent, Lead

    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    ContactActivityEvent.objects.bulk_create(
        ContactActivityEvent(activity=activity) for _ in range(3)
    )
    publish_many("audit", [{"n": i, "nested": {"x": [1, None]}} for i in range(3)])
    for stream in ("audit", "marketing"):
        result = claim(stream)
        config = get_stream(stream)
        batch = Batch(config, result.group_id, 1)

        assert batch.rows() == list(batch.events.values())
        assert batch.rows("id") == list(batch.events.values("id"))
    assert batch.rows("activity") == list(batch.events.values("activity"))
    with pytest.raises(ValueError, match=r"use batch\.events\.values"):
        batch.rows("activity__kind")


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": {**AUDIT, "MAX_ATTEMPTS": 8}}})
def test_a_permanent_failure_skips_the_remaining_attempts(handler_mode):
    publish_many("audit", [{"n": i} for i in range(3)])
    result = claim()
    handler_mode("permanent")

    assert process_group("audit", result.group_id) is AttemptOutcome.EXHAUSTED

    archived = ArchivedEvent.objects.all()
    assert archived.count() == 3
    assert set(archived.values_list("outcome", "attempts")) == {(Outcome.FAILED, 1)}
    assert all(
        "the API rejected the request: 422" in e for e in archived.values_list("error", flat=True)
    )
    assert not OutboxGroup.objects.exists()


@override_settings(
    DJANGO_OUTBOX={
        "STREAMS": {"audit": {**AUDIT, "ON_EXHAUSTED": "tests.testapp.handlers.compensate"}}
    }
)
def test_the_on_exhausted_hook_sees_the_rows_before_they_are_dead_lettered(handler_mode):
    publish_many("audit", [{"n": i} for i in range(4)])
    ids = set(OutboxEvent.objects.values_list("id", flat=True))
    result = claim()
    handler_mode("permanent")

    process_group("audit", result.group_id)

    compensation = HandledCall.objects.get(stream="compensate:audit")
    assert set(compensation.event_ids) == ids
    assert ArchivedEvent.objects.filter(outcome=Outcome.FAILED).count() == 4


@override_settings(
    DJANGO_OUTBOX={
        "STREAMS": {"audit": {**AUDIT, "ON_EXHAUSTED": "tests.testapp.handlers.broken_hook"}}
    }
)
def test_a_failing_hook_is_rolled_back_and_the_rows_are_dead_lettered_anyway(handler_mode, caplog):
    publish_many("audit", [{"n": i} for i in range(2)])
    result = claim()
    handler_mode("permanent")

    assert process_group("audit", result.group_id) is AttemptOutcome.EXHAUSTED

    assert not HandledCall.objects.filter(stream="broken").exists()
    assert ArchivedEvent.objects.filter(outcome=Outcome.FAILED).count() == 2
    assert "ON_EXHAUSTED hook of stream audit failed" in caplog.text


def test_signals_report_processed_failed_and_exhausted_groups(
    handler_mode, django_capture_on_commit_callbacks
):
    from django_outbox import signals

    received = []

    def receiver(signal_name):
        def record(sender, **kwargs):
            received.append((signal_name, sender, kwargs["rows"], kwargs["attempt"]))

        return record

    handlers = {
        name: receiver(name) for name in ("group_processed", "group_failed", "group_exhausted")
    }
    for name, handler in handlers.items():
        getattr(signals, name).connect(handler)
    try:
        publish_many("audit", [{"n": i, "fail": i == 0} for i in range(5)])
        result = claim()
        with django_capture_on_commit_callbacks(execute=True):
            handler_mode("fail-marked")
            process_group("audit", result.group_id)
            make_due(result.group_id)
            handler_mode("permanent")
            process_group("audit", result.group_id)
    finally:
        for name, handler in handlers.items():
            getattr(signals, name).disconnect(handler)

    assert received == [
        ("group_processed", "audit", 4, 1),
        ("group_failed", "audit", 1, 1),
        ("group_exhausted", "audit", 1, 2),
    ]


def test_a_raising_receiver_stops_neither_the_others_nor_the_commits_other_callbacks(
    django_capture_on_commit_callbacks, caplog
):
    from django_outbox import signals

    received, after = [], []

    def broken(sender, **kwargs):
        raise RuntimeError("receiver exploded")

    def working(sender, **kwargs):
        received.append(kwargs["rows"])

    signals.group_processed.connect(broken)
    signals.group_processed.connect(working)
    try:
        publish_many("audit", [{"n": n} for n in range(3)])
        result = claim()
        with django_capture_on_commit_callbacks(execute=True):
            process_group("audit", result.group_id)
            connection.on_commit(lambda: after.append("ran"))
    finally:
        signals.group_processed.disconnect(broken)
        signals.group_processed.disconnect(working)

    assert received == [3]
    assert after == ["ran"]
    assert "A receiver of a django_outbox signal raised" in caplog.text
    assert "receiver exploded" in caplog.text


def test_the_logger_reports_the_same_events_with_fields_and_never_the_payload(
    handler_mode, django_capture_on_commit_callbacks, caplog
):
    secret = "card-4242-4242"
    publish_many("audit", [{"n": i, "fail": i == 0, "secret": secret} for i in range(5)])
    result = claim()
    caplog.set_level(logging.INFO, logger="django_outbox")
    with django_capture_on_commit_callbacks(execute=True):
        handler_mode("fail-marked")
        process_group("audit", result.group_id)
        make_due(result.group_id)
        handler_mode("permanent")
        process_group("audit", result.group_id)

    records = [r for r in caplog.records if r.name == "django_outbox.signals"]
    assert [(r.levelname, r.rows, r.attempt) for r in records] == [
        ("INFO", 4, 1),
        ("WARNING", 1, 1),
        ("ERROR", 1, 2),
    ]
    assert {r.stream for r in records} == {"audit"}
    assert {r.group_id for r in records} == {result.group_id}
    assert records[1].retry_in > 0 and records[0].duration >= 0
    assert "\n" not in records[2].error
    for record in records:
        assert secret not in record.getMessage()
        assert secret not in repr(vars(record))
