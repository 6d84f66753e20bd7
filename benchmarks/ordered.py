"""Ordered streams: what ``ORDER_KEY`` costs, against the same stream unordered.

Run it with ``python3 dev.py bench ordered`` (``--events``, ``--keys``, ``--repeat``).
The same rows (``--events`` of them, each of one of ``--keys`` aggregates drawn at random,
so every batch holds rows of many keys, as an inflow of many aggregates does) are drained
once by the ``keyed`` stream and once by ``keyed_ordered`` (``ORDER_KEY = "aggregate"``),
each through a real qcluster (2 workers, ORM broker, batch 1,000, ``RUNS`` 4, a handler
that serializes every row), from a backlog written before the cluster starts. The runs
alternate; the medians and their ratio are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks.models import KeyedEvent, OrderedKeyedEvent  # noqa: E402
from benchmarks.run import ROOT, cluster, vacuum, wait_until  # noqa: E402
from django_outbox.models import OutboxGroup  # noqa: E402
from django_outbox.transport import handoff  # noqa: E402

STREAMS = {"keyed": KeyedEvent, "keyed_ordered": OrderedKeyedEvent}


def fill(model: Any, events: int, keys: int, seed: int) -> None:
    """Write the backlog with one statement (no wake: the cluster is not running yet)."""
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [seed / 1000])
        cursor.execute(
            f"INSERT INTO {table} (created_at, aggregate, body) "
            "SELECT now(), floor(random() * %s)::int, 'event ' || n "
            "FROM generate_series(1, %s) n",
            [keys, events],
        )


def reset() -> None:
    tables = [model._meta.db_table for model in STREAMS.values()] + [
        "django_outbox_archivedevent",
        "django_outbox_outboxgroup",
        "django_outbox_streamstate",
        "django_outbox_heldkey",
        "django_q_ormq",
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")


def drain(stream: str, events: int, keys: int, seed: int) -> float:
    """Seconds one qcluster takes to drain *events* rows of *stream*."""
    model = STREAMS[stream]
    reset()
    fill(model, events, keys, seed)
    vacuum(model._meta.db_table)
    with cluster():
        started = time.perf_counter()
        handoff.enqueue(handoff.DISTRIBUTE, [(stream,)])
        wait_until(
            lambda: not model.objects.exists() and not OutboxGroup.objects.exists(),
            1800,
            f"the {stream} run",
        )
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs (median)")
    parser.add_argument("--json", type=Path, default=ROOT / "artifacts" / "bench-ordered.json")
    args = parser.parse_args(argv)
    call_command("migrate", verbosity=0)
    rates: dict[str, list[float]] = {stream: [] for stream in STREAMS}
    for run in range(args.repeat):
        for stream in STREAMS:
            seconds = drain(stream, args.events, args.keys, seed=run)
            rates[stream].append(args.events / seconds)
            print(f"run {run + 1}: {stream}: {args.events / seconds:,.0f} events/s", flush=True)
    unordered, ordered = (statistics.median(rates[s]) for s in STREAMS)
    report = {
        "events": args.events,
        "keys": args.keys,
        "runs": args.repeat,
        "unordered_per_s": round(unordered),
        "ordered_per_s": round(ordered),
        "ordered_over_unordered": round(ordered / unordered, 2),
        "all_rates": {stream: [round(r) for r in found] for stream, found in rates.items()},
    }
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(
        f"{args.events:,} events of {args.keys:,} keys, median of {args.repeat}: unordered "
        f"{unordered:,.0f}/s, ordered {ordered:,.0f}/s, ordered/unordered "
        f"{ordered / unordered:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
