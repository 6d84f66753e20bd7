"""The claim floor (PostgreSQL): claims start above the rows known to be claimed.

Rows commit out of id order and claims roll back: the floor must never pass a row that
is still to be claimed. A second connection plays the other transaction (an insert that
commits late, a claim that rolls back, a snapshot held for a long report). Under a held
snapshot, the claim's cost must not grow with the rows claimed and deleted before it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_outbox import claim_floor
from django_outbox.conf import get_stream
from django_outbox.distribute import distribute
from django_outbox.models import OutboxEvent, StreamState
from django_outbox.runs import claim_group, run
from django_outbox.status import stream_status
from tests.conftest import InlineRunner, publish_unwoken

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STREAM = "audit"
TABLE = "django_outbox_outboxevent"


@pytest.fixture(autouse=True)
def _fresh_candidates(monkeypatch):
    claim_floor.forget()
    StreamState.objects.get_or_create(stream=STREAM)
    yield
    claim_floor.forget()


@pytest.fixture
def other() -> Iterator[psycopg.Connection]:
    """A second session on the test database, in a transaction the test ends."""
    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k in ("dbname", "user", "password", "host", "port")
    }
    with psycopg.connect(**params) as conn:
        yield conn
        conn.rollback()


def floor() -> int:
    return StreamState.objects.get(stream=STREAM).claim_floor


def advance(times: int = 3) -> int:
    """Let the floor move as often as a run loop would in a few seconds."""
    config = get_stream(STREAM)
    for _ in range(times):
        claim_floor.advance(config, floor(), force=True)
    return floor()


def advance_until(expected: int, timeout: float = 60) -> int:
    """Move the floor until it reaches *expected*, checking it never passes it.

    The barrier waits for every transaction on the server that was in progress when
    it was taken (other databases' too), so how many moves it takes is not fixed.
    """
    deadline = time.monotonic() + timeout
    while (now := advance(1)) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert now == expected
    assert advance() == expected  # and it stays there
    return now


def claim() -> list[int]:
    """Claim a group as a run does; return its row ids."""
    state = StreamState.objects.get(stream=STREAM)
    result = claim_group(STREAM, run_here=True, state=state)
    claim_floor.claimed(STREAM, result.highest_id)
    if result.group_id is None:
        return []
    return sorted(OutboxEvent.objects.filter(group_id=result.group_id).values_list("id", flat=True))


def insert_held_open(conn: psycopg.Connection) -> int:
    """Insert a row of the stream in *conn*'s transaction, left open; return its id."""
    row = conn.execute(
        f"INSERT INTO {TABLE} (created_at, stream, payload) VALUES (now(), %s, %s) RETURNING id",
        [STREAM, json.dumps({"late": True})],
    ).fetchone()
    return row[0]


def test_a_row_committed_after_higher_ids_were_claimed_is_claimed_next(other):
    late = insert_held_open(other)  # its id is taken; it commits last
    early = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert min(early) > late

    assert claim() == early
    assert advance() < late  # its transaction is in progress: the barrier holds

    other.commit()
    assert claim() == [late]
    advance_until(max(early))


def test_a_rolled_back_claims_rows_are_claimed_again(other):
    ids = publish_unwoken(STREAM, [{"n": n} for n in range(3)])
    # Another claim holds the first row when ours runs: ours skips it.
    other.execute(f"UPDATE {TABLE} SET group_id = gen_random_uuid() WHERE id = %s", [ids[0]])
    assert claim() == ids[1:]
    claim_floor.advance(get_stream(STREAM), floor(), force=True)  # the barrier

    other.rollback()
    advance_until(ids[0] - 1)
    assert claim() == [ids[0]]


def test_a_late_row_claimed_by_a_claim_still_in_progress_holds_the_floor_below_it(other):
    late = insert_held_open(other)
    early = publish_unwoken(STREAM, [{"n": 1}])
    assert claim() == early
    claim_floor.advance(get_stream(STREAM), floor(), force=True)  # the barrier
    other.commit()
    # A claim that began after the barrier holds the late row, then rolls back.
    other.execute(f"UPDATE {TABLE} SET group_id = gen_random_uuid() WHERE id = %s", [late])

    advance_until(late - 1)

    other.rollback()
    assert claim() == [late]


def test_distribute_lowers_a_floor_that_passed_an_unclaimed_row():
    # The case the barrier cannot see: a backend preempted between taking its id and
    # being given a transaction id commits after the floor passed its row.
    (row,) = publish_unwoken(STREAM, [{"n": 1}])
    StreamState.objects.filter(stream=STREAM).update(claim_floor=row + 10)
    assert claim() == []  # the claim starts above the floor

    runner = InlineRunner()
    with runner.capturing():
        result = distribute(STREAM)
    assert result.backlog == 1
    assert floor() == row - 1
    runner.drain()
    assert not OutboxEvent.objects.filter(id=row).exists()  # claimed, handled, archived


def claim_buffers() -> int:
    """Shared buffers the stream's next claim touches, as the run loop issues it."""
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            claim_group(STREAM, run_here=True, state=StreamState.objects.get(stream=STREAM))
        transaction.set_rollback(True)
    (sql,) = [q["sql"] for q in queries.captured_queries if "SET group_id" in q["sql"]]
    return buffers_of(sql)


def buffers_of(sql: str) -> int:
    """Shared buffers *sql* touches (run and rolled back)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def status_buffers() -> int:
    """Shared buffers the stream's status (``outbox_status``, the metrics, the admin's
    dashboard) touches in the buffer table."""
    with CaptureQueriesContext(connection) as queries:
        status = stream_status(STREAM)
    assert status.backlog == 20
    reads = [q["sql"] for q in queries.captured_queries if TABLE in q["sql"]]
    assert len(reads) == 2  # the backlog's count and the oldest row
    return sum(buffers_of(sql) for sql in reads)


def move_rows(rows: int) -> None:
    """Publish *rows* rows and let a run claim, handle, archive and delete them all,
    and its floor catch up."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (created_at, stream, payload) "
            "SELECT now(), %s, jsonb_build_object('n', n) FROM generate_series(1, %s) n "
            "RETURNING id",
            [STREAM, rows],
        )
        last = max(row[0] for row in cursor.fetchall())
    runner = InlineRunner()
    with runner.capturing():  # the runs a full claim starts beside it
        run(STREAM, budget=600)
    runner.drain()
    assert not OutboxEvent.objects.exists()
    advance_until(last)


def test_the_claims_cost_is_flat_in_the_dead_rows_a_held_snapshot_keeps(other, monkeypatch):
    monkeypatch.setattr(claim_floor, "ADVANCE_SECONDS", 0.0)
    StreamState.objects.filter(stream=STREAM).update(batch_size_override=200)
    other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    other.execute("SELECT 1")  # a report's snapshot, held: vacuum can remove nothing

    move_rows(2_000)
    publish_unwoken(STREAM, [{"n": n} for n in range(20)])
    after_few = claim_buffers()

    move_rows(20_000)  # the 20 rows above among them
    publish_unwoken(STREAM, [{"n": n} for n in range(20)])
    after_many = claim_buffers()

    # Ten times the dead rows behind it, and the claim touches the same pages (the
    # indexes' growth aside); from the index's oldest end it touched 280 more here.
    assert after_many <= after_few + 50, (after_few, after_many)


def test_the_status_cost_is_flat_in_the_dead_rows_a_held_snapshot_keeps(other, monkeypatch):
    """Every scrape of the metrics reads each stream's status: from the index's oldest
    end it would step over every row moved since the snapshot was taken."""
    monkeypatch.setattr(claim_floor, "ADVANCE_SECONDS", 0.0)
    StreamState.objects.filter(stream=STREAM).update(batch_size_override=200)
    other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    other.execute("SELECT 1")

    move_rows(2_000)
    publish_unwoken(STREAM, [{"n": n} for n in range(20)])
    after_few = status_buffers()

    move_rows(20_000)
    publish_unwoken(STREAM, [{"n": n} for n in range(20)])
    after_many = status_buffers()

    assert after_many <= after_few + 50, (after_few, after_many)
