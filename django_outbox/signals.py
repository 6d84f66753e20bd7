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
``group_split``
    ``stream``, ``group_id`` (the group split), ``attempt``, ``rows`` (now in two new
    groups of half the size), ``depth`` (the halves' split depth), ``error``.
``rows_replayed``
    ``stream``, ``rows`` (re-published into the buffer).

A receiver that raises is logged (ERROR, with its traceback) and changes nothing else:
the other receivers and the commit's other callbacks still run.

``staged_jobs_forwarded`` is sent with ``sender`` = ``"django_outbox.staged"`` and
``count`` (jobs handed to django-q2), ``duration`` (seconds of the batch).

Payloads and job arguments are never part of a signal.

Each of the stream signals is also logged by this module's logger,
``django_outbox.signals`` (a child of ``django_outbox``), when it is sent: INFO for
progress (processed, replayed), WARNING for a retry, ERROR for a dead-lettered group,
with the same fields in the record's ``extra`` (``stream``, ``group_id``, ``attempt``,
``rows``, ``duration``, ``retry_in``, ``error`` as its last line). Payloads are never
logged.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from django_outbox.base.errors import last_line

__all__ = [
    "group_exhausted",
    "group_failed",
    "group_processed",
    "group_split",
    "rows_replayed",
    "staged_jobs_forwarded",
]

logger = logging.getLogger(__name__)

group_processed = Signal()
group_failed = Signal()
group_exhausted = Signal()
group_split = Signal()
rows_replayed = Signal()
staged_jobs_forwarded = Signal()


_LOGGED: dict[Signal, tuple[int, str]] = {
    group_processed: (
        logging.INFO,
        "Group {group_id} of stream {stream}: {rows} rows done on attempt {attempt} "
        "in {duration:.2f}s.",
    ),
    group_failed: (
        logging.WARNING,
        "Group {group_id} of stream {stream} failed attempt {attempt}; {rows} rows retry "
        "in {retry_in:.0f}s: {error}",
    ),
    group_exhausted: (
        logging.ERROR,
        "Group {group_id} of stream {stream} exhausted after {attempt} attempts; {rows} rows "
        "dead-lettered: {error}",
    ),
    group_split: (
        logging.WARNING,
        "Group {group_id} of stream {stream} failed attempt {attempt} as a whole; its {rows} "
        "rows are split in two groups to isolate the failure (depth {depth}): {error}",
    ),
    rows_replayed: (logging.INFO, "{rows} dead letters of stream {stream} replayed."),
}


def send_on_commit(signal: Signal, stream: str, using: str | None = None, **kwargs: Any) -> None:
    """Send (and log) *signal* once the current transaction commits (at once outside one)."""

    def send() -> None:
        send_robust(signal, stream, stream=stream, **kwargs)
        if signal in _LOGGED:
            level, message = _LOGGED[signal]
            fields = {"stream": stream, **kwargs}
            if "error" in fields:
                fields["error"] = last_line(fields["error"])
            logger.log(level, message.format(**fields), extra=fields)

    transaction.on_commit(send, using=using)


def send_robust(signal: Signal, sender: str, **kwargs: Any) -> None:
    """Send *signal* to every receiver; one that raises is logged and the others still run.

    Sent from on-commit callbacks: a raising receiver must abort neither the receivers
    after it nor the other callbacks of the commit (the run loop's wake among them).
    """
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "A receiver of a django_outbox signal raised: %r (sender %s)",
                receiver,
                sender,
                exc_info=result,
            )
