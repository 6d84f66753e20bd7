"""Process tier, PostgreSQL: an ordered stream through a real qcluster keeps every key in
order while its handler fails at random and its workers are SIGKILLed mid-handler."""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from django_outbox.models import ArchivedEvent, OutboxGroup, Outcome
from django_outbox.streams.distribute import distribute_stream
from tests.procs import kill_one_in_handler, running
from tests.testapp.models import HandledCall, OrderedEvent

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

KEYS = 50
PER_KEY = int(os.environ.get("OUTBOX_TEST_ORDERED_PER_KEY", "1000"))
COMMIT_ROWS = 500
KILLS = 3  # at least, mid-handler


def ordered_settings():
    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "ordered": settings.ORDERED_CHAOS_STREAM}
    return override_settings(DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": streams})


def paced(items: range, per_second: float):
    """Yield *items* on a fixed schedule of *per_second* (the inflow's pace)."""
    started = time.monotonic()
    for n, item in enumerate(items):
        delay = started + n / per_second - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield item


def state() -> str:
    from django_q.models import OrmQ

    groups = list(OutboxGroup.objects.values_list("state", "attempt", "size"))
    return (
        f"buffer {OrderedEvent.objects.count()}, groups {groups[:10]}, "
        f"queued jobs {list(OrmQ.objects.values_list('key', flat=True))[:5]}, "
        f"calls {HandledCall.objects.count()}"
    )


def test_every_key_is_delivered_in_order_through_failures_and_killed_workers(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    rng = random.Random(29)
    # Each key's rows in seq order, the keys interleaved, committed in chunks while the
    # cluster runs (so claims take prefixes of keys whose later rows are still coming).
    rows = [(f"key-{key}", seq) for seq in range(PER_KEY) for key in range(KEYS)]
    kills = 0
    env = {"OUTBOX_TEST_CRASH": "1", "OUTBOX_TEST_BUSY_DIR": str(busy), "Q_CLUSTER_NAME": "crash"}
    started = time.monotonic()
    with ordered_settings(), running(["-m", "django", "qcluster"], "ordered-cluster", **env):
        for start in paced(range(0, len(rows), COMMIT_ROWS), per_second=10):
            with transaction.atomic():
                OrderedEvent.objects.bulk_create(
                    OrderedEvent(aggregate_id=key, seq=seq)
                    for key, seq in rows[start : start + COMMIT_ROWS]
                )
            if start // COMMIT_ROWS % 4 == 3:  # kill a worker in its handler
                kills += kill_one_in_handler(busy, rng, within=0.2) is not None
        while OrderedEvent.objects.exists() or OutboxGroup.objects.exists():
            assert time.monotonic() - started < 300, "the stream did not drain"
            distribute_stream("ordered")  # the schedule's part: rescue the killed workers' groups
            if kills < KILLS:  # a slow cluster start can leave the kills to the drain
                kills += kill_one_in_handler(busy, rng, within=0.5) is not None
            else:
                time.sleep(0.5)  # the schedule's pace, compressed
    elapsed = time.monotonic() - started

    archived = list(
        # One statement archives a group's rows in no particular order: in the order
        # of the finalizes, then of the ids.
        ArchivedEvent.objects.filter(stream="ordered")
        .order_by("archived_at", "event_id")
        .values_list("event_id", "data__aggregate_id", "data__seq", "outcome")
    )
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, key, seq, outcome in archived:
        assert outcome == Outcome.DONE
        by_key[key].append(seq)
    seq_of = {event_id: (key, seq) for event_id, key, seq, _ in archived}
    # The handler never saw a key's row before every earlier row of the key had been
    # handed to it (in an earlier call, or before it in the same call).
    seen: dict[str, int] = defaultdict(lambda: -1)
    overtaken = 0
    calls = HandledCall.objects.filter(stream="ordered").order_by("id")
    for event_ids in calls.values_list("event_ids", flat=True):
        for key, seq in (seq_of[event_id] for event_id in event_ids):
            overtaken += seq > seen[key] + 1
            seen[key] = max(seen[key], seq)
    print(
        f"\nordered stream: {KEYS} keys x {PER_KEY} rows in {elapsed:.1f} s, {kills} workers "
        f"killed mid-handler, {calls.count()} handler calls"
    )
    assert kills >= KILLS, "the test did not kill workers mid-handler"
    assert len(archived) == len({event_id for event_id, *_ in archived}) == KEYS * PER_KEY
    out_of_order = {
        key: [(n, seqs[n - 1 : n + 2]) for n in range(1, len(seqs)) if seqs[n] < seqs[n - 1]][:3]
        for key, seqs in by_key.items()
        if seqs != sorted(seqs)
    }
    assert out_of_order == {}
    assert by_key == {f"key-{key}": list(range(PER_KEY)) for key in range(KEYS)}
    assert overtaken == 0
