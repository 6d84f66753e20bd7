"""publish() and publish_many(): inserts in the caller's transaction, checked at the call."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.translation import gettext_lazy

from django_outbox import PayloadError, UnknownStream, publish, publish_many
from django_outbox.base.jsondata import MAX_DEPTH
from django_outbox.exceptions import WrongBufferModel
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
    # One INSERT for 160 rows (bulk_create may wrap it in a savepoint). Django 5.2 bounds
    # a SQLite statement at 999 parameters: 166 rows of six columns.
    with CaptureQueriesContext(connection) as captured:
        assert publish_many("audit", ({"n": i} for i in range(160))) == 160
    inserts = [q for q in captured.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1
    assert OutboxEvent.objects.filter(stream="audit").count() == 160


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


# -- what DjangoJSONEncoder encodes ----------------------------------------------------

MOMENT = datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=UTC)
DJANGO_TYPES = {
    "datetime": MOMENT,
    "date": date(2026, 3, 1),
    "time": time(12, 30, 15),
    "duration": timedelta(days=1, seconds=5),
    "price": Decimal("19.90"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "label": gettext_lazy("Lazy label"),
}
#: What DjangoJSONEncoder writes for them, hence what a handler reads back.
ENCODED = {
    "datetime": "2026-03-01T12:30:15.250Z",
    "date": "2026-03-01",
    "time": "12:30:15",
    "duration": "P1DT00H00M05S",
    "price": "19.90",
    "id": "12345678-1234-5678-1234-567812345678",
    "label": "Lazy label",
}


def test_publish_stores_what_djangos_encoder_encodes_as_its_strings_in_one_insert():
    with CaptureQueriesContext(connection) as captured:
        event_id = publish("audit", {"nested": [DJANGO_TYPES]})
    assert len(captured.captured_queries) == 1
    assert OutboxEvent.objects.get(pk=event_id).payload == {"nested": [ENCODED]}


def test_publish_many_stores_them_the_same_way():
    assert publish_many("audit", [DJANGO_TYPES, MOMENT]) == 2
    assert [row.payload for row in OutboxEvent.objects.order_by("id")] == [
        ENCODED,
        ENCODED["datetime"],
    ]


def test_the_handler_receives_the_encoded_strings(inline):
    publish("audit", DJANGO_TYPES)
    inline.distribute("audit")
    assert ArchivedEvent.objects.get(stream="audit").data["payload"] == ENCODED


@pytest.mark.parametrize(
    "payload", [{"at": MOMENT, "x": math.nan}, {"when": object()}, {date(2026, 1, 1): "key"}]
)
def test_what_the_encoder_cannot_store_still_fails_at_the_call(payload):
    with pytest.raises(PayloadError, match="not JSON"):
        publish("audit", payload)
    assert OutboxEvent.objects.count() == 0
