"""PublishTrigger: row changes publish events by database trigger, in the writer's transaction.

``tests.testapp.Purchase`` is migrated with
``PublishTrigger("purchase", stream="audit", fields=["id", "customer", "amount"],
on=["insert", "update", "delete"])`` (migration testapp 0003).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from django_outbox.models import ArchivedEvent, OutboxEvent
from django_outbox.models.archive import Outcome
from django_outbox.operations import PublishTrigger
from django_outbox.streams.inline import run_inline
from tests.testapp.models import HandledCall, Purchase

pytestmark = pytest.mark.django_db


def payloads() -> list[dict]:
    return list(
        OutboxEvent.objects.filter(stream="audit").order_by("id").values_list("payload", flat=True)
    )


def amount(payload: dict) -> Decimal:
    return Decimal(str(payload["amount"]))


def test_an_insert_publishes_the_listed_fields_with_no_statement_of_its_own():
    with CaptureQueriesContext(connection) as captured:
        purchase = Purchase.objects.create(customer="ann", amount=Decimal("9.99"), note="secret")

    assert len(captured.captured_queries) == 1
    [payload] = payloads()
    assert {k: v for k, v in payload.items() if k != "amount"} == {
        "op": "insert",
        "id": purchase.pk,
        "customer": "ann",
    }
    assert amount(payload) == Decimal("9.99")
    event = OutboxEvent.objects.get()
    assert event.group_id is None and event.created_at is not None


def test_an_update_publishes_only_when_a_listed_field_changes():
    purchase = Purchase.objects.create(customer="ann", amount=Decimal("1.00"))

    Purchase.objects.filter(pk=purchase.pk).update(note="only the unlisted field")
    Purchase.objects.filter(pk=purchase.pk).update(customer="ann")  # same value
    Purchase.objects.filter(pk=purchase.pk).update(amount=Decimal("2.50"))

    ops = [(p["op"], amount(p)) for p in payloads()]
    assert ops == [("insert", Decimal("1.00")), ("update", Decimal("2.50"))]


def test_a_delete_publishes_the_old_values():
    purchase = Purchase.objects.create(customer="bob", amount=Decimal("3.00"))
    pk = purchase.pk
    purchase.delete()

    last = payloads()[-1]
    assert (last["op"], last["id"], last["customer"], amount(last)) == (
        "delete",
        pk,
        "bob",
        Decimal("3.00"),
    )


def test_a_rolled_back_write_publishes_nothing():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        Purchase.objects.create(customer="ann", amount=Decimal("1.00"))
        assert len(payloads()) == 1
        raise Rollback

    assert payloads() == []


def test_bulk_writes_publish_one_event_per_row():
    Purchase.objects.bulk_create(Purchase(customer=f"c{i}", amount=Decimal(i)) for i in range(50))
    Purchase.objects.filter(customer__in=["c1", "c2", "c3"]).update(amount=Decimal("99"))
    Purchase.objects.filter(customer="c4").delete()

    ops = [p["op"] for p in payloads()]
    assert ops.count("insert") == 50
    assert ops.count("update") == 3
    assert ops.count("delete") == 1


def test_triggered_events_flow_through_the_pipeline_like_published_ones():
    created = [Purchase.objects.create(customer=f"c{i}", amount=Decimal(i)) for i in range(25)]

    run_inline(["audit"], until_empty=True)

    assert OutboxEvent.objects.count() == 0
    archived = ArchivedEvent.objects.filter(stream="audit", outcome=Outcome.DONE)
    assert sorted(p["id"] for p in archived.values_list("data__payload", flat=True)) == [
        p.pk for p in created
    ]
    assert sum(len(call.event_ids) for call in HandledCall.objects.all()) == 25


@pytest.mark.django_db(transaction=True)
def test_migrating_backwards_removes_the_triggers_and_forwards_restores_them():
    executor = MigrationExecutor(connection)
    state = executor.loader.project_state(("testapp", "0003_purchase"))
    operation = PublishTrigger(
        "purchase",
        stream="audit",
        fields=["id", "customer", "amount"],
        on=["insert", "update", "delete"],
    )
    try:
        with connection.schema_editor() as editor:
            operation.database_backwards("testapp", editor, state, state)
        purchase = Purchase.objects.create(customer="ann", amount=Decimal("1.00"))
        purchase.delete()
        assert payloads() == []
    finally:
        with connection.schema_editor() as editor:
            operation.database_forwards("testapp", editor, state, state)

    Purchase.objects.create(customer="ann", amount=Decimal("1.00"))
    assert [p["op"] for p in payloads()] == ["insert"]


@pytest.mark.django_db(transaction=True)
def test_a_field_that_does_not_exist_fails_the_migration_with_its_name():
    state = MigrationExecutor(connection).loader.project_state(("testapp", "0003_purchase"))
    operation = PublishTrigger("purchase", stream="audit", fields=["id", "total"])

    with pytest.raises(ValueError, match=r"PublishTrigger on testapp.purchase: no field 'total'\."):
        with connection.schema_editor() as editor:
            operation.database_forwards("testapp", editor, state, state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stream": "Bad Stream", "fields": ["id"]}, "'Bad Stream' is not a stream name"),
        ({"stream": "audit", "fields": []}, "name at least one field"),
        ({"stream": "audit", "fields": ["op"]}, "'op' is the payload key"),
        (
            {"stream": "audit", "fields": ["id"], "on": ["upsert"]},
            "choose one or more of insert, update, delete",
        ),
        ({"stream": "audit", "fields": ["id"], "on": ["insert", "insert"]}, "each once"),
    ],
)
def test_bad_arguments_fail_when_the_migration_is_loaded(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PublishTrigger("purchase", **kwargs)


def test_deconstruct_and_describe():
    operation = PublishTrigger("purchase", stream="audit", fields=["id"], on=["insert", "delete"])

    name, args, kwargs = operation.deconstruct()
    assert (name, args, kwargs) == (
        "PublishTrigger",
        ["purchase"],
        {"stream": "audit", "fields": ["id"], "on": ["insert", "delete"]},
    )
    assert PublishTrigger(*args, **kwargs).deconstruct() == (name, args, kwargs)
    assert operation.describe() == "Publish insert, delete of purchase to stream audit"
    assert operation.migration_name_fragment == "publish_purchase_audit"
