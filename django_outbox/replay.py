"""Replay dead letters: publish failed archived rows into their buffer again, as new rows."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.db import models, router, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from django_outbox.conf import get_stream, stream_database, stream_databases
from django_outbox.models import ArchivedEvent, Outcome
from django_outbox.signals import rows_replayed, send_on_commit

__all__ = [
    "dead_letters",
    "replay_failed",
]

#: Columns a replayed row gets anew instead of from the snapshot.
_FRESH_COLUMNS = {"id", "group_id", "created_at"}


def dead_letters(
    *,
    stream: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    group_id: uuid.UUID | None = None,
) -> QuerySet[ArchivedEvent]:
    """Failed archived rows that were not replayed yet, filtered as given."""
    rows = ArchivedEvent.objects.filter(outcome=Outcome.FAILED, replayed_at__isnull=True)
    if stream is not None:
        rows = rows.using(get_stream(stream).alias).filter(stream=stream)
    if since is not None:
        rows = rows.filter(archived_at__gte=since)
    if until is not None:
        rows = rows.filter(archived_at__lt=until)
    if group_id is not None:
        rows = rows.filter(group_id=group_id)
    return rows


def archive_databases(stream: str | None = None) -> list[str]:
    """The databases whose archive holds *stream*'s dead letters (its own), or every
    stream's: the router's for ``ArchivedEvent`` and each database that holds streams."""
    if stream is not None:
        return [get_stream(stream).alias]
    aliases = [router.db_for_write(ArchivedEvent), *stream_databases()]
    return [alias for index, alias in enumerate(aliases) if alias not in aliases[:index]]


def replay_failed(rows: QuerySet[ArchivedEvent], *, chunk: int = 1000) -> Counter:
    """Publish the dead letters among *rows* into their buffers again; count per stream.

    Only failed rows not replayed yet are replayed, whatever *rows* holds: done rows and
    rows replayed before are left alone. Rows go back in their original order (by their
    old buffer id). Each chunk is one transaction that locks its archive rows, writes
    new buffer rows built from the snapshots (fresh id, creation time and no group) and
    marks the archive rows ``replayed_at``, so a dead letter is replayed once however
    often, and however concurrently, this runs. A stream that is no longer configured
    raises :class:`~django_outbox.exceptions.UnknownStream` before anything changes.
    """
    rows = rows.filter(outcome=Outcome.FAILED, replayed_at__isnull=True)
    streams = sorted(set(rows.order_by().values_list("stream", flat=True).distinct()))
    configs = {name: get_stream(name) for name in streams}
    replayed: Counter = Counter()
    for name, config in configs.items():
        model = config.model_class
        fields = [f for f in model._meta.concrete_fields if f.column not in _FRESH_COLUMNS]
        while True:
            with stream_database(config), transaction.atomic(using=config.alias):
                batch = list(
                    rows.filter(stream=name)
                    .select_for_update(skip_locked=True)
                    .order_by("event_id", "id")
                    .values_list("id", "data")[:chunk]
                )
                if not batch:
                    break
                model._default_manager.db_manager(config.alias).bulk_create(
                    model(**{f.attname: _value(f, data.get(f.column)) for f in fields})
                    for _, data in batch
                )
                ArchivedEvent.objects.using(rows.db).filter(id__in=[pk for pk, _ in batch]).update(
                    replayed_at=Now()
                )
                send_on_commit(rows_replayed, name, rows=len(batch))
            replayed[name] += len(batch)
    return replayed


def _value(field: models.Field, value: Any) -> Any:
    """A buffer column's value from its snapshot (binary columns are ``\\x`` hex text)."""
    if isinstance(field, models.BinaryField) and isinstance(value, str) and value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return field.to_python(value)
