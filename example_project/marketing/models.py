"""The marketing-sync scenario: activities recorded one by one, synced in bulk."""

from __future__ import annotations

# --8<-- [start:models]
from django.db import models

from django_outbox.models import BufferEvent


class Lead(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(blank=True)

    def __str__(self) -> str:
        return self.name


class ContactActivity(models.Model):
    class Kind(models.TextChoices):
        CALL = "call"
        EMAIL = "email"
        MEETING = "meeting"

    lead = models.ForeignKey(Lead, on_delete=models.CASCADE, related_name="activities")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "contact activities"

    def __str__(self) -> str:
        return f"{self.kind} with {self.lead}"


class ContactActivityEvent(BufferEvent):
    """Buffer row: one activity waiting to be synced to the marketing service.

    The foreign key carries no index: a buffer table keeps only the two indexes its
    pipeline uses, and the handler joins from here to the activity's primary key.
    """

    activity = models.ForeignKey(
        ContactActivity, on_delete=models.CASCADE, db_index=False, related_name="+"
    )


# --8<-- [end:models]


class ApiRequest(models.Model):
    """One request received by the fake marketing API (to count requests across workers)."""

    size = models.PositiveIntegerField()
    succeeded = models.BooleanField()
    error = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"request #{self.pk} ({self.size} records, {'ok' if self.succeeded else self.error})"


class WelcomeEmail(models.Model):
    """A welcome email "sent" to a new lead by a staged job (one row per send)."""

    lead = models.ForeignKey(Lead, on_delete=models.CASCADE, related_name="welcome_emails")
    sent_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"welcome email to {self.lead}"
