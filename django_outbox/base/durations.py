"""Durations given by callers (a key's ``ttl``, a job's delay), checked in one place.

A duration becomes a number of seconds added to the database's clock; a negative, NaN
or infinite one cannot mean anything there, and one longer than :data:`MAX_DURATION`
lands past what both databases can store (SQLite's dates end in 9999).
"""

from __future__ import annotations

import math
from datetime import timedelta

from django_outbox.exceptions import DurationError

#: The longest duration accepted: a hundred years.
MAX_DURATION = timedelta(days=36_500)


def validate_duration(name: str, value: timedelta | float) -> float:
    """Return *value* (a timedelta or seconds) in seconds; raise DurationError if unusable.

    *name* is the argument's name, used in the message.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        raise DurationError(f"{name} must be a timedelta or a number of seconds, not {value!r}.")
    limit = MAX_DURATION.total_seconds()
    if not math.isfinite(seconds) or not 0 <= seconds <= limit:
        raise DurationError(
            f"{name} must be between 0 seconds and {MAX_DURATION.days} days, not {value!r}. "
            "Give a timedelta such as timedelta(days=7)."
        )
    return seconds
