"""The bulk handler of the ``marketing`` stream."""

from __future__ import annotations

from django_outbox import Batch, BatchResult
from marketing import api


def sync_activities(batch: Batch) -> BatchResult | None:
    """Send the group's activities to the marketing service in one bulk request.

    A transient API error propagates, so the whole group is retried with backoff;
    records the service rejects are returned as failed and only they are retried.
    """
    rows = batch.events.values(
        "id",
        "activity_id",
        "activity__kind",
        "activity__comment",
        "activity__created_at",
        "activity__lead__email",
    )
    records = [
        {
            "ref": row["id"],
            "activity": row["activity_id"],
            "type": row["activity__kind"],
            "comment": row["activity__comment"],
            "occurred_at": row["activity__created_at"].isoformat(),
            "email": row["activity__lead__email"],
        }
        for row in rows
    ]
    response = api.bulk_upsert_activities(records)
    return BatchResult(response.rejected) if response.rejected else None
