"""Process tier: the pipeline outlasts database restarts, with no operator and no restart.

A throwaway PostgreSQL (its own server, so that restarting it disturbs nothing else)
is restarted twice (fast shutdown: every session terminated, connections refused for
5 s) while a real qcluster drains 35,000 preloaded events of two streams under a steady
inflow of single transactions. Then: every committed event is delivered, the
``TRANSACTIONAL`` stream's database effects happened exactly once, the plain stream's
duplicates are bounded by the groups in flight, and the pipeline moved again within
seconds of each restart (it never waited for a lease: ``LEASE_SECONDS`` is 300 here and
no distribute runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest

from tests.outage import fresh_rows, restartable_postgres
from tests.procs import ROOT, child_env, qcluster, running, wait_until

pytestmark = [pytest.mark.process, pytest.mark.postgres]

PRELOAD = {"outage_tx": (0, 30_000), "outage_plain": (30_000, 35_000)}
INFLOW = {"rate": 800.0, "rows_per_commit": 4, "seconds": 24.0, "first": 1_000_000}
OUTAGE_SECONDS = 5.0
#: The plain stream may deliver again what was in flight at each restart: at most its
#: runs in flight (RUNS, 4) times a full batch (1,000), per restart.
PLAIN_DUPLICATES_BOUND = 2 * 4 * 1000


def test_two_database_restarts_mid_run_lose_nothing_and_stall_only_seconds(tmp_path):
    with restartable_postgres() as server:
        with psycopg.connect(server.conninfo("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE outbox_outage")
        env = {"DATABASE_URL": server.url("outbox_outage"), "OUTBOX_TEST_OUTAGE": "1"}
        django = [sys.executable, "-m", "django"]
        subprocess.run([*django, "migrate", "-v", "0"], cwd=ROOT, env=child_env(**env), check=True)
        preload = "; ".join(
            [
                "import django; django.setup()",
                "from django_outbox import publish_many",
                *(
                    f"publish_many({stream!r}, [{{'n': k}} for k in range({a}, {b})])"
                    for stream, (a, b) in PRELOAD.items()
                ),
            ]
        )
        subprocess.run([sys.executable, "-c", preload], cwd=ROOT, env=child_env(**env), check=True)

        db = Database(server.conninfo("outbox_outage"))
        report = tmp_path / "published.json"
        inflow = (
            "from tests.outage import publish_steadily; publish_steadily("
            f"{list(PRELOAD)!r}, {INFLOW['rate']}, {INFLOW['rows_per_commit']}, "
            f"{INFLOW['seconds']}, {INFLOW['first']}, {str(report)!r})"
        )
        recoveries = []
        with qcluster("outage-cluster", **env) as cluster:
            with running(["-c", inflow], "outage-publisher", **env) as publisher:
                for _ in range(2):
                    # Restart while work is flowing: once the archive has grown again.
                    base = db.archived_max()
                    wait_until(lambda b=base: db.archived_max() > b + 2_000, 60, watch=[cluster])
                    server.stop()
                    time.sleep(OUTAGE_SECONDS)  # the outage itself: connections refused
                    server.start()
                    back = time.monotonic()
                    base = db.archived_max()
                    wait_until(lambda b=base: db.archived_max() > b, 60, 0.01, watch=[cluster])
                    recoveries.append(time.monotonic() - back)
                publisher.wait(timeout=INFLOW["seconds"] + 60)
                assert publisher.returncode == 0
            wait_until(db.drained, 120, describe=db.describe, watch=[cluster])

        published = json.loads(report.read_text())
        committed = {stream: set(range(a, b)) for stream, (a, b) in PRELOAD.items()}
        for stream, first, last in published["committed"]:
            committed[stream].update(range(first, last + 1))
        unknown = {s: set() for s in PRELOAD}
        for stream, first, last in published["unknown"]:
            unknown[stream].update(range(first, last + 1))

        delivered = {stream: db.delivered(stream) for stream in PRELOAD}
        for stream in PRELOAD:
            missing = committed[stream] - set(delivered[stream])
            assert not missing, f"{stream}: {len(missing)} committed events not delivered"
            strangers = set(delivered[stream]) - committed[stream] - unknown[stream]
            assert not strangers, f"{stream}: {len(strangers)} events nobody published"
            twice = [n for n, count in delivered[stream].items() if count > 1]
            assert not twice, f"{stream}: {len(twice)} events archived twice"
        tx_effects = db.effects("outage_tx")
        assert sorted(tx_effects.values()) == [1] * sum(delivered["outage_tx"].values())
        plain_duplicates = sum(c - 1 for c in db.effects("outage_plain").values() if c > 1)
        assert plain_duplicates <= PLAIN_DUPLICATES_BOUND
        assert all(seconds < 10 for seconds in recoveries), recoveries
        print(
            f"\nevents delivered: {sum(len(d) for d in delivered.values()):,} "
            f"(inflow {len(published['committed'])} commits, {len(published['unknown'])} "
            f"failed during the outages); recovery after each restart: "
            f"{', '.join(f'{s:.2f} s' for s in recoveries)}; duplicated effects: "
            f"transactional 0, plain {plain_duplicates}"
        )


class Database:
    """Reads of the throwaway database, each on a fresh connection (it restarts)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

    def rows(self, sql: str, *params: object) -> list[tuple]:
        return fresh_rows(self.conninfo, sql, *params)

    def archived_max(self) -> int:
        return self.rows("SELECT coalesce(max(id), 0) FROM django_outbox_archivedevent")[0][0]

    def drained(self) -> bool:
        return (
            self.rows(
                "SELECT (SELECT count(*) FROM django_outbox_outboxevent)"
                " + (SELECT count(*) FROM django_outbox_outboxgroup)"
            )[0][0]
            == 0
        )

    def describe(self) -> str:
        return (
            str(
                self.rows(
                    "SELECT stream, state, attempt, size, lease_expires_at, last_error "
                    "FROM django_outbox_outboxgroup ORDER BY created_at LIMIT 5"
                )
            )
            + f" buffer: {self.rows('SELECT count(*) FROM django_outbox_outboxevent')[0][0]}"
        )

    def delivered(self, stream: str) -> Counter:
        return Counter(
            dict(
                self.rows(
                    "SELECT (data->'payload'->>'n')::bigint, count(*) "
                    "FROM django_outbox_archivedevent WHERE stream = %s AND outcome = 'done' "
                    "GROUP BY 1",
                    stream,
                )
            )
        )

    def effects(self, stream: str) -> Counter:
        """How many times the handler's committed effects name each event id."""
        return Counter(
            dict(
                self.rows(
                    "SELECT e::bigint, count(*) FROM testapp_handledcall, "
                    "jsonb_array_elements_text(event_ids::jsonb) AS e "
                    "WHERE stream = %s GROUP BY 1",
                    stream,
                )
            )
        )
