"""Signals sent after the change they describe has committed.

Every signal is sent with ``sender`` = the stream name and these keyword arguments:

``group_processed``
    ``stream``, ``group_id``, ``attempt``, ``rows`` (archived as done), ``duration``
    (seconds from taking the lease to the commit).
``group_failed``
    ``stream``, ``group_id``, ``attempt``, ``rows`` (kept for the retry), ``duration``,
    ``error``, ``retry_in`` (seconds).
``group_exhausted``
    ``stream``, ``group_id``, ``attempt``, ``rows`` (dead-lettered), ``error``.
``rows_replayed``
    ``stream``, ``rows`` (re-published into the buffer).

``staged_jobs_forwarded`` is sent with ``sender`` = ``"django_outbox.staged"`` and
``count`` (jobs handed to django-q2), ``duration`` (seconds of the batch).

Payloads and job arguments are never part of a signal.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import Signal

group_processed = Signal()
group_failed = Signal()
group_exhausted = Signal()
rows_replayed = Signal()
staged_jobs_forwarded = Signal()


def send_on_commit(signal: Signal, stream: str, using: str | None = None, **kwargs: Any) -> None:
    """Send *signal* once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: signal.send(sender=stream, stream=stream, **kwargs), using=using)
