"""backoff_seconds(): exponential, capped, jittered, and monotonic until the cap."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from django_outbox.base.backoff import JITTER_LOW, backoff_seconds

attempts = st.integers(min_value=1, max_value=40)
bases = st.integers(min_value=1, max_value=600)
caps = st.integers(min_value=1, max_value=86_400)
seeds = st.integers(min_value=0, max_value=2**32)


@given(attempt=attempts, base=bases, cap=caps, seed=seeds)
def test_a_delay_lies_between_the_jitter_floor_and_the_capped_exponential(attempt, base, cap, seed):
    expected = min(cap, base * 2 ** (attempt - 1))
    delay = backoff_seconds(attempt, base, cap, random.Random(seed))
    assert JITTER_LOW * expected <= delay <= expected


@given(attempt=attempts, base=bases, cap=caps, seed_a=seeds, seed_b=seeds)
def test_delays_grow_with_the_attempt_until_the_cap(attempt, base, cap, seed_a, seed_b):
    if base * 2**attempt > cap:
        return  # the next attempt's delay reaches the cap: only the bounds apply there
    shorter = backoff_seconds(attempt, base, cap, random.Random(seed_a))
    longer = backoff_seconds(attempt + 1, base, cap, random.Random(seed_b))
    assert longer > shorter


def test_jitter_spreads_retries():
    rng = random.Random(1)
    assert len({backoff_seconds(3, 10, 3600, rng) for _ in range(20)}) == 20
