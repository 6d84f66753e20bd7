"""Replay: dead letters go back into their buffer as new rows, once."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_outbox import publish_many
from django_outbox.archive.replay import dead_letters, replay_failed
from django_outbox.models import ArchivedEvent, OutboxEvent, Outcome
from django_outbox.streams.attempt import process_group
from django_outbox.streams.run import claim_group
from django_outbox.transport import handoff

pytestmark = pytest.mark.django_db

STREAMS = {
    # A group dead-lettered whole (test_isolate.py splits groups).
    "audit": {
        "HANDLER": "tests.testapp.handlers.record",
        "BATCH_SIZE": 10,
        "ISOLATE_FAILURES": False,
    },
    "marketing": {
        "HANDLER": "marketing.outbox.sync_activities",
        "MODEL": "marketing.ContactActivityEvent",
    },
}


def dead_letter(stream: str, handler_mode, n: int = 3):
    """Make one group of *stream* fail permanently; return its group id."""
    with handoff.capture():
        result = claim_group(stream)
    handler_mode("permanent")
    process_group(stream, result.group_id)
    handler_mode("ok")
    return result.group_id


@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_replay_takes_only_dead_letters_not_replayed_whatever_queryset_it_gets(
    handler_mode, inline
):
    publish_many("audit", [{"n": i} for i in range(3)])
    dead_letter("audit", handler_mode)
    publish_many("audit", [{"n": "ok"}])
    inline.distribute("audit")  # one done row in the archive too
    assert ArchivedEvent.objects.count() == 4

    assert replay_failed(ArchivedEvent.objects.filter(outcome="failed")) == {"audit": 3}
    assert replay_failed(ArchivedEvent.objects.filter(outcome="failed")) == {}
    assert replay_failed(ArchivedEvent.objects.all()) == {}

    assert sorted(OutboxEvent.objects.values_list("payload__n", flat=True)) == [0, 1, 2]


@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_dead_letters_are_published_again_as_new_rows_and_only_once(handler_mode, inline):
    publish_many("audit", [{"n": i} for i in range(3)])
    old_ids = set(OutboxEvent.objects.values_list("id", flat=True))
    dead_letter("audit", handler_mode)
    assert not OutboxEvent.objects.exists()

    assert replay_failed(dead_letters()) == {"audit": 3}

    fresh = OutboxEvent.objects.order_by("id")
    assert [e.payload for e in fresh] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert not set(fresh.values_list("id", flat=True)) & old_ids
    assert all(e.group_id is None for e in fresh)
    assert ArchivedEvent.objects.filter(replayed_at__isnull=False).count() == 3
    assert replay_failed(dead_letters()) == {}

    inline.distribute("audit")
    done = ArchivedEvent.objects.filter(outcome=Outcome.DONE)
    assert sorted(done.values_list("data__payload__n", flat=True)) == [0, 1, 2]


@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_rows_of_a_custom_buffer_are_rebuilt_from_their_snapshot(handler_mode):
    from marketing.models import ContactActivity, ContactActivityEvent, Lead

    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    ContactActivityEvent.objects.create(activity=activity)
    ArchivedEvent.objects.create(
        stream="marketing",
        event_id=999,
        data={"id": 999, "activity_id": activity.pk, "group_id": None, "created_at": None},
        created_at=timezone.now(),
        outcome=Outcome.FAILED,
        error="boom",
    )

    assert replay_failed(dead_letters(stream="marketing")) == {"marketing": 1}

    replayed = ContactActivityEvent.objects.exclude(pk=999).latest("id")
    assert replayed.activity_id == activity.pk
    assert replayed.group_id is None


@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_filters_pick_the_dead_letters_to_replay(handler_mode):
    publish_many("audit", [{"n": i} for i in range(20)])
    first = dead_letter("audit", handler_mode)
    second = dead_letter("audit", handler_mode)
    ArchivedEvent.objects.filter(group_id=first).update(
        archived_at=timezone.now() - timedelta(days=2)
    )

    assert dead_letters(group_id=second).count() == 10
    assert dead_letters(until=timezone.now() - timedelta(days=1)).count() == 10
    assert dead_letters(since=timezone.now() - timedelta(days=1)).count() == 10
    assert replay_failed(dead_letters(group_id=first)) == {"audit": 10}
    assert dead_letters().count() == 10


@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_the_replay_command_counts_first_and_then_replays(handler_mode):
    publish_many("audit", [{"n": i} for i in range(3)])
    group = dead_letter("audit", handler_mode)

    out = io.StringIO()
    call_command("outbox_replay", "--dry-run", stdout=out)
    assert out.getvalue() == "Would replay 3 row(s) of stream audit.\n"
    assert not OutboxEvent.objects.exists()

    out = io.StringIO()
    call_command("outbox_replay", "--stream", "audit", "--group", str(group), stdout=out)
    assert out.getvalue() == "Replayed 3 row(s) of stream audit.\n"
    assert OutboxEvent.objects.count() == 3

    out = io.StringIO()
    call_command("outbox_replay", stdout=out)
    assert out.getvalue() == "No dead letters match.\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "'yesterday' is not a date and time"),
        (["--group", "42"], "'42' is not a group id"),
        (["--stream", "nope"], "Unknown outbox stream 'nope'"),
    ],
)
def test_the_replay_command_rejects_bad_arguments_and_changes_nothing(args, message):
    ArchivedEvent.objects.create(
        stream="audit",
        event_id=1,
        data={"payload": {}},
        created_at=timezone.now(),
        outcome=Outcome.FAILED,
    )
    with pytest.raises(CommandError, match=message):
        call_command("outbox_replay", *args, stdout=io.StringIO())
    assert ArchivedEvent.objects.filter(replayed_at__isnull=True).count() == 1
    assert not OutboxEvent.objects.exists()
