"""From a stream's first commit to its handler's first call, on a running cluster.

B's clock starts when its backlog is released to a ready cluster, so B pays for the
start of the work once per run: the wake's claim, the hand-off to the broker, a worker
picking the job up, the group's rows read before the handler is called. At 20,000
events that start is a visible share of B's time; at 100,000 much less. This measures
the start alone, as an application sees it: a qcluster (2 workers) runs, the stream is
idle (nothing buffered, no run in flight, the cluster idle for a moment), and one
transaction commits *N* rows with ``publish()`` (one row) or ``publish_many()`` (a
backlog). The clock runs from the transaction's last statement before ``COMMIT`` to
the start of the handler's first call, both in the database's clock (the handler of
the ``first_call`` stream stamps it, :func:`benchmarks.tasks.stamp_batch`); the time
until the backlog is archived is kept too.

The broker is chosen when django-q2 is imported, so each broker runs in a process of
its own: ``python -m benchmarks.first_call`` measures with the ORM broker, or with
Redis when ``BENCH_BROKER=redis`` and ``BENCH_REDIS_URL`` are set, and prints JSON as
its last line;
:func:`both_brokers` runs both (``benchmarks.run`` calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max  # noqa: E402

from benchmarks.models import Marker  # noqa: E402
from benchmarks.run import ROOT, cluster, payload, reset, wait_until  # noqa: E402
from django_outbox import publish, publish_many  # noqa: E402
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup  # noqa: E402

STREAM = "first_call"
#: The stream is idle this long before each commit: the last run has ended and the
#: cluster's workers wait on the broker.
IDLE_SECONDS = 1.0


def epoch(cursor: Any) -> float:
    cursor.execute("SELECT extract(epoch FROM clock_timestamp())")
    return float(cursor.fetchone()[0])


def one_sample(rows: int) -> dict[str, float]:
    """Commit *rows* events in one transaction to the idle stream; seconds from the
    commit to the handler's first call and to the last archive."""
    reset()
    time.sleep(IDLE_SECONDS)
    with transaction.atomic():
        if rows == 1:
            publish(STREAM, payload(0))
        else:
            publish_many(STREAM, (payload(i) for i in range(rows)), chunk_size=5000)
        with connection.cursor() as cursor:
            committed = epoch(cursor)  # the transaction's last statement before COMMIT
    calls = Marker.objects.filter(name__startswith="call ")
    wait_until(calls.exists, 60, "the handler's first call")
    first = min(float(name.split()[1]) for name in calls.values_list("name", flat=True))
    wait_until(
        lambda: not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists(),
        300,
        "the first_call stream drained",
    )
    last = ArchivedEvent.objects.filter(stream=STREAM).aggregate(last=Max("archived_at"))["last"]
    return {
        "first_call_s": first - committed,
        "archived_s": last.timestamp() - committed,
    }


def measure(samples: int, backlogs: list[int]) -> dict[str, Any]:
    """*samples* commits of each size in *backlogs*, the sizes alternating, on one
    running cluster; the median and every sample of each size.

    The first commit, of the largest backlog, goes to the cluster as it starts (one
    worker has run the readiness ping, no worker has run the stream's code): what B's
    clock covers. It is kept apart, as ``cold``; the samples follow on warm workers."""
    measured: dict[int, list[dict[str, float]]] = {rows: [] for rows in backlogs}
    with cluster():
        cold = one_sample(max(backlogs))
        for _ in range(samples):
            for rows in backlogs:
                measured[rows].append(one_sample(rows))
    reset()
    broker = "redis" if "redis" in settings.Q_CLUSTER else "orm"
    return {
        "broker": broker,
        "poll_s": settings.Q_CLUSTER.get("poll", 0.2) if broker == "orm" else None,
        "workers": settings.Q_CLUSTER["workers"],
        "cold": {
            "rows": max(backlogs),
            "first_call_s": round(cold["first_call_s"], 4),
            "archived_s": round(cold["archived_s"], 4),
        },
        "by_rows": {
            str(rows): {
                "rows": rows,
                "first_call_median_s": round(statistics.median(s["first_call_s"] for s in runs), 4),
                "first_call_runs_s": [round(s["first_call_s"], 4) for s in runs],
                "archived_median_s": round(statistics.median(s["archived_s"] for s in runs), 4),
            }
            for rows, runs in measured.items()
        },
    }


def both_brokers(samples: int, backlogs: list[int]) -> dict[str, Any]:
    """:func:`measure` in a child with the ORM broker, then in one with Redis
    (``BENCH_REDIS_URL``, else a throwaway server; skipped without one)."""
    from tests.redis_server import own_redis

    def child(redis_url: str | None) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if k not in ("BENCH_BROKER", "BENCH_REDIS_URL")}
        if redis_url:
            env.update(BENCH_BROKER="redis", BENCH_REDIS_URL=redis_url)
        done = subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.first_call"),
                *("--samples", str(samples), "--backlogs", *map(str, backlogs)),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    results = {"orm": child(None)}
    if os.environ.get("BENCH_REDIS_URL"):
        results["redis"] = child(os.environ["BENCH_REDIS_URL"])
        return results
    with own_redis() as redis:
        if redis is None:
            print("  first call on Redis skipped: no Redis (BENCH_REDIS_URL, redis-server)")
        else:
            results["redis"] = child(redis.url)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=7, help="commits of each size")
    parser.add_argument("--backlogs", type=int, nargs="+", default=[1, 20_000])
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.samples, args.backlogs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
