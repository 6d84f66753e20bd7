"""Ordered streams: the rows of one ``ORDER_KEY`` value reach the handler in order.

The guarantee rests on one invariant, kept by the claim (:mod:`django_outbox.streams.sql.ordered`):
**a key's rows are claimed only while none of them is in a group**, and then all of its
waiting rows are taken, in id order, up to the batch size. So a key's rows in flight
are in one group, delivered in id order inside it, and the key's later rows wait in the
buffer until that group has left it (done, or dead-lettered). Whatever keeps a group
alive keeps its keys blocked: a retry's backoff, a lease a rescue will take back, a
crashed worker's group, a group whose dead-lettering failed. Concurrent claims of the
stream (``RUNS`` runs) are serialized on PostgreSQL, each seeing the groups of the one
before, so none skips a row another claim is taking to take the key's later rows.
The claim reads the key's value on the rows of the stream's groups, found from the
group rows (a group's row lives as long as any of its rows is in the buffer: the claim,
a split, the archive and a dead letter write both in one transaction), so the key of a
row in a group must not change: the buffer's key guard (a trigger,
:class:`~django_outbox.operations.GuardOrderKey`) refuses such an UPDATE. The claim
scans from the claim floor's start, which is at or below every waiting row, so it sees
every waiting row of a key it takes.

What is left for this module: the group operations that must not split a key apart.

* **Partial failure.** A handler that fails some rows keeps, with each failed row, the
  later rows of its key in the group (:func:`held_behind`): they were handed to the
  handler after it, and are handed over again after it.
* **Failure isolation.** An ordered group splits by keys, never inside one: each half
  takes whole keys (:func:`split_by_key`). A group of one key does not split.
* **Dead letters.** With ``ORDER_AFTER_DEAD_LETTER = "hold"`` the keys of a
  dead-lettered group are *held* (:func:`hold_keys`): no claim takes their later rows
  until an operator releases them (the admin, :func:`django_outbox.streams.steer.release_keys`).
  With ``"continue"`` they go on at once.

Commit order. Ids are handed out at INSERT and transactions commit out of id order, so
the promise is about the rows a claim can see: a row is never delivered before a row of
its key with a lower id that was committed when it was claimed. A row that commits after
a later row of its key was claimed (an overlapping writer) comes after it. When a key's
writers are serialized (each transaction writing the key commits before the next one
writes it, as a row lock on the aggregate makes them), id order is commit order.
"""

from __future__ import annotations

import uuid

from django_outbox.conf import StreamConfig, on_stream_database
from django_outbox.models.held import HeldKey
from django_outbox.streams.sql import stream_buffer
from django_outbox.streams.sql.ordered import OrderedSQL


def ordered_sql(config: StreamConfig) -> OrderedSQL:
    sql = stream_buffer(config).ordered
    assert sql is not None, f"stream {config.name} has no ORDER_KEY"
    return sql


def held_behind(config: StreamConfig, group_id: uuid.UUID, failed: set[int]) -> dict[int, str]:
    """The group's rows that come after a failed row of their key, with why they stay."""
    if not config.ordered or not failed:
        return {}
    first_failed: dict[object, int] = {}
    behind: dict[int, str] = {}
    for row_id, key in ordered_sql(config).group_keys(group_id):
        if key is None:
            continue
        if key in first_failed and row_id not in failed:
            behind[row_id] = f"held behind row {first_failed[key]} of its key"
        elif row_id in failed:
            first_failed.setdefault(key, row_id)
    return behind


def split_by_key(config: StreamConfig, group_id: uuid.UUID) -> tuple[list[int], list[int]]:
    """Two halves of the group's row ids that share no key (rows of a NULL key go
    anywhere); the lower half empty when the group holds a single key."""
    units: dict[object, list[int]] = {}
    for row_id, key in ordered_sql(config).group_keys(group_id):
        units.setdefault(("key", key) if key is not None else ("row", row_id), []).append(row_id)
    groups = list(units.values())  # in the order of each key's first row
    if len(groups) < 2:
        return [], [row_id for ids in groups for row_id in ids]
    total = sum(len(ids) for ids in groups)
    lower: list[int] = []
    cut = 0
    while cut < len(groups) - 1 and (not lower or len(lower) + len(groups[cut]) <= total // 2):
        lower.extend(groups[cut])
        cut += 1
    upper = [row_id for ids in groups[cut:] for row_id in ids]
    return lower, upper


def regroup(config: StreamConfig, ids: list[int], group_id: uuid.UUID) -> int:
    return ordered_sql(config).regroup(ids, group_id)


def hold_keys(config: StreamConfig, group_id: uuid.UUID, error: str) -> int:
    """Hold the keys of a group being dead-lettered, if the stream says so."""
    if not config.holds_dead_keys:
        return 0
    return ordered_sql(config).hold_keys(group_id, error)


@on_stream_database
def held_keys(stream: str, cap: int) -> int:
    """Count the stream's held keys, stopping at *cap*."""
    return HeldKey.objects.filter(stream=stream).values("id")[:cap].count()
