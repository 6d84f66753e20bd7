"""A stream's groups under the lease engine: their lease table, how long a queued group
waits for its job, what follows a failed attempt, and the hand-off of a retry for when
it falls due."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from django_outbox.conf import StreamConfig
from django_outbox.lease.engine import LeaseTable, RetryPolicy
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.transport import handoff


def group_leases(config: StreamConfig) -> LeaseTable:
    """The lease engine over the group table, with the stream's lease."""
    return LeaseTable(
        OutboxGroup,
        what="group",
        lease_seconds=config.lease_seconds,
        running=GroupState.RUNNING,
        touch="updated_at",
    )


def queued_lease(config: StreamConfig) -> timedelta:
    """How long a queued group waits for its run job before it is handed over again.

    With django-q2's ORM broker on our database the job commits with the group and
    cannot be lost: the group keeps the stream's ``LEASE_SECONDS``. Other brokers (Redis)
    can lose a job (a restart without persistence, a flushed queue, a cluster killed
    with jobs it had fetched): after ``HANDOFF_SECONDS`` the group stops counting as a
    run in flight and is re-enqueued (a second delivery of a job that was only slow is
    a no-op).
    """
    if handoff.in_transaction_hand_off():
        return timedelta(seconds=config.lease_seconds)
    return timedelta(seconds=min(config.handoff_seconds, config.lease_seconds))


def group_policy(config: StreamConfig) -> RetryPolicy:
    """After a failed attempt of one of the stream's groups: retry or dead-letter."""
    return RetryPolicy(config.max_attempts, config.backoff_seconds, config.backoff_max_seconds)


def arm_retries(config: StreamConfig, group_ids: Iterable[uuid.UUID], at: datetime) -> None:
    """Hand over a retry of each group, delivered when it falls due at *at*: the group is
    taken again when its backoff (or the stream's pause) ends, by the next free worker,
    whether or not other rows flow.

    In the caller's transaction with django-q2's ORM broker (the retry commits with the
    group's new state); with another broker the schedule's distribute takes the group
    when it is due (:mod:`django_outbox.transport.handoff`).
    """
    handoff.submit(
        [
            handoff.Job(handoff.RETRY, (config.name, str(group_id)), config.cluster, not_before=at)
            for group_id in group_ids
        ]
    )
