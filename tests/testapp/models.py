from __future__ import annotations

from django.db import models


class HandledCall(models.Model):
    """One handler call, as the test handler saw it."""

    stream = models.CharField(max_length=64)
    group_id = models.UUIDField()
    attempt = models.PositiveIntegerField()
    event_ids = models.JSONField()

    def __str__(self) -> str:
        return f"{self.stream} {self.group_id} attempt {self.attempt}"
