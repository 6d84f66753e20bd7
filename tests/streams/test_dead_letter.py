"""Dead-lettering never stops a stream: a group it fails for is kept, the others go on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.archive.replay import dead_letters, replay_failed
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.attempt import AttemptOutcome, process_group
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.run import claim_group
from django_outbox.streams.sql import buffer_ops
from django_outbox.transport import handoff
from tests.testapp.models import Attachment

pytestmark = pytest.mark.django_db  # in a test transaction: no wake on commit

AUDIT = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": 10,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_MAX_SECONDS": 600,
    "ISOLATE_FAILURES": False,  # one group's retries (test_isolate.py splits groups)
}
ATTACHMENTS = {
    "HANDLER": "tests.testapp.handlers.reject",
    "MODEL": "testapp.Attachment",
    "ISOLATE_FAILURES": False,
}


def claim(stream: str):
    with handoff.capture():
        return claim_group(stream).group_id


@pytest.fixture
def archive_fails_for(monkeypatch):
    """Make the archive statement of one group fail as a real SQL error would."""
    ops_class = type(buffer_ops(OutboxEvent))
    real = ops_class.archive_group
    doomed: set = set()

    def archive_group(self, group_id, move):
        if group_id in doomed:
            with connection.cursor() as cursor:
                cursor.execute("SELECT no_such_column FROM django_outbox_outboxevent")
        return real(self, group_id, move)

    monkeypatch.setattr(ops_class, "archive_group", archive_group)
    return doomed


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": AUDIT}})
def test_a_group_that_cannot_be_dead_lettered_is_kept_and_the_others_go_on(
    handler_mode, archive_fails_for, caplog
):
    publish_many("audit", [{"n": n} for n in range(30)])
    first, second, third = claim("audit"), claim("audit"), claim("audit")
    archive_fails_for.add(second)
    handler_mode("permanent")

    outcomes = [process_group("audit", group) for group in (first, second, third)]

    assert outcomes == [AttemptOutcome.EXHAUSTED, AttemptOutcome.KEPT, AttemptOutcome.EXHAUSTED]
    assert ArchivedEvent.objects.filter(outcome=Outcome.FAILED).count() == 20
    kept = OutboxGroup.objects.get()
    assert (kept.id, kept.state) == (second, GroupState.DEAD_LETTERING)
    own_error, note = kept.last_error.split("\n\nDead-lettering failed: ")
    assert own_error.endswith("PermanentFailure: the API rejected the request: 422")
    assert "no_such_column" in note
    assert OutboxEvent.objects.filter(group_id=second).count() == 10
    assert "Dead-lettering group" in caplog.text

    # Not before BACKOFF_MAX_SECONDS: distribute leaves it alone and the stream flows.
    publish_many("audit", [{"n": "later"}])
    assert distribute_stream("audit").groups_exhausted == 0
    assert OutboxGroup.objects.get(id=second).state == GroupState.DEAD_LETTERING

    # Once the cause is gone and the time has come, distribute dead-letters it.
    archive_fails_for.clear()
    OutboxGroup.objects.filter(id=second).update(next_attempt_at=Now() - timedelta(seconds=1))
    assert distribute_stream("audit").groups_exhausted == 1
    assert not OutboxGroup.objects.filter(id=second).exists()
    errors = set(ArchivedEvent.objects.filter(group_id=second).values_list("error", flat=True))
    assert errors == {own_error}  # the group's own error, not the dead-lettering note


@override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": AUDIT}})
def test_a_spent_lease_whose_dead_lettering_fails_does_not_stop_distribute(archive_fails_for):
    publish_many("audit", [{"n": n} for n in range(20)])
    groups = [claim("audit"), claim("audit")]
    OutboxGroup.objects.update(
        state=GroupState.RUNNING, attempt=3, lease_expires_at=Now() - timedelta(seconds=1)
    )
    archive_fails_for.add(groups[0])

    result = distribute_stream("audit")

    assert result.groups_exhausted == 1
    assert OutboxGroup.objects.get().state == GroupState.DEAD_LETTERING
    assert ArchivedEvent.objects.filter(group_id=groups[1], outcome=Outcome.FAILED).count() == 10


@override_settings(DJANGO_OUTBOX={"STREAMS": {"attachments": ATTACHMENTS}})
def test_bytes_and_a_quoted_column_name_are_dead_lettered_and_replayed_intact():
    Attachment.objects.bulk_create(
        [
            Attachment(title="it's a scan", content=b"\x00\xffPDF"),
            Attachment(title="no content", content=None),
        ]
    )
    group = claim("attachments")

    assert process_group("attachments", group) is AttemptOutcome.EXHAUSTED

    snapshots = [row.data for row in ArchivedEvent.objects.order_by("event_id")]
    assert [data["owner's title"] for data in snapshots] == ["it's a scan", "no content"]
    assert replay_failed(dead_letters(stream="attachments")) == {"attachments": 2}
    replayed = Attachment.objects.order_by("id")
    assert [(a.title, a.content and bytes(a.content)) for a in replayed] == [
        ("it's a scan", b"\x00\xffPDF"),
        ("no content", None),
    ]
