"""The work each contender does per event: read it and serialize what it would send."""

from __future__ import annotations

import json
import os
import time

from django.db import connection, transaction

from benchmarks.models import Marker
from django_outbox.models import ArchivedEvent, OutboxEvent, Outcome
from django_outbox.streams.batch import Batch


def serialize_batch(batch: Batch) -> None:
    """django_outbox's handler: one bulk request body for the whole group."""
    rows = batch.rows("id", "payload")
    body = json.dumps([{"ref": row["id"], **row["payload"]} for row in rows])
    assert len(rows) and body


def stamp_batch(batch: Batch) -> None:
    """:func:`serialize_batch`, after a marker of when the call began, in the database's
    clock (seconds since the epoch), and of the worker's process id, committed at once
    (benchmarks.first_call)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO benchmarks_marker (name) "
            "VALUES ('call ' || extract(epoch FROM clock_timestamp())::text || ' ' || %s)",
            [os.getpid()],
        )
    serialize_batch(batch)


def handle_event(event_id: int) -> None:
    """The naive approach: one django-q2 task per event, archived and deleted one by one."""
    with transaction.atomic():
        event = OutboxEvent.objects.select_for_update().get(pk=event_id)
        body = json.dumps([{"ref": event.pk, **event.payload}])
        assert body
        ArchivedEvent.objects.create(
            stream=event.stream,
            event_id=event.pk,
            data={"id": event.pk, "payload": event.payload},
            created_at=event.created_at,
            outcome=Outcome.DONE,
        )
        event.delete()


def noop(number: int) -> None:
    """One job of django-q2's own one-task-per-job rate: nothing to do."""


def ping(name: str) -> None:
    Marker.objects.create(name=name)


def ping_every_worker(name: str, workers: int) -> None:
    """One of *workers* readiness pings: mark this worker, then wait (up to 30 s) until
    every ping is marked, so that no worker takes two and each has connected to the
    database, as C's processes connect before its clock starts."""
    Marker.objects.create(name=f"{name} {os.getpid()}")
    deadline = time.monotonic() + 30
    while Marker.objects.filter(name__startswith=f"{name} ").count() < workers:
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def serialize_orders(batch: Batch) -> None:
    """The ``orders`` stream's handler: one bulk request body for the group."""
    rows = batch.rows("id", "order_ref", "amount")
    body = json.dumps(
        [{"ref": r["id"], "order": r["order_ref"], "amount": str(r["amount"])} for r in rows]
    )
    assert len(rows) and body


def serialize_keyed(batch: Batch) -> None:
    """The ``keyed`` streams' handler: one bulk request body for the group."""
    rows = batch.rows("id", "aggregate", "body")
    body = json.dumps([{"ref": r["id"], "key": r["aggregate"], "body": r["body"]} for r in rows])
    assert len(rows) and body
