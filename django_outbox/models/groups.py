"""In-flight groups: one row per claimed group, carrying its lease and attempt number."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models.functions import Now

from django_outbox.base.routing import StreamScopedManager


class GroupState(models.TextChoices):
    CLAIMED = "claimed", "claimed (process job queued)"
    RUNNING = "running", "running"
    RETRYING = "retrying", "retrying (waiting for backoff)"
    DEAD_LETTERING = "dead_lettering", "exhausted; dead-lettering failed, tried again later"


class OutboxGroup(models.Model):
    """A group of buffer rows handed to one process job.

    The row exists from the claim until the group is finalized. ``attempt`` is the
    fencing token: finalize, fail and heartbeat only change a group whose attempt and
    state still match what the worker took, so a worker that lost its lease changes
    nothing.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    stream = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=GroupState.choices)
    attempt = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    row_errors = models.JSONField(
        null=True, blank=True, help_text="Errors of the rows that failed, by event id."
    )
    worker = models.CharField(max_length=255, blank=True, default="")
    split_depth = models.PositiveSmallIntegerField(
        default=0,
        help_text="How many times failure isolation split this group's rows (0: a claim).",
    )
    sibling_id = models.UUIDField(
        null=True, blank=True, help_text="The other half of the split this group came from."
    )
    sibling_done = models.BooleanField(
        default=False, help_text="The other half was delivered: a failure here is in these rows."
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    objects = StreamScopedManager()  # on its stream's database

    class Meta:
        verbose_name = "group"
        permissions = [("operate_outboxgroup", "Can retry, release or dead-letter groups")]
        indexes = [models.Index(fields=["stream", "state"], name="outbox_group_stream_state")]

    def __str__(self) -> str:
        return f"{self.stream} group {self.pk} ({self.state}, attempt {self.attempt})"
