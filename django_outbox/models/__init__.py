"""The app's models, split by concept and re-exported here."""

from django_outbox.models.archive import ArchivedEvent, Outcome
from django_outbox.models.buffer import BufferEvent, OutboxEvent
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.models.held import HeldKey
from django_outbox.models.keys import IdempotencyKey
from django_outbox.models.staged import StagedJob
from django_outbox.models.state import FloorHole, KindState, StreamState
from django_outbox.models.unique import JobState, UniqueJob

__all__ = [
    "ArchivedEvent",
    "BufferEvent",
    "FloorHole",
    "GroupState",
    "HeldKey",
    "IdempotencyKey",
    "JobState",
    "KindState",
    "OutboxEvent",
    "OutboxGroup",
    "Outcome",
    "StagedJob",
    "StreamState",
    "UniqueJob",
]
