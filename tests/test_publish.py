"""publish() and publish_many(): inserts in the caller's transaction, checked at the call."""

from __future__ import annotations

import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_outbox import PayloadError, UnknownStream, publish, publish_many
from django_outbox.exceptions import WrongBufferModel
from django_outbox.models import OutboxEvent

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
