"""The tutorial's handler module (``marketing/outbox.py`` in the tutorial).

``tests/docs/test_docs_examples.py`` runs it through the pipeline; the tutorial includes it
from here.
"""

# --8<-- [start:handler]
from __future__ import annotations

from django_outbox import Batch, BatchResult


def bulk_upsert(records: list[dict]) -> dict[int, str]:
    """Stand-in for the remote service's bulk endpoint: return the rejected records.

    Replace it with your client's call. Raise on a transient error (a timeout, a 503):
    the whole group is retried after a backoff.
    """
    return {record["ref"]: "no email address" for record in records if not record["email"]}


def sync_activities(batch: Batch) -> BatchResult | None:
    """Send one group of activities to the service in one request."""
    records = [
        {"ref": row["id"], "type": row["activity__kind"], "email": row["activity__lead__email"]}
        for row in batch.events.values("id", "activity__kind", "activity__lead__email")
    ]
    rejected = bulk_upsert(records)  # {event id: reason}
    if rejected:
        return BatchResult(rejected)  # only these rows are retried
    return None  # every row is done


# --8<-- [end:handler]
