"""Failure isolation: one poison row must not take a group's healthy rows with it.

A handler that raises fails its whole group, often because of one row the service
rejects. With ``ISOLATE_FAILURES`` (on by default) such a group is *split* once there
is evidence that the failure is in its rows: its rows, in id order, become two groups of
half the size each (the lower ids and the upper ids), queued at once, each the other's
*sibling*, with the attempts the group had spent before the failure that split it. The evidence:

* a :class:`~django_outbox.PermanentFailure` (the service rejected the request: retrying
  the same rows cannot help), at every level;
* a group claimed as it is that fails as a whole a second time in a row: a passing
  glitch (a timeout, a 503, a rate limit) rarely hits the same group twice, so it costs
  a retry and no split, while a poison row fails every time;
* a half whose sibling was **delivered**: the failure is in its own rows. A half that
  fails while its sibling has not been delivered (it failed too, or has not run yet)
  is retried with the stream's backoff like any group: when every call fails (the
  service is down), halving would only multiply the calls. A half that is delivered
  while its sibling waits for a retry splits that sibling at once.

An ordered stream's group splits by keys, whole keys in each half, so the halves never
hold rows of one key (:mod:`django_outbox.streams.ordering`); a group of a single key does not
split (its later rows could not be delivered before the poison row anyway).

So one poison row in a group of n rows is cornered in about ``log2(n)`` rounds of two
handler calls after the group's second failure (at once with ``PermanentFailure``); the
healthy rows are archived as done as soon as their half succeeds, and the poison row,
alone in a group of one, is retried and dead-lettered with its own error like any
group. An outage costs each group one split, at its second failure.

Each half is a new group (a new id): a worker still holding an earlier attempt of the
split group is fenced out by the group's id. The split happens in the
transaction that records the failure (or the sibling's delivery), so the halves are
queued exactly when it commits.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models.functions import Now

from django_outbox.conf import StreamConfig
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.streams import ordering
from django_outbox.streams.groups import queued_lease
from django_outbox.transport import handoff

#: The fields failure isolation reads when a group fails as a whole.
FIELDS = ("size", "sibling_id", "sibling_done", "split_depth", "row_errors")


def should_split(
    config: StreamConfig, group: dict[str, Any], attempt: int, *, permanent: bool
) -> bool:
    """Whether a group that failed as a whole (its locked row's *group* FIELDS) splits now.

    A group of one row cannot split. Otherwise it splits on evidence that the failure
    is in its rows: a permanent failure, its sibling delivered, or, for a group claimed
    as it is (never split), its second failure as a whole in a row (a previous partial
    failure, ``row_errors``, does not count: the service answered then).
    """
    if not config.isolate_failures or group["size"] < 2:
        return False
    if permanent or group["sibling_done"]:
        return True
    return group["split_depth"] == 0 and attempt >= 2 and not group["row_errors"]


def split_group(
    config: StreamConfig, group_id: uuid.UUID, error: str, depth: int, attempts: int
) -> int:
    """Split the group's rows in two new queued groups; return the rows split (0: none).

    Runs inside the caller's transaction, which holds the group's row. The halves carry
    the error that split them, for the admin, until their own attempt, and the group's
    *attempts* but the one that led to the split: a split spends none of the rows'
    attempts, and a row that keeps failing still runs out of them.
    """
    rows = config.model_class._default_manager.using(config.alias).filter(group_id=group_id)
    lower, upper = uuid.uuid4(), uuid.uuid4()
    if config.ordered:
        # Whole keys in each half: the halves run in parallel (docs: ordered streams).
        lower_ids, upper_ids = ordering.split_by_key(config, group_id)
        if not lower_ids:
            return 0
        ordering.regroup(config, lower_ids, lower)
        middle, total = len(lower_ids), len(lower_ids) + len(upper_ids)
    else:
        ids = list(rows.order_by("id").values_list("id", flat=True))
        if len(ids) < 2:
            return 0
        middle, total = len(ids) // 2, len(ids)
        rows.filter(id__lte=ids[middle - 1]).update(group_id=lower)
    rows.update(group_id=upper)
    OutboxGroup.objects.filter(id=group_id).delete()
    lease = Now() + queued_lease(config)
    OutboxGroup.objects.bulk_create(
        [
            OutboxGroup(
                id=half,
                stream=config.name,
                size=size,
                state=GroupState.CLAIMED,
                attempt=max(attempts - 1, 0),
                lease_expires_at=lease,
                last_error=error,
                split_depth=depth + 1,
                sibling_id=sibling,
            )
            for half, sibling, size in (
                (lower, upper, middle),
                (upper, lower, total - middle),
            )
        ]
    )
    handoff.enqueue(
        handoff.RUN,
        [(config.name, str(lower)), (config.name, str(upper))],
        cluster=config.cluster,
    )
    return total


def sibling_delivered(config: StreamConfig, sibling_id: uuid.UUID) -> bool:
    """A half was delivered: split its sibling now if that waits for a retry.

    Runs inside the transaction that finalizes the delivered half. Otherwise (the
    sibling is queued or running) it is told, so that its failure splits at once.
    Locking the sibling's row orders this against the sibling recording a failure:
    one of the two sees the other. Returns whether the sibling was split.
    """
    group = (
        OutboxGroup.objects.select_for_update()
        .filter(id=sibling_id)
        .values("state", "last_error", "attempt", *FIELDS)
        .first()
    )
    if group is None:
        return False  # delivered or dead-lettered already
    if group["state"] == GroupState.RETRYING and group["size"] > 1:
        split = split_group(
            config, sibling_id, group["last_error"], group["split_depth"], group["attempt"]
        )
        return split > 0
    OutboxGroup.objects.filter(id=sibling_id).update(sibling_done=True)
    return False
