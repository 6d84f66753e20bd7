"""Rescue: groups that are due again, re-enqueued from our tables.

A group is due when its retry's backoff has passed, when its worker died (its lease
expired while running: that counts as an attempt), or when its run job was lost before
it started (a queued group whose lease expired: a broker that lost the job). Distribute
rescues on its schedule; a wake that starts a run re-enqueues lost hand-offs at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from django_outbox.conf import StreamConfig, on_stream_database
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.streams import attempt
from django_outbox.streams.groups import group_leases, group_policy, queued_lease
from django_outbox.transport import handoff

#: At most this many due groups are rescued per stream and call.
RESCUE_LIMIT = 500


@on_stream_database
def requeue_due_groups(
    config: StreamConfig,
    *,
    ids: Collection[uuid.UUID] | None = None,
    lost_only: bool = False,
    hand_off: bool = True,
) -> tuple[int, int]:
    """Re-enqueue groups whose retry is due or whose lease expired (of *ids*, if given).

    A group whose worker died while running it has used an attempt; when that was its
    last one, it is exhausted instead of run again, so a group that kills its worker
    cannot loop forever. With *lost_only*, only queued groups whose job did not start
    within their lease (a lost hand-off) are re-enqueued. Without *hand_off* the groups
    are queued but no run job is sent: the caller runs them itself. Returns
    (re-enqueued, exhausted).
    """
    lease = queued_lease(config)
    lost = Q(state=GroupState.CLAIMED, lease_expires_at__lt=Now())
    waiting = [GroupState.RETRYING, GroupState.DEAD_LETTERING]
    due = lost if lost_only else Q(state__in=waiting, next_attempt_at__lte=Now()) | lost
    filters: dict[str, Any] = {"stream": config.name}
    if ids is not None:
        filters["id__in"] = list(ids)
    requeued: list[str] = []
    exhausted = 0
    leases, retry = group_leases(config), group_policy(config)
    with transaction.atomic(using=leases.alias):
        groups = leases.expired(
            RESCUE_LIMIT,
            due=due,
            fields=("last_error", "row_errors"),
            running=not lost_only,
            **filters,
        )
        # A lost attempt counts: a group that kills its worker is dead-lettered after its
        # last attempt instead of looping.
        spent = [
            g
            for g in groups
            if g["state"] == GroupState.DEAD_LETTERING
            or (g["state"] == GroupState.RUNNING and retry.exhausted(g["attempt"]))
        ]
        for group in spent:
            # Each group in a savepoint of its own: one that cannot be dead-lettered is
            # kept with its error and the others go on.
            error = (
                attempt.group_error(group["last_error"])
                if group["state"] == GroupState.DEAD_LETTERING
                else "lease expired on the last attempt"
            )
            rows = attempt.exhaust_group(
                config, group["pk"], group["attempt"], error, row_errors=group["row_errors"]
            )
            exhausted += rows is not None
        again = [g["pk"] for g in groups if g not in spent]
        if again:
            OutboxGroup.objects.filter(id__in=again).update(
                state=GroupState.CLAIMED,
                lease_expires_at=Now() + lease,
                next_attempt_at=None,
                updated_at=Now(),
            )
            requeued = [str(group_id) for group_id in again]
            if hand_off:
                handoff.enqueue(
                    handoff.RUN, [(config.name, gid) for gid in requeued], cluster=config.cluster
                )
    return len(requeued), exhausted
