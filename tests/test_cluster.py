"""Process tier: the pipeline through a real ``qcluster`` (django-q2, ORM broker)."""

from __future__ import annotations

import pytest

from django_outbox.distribute import distribute
from django_outbox.models import ArchivedEvent, OutboxGroup, Outcome
from marketing.models import ApiRequest, ContactActivity, ContactActivityEvent, Lead
from tests.procs import running, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

EVENTS = 2_000
BATCH_SIZE = 100  # the marketing stream's BATCH_SIZE in tests/settings.py


def backlog() -> dict[str, int]:
    return {
        "buffer": ContactActivityEvent.objects.count(),
        "groups": OutboxGroup.objects.count(),
        "archived": ArchivedEvent.objects.count(),
    }


def test_one_distribute_drains_a_backlog_through_a_real_cluster():
    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activities = ContactActivity.objects.bulk_create(
        ContactActivity(lead=lead, kind="call", comment=f"#{i}") for i in range(EVENTS)
    )
    ContactActivityEvent.objects.bulk_create(
        ContactActivityEvent(activity=activity) for activity in activities
    )
    published = set(ContactActivityEvent.objects.values_list("id", flat=True))
    assert len(published) == EVENTS

    result = distribute("marketing")  # the only distribute: claim chains do the rest
    assert result.claims_enqueued >= 1

    with running(["-m", "django", "qcluster"], "qcluster"):
        wait_until(
            lambda: not ContactActivityEvent.objects.exists() and not OutboxGroup.objects.exists(),
            timeout=120,
            describe=backlog,
        )

    archived = list(
        ArchivedEvent.objects.filter(stream="marketing").values_list("event_id", "outcome")
    )
    archived_ids = [event_id for event_id, _ in archived]
    assert len(archived_ids) == len(set(archived_ids)), "an event was archived twice"
    assert set(archived_ids) == published, "an event is missing from the archive"
    assert {outcome for _, outcome in archived} == {Outcome.DONE}
    groups = ArchivedEvent.objects.values("group_id").distinct().count()
    assert groups == EVENTS // BATCH_SIZE
    # One bulk request per group, never one per event.
    assert ApiRequest.objects.count() == groups
    assert set(ApiRequest.objects.values_list("size", flat=True)) == {BATCH_SIZE}
