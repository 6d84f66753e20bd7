"""Idempotency keys: one row per effect that must happen once."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class IdempotencyKey(models.Model):
    """A key claimed by a run of an ``@idempotent`` function or block.

    The row is inserted in the same transaction as the guarded work and marked completed
    with the work's JSON result before that transaction commits: a committed key always
    means a completed effect. Keys expire ``expires_at`` and are pruned by
    ``manage.py outbox_prune``.
    """

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=200, help_text="Namespace: the function's path by default.")
    key = models.CharField(max_length=255)
    created_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "idempotency key"
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="outbox_idem_scope_key")
        ]
        indexes = [models.Index(fields=["expires_at"], name="outbox_idem_expires")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"
