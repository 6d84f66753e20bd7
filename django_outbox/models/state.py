"""Per-stream runtime state that operators change without a deploy."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class StreamState(models.Model):
    """Runtime switches of one stream, plus the count of its claim jobs in flight.

    ``paused`` and ``batch_size_override`` are obeyed by the next distribute and claim
    run. ``claims_in_flight`` is maintained by the pipeline itself: distribute tops it
    up to ``MAX_BATCHES`` and a claim chain decrements it when it ends.
    """

    stream = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    batch_size_override = models.PositiveIntegerField(
        null=True, blank=True, help_text="Overrides the stream's BATCH_SIZE when set."
    )
    claims_in_flight = models.IntegerField(default=0, editable=False)
    claims_touched_at = models.DateTimeField(null=True, blank=True, editable=False)
    kicked_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Last commit that published to the stream with KICK on (database clock).",
    )
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = "stream state"
        permissions = [("operate_streamstate", "Can pause and resume streams")]

    def __str__(self) -> str:
        return f"{self.stream} ({'paused' if self.paused else 'running'})"
