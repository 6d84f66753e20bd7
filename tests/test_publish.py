"""publish() and publish_many(): inserts in the caller's transaction, checked at the call."""

from __future__ import annotations

import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_outbox import PayloadError, UnknownStream, publish, publish_many
from django_outbox.exceptions import WrongBufferModel
from django_outbox.jsondata import MAX_DEPTH
from django_outbox.models import ArchivedEvent, OutboxEvent

pytestmark = pytest.mark.django_db


def test_publish_inserts_one_unclaimed_row_and_returns_its_id():
    with CaptureQueriesContext(connection) as captured:
        event_id = publish("audit", {"user": 7, "action": "login", "tags": ["a", "é"]})

    assert len(captured.captured_queries) == 1
    row = OutboxEvent.objects.get(pk=event_id)
    assert row.stream == "audit"
    assert row.payload == {"user": 7, "action": "login", "tags": ["a", "é"]}
    assert row.group_id is None
    assert row.created_at is not None


def test_publish_inside_a_rolled_back_transaction_leaves_nothing():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        publish("audit", {"n": 1})
        publish_many("audit", [{"n": 2}, {"n": 3}])
        assert OutboxEvent.objects.count() == 3
        raise Rollback

    assert OutboxEvent.objects.count() == 0


def test_publish_many_inserts_in_bulk_and_returns_the_count():
    # One INSERT for 200 rows (bulk_create may wrap it in a savepoint).
    with CaptureQueriesContext(connection) as captured:
        assert publish_many("audit", ({"n": i} for i in range(200))) == 200
    inserts = [q for q in captured.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1
    assert OutboxEvent.objects.filter(stream="audit").count() == 200


@pytest.mark.parametrize("payload", [{"when": object()}, {1, 2}, {"x": math.nan}, math.inf])
def test_a_payload_that_is_not_json_fails_at_the_call(payload):
    with pytest.raises(PayloadError, match="not JSON"):
        publish("audit", payload)
    with pytest.raises(PayloadError, match="not JSON"):
        publish_many("audit", [{"ok": 1}, payload])
    assert OutboxEvent.objects.count() == 0


def test_an_unknown_stream_fails_at_the_call_and_names_the_known_ones():
    with pytest.raises(UnknownStream, match=r"Unknown outbox stream 'nope'.*audit, marketing"):
        publish("nope", {})
    assert OutboxEvent.objects.count() == 0


def test_a_stream_with_its_own_buffer_model_refuses_publish():
    with pytest.raises(WrongBufferModel, match=r"create marketing\.ContactActivityEvent rows"):
        publish("marketing", {})


def nested(depth: int) -> object:
    """A value with *depth* levels of lists and dicts around a number."""
    value: object = 1
    for level in range(depth):
        value = [value] if level % 2 else {"x": value}
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 990, 2000])
def test_a_payload_nested_too_deep_fails_at_the_call(depth):
    with pytest.raises(PayloadError, match=f"deeper than {MAX_DEPTH} levels"):
        publish("audit", nested(depth))
    with pytest.raises(PayloadError, match=f"deeper than {MAX_DEPTH} levels"):
        publish_many("audit", [{"ok": 1}, nested(depth)])
    assert OutboxEvent.objects.count() == 0


def test_a_payload_that_contains_itself_fails_at_the_call():
    payload: dict = {}
    payload["self"] = payload
    with pytest.raises(PayloadError, match="contains itself"):
        publish("audit", payload)
    assert OutboxEvent.objects.count() == 0


def test_a_payload_nested_to_the_bound_is_archived_and_shown_in_the_admin(inline, admin_client):
    publish("audit", nested(MAX_DEPTH))

    inline.distribute("audit")

    archived = ArchivedEvent.objects.get(stream="audit")
    assert archived.data["payload"] == nested(MAX_DEPTH)
    page = reverse("admin:django_outbox_archivedevent_change", args=[archived.pk])
    assert admin_client.get(page).status_code == 200


@pytest.mark.parametrize(
    "payload",
    [{"note": "nul \x00 inside"}, {"key\x00": 1}, ["lone \ud800 surrogate"], {"\udfff": 1}],
    ids=repr,
)
def test_a_string_postgresql_cannot_store_fails_at_the_call_on_every_database(payload):
    with pytest.raises(PayloadError, match="NUL character or a lone surrogate"):
        publish("audit", payload)
    with pytest.raises(PayloadError, match="NUL character or a lone surrogate"):
        publish_many("audit", [payload])
    assert OutboxEvent.objects.count() == 0


def test_escaped_looking_text_and_characters_beyond_the_bmp_are_stored_as_given():
    payload = {"backslash": "\\u0000 is not a NUL", "emoji": "\U0001f600", "é": "\u2028"}
    event_id = publish("audit", payload)
    publish_many("audit", [payload])
    assert [row.payload for row in OutboxEvent.objects.order_by("id")] == [payload, payload]
    assert OutboxEvent.objects.get(pk=event_id).payload == payload
