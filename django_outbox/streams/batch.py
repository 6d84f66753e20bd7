"""What a stream's handler receives and returns: :class:`Batch` and :class:`BatchResult`.

A handler is called with one :class:`Batch` (a group of buffer rows under a lease) and
returns ``None`` when every row is done, or a :class:`BatchResult` naming the rows that
failed. Raising fails the whole group; :class:`~django_outbox.exceptions.PermanentFailure`
skips its remaining attempts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.db.models import QuerySet
from django.db.models.query import ModelIterable

from django_outbox.base.tracing import Links
from django_outbox.conf import StreamConfig
from django_outbox.streams.groups import group_leases
from django_outbox.streams.sql import buffer_ops

__all__ = [
    "Batch",
    "BatchResult",
]


@dataclass
class BatchResult:
    """What a handler returns when some rows of its batch failed.

    *failed* maps each failed row's id to its error message; those rows stay in the
    group and are retried, every other row is archived as done.
    """

    failed: dict[int, str] = field(default_factory=dict)

    @classmethod
    def failures(cls, ids: Iterable[int], error: str) -> BatchResult:
        """Mark every id in *ids* as failed with the same *error*."""
        return cls({int(pk): error for pk in ids})


class Batch:
    """One group of buffer rows, as handed to a handler.

    ``events`` is a queryset of the group's rows in id order. ``rows()`` returns them
    as dicts (one query, no model instances) for handlers that serialize many rows.
    """

    def __init__(
        self, config: StreamConfig, group_id: uuid.UUID, attempt: int, links: Links | None = None
    ) -> None:
        self.config = config
        #: The delivery span's producer links (OpenTelemetry), fed by the rows read.
        self.links = links
        self.stream = config.name
        self.group_id = group_id
        self.attempt = attempt
        self.model = config.model_class
        self.started = time.monotonic()

    def __repr__(self) -> str:
        return f"<Batch {self.stream} group={self.group_id} attempt={self.attempt}>"

    @property
    def events(self) -> QuerySet:
        events = self.model._default_manager.using(self.config.alias)
        events = events.filter(group_id=self.group_id).order_by("id")
        if self.links is not None:
            events._iterable_class = _linking(self.links)
        return events

    def rows(self, *fields: str) -> list[dict[str, Any]]:
        """Return the group's rows as dicts of *fields* (all concrete fields by default).

        One query and no model instances: the cheap view for a handler that serializes
        many rows. *fields* are column names of the buffer model (``"activity_id"``,
        ``"payload"``); use ``events.values(...)`` to follow relations.
        """
        if self.links is None:
            return buffer_ops(self.model, alias=self.config.alias).group_rows(self.group_id, fields)
        extra = bool(fields) and "trace_context" not in fields
        names = (*fields, "trace_context") if extra else fields
        rows = buffer_ops(self.model, alias=self.config.alias).group_rows(self.group_id, names)
        self.links.read((row["trace_context"] for row in rows), len(rows))
        if extra:
            for row in rows:
                del row["trace_context"]
        return rows

    @cached_property
    def ids(self) -> list[int]:
        return list(self.events.values_list("id", flat=True))

    def heartbeat(self) -> None:
        """Extend the lease by ``LEASE_SECONDS``; raise :class:`LeaseLost` if it is gone."""
        group_leases(self.config).heartbeat(self.group_id, self.attempt)


def _linking(links: Links) -> type[ModelIterable]:
    """The queryset iterable of ``Batch.events`` that hands the rows' producers to *links*."""

    class LinkingIterable(ModelIterable):
        def __iter__(self) -> Any:
            contexts = []
            for event in super().__iter__():
                contexts.append(event.__dict__.get("trace_context"))  # never a deferred load
                yield event
            links.read(contexts, len(contexts))

    return LinkingIterable
