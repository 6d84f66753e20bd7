"""Handlers for the test streams. They record what they saw in HandledCall rows."""

from __future__ import annotations

from django.core.cache import cache

from django_outbox import BatchResult
from django_outbox.process import Batch
from tests.testapp.models import HandledCall

#: Behaviour switch for the tests, read by the ``audit`` stream's handler.
MODE_KEY = "tests.handler.mode"


def record(batch: Batch) -> BatchResult | None:
    """Record the batch; fail as the current test asks through the cache key."""
    rows = batch.rows("id", "payload")
    HandledCall.objects.create(
        stream=batch.stream,
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in rows],
    )
    mode = cache.get(MODE_KEY, "ok")
    if mode == "raise":
        raise RuntimeError("handler exploded")
    if mode == "fail-odd":
        return BatchResult({row["id"]: "odd id rejected" for row in rows if row["id"] % 2})
    if mode == "fail-marked":
        return BatchResult(
            {row["id"]: "marked" for row in rows if (row["payload"] or {}).get("fail")}
        )
    if mode == "bad-return":
        return "not a BatchResult"  # type: ignore[return-value]
    return None
