"""The statements of a stream's claim floor (PostgreSQL; see
:mod:`django_outbox.streams.claim_floor` for why each move is safe): the advance, the lowering,
the floor a claim starts from, and the insert trigger that records holes."""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper

from django_outbox.models.state import FloorHole, StreamState
from django_outbox.streams.sql.base import BufferOps


class FloorStep(NamedTuple):
    """What one advance did: the floor and pending id now, whether a barrier waits,
    and whether the caller's highest id was published into the pending id."""

    floor: int
    pending: int
    barrier: bool
    published: bool


#: The advisory lock of a stream's floor (transaction-scoped): a writer whose rows may
#: be at or below the pending id holds it shared until it ends; a move takes it
#: exclusively, without waiting, and does not move when it cannot.
LOCK_KEYS = "hashtext('django_outbox.floor'), hashtext({stream})"

#: This database's transactions that hold a transaction id now, as 64-bit ids
#: (``xid8``, placed in the epoch of *nx*, the ``xmax`` of the statement's snapshot):
#: sessions' (``pg_stat_activity.backend_xid``, which every role may read) and prepared
#: ones. Another database's transactions cannot write this table, so they do not count.
OPEN_TRANSACTIONS = (
    "SELECT nx + d - CASE WHEN d >= 2147483648 THEN 4294967296 ELSE 0 END AS xid "
    "FROM (SELECT snap.nx, (x::text::bigint - snap.nx %% 4294967296 + 4294967296) "
    "%% 4294967296 AS d FROM ("
    "SELECT backend_xid AS x FROM pg_stat_activity "
    "WHERE datname = current_database() AND backend_xid IS NOT NULL "
    "UNION ALL SELECT transaction FROM pg_prepared_xacts "
    "WHERE database = current_database()) open, snap) xids"
)

#: The trigger on every buffer table of PostgreSQL, and its functions.
TRIGGER = "django_outbox_floor"
TRIGGER_FUNCTION = "django_outbox_floor_guard"
HOLE_FUNCTION = "django_outbox_floor_hole"

_STATE = StreamState._meta.db_table
_HOLES = FloorHole._meta.db_table

#: One statement's new rows of one stream, *p_low* to *p_high*: nothing more when they
#: are all above the floor and the pending id (READ COMMITTED: the read sees every
#: committed move). Otherwise the stream's lock, shared, so no move happens until this
#: transaction ends, and a hole when the floor is at or above the lowest row already.
#: Another isolation level reads an old snapshot: a hole, read nothing.
_CREATE_HOLE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {HOLE_FUNCTION}(p_stream text, p_low bigint, p_high bigint)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_floor bigint;
    v_pending bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        INSERT INTO {_HOLES} (stream, low, high) VALUES (p_stream, p_low, p_high);
        RETURN;
    END IF;
    SELECT s.claim_floor, s.floor_pending INTO v_floor, v_pending
      FROM {_STATE} s WHERE s.stream = p_stream;
    IF NOT FOUND OR p_low > GREATEST(v_floor, v_pending) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({LOCK_KEYS.format(stream="p_stream")});
    SELECT s.claim_floor INTO v_floor FROM {_STATE} s WHERE s.stream = p_stream;
    IF p_low <= v_floor THEN
        INSERT INTO {_HOLES} (stream, low, high)
            VALUES (p_stream, p_low, LEAST(p_high, v_floor));
    END IF;
END
$$;
"""

#: The statement trigger's function: the generic buffer's rows by stream; a stream's
#: own table names its stream as the trigger's argument. A statement of one stream whose
#: rows are all above the floor and the pending id (the common case) costs one read of
#: the state row.
_CREATE_TRIGGER_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {TRIGGER_FUNCTION}() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_stream text;
    v_last text;
    v_low bigint;
    v_high bigint;
    r record;
BEGIN
    IF TG_NARGS > 0 THEN
        SELECT TG_ARGV[0], TG_ARGV[0], min(n.id), max(n.id)
          INTO v_stream, v_last, v_low, v_high FROM new_rows n;
    ELSE
        SELECT min(n.stream), max(n.stream), min(n.id), max(n.id)
          INTO v_stream, v_last, v_low, v_high FROM new_rows n;
    END IF;
    IF v_low IS NULL THEN
        RETURN NULL;
    ELSIF v_stream IS DISTINCT FROM v_last THEN
        FOR r IN SELECT n.stream, min(n.id) AS low, max(n.id) AS high
                 FROM new_rows n GROUP BY n.stream LOOP
            PERFORM {HOLE_FUNCTION}(r.stream, r.low, r.high);
        END LOOP;
    ELSIF current_setting('transaction_isolation') <> 'read committed'
          OR NOT v_low > (SELECT GREATEST(s.claim_floor, s.floor_pending)
                          FROM {_STATE} s WHERE s.stream = v_stream) THEN
        PERFORM {HOLE_FUNCTION}(v_stream, v_low, v_high);
    END IF;
    RETURN NULL;
END
$$;
"""


def create_functions(connection: BaseDatabaseWrapper) -> list[str]:
    """The statements that install the trigger's functions (PostgreSQL; else none)."""
    if connection.vendor != "postgresql":
        return []
    return [_CREATE_HOLE_FUNCTION, _CREATE_TRIGGER_FUNCTION]


def drop_functions(connection: BaseDatabaseWrapper) -> list[str]:
    if connection.vendor != "postgresql":
        return []
    return [
        f"DROP FUNCTION IF EXISTS {TRIGGER_FUNCTION}()",
        f"DROP FUNCTION IF EXISTS {HOLE_FUNCTION}(text, bigint, bigint)",
    ]


def trigger_statements(
    connection: BaseDatabaseWrapper, table: str, stream: str | None
) -> list[str]:
    """The statements that put the floor's trigger on buffer table *table* (of one
    *stream*, or None: the generic buffer, whose rows name theirs)."""
    if connection.vendor != "postgresql":
        return []
    qn = connection.ops.quote_name
    argument = "" if stream is None else "'" + stream.replace("'", "''") + "'"
    return [
        f"DROP TRIGGER IF EXISTS {TRIGGER} ON {qn(table)}",
        f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON {qn(table)} "
        f"REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {TRIGGER_FUNCTION}({argument})",
    ]


def drop_trigger_statements(connection: BaseDatabaseWrapper, table: str) -> list[str]:
    if connection.vendor != "postgresql":
        return []
    return [f"DROP TRIGGER IF EXISTS {TRIGGER} ON {connection.ops.quote_name(table)}"]


def functions_found(connection: BaseDatabaseWrapper) -> bool:
    """Whether the trigger's functions are installed (PostgreSQL, migrated)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT to_regproc('{TRIGGER_FUNCTION}') IS NOT NULL")
        row = cursor.fetchone()
    return bool(row and row[0])


def triggered_tables(connection: BaseDatabaseWrapper) -> list[str]:
    """The tables that carry the floor's trigger (PostgreSQL; else none)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = %s AND pg_table_is_visible(c.oid)",
            [TRIGGER],
        )
        return [row[0] for row in cursor.fetchall()]


#: Whether *table* carries the trigger, for *stream* (NULL: the generic buffer's).
_TRIGGER_FOUND = (
    "SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
    f"WHERE t.tgrelid = to_regclass(%s) AND t.tgname = '{TRIGGER}' "
    f"AND p.proname = '{TRIGGER_FUNCTION}' AND NOT t.tgisinternal AND t.tgenabled <> 'D' "
    "AND (CASE WHEN %s::text IS NULL THEN t.tgnargs = 0 ELSE t.tgnargs = 1 "
    "AND split_part(encode(t.tgargs, 'escape'), '\\000', 1) = %s END))"
)


def trigger_found(connection: BaseDatabaseWrapper, table: str, stream: str | None) -> bool:
    """Whether buffer table *table* records the holes of *stream* (None: the generic
    buffer's rows, each of its own stream)."""
    with connection.cursor() as cursor:
        cursor.execute(_TRIGGER_FOUND, [connection.ops.quote_name(table), stream, stream])
        row = cursor.fetchone()
    return bool(row and row[0])


class ClaimFloorSQL:
    """The claim floor of *stream*, kept in its state row, over the buffer of *ops*."""

    def __init__(self, ops: BufferOps, stream: str) -> None:
        self.ops = ops
        self.stream = stream
        self.state_table = ops.qn(_STATE)
        self.holes_table = ops.qn(_HOLES)

    def trigger_found(self) -> bool:
        """Whether the stream's buffer table carries the trigger that records holes."""
        generic = self.ops.stream is not None
        return trigger_found(
            self.ops.connection, self.ops.model._meta.db_table, None if generic else self.stream
        )

    def advance(self, highest_id: int) -> FloorStep | None:
        """Two statements, in the caller's transaction: one step of the floor.

        The state row holds the floor, the *pending* id the floor may move to next, and
        the *barrier* taken after the pending id was committed. Each step does one of:

        * *publish*: no barrier waits and nothing is pending: the pending id becomes
          *highest_id*, the highest id the caller claimed since it last published (the
          barrier is taken by a later statement, after this commit);
        * *barrier*: the transactions that hold an id now, once the pending id is
          committed, and nothing else changes until the move;
        * *move*: the barrier has passed (every one of its transactions has ended as
          this statement's snapshot sees it) and the stream's lock was free: one MVCC
          read, in the same snapshot, finds the lowest row up to the pending id that is
          still unclaimed (committed late, its claim rolled back, or claimed by a
          transaction still in progress), from the floor or the lowest hole, and the
          floor goes to just below it, or to the pending id; the holes whose rows are
          all at or below the new floor go. Never above the id sequence's last value:
          when the identity was restarted or the sequence set back, the floor comes
          down to it, and the rows after it are above the floor again. The pending id
          becomes *highest_id* if that is higher than the new floor (and than the
          pending id, when the floor stopped below it).

        Each step is a compare-and-set on the row it read (a concurrent step, or the
        safety net's lowering, wins). Returns None when the stream has no state row.
        """
        keys = LOCK_KEYS.format(stream="%s")
        locked = self.ops.fetchone(f"SELECT pg_try_advisory_xact_lock({keys})", [self.stream])
        # (the shared table: the stream's rows)
        where = "AND b.stream = %(stream)s" if self.ops.stream is not None else ""
        table, state, holes = self.ops.table, self.state_table, self.holes_table
        sql = (
            "WITH snap AS MATERIALIZED (SELECT s, pg_snapshot_xmax(s)::text::bigint AS nx "
            "FROM pg_current_snapshot() s), "
            "seen AS MATERIALIZED (SELECT st.claim_floor AS floor, st.floor_pending AS "
            f"pending, st.floor_barrier AS barrier FROM {state} st WHERE st.stream = %(stream)s), "
            f"hole AS MATERIALIZED (SELECT MIN(h.low) AS low FROM {holes} h "
            "WHERE h.stream = %(stream)s), "
            "step AS MATERIALIZED (SELECT seen.*, hole.low AS hole, "
            "pg_sequence_last_value(pg_get_serial_sequence(%(table)s, 'id')) AS top, CASE "
            "WHEN seen.barrier IS NOT NULL THEN CASE WHEN %(locked)s AND NOT EXISTS ("
            "SELECT 1 FROM jsonb_array_elements_text(seen.barrier) b "
            "WHERE NOT pg_visible_in_snapshot(b::xid8, snap.s)) THEN 'move' END "
            "WHEN %(hi)s::bigint > seen.pending AND seen.pending = seen.floor THEN 'publish' "
            "WHEN seen.pending <> seen.floor OR hole.low IS NOT NULL THEN 'barrier' "
            "END AS action FROM seen, snap, hole), "
            "goal AS MATERIALIZED (SELECT step.*, CASE WHEN step.action = 'move' THEN "
            f"COALESCE((SELECT MIN(b.id) - 1 FROM {table} b WHERE b.group_id IS NULL {where} "
            "AND b.id > LEAST(step.floor, step.hole - 1) "
            "AND b.id <= LEAST(step.pending, step.top)), LEAST(step.pending, step.top)) "
            "END AS target FROM step), "
            f"moved AS (UPDATE {state} st SET "
            "claim_floor = CASE WHEN goal.action = 'move' THEN goal.target "
            "ELSE st.claim_floor END, "
            "floor_pending = CASE WHEN goal.action = 'publish' THEN %(hi)s::bigint "
            "WHEN goal.action = 'move' THEN GREATEST(%(hi)s::bigint, goal.target, CASE "
            "WHEN goal.target < LEAST(goal.pending, goal.top) THEN goal.pending END) "
            "ELSE st.floor_pending END, "
            "floor_barrier = CASE WHEN goal.action = 'barrier' "
            f"THEN to_jsonb(ARRAY({OPEN_TRANSACTIONS})) END "
            "FROM goal WHERE st.stream = %(stream)s AND goal.action IS NOT NULL "
            "AND st.claim_floor = goal.floor AND st.floor_pending = goal.pending "
            "AND st.floor_barrier IS NOT DISTINCT FROM goal.barrier "
            "RETURNING st.claim_floor, st.floor_pending, st.floor_barrier, goal.action), "
            f"filled AS (DELETE FROM {holes} h USING moved, goal "
            "WHERE moved.action = 'move' AND h.stream = %(stream)s AND h.high <= goal.target) "
            "SELECT COALESCE(m.claim_floor, g.floor), COALESCE(m.floor_pending, g.pending), "
            "CASE WHEN m.action IS NULL THEN g.barrier ELSE m.floor_barrier END IS NOT NULL, "
            "COALESCE(m.action IN ('publish', 'move') AND %(hi)s::bigint > 0, FALSE) "
            "FROM goal g LEFT JOIN moved m ON TRUE"
        )
        values: dict[str, str | int | bool] = {
            "stream": self.stream,
            "table": self.ops.table,
            "locked": bool(locked and locked[0]),
            "hi": highest_id,
        }
        with self.ops.connection.cursor() as cursor:
            cursor.execute(sql, values)
            row = cursor.fetchone()
        if row is None:
            return None
        return FloorStep(int(row[0]), int(row[1]), bool(row[2]), bool(row[3]))

    def lower(self, lowest_id: int) -> int | None:
        """Lower the floor below *lowest_id*, an unclaimed row, if it passed it.

        Returns the lowered floor, or None when the floor was already below the row.
        """
        row = self.ops.fetchone(
            f"UPDATE {self.state_table} SET claim_floor = %s "
            "WHERE stream = %s AND claim_floor >= %s RETURNING claim_floor",
            [lowest_id - 1, self.stream, lowest_id],
        )
        return None if row is None else int(row[0])


def claim_start(holes_table: str, floor: int, stream: str) -> tuple[str, list[Any]]:
    """The id a claim of *stream* starts above, as SQL: *floor*, or below the lowest
    hole (a row recorded at or below the floor when it was written), whichever is lower."""
    if floor <= 0:
        return "%s", [floor]
    return (
        f"LEAST(%s::bigint, (SELECT MIN(h.low) FROM {holes_table} h WHERE h.stream = %s) - 1)",
        [floor, stream],
    )
