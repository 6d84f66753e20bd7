"""Process tier: a retry is taken when it falls due, not at the schedule's next distribute.

A real qcluster (django-q2's ORM broker) and no django-q2 schedule at all: nothing but the
retry handed over for its due time can bring a failed group back. The handler records
when each call starts, in the database's clock; the test reads when each retry was due
(the group's ``next_attempt_at`` while it waits).
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings
from django_q.models import Schedule

from django_outbox import publish
from django_outbox.models import ArchivedEvent, OutboxGroup
from django_outbox.models.groups import GroupState
from tests.procs import qcluster, wait_until
from tests.testapp.models import JobEffect

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

#: A retry starts at most this long after it falls due (django-q2's poll is 0.05 s here).
PICKUP_SECONDS = 0.5


def cluster(tmp_path):
    """A qcluster whose settings have the two streams of these tests."""
    return qcluster(log=tmp_path / "qcluster.log", OUTBOX_TEST_RETRY_TIMING="1")


def timing_settings():
    streams = {
        **settings.DJANGO_OUTBOX["STREAMS"],
        "backoff": settings.BACKOFF_STREAM,
        "paused": settings.PAUSED_STREAM,
    }
    return override_settings(DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": streams})


def calls(stream: str) -> list[dict]:
    rows = JobEffect.objects.filter(label=f"call:{stream}").values_list("value", flat=True)
    return sorted(rows, key=lambda call: call["at"])


def test_backoffs_of_1_2_and_4_seconds_are_honoured_on_a_quiet_stream(tmp_path):
    assert not Schedule.objects.exists(), "a schedule would distribute behind our back"
    due: dict[int, float] = {}  # failed attempt -> when its retry is due

    def delivered() -> bool:
        waiting = OutboxGroup.objects.filter(stream="backoff", state=GroupState.RETRYING)
        for attempt, at in waiting.values_list("attempt", "next_attempt_at"):
            due[attempt] = at.timestamp()
        return ArchivedEvent.objects.filter(stream="backoff").exists()

    with timing_settings(), cluster(tmp_path) as running:
        publish("backoff", {"n": 1})
        wait_until(delivered, timeout=60, interval=0.02, watch=[running])
    made = calls("backoff")
    assert [call["attempt"] for call in made] == [1, 2, 3, 4]
    assert sorted(due) == [1, 2, 3]
    late = [round(made[n]["at"] - due[n], 3) for n in (1, 2, 3)]
    waits = [round(made[n]["at"] - made[n - 1]["at"], 3) for n in (1, 2, 3)]
    print(f"\nbackoff 1 s: called again after {waits} s, {late} s after each was due")
    assert all(0 <= x <= PICKUP_SECONDS for x in late), late
    for n, wait in enumerate(waits, start=1):  # the backoff: 0.8 to 1.0 of 1, 2, 4 s
        assert 0.8 * 2 ** (n - 1) <= wait <= 2 ** (n - 1) + PICKUP_SECONDS, waits


def test_a_pause_of_3_seconds_is_honoured_on_a_quiet_stream(tmp_path):
    assert not Schedule.objects.exists(), "a schedule would distribute behind our back"
    with timing_settings(), cluster(tmp_path) as running:
        publish("paused", {"n": 1})
        wait_until(
            lambda: ArchivedEvent.objects.filter(stream="paused").exists(),
            timeout=60,
            watch=[running],
        )
    first, second = calls("paused")
    print(f"\nRetryAfter(3): called again {second['at'] - first['at']:.3f} s later")
    assert first["attempt"] == second["attempt"] == 1  # a pause spends no attempt
    assert 3 <= second["at"] - first["at"] <= 3 + PICKUP_SECONDS
