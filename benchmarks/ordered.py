"""Ordered streams: what ``ORDER_KEY`` costs, against the same stream unordered.

Run it with ``python3 dev.py bench ordered`` (``--events``, ``--keys``, ``--repeat``).
For each number of keys (10, 1,000 and 100,000 by default), the same rows (``--events``
of them, each of one of the keys drawn at random, so every batch holds rows of many keys,
as an inflow of many aggregates does) are drained once by the ``keyed`` stream and once
by ``keyed_ordered`` (``ORDER_KEY = "aggregate"``), each through a real qcluster (2
workers, ORM broker, batch 1,000, ``RUNS`` 4, a handler that serializes every row), from
a backlog written before the cluster starts. The two runs of a pair alternate which goes
first; each pair gives a ratio (ordered over unordered, the machine's load alike for
both), and the median of the pairs is the figure. The default size makes a drain last
seconds, so the cluster's first claim does not weigh on the rate.

The figures are printed with the load average and written as JSON
(``artifacts/bench-ordered.json``, which ``python -m benchmarks.report`` renders). With
1,000 keys ordered must reach :data:`TARGET_RATIO` of unordered: below it the run prints
FAIL and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks.models import KeyedEvent, OrderedKeyedEvent  # noqa: E402
from benchmarks.run import ROOT, cluster, machine, vacuum, wait_until  # noqa: E402
from django_outbox.models import ArchivedEvent, OutboxGroup  # noqa: E402
from django_outbox.transport import handoff  # noqa: E402

STREAMS = {"keyed": KeyedEvent, "keyed_ordered": OrderedKeyedEvent}
#: The numbers of keys measured by default: few busy keys, many, one or two rows a key.
KEYS = (10, 1_000, 100_000)
#: With this many keys, ordered must reach TARGET_RATIO of unordered (median of pairs).
TARGET_KEYS = 1_000
TARGET_RATIO = 0.85


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


def measure(keys: int, events: int, repeat: int) -> dict[str, Any]:
    """*repeat* alternating pairs of drains of *events* rows of *keys* keys."""
    rates: dict[str, list[float]] = {stream: [] for stream in STREAMS}
    groups: dict[str, list[int]] = {stream: [] for stream in STREAMS}
    ratios: list[float] = []
    loads: list[float] = []
    for run in range(repeat):
        order = list(STREAMS) if run % 2 == 0 else list(reversed(STREAMS))
        for stream in order:
            seconds = drain(stream, events, keys, seed=run)
            rates[stream].append(events / seconds)
            # Handler calls: an ordered claim that finds its keys busy takes short groups.
            groups[stream].append(ArchivedEvent.objects.values("group_id").distinct().count())
            loads.append(round(os.getloadavg()[0], 2))
            print(
                f"{keys:,} keys, pair {run + 1}: {stream}: {events / seconds:,.0f} events/s, "
                f"{groups[stream][-1]} groups (load {loads[-1]})",
                flush=True,
            )
        ratios.append(rates["keyed_ordered"][-1] / rates["keyed"][-1])
    unordered, ordered = (statistics.median(rates[s]) for s in STREAMS)
    ratio = statistics.median(ratios)
    print(
        f"{keys:,} keys: unordered {unordered:,.0f}/s, ordered {ordered:,.0f}/s, ordered/"
        f"unordered {ratio:.2f} (median of pairs {', '.join(f'{r:.2f}' for r in ratios)})",
        flush=True,
    )
    return {
        "keys": keys,
        "unordered_per_s": round(unordered),
        "ordered_per_s": round(ordered),
        "ordered_over_unordered": round(ratio, 2),
        "pair_ratios": [round(r, 2) for r in ratios],
        "all_rates": {stream: [round(r) for r in found] for stream, found in rates.items()},
        "groups": groups,
        "load_averages": loads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, nargs="+", default=list(KEYS))
    parser.add_argument("--repeat", type=int, default=3, help="alternating pairs (median)")
    parser.add_argument("--json", type=Path, default=ROOT / "artifacts" / "bench-ordered.json")
    args = parser.parse_args(argv)
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    load_before = os.getloadavg()[0]
    print(f"{args.events:,} events, {args.repeat} pairs, load {load_before:.2f}", flush=True)
    measured = [measure(keys, args.events, args.repeat) for keys in args.keys]
    target = next((m for m in measured if m["keys"] == TARGET_KEYS), None)
    met = target is None or target["ordered_over_unordered"] >= TARGET_RATIO
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "postgresql": server,
        "arguments": ["ordered", *(argv if argv is not None else sys.argv[1:])],
        "events": args.events,
        "runs": args.repeat,
        "target": {"keys": TARGET_KEYS, "ratio": TARGET_RATIO, "met": met},
        "by_keys": measured,
    }
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    if target is not None:
        verdict = "ok" if met else "FAIL"
        print(
            f"{verdict}: {TARGET_KEYS:,} keys, ordered/unordered "
            f"{target['ordered_over_unordered']:.2f} (target {TARGET_RATIO})"
        )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
