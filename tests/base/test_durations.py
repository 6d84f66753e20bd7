"""validate_duration(): the one check of every duration a caller gives."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from django_outbox.base.durations import MAX_DURATION, validate_duration
from django_outbox.exceptions import DurationError, OutboxError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), (1.5, 1.5), (timedelta(days=7), 604_800.0), (MAX_DURATION, 3_153_600_000.0)],
)
def test_a_usable_duration_is_returned_in_seconds(value, seconds):
    assert validate_duration("ttl", value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        -1,
        -0.001,
        timedelta(seconds=-5),
        math.nan,
        math.inf,
        -math.inf,
        1e30,
        10**400,
        MAX_DURATION + timedelta(seconds=1),
        timedelta.max,
    ],
    ids=repr,
)
def test_a_negative_non_finite_or_too_long_duration_is_refused(value):
    with pytest.raises(DurationError) as error:
        validate_duration("ttl", value)

    assert isinstance(error.value, OutboxError) and isinstance(error.value, ValueError)
    assert str(error.value).startswith("ttl must be between 0 seconds and 36500 days, not ")
    assert str(error.value).endswith("Give a timedelta such as timedelta(days=7).")


@pytest.mark.parametrize("value", ["7", None, True, [1]], ids=repr)
def test_a_duration_of_another_type_is_refused(value):
    with pytest.raises(DurationError, match=r"^ttl must be a timedelta or a number of seconds"):
        validate_duration("ttl", value)
