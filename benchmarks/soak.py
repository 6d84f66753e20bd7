"""Dead tuples of the buffer under sustained load: PostgreSQL's defaults against tuned.

``python3 dev.py bench soak [--minutes M] [--rate N] [--standing ROWS]`` publishes N events/s
into the benchmark stream while a real qcluster drains it, next to a standing backlog of
another stream (a buffer that holds rows for a while, as during an outage of the remote
side). It samples the buffer's live and dead tuples every 5 s, first with the table's
autovacuum parameters reset to PostgreSQL's defaults, then after ``outbox_tune --apply``,
and prints the peak and mean dead-tuple ratio and the autovacuum runs of each phase.

``--held-snapshot`` measures what a held snapshot does instead: a session opens a
REPEATABLE READ transaction, reads a row and stays idle in it for the whole run (a
long report, say), so vacuum can remove nothing, while N events/s (a commit every
0.1 s) flow through the qcluster with distribute once a minute, as its schedule runs.
It prints per minute of the run the commit-to-archive p50 and p99 of the events
committed in that minute, the rows in the buffer (the backlog), the claim statement's
mean time and shared buffers (the stream's claim, as a worker would issue it then,
run under EXPLAIN ANALYZE every 5 s and rolled back), the buffer's dead tuples, and
at the end the buffer's size and whether every event was archived exactly once::

    BENCH_DATABASE_URL=postgres://… python -m benchmarks.soak --held-snapshot \
        --minutes 10 --rate 5000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

import psycopg  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from benchmarks.run import ROOT, STREAM, cluster, payload, reset, wait_until  # noqa: E402
from django_outbox import publish_many  # noqa: E402
from django_outbox.archive import tune  # noqa: E402
from django_outbox.archive.sql.tune import server_settings  # noqa: E402
from django_outbox.conf import get_stream  # noqa: E402
from django_outbox.models import StreamState  # noqa: E402
from django_outbox.streams.run import effective_batch_size  # noqa: E402
from django_outbox.streams.sql import stream_buffer  # noqa: E402
from django_outbox.transport import handoff  # noqa: E402

TABLE = "django_outbox_outboxevent"


def sample() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
            "WHERE relname = %s",
            [TABLE],
        )
        live, dead, vacuums = cursor.fetchone()
    return {"live": int(live), "dead": int(dead), "autovacuums": int(vacuums)}


def standing_backlog(rows: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (created_at, stream, payload) SELECT now(), 'standing', "
            "jsonb_build_object('n', n) FROM generate_series(1, %s) n",
            [rows],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def phase(name: str, seconds: float, rate: int) -> dict[str, Any]:
    """Publish *rate* events/s for *seconds* while the cluster drains; sample every 5 s."""
    first = sample()
    samples = []
    started = time.monotonic()
    next_sample = started + 5
    published = 0
    while time.monotonic() - started < seconds:
        tick = time.monotonic()
        batch = max(1, rate // 10)
        publish_many(STREAM, (payload(published + i) for i in range(batch)))
        published += batch
        if int(tick - started) != int(time.monotonic() - started):  # about once a second
            handoff.enqueue(handoff.DISTRIBUTE, [(STREAM,)])
        if time.monotonic() >= next_sample:
            now = sample()
            total = now["live"] + now["dead"]
            samples.append(now["dead"] / total if total else 0.0)
            now["ratio"] = round(samples[-1], 4)
            print(f"  {name} t={time.monotonic() - started:5.0f}s {now}", flush=True)
            next_sample += 5
        time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
    last = sample()
    return {
        "seconds": seconds,
        "published": published,
        "peak_dead_ratio": round(max(samples, default=0.0), 4),
        "mean_dead_ratio": round(statistics.mean(samples) if samples else 0.0, 4),
        "autovacuum_runs": last["autovacuums"] - first["autovacuums"],
    }


ARCHIVE = "django_outbox_archivedevent"
#: Seconds between two samples of the held-snapshot run.
SAMPLE_SECONDS = 5


def claim_sample() -> dict[str, float]:
    """Run the stream's next claim as a worker would issue it now, under EXPLAIN
    ANALYZE, and roll it back: its execution time (ms) and shared buffers."""
    config = get_stream(STREAM)
    state = StreamState.objects.filter(stream=STREAM).first()
    ops = stream_buffer(config)
    if getattr(ops, "keeps_claim_floor", False):
        sql, params = ops.claim_sql(state.claim_floor if state else 0)
    else:  # the code before the claim floor
        sql, params = ops.claim_sql()
    limit = effective_batch_size(config, state)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
            [ops.group_param(uuid.uuid4()), *params, limit],
        )
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]
    # The pick: the index scan under the claim's FOR UPDATE SKIP LOCKED (LockRows).
    picks = [
        child
        for node in _nodes(top["Plan"])
        if node["Node Type"] == "LockRows"
        for child in node.get("Plans", ())
    ]
    return {
        "ms": float(top["Execution Time"]),
        # Rows the pick's scan returned (a row another claim holds is skipped after).
        "pick_rows": sum(int(node.get("Actual Rows", 0)) for node in picks),
        # What the pick stepped over: the buffers of its scan of the unclaimed index.
        "pick_buffers": sum(
            int(node["Shared Hit Blocks"] + node["Shared Read Blocks"]) for node in picks
        ),
        "buffers": int(top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"]),
    }


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(found for child in node.get("Plans", ()) for found in _nodes(child))]


def hold_snapshot() -> psycopg.Connection:
    """A session that reads a row in a REPEATABLE READ transaction and stays idle in it."""
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k in ("dbname", "user", "password", "host", "port")
    }
    held = psycopg.connect(**params)
    held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    held.execute("SELECT * FROM django_outbox_streamstate LIMIT 1").fetchall()
    return held


def _publisher(rate: int, seconds: float, start_at: float, out: Any) -> None:
    """The inflow, in a process of its own: *rate* // 10 events every 0.1 s, on a fixed
    schedule. Each commit is one INSERT of the rows ``publish_many()`` would write (the
    payloads of :func:`benchmarks.run.payload`, built by the database), then ``wake()``,
    as the documented path for rows written without the ORM: the client's Python is
    not what this run measures, and on a loaded machine it could not keep the pace."""
    from django_outbox import wake

    batch = max(1, rate // 10)
    published = 0
    commits = 0
    while time.time() < start_at:
        time.sleep(0.001)
    while (due := start_at + commits * 0.1) < start_at + seconds:
        if due > time.time():
            time.sleep(due - time.time())
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TABLE} (created_at, stream, payload) SELECT now(), %s, "
                "jsonb_build_object('activity', n, 'type', (ARRAY['call', 'email', "
                "'meeting'])[n %% 3 + 1], 'email', 'lead' || n %% 997 || '@example.com', "
                "'comment', 'follow-up #' || n) FROM generate_series(%s, %s) n",
                [STREAM, published, published + batch - 1],
            )
        wake(STREAM)
        published += batch
        commits += 1
    out.put(published)


def held_phase(seconds: float, rate: int) -> dict[str, Any]:
    """Publish *rate* events/s for *seconds* under a held snapshot; sample every 5 s."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0  # the child imports Django meanwhile
    child = context.Process(target=_publisher, args=(rate, seconds, start_at, out))
    child.start()
    while time.time() < start_at:
        time.sleep(0.01)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        db_start = cursor.fetchone()[0]
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    next_distribute = started + 60
    for n in range(1, int(seconds // SAMPLE_SECONDS) + 1):
        time.sleep(max(0.0, started + n * SAMPLE_SECONDS - time.monotonic()))
        if time.monotonic() >= next_distribute:  # the schedule's safety net, once a minute
            handoff.enqueue(handoff.DISTRIBUTE, [(STREAM,)])
            next_distribute += 60
        now = {"t": round(time.monotonic() - started, 1), **sample(), **claim_sample()}
        samples.append(now)
        print(f"  held t={now['t']:5.0f}s {now}", flush=True)
    published = out.get(timeout=600)
    child.join()
    return {"db_start": db_start, "published": published, "samples": samples}


def held_minutes(phase: dict[str, Any]) -> list[dict[str, Any]]:
    """Per minute of the run: latency of the events committed in it, and the samples."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT FLOOR(EXTRACT(EPOCH FROM created_at - %s) / 60)::int AS minute, "
            "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY "
            "EXTRACT(EPOCH FROM archived_at - created_at)), "
            "PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY "
            "EXTRACT(EPOCH FROM archived_at - created_at)), COUNT(*) "
            f"FROM {ARCHIVE} WHERE stream = %s GROUP BY 1 ORDER BY 1",
            [phase["db_start"], STREAM],
        )
        latency = {m: (p50, p99, n) for m, p50, p99, n in cursor.fetchall()}
    minutes = []
    for minute, (p50, p99, events) in sorted(latency.items()):
        inside = [s for s in phase["samples"] if minute * 60 <= s["t"] < (minute + 1) * 60]
        minutes.append(
            {
                "minute": minute + 1,
                "events": events,
                "p50_s": round(float(p50), 3),
                "p99_s": round(float(p99), 3),
                "peak_buffer_rows": max((s["live"] for s in inside), default=None),
                "claim_ms_mean": round(statistics.mean(s["ms"] for s in inside), 2)
                if inside
                else None,
                "pick_rows_mean": round(statistics.mean(s["pick_rows"] for s in inside))
                if inside
                else None,
                "pick_buffers_mean": round(statistics.mean(s["pick_buffers"] for s in inside))
                if inside
                else None,
                "dead_tuples_end": inside[-1]["dead"] if inside else None,
            }
        )
    return minutes


def held_snapshot_run(minutes: float, rate: int) -> dict[str, Any]:
    reset()
    held = hold_snapshot()
    try:
        with cluster():
            phase = held_phase(minutes * 60, rate)

            def archived() -> int:
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT COUNT(*) FROM {ARCHIVE} WHERE stream = %s", [STREAM])
                    return int(cursor.fetchone()[0])

            drained_at = time.monotonic()
            wait_until(lambda: archived() >= phase["published"], 600, "every event archived")
            drain_seconds = time.monotonic() - drained_at
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*), COUNT(DISTINCT event_id), "
                f"COUNT(DISTINCT (data -> 'payload' ->> 'activity')) FROM {ARCHIVE} "
                "WHERE stream = %s",
                [STREAM],
            )
            rows, distinct_events, distinct_payloads = cursor.fetchone()
            cursor.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s)", [TABLE, TABLE]
            )
            total_size, heap_size = cursor.fetchone()
            cursor.execute(
                "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
                [held.info.backend_pid],
            )
            held_xmin = cursor.fetchone()[0]
        state = StreamState.objects.filter(stream=STREAM).first()
        return {
            "rate": rate,
            "minutes": minutes,
            "published": phase["published"],
            "achieved_events_per_s": round(phase["published"] / (minutes * 60)),
            "archived_rows": rows,
            "exactly_once": rows == distinct_events == distinct_payloads == phase["published"],
            "seconds_to_drain_after_the_inflow": round(drain_seconds, 1),
            "held_snapshot_xmin": held_xmin,
            "claim_floor": getattr(state, "claim_floor", None),
            "buffer_total_bytes_end": total_size,
            "buffer_heap_bytes_end": heap_size,
            "buffer_at_end": sample(),
            "per_minute": held_minutes(phase),
            "samples": phase["samples"],
        }
    finally:
        held.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="per phase")
    parser.add_argument("--rate", type=int, default=300, help="events published per second")
    parser.add_argument("--standing", type=int, default=1_000_000, help="standing backlog")
    parser.add_argument(
        "--held-snapshot", action="store_true", help="one phase under a held snapshot"
    )
    args = parser.parse_args(argv)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.held_snapshot:
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            autovacuum = cursor.fetchone()[0]
        report = {
            "autovacuum": autovacuum,  # a held snapshot leaves vacuum nothing to remove
            "load_before": os.getloadavg(),
            **held_snapshot_run(args.minutes, args.rate),
            "load_after": os.getloadavg(),
        }
        out = ROOT / "artifacts" / "soak-held.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        summary = {k: v for k, v in report.items() if k != "samples"}
        print(json.dumps(summary, indent=2, default=str))
        return 0 if report["exactly_once"] else 1
    reset()
    names = ", ".join(tune.CHURN_PARAMETERS)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} RESET ({names})")
        cursor.execute("SHOW autovacuum_naptime")
        naptime = cursor.fetchone()[0]
        if server_settings(connection)["autovacuum"] != "on":
            print(
                "autovacuum is off on this server: the soak measures autovacuum, so it needs "
                "a server where it runs (python3 dev.py bench soak picks one).",
                file=sys.stderr,
            )
            return 2
    standing_backlog(args.standing)
    report: dict[str, Any] = {"rate": args.rate, "standing": args.standing, "naptime": naptime}
    with cluster():
        report["defaults"] = phase("defaults", args.minutes * 60, args.rate)
        report["applied"] = tune.apply()
        report["tuned"] = phase("tuned", args.minutes * 60, args.rate)
    out = ROOT / "artifacts" / "soak.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
