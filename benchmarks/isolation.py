"""Failure isolation: how fast one poison row is cornered in a group of n rows.

One group of n rows (the ``poison`` stream's batch size raised to n through the
operator's override), one row of it poisoned: the handler raises for any group that
holds it with :class:`~django_outbox.PermanentFailure`, as a bulk API that rejects a
whole request for one invalid record (HTTP 422) does. Measured through a real
qcluster (2 workers, ORM broker, the stream's defaults otherwise): handler calls and
wall time from the commit of the n rows until every healthy row is archived as done (the
poison row, alone, is then dead-lettered at once).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from benchmarks.models import Marker
from django_outbox import PermanentFailure, publish_many
from django_outbox.models import ArchivedEvent, Outcome, StreamState

STREAM = "poison"


def refuse_poison(batch: Any) -> None:
    """The ``poison`` stream's handler: count the call, refuse a group holding the poison."""
    Marker.objects.create(name="poison-call")
    if any(row["payload"].get("poison") for row in batch.rows("payload")):
        raise PermanentFailure("the API rejected the request: 422 (poison pill)")


def isolate_once(
    size: int, cluster: Callable[[], AbstractContextManager[None]], reset: Callable[[], None]
) -> dict[str, Any]:
    reset()
    StreamState.objects.update_or_create(stream=STREAM, defaults={"batch_size_override": size})
    poison = random.Random(size).randrange(size)
    archived = ArchivedEvent.objects.filter(stream=STREAM)
    done = archived.filter(outcome=Outcome.DONE)
    with cluster():
        started = time.perf_counter()
        # One commit; its wake claims the n rows as one group and hands it to a run.
        publish_many(STREAM, ({"n": n, "poison": n == poison} for n in range(size)))
        deadline = started + 600
        while done.count() < size - 1:
            if time.perf_counter() > deadline:
                raise SystemExit(f"benchmark: isolation in a group of {size} took over 600 s")
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        # The poison row, alone, is dead-lettered at once (the failure is permanent).
        while not archived.filter(outcome=Outcome.FAILED).exists():
            if time.perf_counter() > deadline:
                raise SystemExit("benchmark: the poison row was not dead-lettered")
            time.sleep(0.02)
    [dead] = archived.filter(outcome=Outcome.FAILED)
    assert dead.data["payload"] == {"n": poison, "poison": True}, dead.data
    calls = Marker.objects.filter(name="poison-call").count()
    return {
        "group_rows": size,
        "poison_at": poison,
        "handler_calls": calls,
        "splits": (calls - 1) // 2,
        "seconds_to_isolate": round(seconds, 3),
        "healthy_rows_delivered": done.count(),
    }


def isolation(
    sizes: Iterator[int] | list[int],
    cluster: Callable[[], AbstractContextManager[None]],
    reset: Callable[[], None],
) -> list[dict[str, Any]]:
    """Isolate one poison row in a group of each of *sizes* rows."""
    return [isolate_once(size, cluster, reset) for size in sizes]
