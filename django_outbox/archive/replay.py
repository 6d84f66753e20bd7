"""Replay dead letters: publish failed archived rows into their buffer again, as new rows.

The dead letter of an ordered stream whose keys it still holds (``ORDER_AFTER_DEAD_LETTER
= "hold"``, not released yet) goes back at the head of its keys: its rows are written as
one group, queued for a run at once, so they are delivered before the keys' rows that
waited behind the hold (a key's rows are claimed only while none of them is in a group).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models, router, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from django_outbox.conf import StreamConfig, get_stream, stream_database, stream_databases
from django_outbox.models.archive import ArchivedEvent, Outcome
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.held import HeldKey
from django_outbox.signals import rows_replayed, send_on_commit
from django_outbox.streams.groups import queued_lease
from django_outbox.transport import handoff

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
    # A stream's DATABASE that names no database is system check E025's to report.
    return [alias for alias in dict.fromkeys(aliases) if alias in settings.DATABASES]


def replay_failed(rows: QuerySet[ArchivedEvent], *, chunk: int = 1000) -> Counter:
    """Publish the dead letters among *rows* into their buffers again; count per stream.

    Only failed rows not replayed yet are replayed, whatever *rows* holds: done rows and
    rows replayed before are left alone. Rows go back in their original order (by their
    old buffer id). Each chunk is one transaction that locks its archive rows, writes
    new buffer rows built from the snapshots (fresh id, creation time and no group) and
    marks the archive rows ``replayed_at``, so a dead letter is replayed once however
    often, and however concurrently, this runs. A stream that is no longer configured
    raises :class:`~django_outbox.exceptions.UnknownStream` before anything changes.

    The rows of a dead-lettered group that still holds keys of an ordered stream are
    replayed together (a chunk takes the rest of such a group) into one new group,
    queued for a run in the same transaction: they go before the keys' waiting rows.
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
                locked = rows.filter(stream=name).select_for_update(skip_locked=True)
                columns = ("event_id", "id", "data", "group_id")
                batch = list(locked.order_by("event_id", "id").values_list(*columns)[:chunk])
                if not batch:
                    break
                heads = _holding_groups(config, {group for *_, group in batch})
                if heads:  # the whole of each such group, in this transaction
                    taken = [pk for _, pk, _, _ in batch]
                    rest = locked.filter(group_id__in=heads).exclude(id__in=taken)
                    batch = sorted([*batch, *rest.values_list(*columns)])
                new_groups = {old: uuid.uuid4() for old in heads}
                model._default_manager.db_manager(config.alias).bulk_create(
                    model(
                        **{f.attname: _value(f, data.get(f.column)) for f in fields},
                        group_id=new_groups.get(group),
                    )
                    for _, _, data, group in batch
                )
                _queue_heads(config, new_groups, [group for *_, group in batch])
                ArchivedEvent.objects.using(rows.db).filter(
                    id__in=[pk for _, pk, _, _ in batch]
                ).update(replayed_at=Now())
                send_on_commit(rows_replayed, name, rows=len(batch))
            replayed[name] += len(batch)
    return replayed


def _holding_groups(config: StreamConfig, groups: set[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the dead-lettered *groups* that still hold keys of the ordered stream."""
    if not config.ordered or not config.holds_dead_keys:
        return set()
    held = HeldKey.objects.filter(stream=config.name, group_id__in=groups)
    return set(held.values_list("group_id", flat=True).distinct())


def _queue_heads(
    config: StreamConfig, new_groups: dict[uuid.UUID, uuid.UUID], old_groups: list[Any]
) -> None:
    """Queue the groups the replayed rows of holding dead letters were written into."""
    if not new_groups:
        return
    sizes = Counter(new_groups[old] for old in old_groups if old in new_groups)
    OutboxGroup.objects.bulk_create(
        OutboxGroup(
            id=group_id,
            stream=config.name,
            size=size,
            state=GroupState.CLAIMED,
            lease_expires_at=Now() + queued_lease(config),
        )
        for group_id, size in sizes.items()
    )
    handoff.enqueue(
        handoff.RUN, [(config.name, str(group)) for group in sizes], cluster=config.cluster
    )


def _value(field: models.Field, value: Any) -> Any:
    """A buffer column's value from its snapshot (binary columns are ``\\x`` hex text)."""
    if isinstance(field, models.BinaryField) and isinstance(value, str) and value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    return field.to_python(value)
