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
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg.copy import LibpqWriter

from django_outbox.conf import get_stream
from django_outbox.models import FloorHole, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams import claim_floor
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.publish import publish, publish_many
from django_outbox.streams.run import claim_group, run_stream
from django_outbox.streams.sql import claim_floor as floor_sql
from django_outbox.streams.status import stream_status
from tests.conftest import InlineRunner, publish_unwoken, unwoken
from tests.settings import DJANGO_OUTBOX, ORDERED_STREAM

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


def floor(stream: str = STREAM) -> int:
    return StreamState.objects.get(stream=stream).claim_floor


def advance(times: int = 3, stream: str = STREAM) -> int:
    """Let the floor move as often as a run loop would in a few seconds."""
    config = get_stream(stream)
    for _ in range(times):
        claim_floor.advance(config, StreamState.objects.get(stream=stream), force=True)
    return floor(stream)


def advance_until(expected: int, timeout: float = 60, stream: str = STREAM) -> int:
    """Move the floor until it reaches *expected*, checking it never passes it.

    The barrier waits for every transaction on the server that was in progress when
    it was taken (other databases' too), so how many moves it takes is not fixed.
    """
    deadline = time.monotonic() + timeout
    while (now := advance(1, stream)) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert now == expected
    assert advance(stream=stream) == expected  # and it stays there
    return now


def take_barrier(timeout: float = 60) -> None:
    """Advance until the floor's next move waits for a barrier (the transactions open
    now): the pending id is published and committed, then the barrier taken."""
    deadline = time.monotonic() + timeout
    while StreamState.objects.get(stream=STREAM).floor_barrier is None:
        assert time.monotonic() < deadline
        advance(1)


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
    advance(1)  # the barrier

    other.rollback()
    advance_until(ids[0] - 1)
    assert claim() == [ids[0]]


def test_a_late_row_claimed_by_a_claim_still_in_progress_holds_the_floor_below_it(other):
    late = insert_held_open(other)
    early = publish_unwoken(STREAM, [{"n": 1}])
    assert claim() == early
    take_barrier()
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
        result = distribute_stream(STREAM)
    assert result.backlog == 1
    assert floor() == row - 1
    runner.drain()
    assert not OutboxEvent.objects.filter(id=row).exists()  # claimed, handled, archived


def claim_buffers(stream: str = STREAM) -> int:
    """Shared buffers the stream's next claim touches, as the run loop issues it."""
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            claim_group(stream, run_here=True, state=StreamState.objects.get(stream=stream))
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


def move_rows(rows: int, stream: str = STREAM, keys: int = 0) -> None:
    """Publish *rows* rows and let a run claim, handle, archive and delete them all,
    and its floor catch up. With *keys*, the rows have that many order keys, in turn."""
    key = "(n %% %s)::text" if keys else "NULL"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (created_at, stream, payload, order_key) "
            f"SELECT now(), %s, jsonb_build_object('n', n), {key} "
            "FROM generate_series(1, %s) n RETURNING id",
            [stream, *([keys] if keys else []), rows],
        )
        last = max(row[0] for row in cursor.fetchall())
    runner = InlineRunner()
    with runner.capturing():  # the runs a full claim starts beside it
        run_stream(stream, budget=600)
    runner.drain()
    assert not OutboxEvent.objects.exists()
    advance_until(last, stream=stream)


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


def test_an_ordered_claims_cost_is_flat_in_the_dead_rows_a_held_snapshot_keeps(other, monkeypatch):
    """An ordered claim reads the keys in groups and takes every free key's waiting
    rows: each of those reads starting from an index's oldest end (the group index's
    entries, a key's first entry) would step over every row of it moved since the
    snapshot was taken (issue 39)."""
    stream = "ordered_audit"
    options = {
        **DJANGO_OUTBOX,
        "STREAMS": {
            **DJANGO_OUTBOX["STREAMS"],
            stream: {**DJANGO_OUTBOX["STREAMS"][STREAM], "ORDER_KEY": "key"},
        },
    }
    monkeypatch.setattr(claim_floor, "ADVANCE_SECONDS", 0.0)
    with override_settings(DJANGO_OUTBOX=options):
        StreamState.objects.update_or_create(stream=stream, defaults={"batch_size_override": 200})
        other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        other.execute("SELECT 1")  # a report's snapshot, held: vacuum can remove nothing

        def waiting_rows() -> None:
            """20 rows of 10 keys, the first two (keys 0 and 1) in a group."""
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {TABLE} (created_at, stream, payload, order_key) "
                    "SELECT now(), %s, '{}', (n %% 10)::text FROM generate_series(0, 19) n",
                    [stream],
                )
            StreamState.objects.filter(stream=stream).update(batch_size_override=2)
            assert len(claim_ordered(stream)) == 2
            StreamState.objects.filter(stream=stream).update(batch_size_override=200)

        move_rows(2_000, stream, keys=10)
        waiting_rows()
        after_few = claim_buffers(stream)
        OutboxEvent.objects.all().delete()
        OutboxGroup.objects.filter(stream=stream).delete()

        move_rows(20_000, stream, keys=10)
        waiting_rows()
        after_many = claim_buffers(stream)

    # Ten times the dead rows behind it, and the claim touches the same pages (the
    # indexes' growth aside); reading from the indexes' oldest ends it touched 4,430
    # more here (699, then 5,129 buffers).
    assert after_many <= after_few + 50, (after_few, after_many)


def claim_ordered(stream: str) -> list[int]:
    """Claim a group of *stream* as a run does; return its row ids."""
    result = claim_group(stream, run_here=True, state=StreamState.objects.get(stream=stream))
    return sorted(OutboxEvent.objects.filter(group_id=result.group_id).values_list("id", flat=True))


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


# -- rows written below the floor, or at or below the pending id, by every path -------

SEQUENCE = f"pg_get_serial_sequence('{TABLE}', 'id')"


def unclaimed_ids() -> list[int]:
    return sorted(
        OutboxEvent.objects.filter(stream=STREAM, group_id__isnull=True).values_list(
            "id", flat=True
        )
    )


def write_publish() -> None:
    publish(STREAM, {"path": "publish"})


def write_publish_many() -> None:
    publish_many(STREAM, [{"path": "publish_many", "n": n} for n in range(2)])


def write_create() -> None:
    OutboxEvent.objects.create(stream=STREAM, payload={"path": "create"})


def write_bulk_create() -> None:
    OutboxEvent.objects.bulk_create(
        [OutboxEvent(stream=STREAM, payload={"path": "bulk_create", "n": n}) for n in range(2)]
    )


def write_insert() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (created_at, stream, payload) VALUES (now(), %s, %s)",
            [STREAM, json.dumps({"path": "insert"})],
        )


def write_copy() -> None:
    with connection.cursor() as cursor:
        copy_sql = f"COPY {TABLE} (created_at, stream, payload) FROM STDIN"
        with cursor.cursor.copy(copy_sql) as copy:
            copy.write_row(["now", STREAM, json.dumps({"path": "copy"})])


WRITERS = [write_publish, write_publish_many, write_create, write_bulk_create, write_insert]


@pytest.fixture
def cached_sequence() -> Iterator[None]:
    """The buffer's id sequence with ``CACHE 20``: each session takes 20 ids at a time."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {SEQUENCE}")
        (sequence,) = cursor.fetchone()
        cursor.execute(f"ALTER SEQUENCE {sequence} CACHE 20")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER SEQUENCE {sequence} CACHE 1")


@pytest.mark.parametrize("write", [*WRITERS, write_copy], ids=lambda w: w.__name__[6:])
def test_a_row_below_the_floor_from_a_cached_sequence_is_claimed_next(
    write, cached_sequence, other, monkeypatch
):
    # the test claims
    monkeypatch.setattr("django_outbox.streams.publish.wake", lambda *a, **k: None)
    monkeypatch.setattr("django_outbox.streams.run.wake", lambda *a, **k: None)
    with unwoken():
        write()  # this session takes ids [first, first + 20)
    first = unclaimed_ids()
    later = insert_held_open(other)  # another session's ids: above this one's
    other.commit()
    assert later > max(first) + 1
    assert claim() == [*first, later]
    advance_until(later)

    with unwoken():
        write()  # from this session's cached ids: below the floor
    below = unclaimed_ids()
    assert below and max(below) < later

    assert claim() == below  # the run loop's next claim, not distribute's
    advance_until(later)


@pytest.mark.parametrize("write", [write_create, write_insert], ids=["create", "insert"])
def test_a_row_with_an_explicit_id_below_the_floor_is_claimed_next(write):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval({SEQUENCE})")  # an id taken long before its row
        (early,) = cursor.fetchone()
    ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert claim() == ids
    advance_until(max(ids))

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT setval({SEQUENCE}, %s, false)", [early])
    with unwoken():
        write()  # its row takes the id *early*: as if written with that id
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT setval({SEQUENCE}, %s)", [max(ids)])  # forward again
    assert unclaimed_ids() == [early]

    assert claim() == [early]


def test_rows_with_explicit_ids_in_a_bulk_create_below_the_floor_are_claimed_next():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval({SEQUENCE}), nextval({SEQUENCE})")
        reserved = list(cursor.fetchone())
    ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert claim() == ids
    advance_until(max(ids))

    with unwoken():
        OutboxEvent.objects.bulk_create(
            [OutboxEvent(id=i, stream=STREAM, payload={"n": i}) for i in reserved]
        )
    assert claim() == reserved


def test_a_copy_whose_ids_were_taken_before_its_transaction_id_is_claimed_next(other):
    """``COPY`` takes each row's id as it arrives and a transaction id only when it
    flushes its rows: no barrier sees the session meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval({SEQUENCE})")  # logs the next 32: the COPY's won't
    cursor = other.cursor()
    writer = LibpqWriter(cursor, flush_threshold=1)  # each write reaches the server
    with cursor.copy(
        f"COPY {TABLE} (created_at, stream, payload) FROM STDIN", writer=writer
    ) as copy:
        copy.write(f"now\t{STREAM}\t{{}}\n")
        wait_for_copied_rows(other.info.backend_pid, 1)
        assert backend_xid(other.info.backend_pid) is None  # its id taken, no xid yet
        ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
        assert claim() == ids
        advance_until(max(ids))  # the barrier cannot see the COPY: the floor passes its row
    other.commit()
    (copied,) = unclaimed_ids()
    assert copied < min(ids)

    assert claim() == [copied]


def test_a_row_at_or_below_the_pending_id_holds_the_floor_until_its_transaction_ends(other):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval({SEQUENCE})")
        (early,) = cursor.fetchone()
    ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert claim() == ids
    take_barrier()  # the floor may move to max(ids) once the open transactions end
    other.execute(
        f"INSERT INTO {TABLE} (id, created_at, stream, payload) VALUES (%s, now(), %s, '{{}}')",
        [early, STREAM],
    )  # its transaction id comes after the barrier: the trigger holds the floor's lock

    for _ in range(5):
        assert advance(1) < early

    other.commit()
    assert claim() == [early]
    advance_until(max(ids))


def test_a_repeatable_read_writer_below_the_floor_is_claimed_next(other):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval({SEQUENCE})")
        (early,) = cursor.fetchone()
    other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    other.execute("SELECT claim_floor FROM django_outbox_streamstate")  # its snapshot
    ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert claim() == ids
    advance_until(max(ids))
    other.execute(
        f"INSERT INTO {TABLE} (id, created_at, stream, payload) VALUES (%s, now(), %s, '{{}}')",
        [early, STREAM],
    )  # the floor it could read is its snapshot's, from before the move
    other.commit()

    assert claim() == [early]


@pytest.mark.parametrize("restart", ["truncate", "setval"])
def test_rows_after_a_restarted_identity_are_claimed_and_the_floor_comes_down(restart):
    ids = publish_unwoken(STREAM, [{"n": n} for n in range(5)])
    assert claim() == ids
    advance_until(max(ids))
    with connection.cursor() as cursor:
        if restart == "truncate":
            cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")
        else:
            cursor.execute(f"DELETE FROM {TABLE}")
            cursor.execute(f"SELECT setval({SEQUENCE}, 1, false)")

    (first,) = publish_unwoken(STREAM, [{"n": "after"}])
    assert first < floor()
    assert claim() == [first]  # this process still remembers the old ids as claimed

    # The floor comes down to the new ids; rows after them are in id order again.
    deadline = time.monotonic() + 60
    while advance(1) > first:
        assert time.monotonic() < deadline
    assert not FloorHole.objects.filter(stream=STREAM).exists()
    later = publish_unwoken(STREAM, [{"n": n} for n in range(3)])
    assert not FloorHole.objects.filter(stream=STREAM).exists()  # no hole: above the floor
    assert claim() == later
    advance_until(max(later))


def test_a_buffer_without_the_trigger_keeps_no_floor_and_says_so(other):
    ids = publish_unwoken(STREAM, [{"n": 1}, {"n": 2}])
    assert claim() == ids
    advance_until(max(ids))
    with connection.cursor() as cursor:
        for sql in floor_sql.drop_trigger_statements(connection, TABLE):
            cursor.execute(sql)
    try:
        claim_floor.forget()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT nextval({SEQUENCE})")
            (early,) = cursor.fetchone()
            cursor.execute(
                f"INSERT INTO {TABLE} (id, created_at, stream, payload) "
                "VALUES (%s, now(), %s, '{}')",
                [early, STREAM],
            )  # (an id above the floor: the floor would claim it either way)
            cursor.execute(
                f"INSERT INTO {TABLE} (id, created_at, stream, payload) "
                "VALUES (%s, now(), %s, '{}')",
                [min(ids) - 1, STREAM],
            )
        assert "no claim floor trigger" in stream_status(STREAM).claim_floor_off
        assert claim() == sorted([min(ids) - 1, early])  # from the index's oldest end
        out = StringIO()
        call_command("outbox_status", STREAM, stdout=out)
        assert f"{STREAM} keeps no claim floor: the buffer table {TABLE}" in out.getvalue()
    finally:
        with connection.cursor() as cursor:
            for sql in floor_sql.trigger_statements(connection, TABLE, None):
                cursor.execute(sql)
        claim_floor.forget()
    assert stream_status(STREAM).claim_floor_off == ""


def wait_for_copied_rows(pid: int, rows: int, timeout: float = 30) -> None:
    """Wait until the COPY of backend *pid* has taken *rows* rows (and their ids)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(
                "SELECT tuples_processed FROM pg_stat_progress_copy WHERE pid = %s", [pid]
            )
            row = cursor.fetchone()
            if row and row[0] >= rows:
                return
            assert time.monotonic() < deadline, "the COPY took no row"
            time.sleep(0.01)


def backend_xid(pid: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT backend_xid::text FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0]


def test_a_streams_own_buffer_table_gets_the_trigger_after_migrate():
    """``migrate`` put the trigger on the custom buffer model's table too."""
    from marketing.models import ContactActivity, ContactActivityEvent, Lead

    config = get_stream("marketing")
    assert claim_floor.off_reason(config) == ""
    activity = ContactActivity.objects.create(lead=Lead.objects.create(name="a"), kind="call")

    def claim_marketing() -> list[int]:
        state = StreamState.objects.get(stream="marketing")
        result = claim_group("marketing", run_here=True, state=state)
        claimed = ContactActivityEvent.objects.filter(group_id=result.group_id)
        return sorted(claimed.values_list("id", flat=True)) if result.group_id else []

    with unwoken():
        first = ContactActivityEvent.objects.create(activity=activity)
    assert claim_marketing() == [first.id]
    # As if the floor had passed the next id (taken by a session that commits late):
    StreamState.objects.filter(stream="marketing").update(claim_floor=first.id + 5)
    with unwoken():
        below = ContactActivityEvent.objects.create(activity=activity)
    assert FloorHole.objects.filter(stream="marketing", low=below.id).exists()

    assert claim_marketing() == [below.id]


def test_an_ordered_streams_row_below_the_floor_goes_first_and_frees_its_key():
    """A row of an ordered stream written below the floor neither waits nor holds back
    its key's later rows: the next claim takes it, then them."""
    from tests.testapp.models import OrderedEvent

    stream = "ordered"
    options = {**DJANGO_OUTBOX, "STREAMS": {**DJANGO_OUTBOX["STREAMS"], stream: ORDERED_STREAM}}
    with override_settings(DJANGO_OUTBOX=options):
        claim_floor.install_triggers(connection.alias)
        StreamState.objects.get_or_create(stream=stream)
        table = OrderedEvent._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT nextval(pg_get_serial_sequence('{table}', 'id'))")
            (early,) = cursor.fetchone()

        def claim_ordered() -> list[tuple[int, str]]:
            state = StreamState.objects.get(stream=stream)
            result = claim_group(stream, run_here=True, state=state)
            claim_floor.claimed(stream, result.highest_id)
            rows = OrderedEvent.objects.filter(group_id=result.group_id).order_by("id")
            return list(rows.values_list("id", "aggregate_id")) if result.group_id else []

        with unwoken():
            others = OrderedEvent.objects.bulk_create(
                [OrderedEvent(aggregate_id="other") for _ in range(2)]
            )
        assert claim_ordered() == [(row.id, "other") for row in others]
        deadline = time.monotonic() + 60
        while StreamState.objects.get(stream=stream).claim_floor < others[-1].id:
            assert time.monotonic() < deadline
            claim_floor.advance(
                get_stream(stream), StreamState.objects.get(stream=stream), force=True
            )

        with unwoken():
            OrderedEvent.objects.create(id=early, aggregate_id="k")  # below the floor
            later = OrderedEvent.objects.create(aggregate_id="k")

        assert claim_ordered() == [(early, "k"), (later.id, "k")]
