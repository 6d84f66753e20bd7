"""The statements that move a stream's claim floor (PostgreSQL; see
:mod:`django_outbox.claim_floor` for why each move is safe)."""

from __future__ import annotations

from typing import NamedTuple

from django_outbox.db.base import BufferOps
from django_outbox.models import StreamState


class FloorStep(NamedTuple):
    """What one advance found: the floor now, the barrier for the next candidate, and
    whether the candidate's barrier had passed."""

    floor: int
    barrier: list[int]
    passed: bool


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


class ClaimFloorSQL:
    """The claim floor of *stream*, kept in its state row, over the buffer of *ops*."""

    def __init__(self, ops: BufferOps, stream: str) -> None:
        self.ops = ops
        self.stream = stream
        self.state_table = ops.qn(StreamState._meta.db_table)

    def advance(self, highest_id: int | None, barrier: list[int] | None) -> FloorStep | None:
        """One statement: move the floor up to *highest_id* once *barrier* has passed.

        *barrier* is the set of transactions that were open when a statement after the
        claim of *highest_id* ran (what this statement returns for the next candidate).
        It has passed when every one of them has ended as this statement's snapshot
        sees it; then one MVCC read, in the same snapshot, finds the lowest row at or
        below the candidate that is still unclaimed (committed late, or its claim rolled
        back, or claimed by a transaction still in progress) and the floor stops below
        it. The update is a compare-and-set on the floor the statement read, so a
        concurrent move (an advance, the safety net's lowering) wins. Must run in a
        transaction of its own (``pg_stat_activity`` is read once per transaction).
        Returns None when the stream has no state row.
        """
        where, params = self.ops.stream_clause()
        table, state = self.ops.table, self.state_table
        sql = (
            "WITH snap AS MATERIALIZED (SELECT s, pg_snapshot_xmax(s)::text::bigint AS nx "
            "FROM pg_current_snapshot() s), "
            "seen AS MATERIALIZED ("
            f"SELECT st.claim_floor AS floor FROM {state} st WHERE st.stream = %s), "
            "passed AS MATERIALIZED (SELECT NOT EXISTS (SELECT 1 FROM unnest(%s::bigint[]) b "
            "WHERE NOT pg_visible_in_snapshot(b::text::xid8, snap.s)) AS passed FROM snap), "
            "goal AS MATERIALIZED ("
            "SELECT seen.floor, passed.passed, "
            "CASE WHEN passed.passed THEN COALESCE("
            f"(SELECT MIN(b.id) - 1 FROM {table} b WHERE b.group_id IS NULL {where} "
            "AND b.id > seen.floor AND b.id <= %s::bigint), %s::bigint) END AS target "
            "FROM seen, passed), "
            f"moved AS (UPDATE {state} st SET claim_floor = goal.target FROM goal "
            "WHERE st.stream = %s AND st.claim_floor = goal.floor AND goal.target > goal.floor "
            "RETURNING st.claim_floor) "
            "SELECT COALESCE((SELECT claim_floor FROM moved), goal.floor), "
            f"ARRAY({OPEN_TRANSACTIONS}), COALESCE(goal.passed, FALSE) FROM goal"
        )
        row = self.ops.fetchone(
            sql,
            [self.stream, barrier, *params, highest_id, highest_id, self.stream],
        )
        if row is None:
            return None
        return FloorStep(int(row[0]), [int(x) for x in row[1]], bool(row[2]))

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
