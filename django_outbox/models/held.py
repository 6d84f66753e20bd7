"""Held keys: keys of an ordered stream whose later rows wait for an operator."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models.functions import Now

from django_outbox.base.routing import StreamScopedManager


class HeldKey(models.Model):
    """One ``ORDER_KEY`` value of an ordered stream held back by a dead letter.

    Written when a group of an ordered stream with ``ORDER_AFTER_DEAD_LETTER = "hold"``
    is dead-lettered, one row per key of its rows; a claim takes no row of a held key.
    Deleting the row (the admin's *release* action) lets the key's later rows go on.
    ``key`` is the key's value as text (the database's own cast of the column).
    """

    id = models.BigAutoField(primary_key=True)
    stream = models.CharField(max_length=64)
    key = models.TextField()
    group_id = models.UUIDField(
        default=uuid.uuid4, help_text="The dead-lettered group that holds the key."
    )
    error = models.TextField(blank=True, default="")
    held_at = models.DateTimeField(db_default=Now(), editable=False)

    objects = StreamScopedManager()  # on its stream's database

    class Meta:
        verbose_name = "held key"
        permissions = [("operate_heldkey", "Can release held keys of ordered streams")]
        constraints = [
            models.UniqueConstraint(fields=["stream", "key"], name="outbox_held_stream_key")
        ]

    def __str__(self) -> str:
        return f"{self.stream} key {self.key}"
