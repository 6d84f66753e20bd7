"""Distribute: the safety net on each stream's schedule. It never sets the pace.

It rescues groups whose lease expired (a worker died) or whose retry is due, and
restarts runs for a backlog that no run is taking (a wake that was lost with its
process). Work otherwise starts on commit. One stream's distribute is
:func:`django_outbox.runs.distribute` (resuming a stream runs it too); this module
adds every stream's, for the schedules.
"""

from __future__ import annotations

from django_outbox.conf import outbox_settings
from django_outbox.runs import DistributeResult, distribute

__all__ = ["DistributeResult", "distribute", "distribute_all"]


def distribute_all() -> list[DistributeResult]:
    """Distribute every configured stream."""
    return [distribute(name) for name in outbox_settings().streams]
