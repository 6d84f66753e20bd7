"""The README's example: a bulk handler, a publish in your transaction, and the stream.

``tests/docs/test_docs_examples.py`` publishes through ``save_contact`` and runs the
stream; the README shows the section below as it is.
"""

from __future__ import annotations

from typing import Any

# --8<-- [start:example]
# myapp/outbox.py: one handler call per group of up to BATCH_SIZE rows
from django.db import transaction

from django_outbox import Batch, BatchResult, publish


def sync_contacts(batch: Batch) -> BatchResult | None:
    records = [{"event": row["id"], **row["payload"]} for row in batch.rows("id", "payload")]
    rejected = crm_bulk_upsert(records)  # your service's client; raise on a timeout
    return BatchResult(rejected) if rejected else None  # only rejected rows are retried


def save_contact(contact) -> None:
    with transaction.atomic():  # the event commits with the contact, or neither does
        contact.save()
        publish("contacts", {"id": contact.pk, "email": contact.email})


# settings.py
DJANGO_OUTBOX = {"STREAMS": {"contacts": {"HANDLER": "myapp.outbox.sync_contacts"}}}
# --8<-- [end:example]

#: What the stand-in service received, one list per handler call.
RECEIVED: list[list[dict[str, Any]]] = []


def crm_bulk_upsert(records: list[dict[str, Any]]) -> dict[int, str]:
    """Stand-in for the service's bulk endpoint: the records it rejects, by event id."""
    RECEIVED.append(records)
    return {record["event"]: "no email" for record in records if not record["email"]}
