"""End to end, inline: publish → distribute → claim → process → archive."""

from __future__ import annotations

import pytest

from django_outbox import publish_many
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome
from tests.testapp.models import HandledCall

pytestmark = pytest.mark.django_db


def test_backlog_drains_in_full_batches_and_is_archived(inline):
    publish_many("audit", [{"n": i} for i in range(35)])

    inline.distribute("audit")

    assert OutboxEvent.objects.count() == 0
    assert OutboxGroup.objects.count() == 0
    calls = list(HandledCall.objects.order_by("id"))
    assert [len(c.event_ids) for c in calls] == [10, 10, 10, 5]
    seen = [pk for c in calls for pk in c.event_ids]
    assert len(seen) == len(set(seen)) == 35
    archived = ArchivedEvent.objects.filter(stream="audit")
    assert archived.count() == 35
    assert set(archived.values_list("outcome", flat=True)) == {Outcome.DONE}
    assert sorted(archived.values_list("event_id", flat=True)) == sorted(seen)
    one = archived.get(event_id=seen[0])
    assert one.data["payload"] == {"n": 0}
    assert one.data["stream"] == "audit"
    assert one.attempts == 1
