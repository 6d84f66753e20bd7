"""The archive: a JSON snapshot of every buffer row that was finalized, with its outcome."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from django_outbox.base.routing import StreamScopedManager


class Outcome(models.TextChoices):
    DONE = "done", "done"
    FAILED = "failed", "failed"


class ArchivedEvent(models.Model):
    """One finalized buffer row: processed (``done``) or dead-lettered (``failed``)."""

    id = models.BigAutoField(primary_key=True)
    stream = models.CharField(max_length=64)
    event_id = models.BigIntegerField(help_text="The row's id in its buffer table.")
    group_id = models.UUIDField(null=True, blank=True)
    data = models.JSONField(help_text="Snapshot of the buffer row as it was finalized.")
    created_at = models.DateTimeField(help_text="When the buffer row was created.")
    archived_at = models.DateTimeField(db_default=Now())
    outcome = models.CharField(max_length=8, choices=Outcome.choices)
    attempts = models.PositiveIntegerField(default=1)
    error = models.TextField(blank=True, default="")
    replayed_at = models.DateTimeField(
        null=True, blank=True, help_text="When this dead letter was published again."
    )

    objects = StreamScopedManager()  # on its stream's database

    class Meta:
        verbose_name = "archived event"
        permissions = [("replay_archivedevent", "Can replay dead letters")]
        # Serves pruning by stream, outcome and age, and the counts of status and metrics
        # (rows archived per outcome in a recent window) as index-only scans.
        indexes = [
            models.Index(
                fields=["stream", "outcome", "archived_at"], name="outbox_archive_outcome_at"
            )
        ]

    def __str__(self) -> str:
        return f"{self.stream} #{self.event_id} ({self.outcome})"
