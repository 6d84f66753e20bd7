"""Dead tuples of the buffer under sustained load: PostgreSQL's defaults against tuned.

``python3 dev.py bench soak [--minutes M] [--rate N] [--standing ROWS]`` publishes N events/s
into the benchmark stream while a real qcluster drains it, next to a standing backlog of
another stream (a buffer that holds rows for a while, as during an outage of the remote
side). It samples the buffer's live and dead tuples every 5 s, first with the table's
autovacuum parameters reset to PostgreSQL's defaults, then after ``outbox_tune --apply``,
and prints the peak and mean dead-tuple ratio and the autovacuum runs of each phase.
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

from django.db import connection  # noqa: E402

from benchmarks.run import ROOT, STREAM, cluster, payload, reset  # noqa: E402
from django_outbox import publish_many, transport, tune  # noqa: E402
from django_outbox.db.tune import server_settings  # noqa: E402

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
            transport.enqueue(transport.DISTRIBUTE, [(STREAM,)])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="per phase")
    parser.add_argument("--rate", type=int, default=300, help="events published per second")
    parser.add_argument("--standing", type=int, default=1_000_000, help="standing backlog")
    args = parser.parse_args(argv)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
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
