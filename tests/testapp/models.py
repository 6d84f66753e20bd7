from __future__ import annotations

from django.db import models

from django_outbox.models import BufferEvent


class HandledCall(models.Model):
    """One handler call, as the test handler saw it."""

    stream = models.CharField(max_length=64)
    group_id = models.UUIDField()
    attempt = models.PositiveIntegerField()
    event_ids = models.JSONField()
    # The cluster that ran it (``OUTBOX_TEST_CLUSTER_LABEL`` of the qcluster child).
    cluster = models.CharField(max_length=32, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.stream} {self.group_id} attempt {self.attempt}"


class JobEffect(models.Model):
    """One run of a staged test job: the effect the tests count."""

    label = models.CharField(max_length=100)
    value = models.JSONField(null=True)
    ran_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label


class Purchase(models.Model):
    """An application table whose writes publish to the ``audit`` stream by trigger."""

    customer = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    note = models.CharField(max_length=100, blank=True)  # not published

    def __str__(self) -> str:
        return f"purchase {self.pk}"


class Attachment(BufferEvent):
    """A buffer with columns the archive must still hold: bytes and a quoted column name."""

    title = models.CharField(max_length=100, db_column="owner's title")
    content = models.BinaryField(null=True)


# --8<-- [start:ordered_model]
class OrderedEvent(BufferEvent):
    """The buffer of the ordered test stream: rows of one aggregate stay in order."""

    aggregate_id = models.CharField(max_length=40, null=True)  # noqa: DJ001 (NULL: unordered)
    seq = models.PositiveIntegerField(default=0)
    # --8<-- [end:ordered_model]
