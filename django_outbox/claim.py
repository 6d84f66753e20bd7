"""Claim: stamp one group of unclaimed rows and enqueue its process job."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models.functions import Now

from django_outbox import transport
from django_outbox.conf import get_stream
from django_outbox.db import buffer_ops, connection_for, database_now
from django_outbox.db.transient import retry_transient
from django_outbox.models import GroupState, OutboxGroup, StreamState
from django_outbox.streams import continue_chain, effective_batch_size


@dataclass(frozen=True)
class ClaimResult:
    stream: str
    group_id: uuid.UUID | None
    size: int
    limit: int
    #: When the claim statement's snapshot could be taken at the earliest (database
    #: clock); measured only for streams that have been kicked.
    started_at: datetime | None = None

    @property
    def claimed_any(self) -> bool:
        return self.size > 0

    @property
    def full(self) -> bool:
        """Whether the claim filled its batch, so more rows are probably waiting."""
        return self.size >= self.limit > 0


def claim_group(stream: str) -> ClaimResult:
    """Claim up to the stream's batch size of unclaimed rows as one new group.

    One transaction: the claim statement (``FOR UPDATE SKIP LOCKED`` on PostgreSQL),
    the group row, and the process job (inside the same transaction with the ORM
    broker, after commit with another). A paused stream claims nothing.
    """
    config = get_stream(stream)
    model = config.model_class
    state = StreamState.objects.filter(stream=stream).first()
    limit = effective_batch_size(config, state)
    if state is not None and state.paused:
        return ClaimResult(stream, None, 0, 0)
    group_id = uuid.uuid4()
    ops = buffer_ops(model)
    alias = connection_for(model).alias
    kicked = state is not None and state.kicked_at is not None
    started_at = database_now(alias) if kicked else None

    def claim_transaction() -> int:
        with transaction.atomic(using=alias):
            size = ops.claim(group_id, limit, stream if config.is_generic else None)
            if size:
                OutboxGroup.objects.create(
                    id=group_id,
                    stream=stream,
                    size=size,
                    state=GroupState.CLAIMED,
                    lease_expires_at=Now() + timedelta(seconds=config.lease_seconds),
                )
                transport.enqueue(
                    transport.PROCESS, [(stream, str(group_id))], cluster=config.cluster
                )
        return size

    size = retry_transient(claim_transaction, alias, what=f"claim of stream {stream}")
    return ClaimResult(stream, group_id if size else None, size, limit, started_at)


def run_claim_chain_link(stream: str) -> ClaimResult:
    """Claim one group, give back this claim's slot, and continue the chain if needed.

    A full claim enqueues its successor while fewer than ``CHAINS`` claims of the stream
    are left in flight, so a backlog drains at worker speed, not at the distribute
    schedule's pace, without every claim of distribute's wave leaving an empty successor
    behind. The decision is made under the stream's state-row lock.
    """
    result = claim_group(stream)
    continue_chain(stream, full=result.full, started_at=result.started_at)
    return result
