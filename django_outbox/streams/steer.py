"""Steer streams and groups by hand (the admin's actions): pause and resume a stream;
retry a group now, release its lease, dead-letter it now; release the held keys of an
ordered stream.

None of them waits for a worker: a group whose row is locked is being finalized or runs
a ``TRANSACTIONAL`` attempt (its handler's writes and the group commit together, the row
locked for the whole attempt). Such a group is skipped (``SKIP LOCKED``) and named in
the result, so an operator's request answers at once instead of waiting for the handler
to end. On SQLite, whose writers wait for each other's whole transaction, there is no
row lock to skip: an action waits for a running ``TRANSACTIONAL`` attempt's commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from django_outbox.base.routing import connection_for
from django_outbox.conf import get_stream, on_stream_database, outbox_settings
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.held import HeldKey
from django_outbox.models.state import StreamState
from django_outbox.streams.attempt import exhaust_group
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.rescue import requeue_due_groups
from django_outbox.streams.run import runtime_state, wake

__all__ = [
    "Steered",
    "dead_letter",
    "release_keys",
    "release_leases",
    "retry_now",
    "set_paused",
]


@on_stream_database
def set_paused(stream: str, paused: bool) -> None:
    """Pause or resume a stream: no claim is made, and no queued group taken, while it
    is paused (the group goes back to the queue: :func:`django_outbox.streams.budget.hold_back`).

    Resuming distributes the stream once the change commits: groups whose retry came
    due meanwhile are re-enqueued, and runs start for the backlog at once, up to
    ``RUNS`` (not one run that fans out after its first claim).
    """
    config = get_stream(stream)
    runtime_state(stream)
    StreamState.objects.filter(stream=stream).update(paused=paused, updated_at=Now())
    if not paused:
        transaction.on_commit(partial(distribute_stream, stream), using=config.alias)


@dataclass(frozen=True)
class Steered:
    """What an action did to the groups chosen."""

    #: Groups in a state the action applies to, made due now (retry, release).
    chosen: int = 0
    #: Of those, re-enqueued for their next attempt, and dead-lettered (their last one).
    requeued: int = 0
    exhausted: int = 0
    #: Dead-lettered by "dead-letter now", their rows, and those kept because
    #: dead-lettering failed (state ``dead_lettering``, with the error).
    dead_lettered: int = 0
    rows: int = 0
    kept: int = 0
    #: Dead-lettered while a worker ran their handler (not ``TRANSACTIONAL``): it may
    #: still deliver their rows.
    running: int = 0
    #: Left alone: their row is locked by a running attempt (``TRANSACTIONAL``).
    locked: tuple[uuid.UUID, ...] = ()


def retry_now(ids: Collection[Any]) -> Steered:
    """Make the chosen retrying (or dead-lettering) groups due now and rescue them."""
    return _due_now(ids, [GroupState.RETRYING, GroupState.DEAD_LETTERING], "next_attempt_at")


def release_leases(ids: Collection[Any]) -> Steered:
    """Expire the leases of the chosen claimed or running groups and rescue them, as
    distribute would once they expired (a new attempt, or dead-lettered after the last).

    A worker still running one of them can no longer finalize it (fenced by the attempt).
    """
    return _due_now(ids, [GroupState.CLAIMED, GroupState.RUNNING], "lease_expires_at")


def dead_letter(ids: Collection[Any], error: str) -> Steered:
    """Dead-letter the chosen groups now: their rows archived as failed, for replay.

    Each group in a transaction of its own. A plain group that was running is
    dead-lettered all the same (counted in :attr:`Steered.running`): its handler runs
    on and may still deliver the rows, its finalize then finds the group gone. An
    ordered stream whose dead letters let their keys go on is woken for their later rows.
    """
    dead_lettered = rows = kept = running = 0
    locked: list[uuid.UUID] = []
    alias = connection_for(OutboxGroup).alias
    streams = outbox_settings().streams
    for group_id in ids:
        with transaction.atomic(using=alias):
            group = (
                OutboxGroup.objects.select_for_update(skip_locked=True).filter(id=group_id).first()
            )
            if group is None:
                if OutboxGroup.objects.filter(id=group_id).exists():
                    locked.append(group_id)
                continue
            if group.stream not in streams:
                continue
            config = outbox_settings().stream(group.stream)
            done = exhaust_group(config, group.id, max(group.attempt, 1), error)
        if done is None:
            kept += 1
            continue
        dead_lettered, rows = dead_lettered + 1, rows + done
        running += group.state == GroupState.RUNNING and not config.transactional
        if config.ordered and not config.holds_dead_keys:
            wake(config.name)  # the keys it held go on: their waiting rows
    return Steered(
        dead_lettered=dead_lettered, rows=rows, kept=kept, running=running, locked=tuple(locked)
    )


def _due_now(ids: Collection[Any], states: list[str], due_field: str) -> Steered:
    """Make the chosen groups in *states* due now, skipping locked ones, then rescue them."""
    with transaction.atomic(using=connection_for(OutboxGroup).alias):
        chosen = OutboxGroup.objects.filter(id__in=list(ids), state__in=states)
        free = set(chosen.select_for_update(skip_locked=True).values_list("id", flat=True))
        locked = [pk for pk in chosen.values_list("id", flat=True) if pk not in free]
        OutboxGroup.objects.filter(id__in=free).update(**{due_field: Now() - timedelta(seconds=1)})
    requeued = exhausted = 0
    groups = OutboxGroup.objects.filter(id__in=free)
    for stream in sorted(set(groups.values_list("stream", flat=True))):
        if stream in outbox_settings().streams:
            config = outbox_settings().stream(stream)
            again, spent = requeue_due_groups(config, ids=free)
            requeued, exhausted = requeued + again, exhausted + spent
    return Steered(chosen=len(free), requeued=requeued, exhausted=exhausted, locked=tuple(locked))


@on_stream_database
def release_keys(stream: str, keys: Collection[str]) -> int:
    """Release held keys of an ordered stream: their later rows go on. Returns how many.

    The dead letters that held them stay in the archive. Replay them first if they must
    be delivered before the key's later rows: a dead letter replayed while it holds its
    keys goes back as one group of its own, which the key's waiting rows stay behind
    (:func:`django_outbox.archive.replay.replay_failed`). Replayed after the release, its rows
    (new ids) come after the rows that waited.
    """
    released, _ = HeldKey.objects.filter(stream=stream, key__in=list(keys)).delete()
    if released:
        wake(stream)
    return released
