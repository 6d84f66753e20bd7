"""The raw-SQL floor: the same SQL work per event with psycopg alone, no Django, no queue.

Each worker claims batches with ``FOR UPDATE SKIP LOCKED``, fetches the group's rows,
serializes them as django_outbox's benchmark handler does, then moves them to the
archive with one ``DELETE … RETURNING`` statement, until no unclaimed row is left.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

CLAIM = (
    "UPDATE django_outbox_outboxevent SET group_id = %s WHERE id IN ("
    "SELECT id FROM django_outbox_outboxevent WHERE group_id IS NULL AND stream = %s "
    "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
)
FETCH = "SELECT id, payload FROM django_outbox_outboxevent WHERE group_id = %s ORDER BY id"
MOVE = (
    "WITH moved AS (DELETE FROM django_outbox_outboxevent WHERE group_id = %s "
    "RETURNING django_outbox_outboxevent.*) "
    "INSERT INTO django_outbox_archivedevent "
    "(stream, event_id, group_id, data, created_at, archived_at, outcome, attempts, error) "
    "SELECT stream, id, group_id, to_jsonb(moved), created_at, statement_timestamp(), "
    "'done', 1, '' FROM moved"
)


def work(
    conninfo: dict[str, Any], stream: str, batch_size: int, start: Any, results: Any, ready: Any
) -> None:
    """Once connected, release *ready* and wait for *start*; drain *stream*; put the
    number of events this worker moved on *results*."""
    moved = 0
    with psycopg.connect(autocommit=True, **conninfo) as conn:
        ready.release()
        start.wait()
        while True:
            group_id = uuid.uuid4()
            with conn.transaction():
                claimed = conn.execute(CLAIM, (group_id, stream, batch_size)).rowcount
            if not claimed:
                results.put(moved)
                return
            rows = conn.execute(FETCH, (group_id,)).fetchall()
            body = json.dumps([{"ref": pk, **payload} for pk, payload in rows])
            assert body
            with conn.transaction():
                moved += conn.execute(MOVE, (group_id,)).rowcount
