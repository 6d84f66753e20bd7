"""The statements of ordered streams (``ORDER_KEY``): the ordered claim, held keys, and
the reads that keep a key's rows together (see :mod:`django_outbox.streams.ordering`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django_outbox.base.dialect import column_name, concrete_field
from django_outbox.models.groups import OutboxGroup
from django_outbox.models.held import HeldKey
from django_outbox.streams.sql.base import BufferOps

#: Serializes the ordered claims of one stream (PostgreSQL, transaction-scoped): the
#: next claim's statement starts after the last one committed, so it sees that claim's
#: groups and never skips a locked row of a key to take the key's later rows.
CLAIM_LOCK = "SELECT pg_advisory_xact_lock(hashtext('django_outbox.ordered_claim'), hashtext(%s))"


class OrderedSQL:
    """The ordered statements of a stream over the buffer of *ops*, keyed by *key*."""

    def __init__(self, ops: BufferOps, stream: str, key: str) -> None:
        self.ops = ops
        self.stream = stream
        self.key = ops.qn(column_name(ops._column_field(key)))
        self.held_table = ops.qn(HeldKey._meta.db_table)
        self.groups_table = ops.qn(OutboxGroup._meta.db_table)

    def lock_statement(self) -> tuple[str, list[Any]] | None:
        """The statement that serializes the stream's claims, where claims can overlap."""
        if self.ops.dialect.serializes_writers:
            return None  # SQLite: the write lock serializes every claim already
        return CLAIM_LOCK, [self.stream]

    def pick(self, floor: str = "%s") -> str:
        """The ids an ordered claim takes: for each key, every waiting row, in id order.

        A row is taken only if no row of its key is in a group (claimed, running,
        retrying or being dead-lettered) and its key is not held by a dead letter. The
        scan starts at the claim's start, *floor* (the SQL of
        :meth:`BufferOps.floor_start`), which is at or below every waiting row: the claim
        floor never passes an unclaimed row, and a row written at or below it is a hole
        the start goes below (:mod:`django_outbox.streams.claim_floor`). So every waiting
        row of a free key is in the scan, and the limit cuts them in id order: a key's
        taken rows are a prefix of its waiting ones. Rows whose key is NULL are not
        ordered. Parameters: :meth:`pick_params`.
        """
        table, key = self.ops.table, self.key
        postgres = self.ops.dialect.vendor == "postgresql"
        lock = " FOR UPDATE OF r" if postgres else ""
        # The generic buffer is shared: every read keeps to the stream's rows, in the
        # order of its (stream, …) indexes.
        shared = self.ops.stream is not None
        r_stream, e_stream = (" AND r.stream = %s", " AND e.stream = %s") if shared else ("", "")
        r_order = "r.stream, r.id" if shared else "r.id"
        # The keys in groups and the held keys are read once per claim (a hashed set).
        # The rows in groups are found from the stream's group rows, one probe of the
        # buffer's group index per group: a scan of that partial index would step over
        # the entries every archived row leaves there until vacuum, and while a snapshot
        # is held that is every row moved since.
        groups = f"SELECT g.id FROM {self.groups_table} g WHERE g.stream = %s"
        in_groups = f"= ANY(ARRAY({groups}))" if postgres else f"IN ({groups})"
        return self.ops.dialect.id_pick(
            f"SELECT r.id FROM {table} r WHERE r.group_id IS NULL{r_stream} AND r.id > {floor} "
            f"AND (r.{key} IS NULL OR (r.{key} NOT IN (SELECT e.{key} FROM {table} e "
            f"WHERE e.group_id {in_groups} AND e.{key} IS NOT NULL{e_stream}) "
            f"AND CAST(r.{key} AS TEXT) NOT IN (SELECT h.{self.ops.qn('key')} "
            f"FROM {self.held_table} h WHERE h.stream = %s))) "
            f"ORDER BY {r_order} LIMIT %s{lock}"
        )

    def pick_params(self, floor: list[Any], limit: int) -> list[Any]:
        """The parameters of :meth:`pick`, in order (the stream's, on the shared table),
        with *floor* those of its floor's SQL."""
        shared = [self.stream] if self.ops.stream is not None else []
        return [*shared, *floor, self.stream, *shared, self.stream, limit]

    def hold_keys(self, group_id: uuid.UUID, error: str) -> int:
        """Hold the keys of the group's rows (being dead-lettered); return how many."""
        held = HeldKey._meta
        qn = self.ops.qn
        columns = ", ".join(
            qn(column_name(concrete_field(HeldKey, name)))
            for name in ("stream", "key", "group_id", "error")
        )
        group = held.get_field("group_id").get_db_prep_value(group_id, self.ops.connection)
        return self.ops.execute(
            f"INSERT INTO {self.held_table} ({columns}, {qn('held_at')}) "
            f"SELECT DISTINCT %s, CAST(b.{self.key} AS TEXT), %s, %s, {self.ops.dialect.now} "
            f"FROM {self.ops.table} b WHERE b.group_id = %s AND b.{self.key} IS NOT NULL "
            f"ON CONFLICT ({qn('stream')}, {qn('key')}) DO NOTHING",
            [self.stream, group, error, self.ops.group_param(group_id)],
        )

    def group_keys(self, group_id: uuid.UUID) -> list[tuple[int, Any]]:
        """(id, key) of the group's rows, in id order."""
        with self.ops.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, {self.key} FROM {self.ops.table} WHERE group_id = %s ORDER BY id",
                [self.ops.group_param(group_id)],
            )
            return [(int(row[0]), row[1]) for row in cursor.fetchall()]

    def regroup(self, ids: Sequence[int], group_id: uuid.UUID) -> int:
        """Move the rows *ids* to the group *group_id*."""
        where, params = self.ops.dialect.in_ids(ids)
        return self.ops.execute(
            f"UPDATE {self.ops.table} SET group_id = %s WHERE {where}",
            [self.ops.group_param(group_id), *params],
        )
