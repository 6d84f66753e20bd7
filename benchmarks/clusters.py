"""Scale-out: events/s with 1, 2 and 3 qclusters on the Redis broker, one PostgreSQL.

Each cluster is its own process tree (2 workers, as B), as one machine would run it;
they share one Redis queue and one database. The buffer is filled with raw SQL (no
wake), one distribute starts the runs, and the clock stops when the buffer and the
group table are empty. Beside the rate, the CPU seconds spent by PostgreSQL's processes
and by the clusters' processes during the drain say where the time goes.

Run by ``benchmarks.run`` (``python3 dev.py bench``) in a child of its own, because the
Redis broker is chosen when django-q2 is imported: ``BENCH_REDIS_URL`` must be set
before (this module sets ``BENCH_BROKER=redis`` for the settings). ``python -m
benchmarks.clusters --events N --clusters 1 2 3`` prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import django

if not os.environ.get("BENCH_REDIS_URL"):
    raise SystemExit("benchmarks.clusters needs BENCH_REDIS_URL (a Redis for the broker).")
os.environ["BENCH_BROKER"] = "redis"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django_q.tasks import async_task  # noqa: E402

from benchmarks.models import Marker  # noqa: E402
from benchmarks.run import (  # noqa: E402
    ROOT,
    STREAM,
    drained,
    fill_buffer,
    start_django,
    stop,
    wait_until,
)
from django_outbox.transport import handoff  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds so far of the live postgres and python processes of this machine."""
    totals = {"postgres": 0.0, "python": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
        except (OSError, ValueError):
            continue
        kind = (
            "postgres"
            if name.startswith("postgres")
            else "python"
            if "python" in name or name.startswith("qcluster")
            else None
        )
        if kind:
            totals[kind] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return totals


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU jiffies of the whole machine so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@contextlib.contextmanager
def clusters(count: int) -> Iterator[None]:
    """*count* qclusters on the Redis broker, each in its own session; wait until all take jobs."""
    log = ROOT / "artifacts" / "bench-clusters.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as out:
        processes = [start_django(["qcluster"], out, BENCH_SCHEDULER="0") for _ in range(count)]
    try:
        names = [f"ready-{p.pid}-{n}" for p in processes for n in range(4)]
        for name in names:
            async_task("benchmarks.tasks.ping", name, save=False)
        wait_until(
            lambda: Marker.objects.filter(name__in=names).count() == len(names), 60, "clusters"
        )
        yield
    finally:
        stop(processes)


def drain_with(count: int, events: int) -> dict[str, float]:
    fill_buffer(events)
    with clusters(count):
        cpu, busy = cpu_by_kind(), machine_busy()
        started = time.perf_counter()
        handoff.enqueue(handoff.DISTRIBUTE, [(STREAM,)])
        wait_until(drained, 1800, f"drain with {count} clusters")
        seconds = time.perf_counter() - started
        cpu_after, busy_after = cpu_by_kind(), machine_busy()
    used = {kind: cpu_after[kind] - cpu[kind] for kind in cpu}
    return {
        "clusters": count,
        "workers": 2 * count,
        "events": events,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "machine_busy": round((busy_after[0] - busy[0]) / (busy_after[1] - busy[1]), 3),
        "postgres_cpu_s_per_10k": round(used["postgres"] / events * 10_000, 3),
        "clusters_cpu_s_per_10k": round(used["python"] / events * 10_000, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--repeat", type=int, default=3, help="runs per count (median)")
    args = parser.parse_args(argv)
    runs: dict[int, list[dict[str, float]]] = {count: [] for count in args.clusters}
    for _ in range(args.repeat):  # interleaved, so a slow minute does not hit one count
        for count in args.clusters:
            runs[count].append(drain_with(count, args.events))
    results = []
    for measured in runs.values():
        median = sorted(measured, key=lambda r: r["events_per_s"])[len(measured) // 2]
        results.append({**median, "runs_events_per_s": [r["events_per_s"] for r in measured]})
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
