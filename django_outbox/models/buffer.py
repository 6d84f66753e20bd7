"""Buffer tables: rows inserted one by one in the app's transactions, processed in groups.

A buffer table is small and single-purpose. Rows are inserted, stamped with a
``group_id`` by a claim, then archived and deleted by the group's process job. It
carries exactly two indexes, both partial so that an insert touches only one of them:
the unclaimed rows in id order (what a claim scans) and the claimed rows by group
(what a process job reads and deletes). Add no other index to a buffer model, except
the key's of an ordered stream (``ORDER_KEY``), which its claim probes; the generic
buffer has that one too, holding only the rows of ordered streams.
"""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now
from django.db.models.signals import class_prepared
from django.dispatch import Signal, receiver

from django_outbox.base.tracing import current_traceparent
from django_outbox.conf import outbox_settings

UNCLAIMED_INDEX = "outbox_unclaimed"
#: The longest ``OutboxEvent.order_key`` value (an ordered stream's key, as text).
MAX_ORDER_KEY_LENGTH = 255
GROUP_INDEX = "outbox_group"

#: Sent after ``bulk_create()`` of a buffer model, with ``sender`` = the model and
#: ``objs`` = the rows; ``post_save`` covers ``create()`` and ``save()``. The run loop
#: listens to both, so every ORM write of buffer rows wakes its stream on commit.
rows_bulk_created = Signal()


class BufferQuerySet(models.QuerySet):
    """The buffer's queryset: ``bulk_create`` announces its rows (no ``post_save``)."""

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        created = super().bulk_create(objs, *args, **kwargs)
        if created:
            rows_bulk_created.send(sender=self.model, objs=created, using=self.db)
        return created


BufferManager = models.Manager.from_queryset(BufferQuerySet)


class BufferEvent(models.Model):
    """Abstract base of a buffer table. Subclass it and add your payload fields.

    Bind the subclass to a stream with ``"MODEL": "app_label.ModelName"`` in
    ``DJANGO_OUTBOX["STREAMS"]``; publish by creating rows with the plain ORM inside
    your own transaction.
    """

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    group_id = models.UUIDField(null=True, blank=True, editable=False)
    #: The W3C ``traceparent`` of the span that wrote the row, when one was recording
    #: (OpenTelemetry, :mod:`django_outbox.base.tracing`); the handler's span links to it.
    #: NULL, not "": no trace, and a column added to a big table without rewriting it.
    trace_context = models.CharField(  # noqa: DJ001
        max_length=55, null=True, blank=True, editable=False, default=current_traceparent
    )

    objects = BufferManager()

    class Meta:
        abstract = True
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["id"],
                condition=models.Q(group_id__isnull=True),
                name=UNCLAIMED_INDEX,
            ),
            models.Index(
                fields=["group_id"],
                condition=models.Q(group_id__isnull=False),
                name=GROUP_INDEX,
            ),
        ]

    @property
    def is_claimed(self) -> bool:
        return self.group_id is not None


@receiver(class_prepared)
def _name_buffer_indexes(sender: type[models.Model], **kwargs: Any) -> None:
    """Give the two inherited buffer indexes unique names of at most 30 characters.

    Index names are global per database and Django limits them to 30 characters, so
    ``%(app_label)s_%(class)s`` placeholders do not fit; Django's own hashed naming
    scheme (table, first column, digest) does.
    """
    if not issubclass(sender, BufferEvent) or sender._meta.abstract:
        return
    for index in sender._meta.indexes:
        if index.name in (UNCLAIMED_INDEX, GROUP_INDEX):
            index.set_name_with_model(sender)


class OutboxEvent(BufferEvent):
    """The generic buffer shared by streams that need only a JSON payload.

    Write to it with :func:`django_outbox.publish` / :func:`django_outbox.publish_many`.
    The payload is encoded by Django's ``DjangoJSONEncoder`` (dates, times, durations,
    decimals, UUIDs and lazy strings become strings) and read back as plain JSON.
    """

    stream = models.CharField(max_length=64)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    #: An ordered stream's key (``ORDER_KEY`` names a top-level payload key): its value,
    #: as text, written by ``publish()`` and ``publish_many()``. NULL: not ordered.
    order_key = models.CharField(  # noqa: DJ001 (NULL: no key, as ORDER_KEY columns)
        max_length=MAX_ORDER_KEY_LENGTH,
        null=True,
        blank=True,
        editable=False,
        help_text="The value of the payload key the stream's ORDER_KEY names (ordered "
        "streams only).",
    )

    class Meta(BufferEvent.Meta):
        verbose_name = "outbox event"
        indexes = [
            models.Index(
                fields=["stream", "id"],
                condition=models.Q(group_id__isnull=True),
                name="outbox_event_unclaimed",
            ),
            models.Index(
                fields=["group_id"],
                condition=models.Q(group_id__isnull=False),
                name="outbox_event_group",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stream} #{self.pk}"


def buffer_models() -> list[type[BufferEvent]]:
    """The buffer model of every configured stream whose ``MODEL`` is one.

    A stream whose model is not installed (check E020) or is not a buffer model (E021)
    is left out, not raised for: this runs while Django starts, before the checks can
    report the stream with their hint.
    """

    models_ = []
    for config in outbox_settings().streams.values():
        try:
            model = config.model_class
        except (LookupError, ValueError, TypeError, AttributeError):
            continue
        if isinstance(model, type) and issubclass(model, BufferEvent):
            models_.append(model)
    return models_
