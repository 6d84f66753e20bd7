"""Handlers for the test streams. They record what they saw in HandledCall rows."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from django.core.cache import cache

from django_outbox import BatchResult, PermanentFailure, RetryAfter
from django_outbox.base.dialect import database_now
from django_outbox.streams.batch import Batch
from tests.testapp.models import HandledCall, JobEffect

#: Behaviour switch for the tests, read by the ``audit`` stream's handler.
MODE_KEY = "tests.handler.mode"


def record(batch: Batch) -> BatchResult | None:
    """Record the batch; fail as the current test asks through the cache key."""
    rows = batch.rows("id", "payload")
    HandledCall.objects.create(
        stream=batch.stream,
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in rows],
        cluster=os.environ.get("OUTBOX_TEST_CLUSTER_LABEL", ""),
    )
    mode = cache.get(MODE_KEY, "ok")
    if mode == "raise":
        raise RuntimeError("handler exploded")
    if mode == "fail-odd":
        return BatchResult({row["id"]: "odd id rejected" for row in rows if row["id"] % 2})
    if mode == "fail-marked":
        return BatchResult(
            {row["id"]: "marked" for row in rows if (row["payload"] or {}).get("fail")}
        )
    if mode == "permanent":
        raise PermanentFailure("the API rejected the request: 422")
    if mode == "retry-after":
        raise RetryAfter(30, "429 Too Many Requests")
    if mode == "return-retry-after":
        return RetryAfter(30, "429 Too Many Requests")  # type: ignore[return-value]
    poisoned = mode.startswith("poison") and any(
        (row["payload"] or {}).get("poison") for row in rows
    )
    if poisoned and mode == "poison":
        raise RuntimeError("poison pill")
    if poisoned and mode == "poison-permanent":
        raise PermanentFailure("the API rejected the batch: 422 (poison pill)")
    if mode == "bad-keys":
        return BatchResult({"first": "not an id", 10**12: "no such row"})
    if mode == "bad-return":
        return "not a BatchResult"  # type: ignore[return-value]
    return None


def slow_record(batch: Batch) -> None:
    """A handler that takes a while, like a remote call, so a test can kill it mid-way.

    While it runs, a file named after the worker's pid exists in ``OUTBOX_TEST_BUSY_DIR``.
    """
    rows = batch.rows("id")
    marker = Path(os.environ["OUTBOX_TEST_BUSY_DIR"]) / str(os.getpid())
    marker.write_text(f"{batch.group_id} {batch.attempt} {len(rows)} {batch.stream}")
    try:
        time.sleep(0.15)
    finally:
        marker.unlink(missing_ok=True)


def compensate(batch: Batch, error: str) -> None:
    """An ON_EXHAUSTED hook that records the compensating action it would take."""
    HandledCall.objects.create(
        stream=f"compensate:{batch.stream}",
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in batch.rows("id")],
    )


def broken_hook(batch: Batch, error: str) -> None:
    """An ON_EXHAUSTED hook that writes, then fails: its write must not survive."""
    HandledCall.objects.create(stream="broken", group_id=batch.group_id, attempt=0, event_ids=[])
    raise RuntimeError("hook exploded")


def stall(batch: Batch) -> None:
    """A handler that, in a stalling worker, waits for the test's go-ahead.

    With ``OUTBOX_TEST_STALL_DIR`` set, it writes ``started``, waits for ``go`` to exist,
    then heartbeats when ``OUTBOX_TEST_HEARTBEAT=1``. Elsewhere it returns at once.
    """
    stall_dir = os.environ.get("OUTBOX_TEST_STALL_DIR")
    if not stall_dir:
        return
    (Path(stall_dir) / "started").write_text(str(batch.attempt))
    while not (Path(stall_dir) / "go").exists():
        time.sleep(0.01)
    if os.environ.get("OUTBOX_TEST_HEARTBEAT") == "1":
        batch.heartbeat()


def refuse_poison(batch: Batch) -> None:
    """Fail every attempt of a group holding a row whose payload says ``poison``."""
    if any(row["payload"].get("poison") for row in batch.rows("payload")):
        raise RuntimeError("poison pill")


def refuse_poison_title(batch: Batch) -> None:
    """For ``testapp.Attachment`` rows: fail a group holding an attachment titled poison."""
    if batch.events.filter(title="poison").exists():
        raise PermanentFailure("the API rejected the batch: 422 (poison attachment)")


#: The first attempt of ``block_first_attempt`` sets STARTED, then waits for GO.
STARTED = threading.Event()
GO = threading.Event()


def block_first_attempt(batch: Batch) -> None:
    """Record the call; the first attempt runs until the test says go (a long handler)."""
    HandledCall.objects.create(
        stream=batch.stream, group_id=batch.group_id, attempt=batch.attempt, event_ids=batch.ids
    )
    if batch.attempt == 1:
        STARTED.set()
        if not GO.wait(60):
            raise RuntimeError("the test never said go")


def reject(batch: Batch) -> None:
    """A handler whose API refuses every batch for good."""
    raise PermanentFailure("the API rejected the batch: 422")


def record_ordered(batch: Batch) -> BatchResult | None:
    """Record the batch of the ordered stream; fail rows as the test asks.

    Modes (the cache key): ``ok``; ``raise``; ``fail-key:<key>`` fails the first row of
    that aggregate in the batch; ``fail-seq:<n>`` fails the rows whose seq is n;
    ``poison`` raises for a batch holding a row with seq 0.
    """
    rows = batch.rows("id", "aggregate_id", "seq")
    HandledCall.objects.create(
        stream=batch.stream,
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in rows],
    )
    mode = cache.get(MODE_KEY, "ok")
    if mode == "raise":
        raise RuntimeError("handler exploded")
    if mode.startswith("fail-key:"):
        key = mode.split(":", 1)[1]
        first = next((row["id"] for row in rows if row["aggregate_id"] == key), None)
        return BatchResult({first: "rejected"}) if first is not None else None
    if mode.startswith("fail-seq:"):
        seq = int(mode.split(":", 1)[1])
        failed = {row["id"]: "rejected" for row in rows if row["seq"] == seq}
        return BatchResult(failed) if failed else None
    if mode == "poison" and any(row["seq"] == 0 for row in rows):
        raise PermanentFailure("the API rejected the batch: 422 (poison)")
    return None


def ordered_chaos(batch: Batch) -> BatchResult | None:
    """The ordered process test's handler: it fails at random, and can be killed.

    Records each call; on its first attempts a group fails as a whole one time in six,
    or one row of a random key in it fails one time in six. While it runs, a file named
    after the worker's pid exists in ``OUTBOX_TEST_BUSY_DIR`` (the test kills workers
    found there).
    """
    import random

    rows = batch.rows("id", "aggregate_id")
    HandledCall.objects.create(
        stream=batch.stream,
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in rows],
    )
    marker = Path(os.environ["OUTBOX_TEST_BUSY_DIR"]) / str(os.getpid())
    marker.write_text(str(batch.group_id))
    try:
        time.sleep(0.1)  # a remote call's time, for a kill to land in
    finally:
        marker.unlink(missing_ok=True)
    if batch.attempt > 3:
        return None
    dice = random.random()
    if dice < 1 / 6:
        raise RuntimeError("the service is unavailable (503)")
    if dice < 2 / 6:
        key = random.choice(rows)["aggregate_id"]
        first = next(row["id"] for row in rows if row["aggregate_id"] == key)
        return BatchResult({first: "rejected (409)"})
    return None


def record_call_time(batch: Batch) -> None:
    """Record when the call started, in the database's clock, and which cluster made it."""
    JobEffect.objects.create(
        label=f"call:{batch.stream}",
        value={
            "at": database_now().timestamp(),
            "ids": batch.ids,
            "attempt": batch.attempt,
            "cluster": os.environ.get("OUTBOX_TEST_CLUSTER_LABEL", ""),
        },
    )


def fail_three_times(batch: Batch) -> None:
    """Record the call's start (the database's clock); fail attempts 1 to 3."""
    record_call_time(batch)
    if batch.attempt <= 3:
        raise RuntimeError(f"the service is down (attempt {batch.attempt})")


def pause_once(batch: Batch) -> None:
    """Record the call's start; the stream's first call asks for a pause of 3 s."""
    first = not JobEffect.objects.filter(label=f"call:{batch.stream}").exists()
    record_call_time(batch)
    if first:
        raise RetryAfter(3, "429 Too Many Requests")
