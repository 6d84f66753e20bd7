"""The statements that move a stream's claim floor (PostgreSQL; see
:mod:`django_outbox.claim_floor` for why each move is safe)."""

from __future__ import annotations

from typing import NamedTuple

from django_outbox.db.base import BufferOps
from django_outbox.models import StreamState


class FloorStep(NamedTuple):
    """What one advance found: the floor now, the barrier for the next candidate (the
    ``xmax`` of the statement's snapshot), and whether the candidate's barrier passed."""

    floor: int
    barrier: int
    passed: bool


class ClaimFloorSQL:
    """The claim floor of *stream*, kept in its state row, over the buffer of *ops*."""

    def __init__(self, ops: BufferOps, stream: str) -> None:
        self.ops = ops
        self.stream = stream
        self.state_table = ops.qn(StreamState._meta.db_table)

    def advance(self, highest_id: int | None, barrier: int | None) -> FloorStep | None:
        """One statement: move the floor up to *highest_id* once *barrier* has passed.

        The candidate (*highest_id*, *barrier*) passed when the statement's snapshot has
        no transaction older than *barrier* in progress. Then one MVCC read finds the
        lowest row at or below the candidate that is still unclaimed (committed late, or
        its claim rolled back, or claimed by a transaction still in progress) and the
        floor stops below it. The update is a compare-and-set on the floor the statement
        read, so a concurrent move (an advance, the safety net's lowering) wins. Returns
        None when the stream has no state row.
        """
        where, params = self.ops.stream_clause()
        table, state = self.ops.table, self.state_table
        sql = (
            "WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s), "
            "seen AS MATERIALIZED ("
            f"SELECT s.claim_floor AS floor FROM {state} s WHERE s.stream = %s), "
            "goal AS MATERIALIZED ("
            "SELECT seen.floor, "
            "pg_snapshot_xmax(snap.s)::text::bigint AS barrier, "
            "pg_snapshot_xmin(snap.s)::text::bigint >= %s::bigint AS passed, "
            "CASE WHEN pg_snapshot_xmin(snap.s)::text::bigint >= %s::bigint THEN COALESCE("
            f"(SELECT MIN(b.id) - 1 FROM {table} b WHERE b.group_id IS NULL {where} "
            "AND b.id > seen.floor AND b.id <= %s::bigint), %s::bigint) END AS target "
            "FROM snap, seen), "
            f"moved AS (UPDATE {state} s SET claim_floor = goal.target FROM goal "
            "WHERE s.stream = %s AND s.claim_floor = goal.floor AND goal.target > goal.floor "
            "RETURNING s.claim_floor) "
            "SELECT COALESCE((SELECT claim_floor FROM moved), goal.floor), goal.barrier, "
            "COALESCE(goal.passed, FALSE) FROM goal"
        )
        row = self.ops.fetchone(
            sql,
            [
                self.stream,
                barrier,
                barrier,
                *params,
                highest_id,
                highest_id,
                self.stream,
            ],
        )
        return None if row is None else FloorStep(int(row[0]), int(row[1]), bool(row[2]))

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
