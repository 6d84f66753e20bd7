"""Retry delays: exponential in the attempt number, capped, with jitter."""

from __future__ import annotations

import random

#: A delay is drawn from [JITTER_LOW * d, d] where d is the exponential delay. Because
#: 2 * JITTER_LOW > 1, every draw for attempt n + 1 exceeds every draw for attempt n
#: until the cap is reached.
JITTER_LOW = 0.8


def backoff_seconds(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Return the delay before the retry that follows failed attempt *attempt* (1-based)."""
    delay = min(float(cap), float(base) * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(JITTER_LOW * delay, delay)
