"""Rate budgets: does ``CALLS_PER_SECOND`` hold across clusters, and what does it cost below it?

``python3 dev.py bench budget pace`` — three qclusters (2 workers each, ORM broker, the
schedules on as in production) drain a backlog of the ``paced`` stream (generic buffer,
batches of 10, ``CALLS_PER_SECOND`` 20). After a warm-up, the handler calls of a window
of ``--seconds`` are counted twice: by the stream's budget counter (``budget_calls``)
and by the groups archived per second, both in the database's clock.

``BENCH_ROWS_PER_SECOND=2000 python3 dev.py bench budget pace`` — the same with the
row budget instead (``ROWS_PER_SECOND``, batches of 100): rows archived per second and
the ``budget_rows`` counter.

``python3 dev.py bench budget latency`` — the latency benchmark's trickle (``--rate``,
300 events a second by default, one row per commit, the ``orders`` stream with its
defaults, one qcluster), in pairs: without a budget, then with a budget it never
reaches (``CALLS_PER_SECOND`` 10,000), so the budget's own cost shows in the
commit-to-archive latency.

Both print JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from benchmarks import latency  # noqa: E402
from benchmarks.run import ROOT, cluster, reset, start_django, stop  # noqa: E402
from django_outbox import wake  # noqa: E402
from django_outbox.conf import get_stream  # noqa: E402
from django_outbox.models import StreamState  # noqa: E402

PACED = "paced"
#: The budget of the latency pairs' second run: far above any rate the trickle reaches.
UNREACHED = "10000"


def fill(stream: str, rows: int) -> None:
    """*rows* unclaimed rows of *stream*, by raw SQL (nothing wakes the stream)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_outbox_outboxevent (created_at, stream, payload) "
            "SELECT statement_timestamp(), %s, jsonb_build_object('n', g) "
            "FROM generate_series(1, %s) AS g",
            [stream, rows],
        )


def database_seconds() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        return float(cursor.fetchone()[0])


def budget_spent(rows: bool) -> int:
    """The stream's budget counter: handler calls, or rows with the row budget."""
    state = StreamState.objects.get(stream=PACED)
    return state.budget_rows if rows else state.budget_calls


def spent_per_second(start: float, end: float, rows: bool) -> list[int]:
    """Handler calls (groups archived), or rows archived, in each whole second of
    [start, end)."""
    what = "COUNT(*)" if rows else "COUNT(DISTINCT group_id)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT FLOOR(EXTRACT(EPOCH FROM archived_at) - %s)::int, {what} "
            "FROM django_outbox_archivedevent WHERE stream = %s "
            "AND archived_at >= to_timestamp(%s) AND archived_at < to_timestamp(%s) "
            "GROUP BY 1 ORDER BY 1",
            [start, PACED, start, end],
        )
        found = dict(cursor.fetchall())
    return [found.get(second, 0) for second in range(int(end - start))]


def pace(clusters: int, seconds: float, warmup: float) -> dict[str, Any]:
    config = get_stream(PACED)
    rows = bool(config.rows_per_second)  # BENCH_ROWS_PER_SECOND: the row budget
    budget = config.rows_per_second if rows else config.calls_per_second
    assert budget, "the paced stream has no budget"
    reset()
    # Enough rows that the backlog outlasts the run at the budget: it is never short.
    per_unit = 1 if rows else config.batch_size
    fill(PACED, int(budget * (seconds + warmup + 30) * per_unit * 1.5))
    call_command("outbox_schedules", verbosity=0)
    logs = [(ROOT / "artifacts" / f"bench-budget-{n}.log") for n in range(clusters)]
    logs[0].parent.mkdir(exist_ok=True)
    processes = []
    for path in logs:
        with path.open("w") as out:
            processes.append(start_django(["qcluster"], out, BENCH_SCHEDULER="1"))
    try:
        wake(PACED)  # as a commit would: one run, which fans out up to CHAINS
        time.sleep(warmup)  # the clusters start and the runs fan out
        start, spent_before = database_seconds(), budget_spent(rows)
        time.sleep(seconds)  # the window being measured
        end, spent_after = database_seconds(), budget_spent(rows)
    finally:
        stop(processes)
    per_second = spent_per_second(start, end, rows)
    window = end - start
    rate = (spent_after - spent_before) / window
    tens = [sum(per_second[i : i + 10]) / 10 for i in range(0, len(per_second) - 9, 10)]
    unit = "rows" if rows else "calls"
    archived = "archived_rows" if rows else "archived_groups"
    return {
        "clusters": clusters,
        "workers": clusters * 2,
        f"{unit}_per_second_budget": budget,
        "batch_size": config.batch_size,
        "window_s": round(window, 1),
        unit: spent_after - spent_before,
        f"{unit}_per_s": round(rate, 2),
        "ratio_to_budget": round(rate / budget, 3),
        f"{archived}_per_s_by_10s": [round(t, 1) for t in tens],
        f"{archived}_per_s_min_max": [min(per_second), max(per_second)],
    }


def latency_pairs(pairs: int, seconds: float, rate: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"no_budget": [], "unreached_budget": []}
    for _ in range(pairs):
        for name, budget in (("no_budget", ""), ("unreached_budget", UNREACHED)):
            # The cluster and the publishers (spawned children) read it from the settings.
            os.environ["BENCH_ORDERS_CALLS_PER_SECOND"] = budget
            reset()
            with cluster(BENCH_ORDERS_CALLS_PER_SECOND=budget):
                runs[name].append(latency.steady_latency(rate, 1, seconds))
    os.environ.pop("BENCH_ORDERS_CALLS_PER_SECOND", None)

    def median(name: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[name]), 3)

    keys = ("p50_s", "p95_s", "p99_s", "max_s")
    return {
        "events_per_s": rate,
        "seconds": seconds,
        "pairs": pairs,
        "unreached_budget_calls_per_s": int(UNREACHED),
        "median": {name: {k: median(name, k) for k in keys} for name in runs},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    paced = sub.add_parser("pace", help="the budget held by several clusters")
    paced.add_argument("--clusters", type=int, default=3)
    paced.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    paced.add_argument("--warmup", type=float, default=10.0)
    paired = sub.add_parser("latency", help="latency with and without an unreached budget")
    paired.add_argument("--pairs", type=int, default=3)
    paired.add_argument("--seconds", type=float, default=30.0, help="each latency run")
    paired.add_argument("--rate", type=float, default=300.0, help="events (commits) a second")
    args = parser.parse_args(argv)
    call_command("migrate", verbosity=0)
    if args.what == "pace":
        report = pace(args.clusters, args.seconds, args.warmup)
    else:
        report = latency_pairs(args.pairs, args.seconds, args.rate)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
