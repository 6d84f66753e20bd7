"""SQL of unique-job kinds: the conflict-free insert and the dispatch statement.

One :class:`JobTable` per kind and connection. The statements are the same on
PostgreSQL and SQLite but for the clock, ``SKIP LOCKED`` and the per-kind dispatch
lock: PostgreSQL takes a transaction-scoped advisory lock so that two dispatchers never
both fill the same free concurrency slots; SQLite's write lock (``IMMEDIATE``
transactions) already serializes them.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Field

from django_outbox.base.dialect import column_name, concrete_field, dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.models.state import KindState
from django_outbox.streams.sql import wake_guard
from django_outbox.unique.options import keyless_fields, kind_options

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

PENDING, RUNNING, PROCESSED = "pending", "running", "processed"
#: The condition of the unique index over the unique fields: jobs no worker started,
#: pending or dispatched (``models.unique.UNSTARTED``). The conflict target of the
#: enqueue's INSERT names it, in the order Django compiles it (SQLite matches a partial
#: index's condition by its form, not its meaning).
UNSTARTED_SQL = f"(state = '{PENDING}' OR (started_at IS NULL AND state = '{RUNNING}'))"
#: First key of the advisory lock of a dispatch (the second is the kind's table).
ADVISORY_NAMESPACE = 7_270_001


def new_token() -> int:
    """A fresh fencing token: a random positive 63-bit integer (never 0, the token of a
    job no worker started yet), drawn from the operating system's randomness, so that
    forked workers never draw the same."""
    return secrets.randbits(63) or 1


class JobTable:
    """Statements over one kind's table; every one a constant cost whatever its size."""

    def __init__(self, model: type[UniqueJob]) -> None:

        self.model = model
        self.options = kind_options(model)
        self.connection = connection_for(model)
        self.alias = self.connection.alias
        self.dialect = dialect_of(self.connection)
        self.qn = self.connection.ops.quote_name
        self.table = self.qn(model._meta.db_table)
        self.now = self.dialect.now
        self._kept_cursor: tuple[Any, Any] | None = None  # (raw connection, its cursor)
        #: Whether the last one-row insert found the kind at its concurrency, or this
        #: process's last wake of it untaken, under the wake guard's lock: its commit
        #: needs no dispatch (:mod:`.wake_guard`).
        self.guarded = False
        #: Whether the last one-row insert queued the kind's wake (``wake``).
        self.woke = False

    def columns(self, names: Sequence[str]) -> list[str]:
        return [self.qn(column_name(concrete_field(self.model, name))) for name in names]

    def _rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
        cursor = self._cursor()
        cursor.execute(sql, params if isinstance(params, Mapping) else list(params))
        return cursor.fetchall()

    def _cursor(self) -> Any:
        """A cursor kept for the statements of this object while its connection lives.

        Making a cursor costs about as much of the client's CPU as running a short
        statement (a chunk runs one statement per job); Django's wrappers, error
        translation and query logging apply to a kept cursor all the same.
        """
        self.connection.ensure_connection()
        raw = self.connection.connection
        if self._kept_cursor is None or self._kept_cursor[0] is not raw:
            self._kept_cursor = (raw, self.connection.cursor())
        return self._kept_cursor[1]

    # -- enqueue ---------------------------------------------------------------------

    def insert_pending(
        self,
        values: Sequence[tuple[Field, Any]],
        process_after: datetime | float | None,
        wake: tuple[str, str] | None = None,
    ) -> UniqueJob | None:
        """Insert a pending job unless one with the same unique key has not started.

        *values* are (field, database value) pairs of the payload; *process_after* is an
        aware datetime, seconds from the database's now, or None (now). Returns the new
        job, or None when the partial unique index said a twin waits to start (pending,
        or dispatched to a worker that has not started it).
        """
        created = self.insert_pending_many([values], process_after, wake=wake)
        return created[0] if created else None

    def insert_pending_many(
        self,
        rows: Sequence[Sequence[tuple[Field, Any]]],
        process_after: datetime | float | None,
        returning: Sequence[str] | None = None,
        common: Sequence[tuple[Field, Any]] = (),
        wake: tuple[str, str] | None = None,
    ) -> list[Any]:
        """Insert pending jobs, all with the same payload fields, in one statement; skip
        each whose unique key has a job not started (an earlier row of *rows* included).

        One row on PostgreSQL asks the wake guard (:attr:`guarded`); with *wake* (a
        cluster key and a signed package) the same statement also queues that django-q2
        task unless the guard said a worker will dispatch after this commit (:attr:`woke`).

        *common* are (field, database value) pairs every row shares, sent once instead of
        once per row. Returns the jobs inserted, in the order of *rows*: model
        instances, or with *returning* (field names, ``id`` first) tuples of those
        values, converted as the ORM would, without building instances.
        """
        if not rows:
            return []
        if common and len(rows) == 1:  # one row: a plain VALUES list is cheaper to plan
            rows, common = [[*common, *rows[0]]], ()
        names = [self.qn(column_name(field)) for field, _ in rows[0]]
        after_params: list[Any]
        if process_after is None:
            after_sql, after_params = self.now, []
        elif isinstance(process_after, datetime):
            after_sql = "%s"
            after_params = [self.connection.ops.adapt_datetimefield_value(process_after)]
        else:
            after_sql, after_params = self.dialect.seconds_from_now(process_after)
        conflict = ""
        if self.options.unique_fields and not self._keyless(rows, common):
            target = ", ".join(self.columns(self.options.unique_fields))
            conflict = f" ON CONFLICT ({target}) WHERE {self.unstarted_with_key()} DO NOTHING"
        meta = self.model._meta
        fields: Sequence[Field[Any, Any]] = (
            meta.concrete_fields
            if returning is None
            else [concrete_field(self.model, n) for n in returning]
        )
        returned = ", ".join(self.qn(column_name(field)) for field in fields)
        columns = [
            *names,
            "state",
            "attempt",
            "token",
            "process_after",
            "created_at",
            "last_error",
            "worker",
        ]
        bookkeeping = [f"'{PENDING}'", "0", "0", after_sql, self.now, "''", "''"]
        params: list[Any] = []
        if common:
            # INSERT … SELECT from a VALUES list: the shared values appear once, cast to
            # their columns' types (a parameter alone in a select list has none).
            def cast(field: Field, sql: str) -> str:
                return f"CAST({sql} AS {field.db_type(self.connection)})"

            fields_of_row = [field for field, _ in rows[0]]
            select = [
                *(cast(field, "%s") for field, _ in common),
                *(cast(f, f"v.column{i}") for i, f in enumerate(fields_of_row, start=1)),
                *bookkeeping,
            ]
            columns = [self.qn(column_name(field)) for field, _ in common] + columns
            params += [value for _, value in common] + after_params
            row_sql = ", ".join(["%s"] * len(names))
            for values in rows:
                params += [value for _, value in values]
            sql = (
                f"INSERT INTO {self.table} ({', '.join(columns)}) SELECT {', '.join(select)} "
                f"FROM (VALUES {', '.join(f'({row_sql})' for _ in rows)}) AS v WHERE true"
                f"{conflict} RETURNING {returned}"
            )
        else:
            row_sql = ", ".join(["%s"] * len(names) + bookkeeping)
            for values in rows:
                params += [value for _, value in values]
                params += after_params
            sql = (
                f"INSERT INTO {self.table} ({', '.join(columns)}) VALUES "
                f"{', '.join(f'({row_sql})' for _ in rows)}{conflict} RETURNING {returned}"
            )
        guard = len(rows) == 1 and self.guards()
        if guard:
            # The guard rides in the statement (one call, for the one row inserted): it
            # answers whether the commit may skip its dispatch, and with *wake* queues
            # that task unless a worker in flight, or the wake this process queued last
            # and no worker has taken yet, will dispatch after this commit.
            queued_key = (self.alias, self.model._meta.label, wake[0] if wake else "")
            sql += (
                f", {wake_guard.JOB_FUNCTION}(%s, %s, %s, %s::bigint, %s::text, %s::text, %s::text)"
            )
            params += [self.model._meta.label, self.table, self.options.concurrency]
            last_id, last_digest = wake_guard.last_queued(queued_key)
            params += [last_id, last_digest, *(wake or (None, None))]
        found = self._rows(sql, params)
        answer = found[0][-1] if guard and found else wake_guard.WAKE_AFTER_COMMIT
        self.guarded = answer == wake_guard.SKIP
        self.woke = answer > 0
        if self.woke and wake is not None:
            wake_guard.remember_queued(queued_key, answer, wake[1])
        if guard:
            found = [row[:-1] for row in found]
        if returning is not None:
            values = [self._values(fields, row) for row in found]
            return sorted(values, key=lambda row: row[0])
        created = [self._instance(fields, row) for row in found]
        return sorted(created, key=lambda job: job.pk)

    def unstarted_with_key(self) -> str:
        """The unique index's condition as its conflict target names it (the same form
        as Django compiles ``models.unique.unstarted_with_key``: SQLite compares them)."""
        keyed = [
            f"{self.qn(column_name(concrete_field(self.model, name)))} IS NOT NULL"
            for name in keyless_fields(self.model)
        ]
        if not keyed:
            return UNSTARTED_SQL
        return f"({' AND '.join([UNSTARTED_SQL, *keyed])})"

    def guards(self) -> bool:
        """Whether a one-row insert asks the wake guard (PostgreSQL, with the kinds'
        state on this database)."""
        return wake_guard.guarded(self.connection) and connection_for(KindState) is self.connection

    def raise_wake_epoch(self) -> int | None:
        """Raise the kind's wake epoch; return the one enqueues relied on (None where
        no enqueue skips its dispatch: nothing to wait for)."""
        if not self.guards():
            return None
        state_table = self.qn(KindState._meta.db_table)
        row = self._rows(
            f"INSERT INTO {state_table} (kind, wake_epoch) VALUES (%s, 1) "
            f"ON CONFLICT (kind) DO UPDATE SET wake_epoch = {state_table}.wake_epoch + 1 "
            "RETURNING wake_epoch - 1",
            [self.model._meta.label],
        )
        return int(row[0][0])

    def enqueuers_done(self, epoch: int) -> bool:
        """Whether every enqueue that skipped its dispatch under *epoch* has ended."""
        return wake_guard.publishers_done(
            self.connection, self.model._meta.label, epoch, keys=wake_guard.JOB_LOCK_KEYS
        )

    def _keyless(
        self, rows: Sequence[Sequence[tuple[Field, Any]]], common: Sequence[tuple[Field, Any]]
    ) -> bool:
        """Whether no row can hit the unstarted-jobs index: each holds a NULL in its unique
        fields (``nullable_keys``), which a unique index never matches. Such rows are
        inserted without ``ON CONFLICT``, which would probe the index for nothing."""
        if not self.options.nullable_keys:
            return False
        key = set(self.options.unique_fields)

        def has_null(pairs: Sequence[tuple[Field, Any]]) -> bool:
            return any(field.name in key and value is None for field, value in pairs)

        return has_null(common) or all(has_null(row) for row in rows)

    def _values(self, fields: Sequence[Field], row: Sequence[Any]) -> tuple[Any, ...]:
        """Raw column values converted as the ORM would."""
        values = []
        for field, value in zip(fields, row, strict=True):
            column = field.get_col(self.model._meta.db_table)
            converters = self.connection.ops.get_db_converters(column) + field.get_db_converters(
                self.connection
            )
            for convert in converters:
                value = convert(value, column, self.connection)
            values.append(value)
        return tuple(values)

    def _instance(self, fields: Sequence[Field], row: Sequence[Any]) -> UniqueJob:
        """Build a model instance from raw column values, converted as the ORM would."""
        values = self._values(fields, row)
        return self.model.from_db(self.alias, [field.attname for field in fields], list(values))

    # -- dispatch --------------------------------------------------------------------

    def lock_dispatch(self) -> None:
        """Serialize dispatchers of this kind until the transaction ends.

        PostgreSQL takes a transaction-scoped advisory lock; SQLite's write lock already
        serializes them. On PostgreSQL a dispatch that is its own transaction then
        commits without waiting for the log flush (``synchronous_commit = off`` for it
        alone): a server crash can only undo a whole dispatch (its jobs pending again,
        its queue rows gone with them, and a chunk already handed to Redis finds its
        jobs not started and runs nothing), and any later synchronous commit makes it
        durable.

        Such a dispatch also reads in index order (:attr:`Dialect.index_order`): the
        next ready jobs and the expired leases are the first entries of their partial
        indexes, so a dispatch costs the same with ten pending jobs or a million, and
        with or without planner statistics.
        """
        if not self.dialect.serializes_writers:
            # Only when the dispatch is its own transaction: inside a caller's, the
            # settings would cover the caller's own statements too.
            alone = len(self.connection.atomic_blocks) == 1
            settings = self.dialect.no_flush_wait + self.dialect.index_order if alone else ""
            self._rows(
                f"SELECT pg_advisory_xact_lock(%s, hashtext(%s)){settings}",
                [ADVISORY_NAMESPACE, self.model._meta.db_table],
            )

    def count_running(self, cap: int) -> int:
        """Count running jobs, stopping at *cap* (the kind's concurrency)."""
        return int(self._rows(*self.running_sql(cap))[0][0])

    def running_sql(self, cap: int) -> tuple[str, list[Any]]:
        """The query of :meth:`count_running`.

        Ordered by the running jobs' lease index, so that the planner walks that index
        (and stops at *cap*) whatever its statistics say: unordered, statistics taken
        while most of the table was running make it scan the whole table for a few
        rows, on every dispatch and every commit that asks for one.
        """
        return (
            f"SELECT COUNT(*) FROM (SELECT 1 FROM {self.table} WHERE state = %s "
            "ORDER BY lease_expires_at LIMIT %s) AS r",
            [RUNNING, cap],
        )

    def _start_set(self) -> tuple[str, list[Any]]:
        # A dispatched job is no worker's yet: token 0, which no worker holds (a stalled
        # worker of its last run must not match it before its new worker starts it).
        expiry, params = self.dialect.seconds_from_now(self.options.lease_seconds)
        return (
            f"SET state = %s, attempt = attempt + 1, lease_expires_at = {expiry}, "
            "started_at = NULL, finished_at = NULL, worker = '', token = 0",
            [RUNNING, *params],
        )

    def next_ready_sql(self) -> tuple[str, list[Any]]:
        """The query of the ids of the next ready jobs that may start, in the kind's order.

        A pending job may start when it is due and no job of its exclusive key is
        running. With ``created`` ordering no older pending job of its key may exist
        (due or not: happens-before); with ``ready`` ordering no pending job of its key
        may be due before it.
        """
        options = self.options
        key = self.columns(options.exclusive_fields)
        clauses = [f"j.state = %s AND j.process_after <= {self.now}"]
        params: list[Any] = [PENDING]
        if key:
            same = " AND ".join(f"o.{column} = j.{column}" for column in key)
            # A job whose key holds a NULL (nullable_keys) has no key: it is not looked
            # up at all, which also keeps the lookup a per-row probe of the index.
            nullable = [
                column
                for name, column in zip(options.exclusive_fields, key, strict=True)
                if options.nullable_keys and self.model._meta.get_field(name).null
            ]
            keyless = "".join(f"j.{column} IS NULL OR " for column in nullable)
            clauses.append(
                f"({keyless}NOT EXISTS (SELECT 1 FROM {self.table} AS o "
                f"WHERE o.state = %s AND {same}))"
            )
            params.append(RUNNING)
            if not options.one_pending_per_exclusive_key:
                before = (
                    "o.id < j.id"
                    if options.ordering != "ready"
                    else "(o.process_after, o.id) < (j.process_after, j.id)"
                )
                clauses.append(
                    f"NOT EXISTS (SELECT 1 FROM {self.table} AS o "
                    f"WHERE o.state = %s AND {same} AND {before})"
                )
                params.append(PENDING)
        order = "j.id" if options.ordering != "ready" else "j.process_after, j.id"
        if options.priority_field:
            order = f"j.{self.columns([options.priority_field])[0]} DESC, {order}"
        lock = self.dialect.skip_locked
        sql = (
            f"SELECT j.id FROM {self.table} AS j WHERE {' AND '.join(clauses)} "
            f"ORDER BY {order} LIMIT %s{lock}"
        )
        return sql, params

    def start_next(self, limit: int) -> list[tuple[int, int]]:
        """Mark up to *limit* next ready jobs running (attempt n + 1) in one statement.

        Returns (id, attempt) pairs in the kind's order. Raises IntegrityError if the
        unique-while-executing index rejects one of them (the caller falls back to
        :meth:`start_one`).
        """
        select, select_params = self.next_ready_sql()
        assignments, set_params = self._start_set()
        # A materialized CTE runs the LIMIT query once: as an IN (subquery), PostgreSQL
        # may run it again for every row of a nested loop and start more than *limit*.
        # The ids are picked by primary key (Dialect.id_pick), whatever the planner
        # believes of the table (a join may walk every pending row per id when it has
        # no statistics yet). No "state = 'pending'" beside it (a partial
        # index would tempt the planner): the query locked the rows it found pending
        # (PostgreSQL), or holds the database's write lock (SQLite).
        # RETURNING gives no order: it returns the sort key too (priority, then the due
        # time with ``ready`` ordering, then id), and the rows are sorted here.
        key = []
        if self.options.priority_field:
            key.append(self.columns([self.options.priority_field])[0])
        if self.options.ordering == "ready":
            key.append("process_after")
        rows = self._rows(
            f"WITH next AS MATERIALIZED ({select}) UPDATE {self.table} {assignments} "
            f"WHERE {self.dialect.id_pick('SELECT id FROM next')} "
            f"RETURNING {', '.join(['id', 'attempt', *key])}",
            [*select_params, limit, *set_params],
        )

        def order(row: Sequence[Any]) -> tuple[Any, ...]:
            rest = list(row[2:])
            if self.options.priority_field:
                rest[0] = -rest[0]
            return (*rest, row[0])

        return [(int(row[0]), int(row[1])) for row in sorted(rows, key=order)]

    def next_ready_ids(self, limit: int) -> list[int]:
        """The ids :meth:`start_next` would start, without starting them (the fallback)."""
        select, params = self.next_ready_sql()
        return [int(row[0]) for row in self._rows(select, [*params, limit])]

    def start_one(self, job_id: int) -> tuple[int, int] | None:
        """Mark one pending job running; None if it is no longer pending."""
        assignments, set_params = self._start_set()
        rows = self._rows(
            f"UPDATE {self.table} {assignments} WHERE id = %s AND state = %s RETURNING id, attempt",
            [*set_params, job_id, PENDING],
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    # -- execution -------------------------------------------------------------------

    def step(
        self,
        finish: tuple[int, int] | None,
        start: tuple[int, int] | None,
        worker: str,
        result: Any = None,
        *,
        token: int | None = None,
    ) -> tuple[bool, bool]:
        """Mark one job processed and start the next, in one statement; either may be None.

        *finish* is an (id, token) pair, *start* an (id, attempt) pair started with
        *token* (a fresh one by default); *result* is the finished job's (see
        :meth:`steps`). Returns whether each matched.
        """
        finished, started = self.steps(
            [(*finish, result)] if finish else [],
            [start] if start else [],
            worker,
            token=new_token() if token is None else token,
        )
        return (
            finish is not None and finish[0] in finished,
            start is not None and start[0] in started,
        )

    def steps(
        self,
        finishes: Sequence[tuple[int, int, Any]],
        starts: Sequence[tuple[int, int]],
        worker: str,
        *,
        token: int = 0,
        resumed: bool = False,
    ) -> tuple[set[int], set[int]]:
        """Mark jobs processed and start others, in one statement; either list may be empty.

        *finishes* are (id, token, result) triples, *starts* (id, attempt) pairs.
        Finishing matches a job only while it runs under that fencing token; starting
        matches it only while no worker has started that attempt (``started_at`` NULL),
        and stamps the start, gives it *token* (fresh for every statement that starts
        jobs: :func:`new_token`; the jobs started together share it), renews the lease
        and records *worker*. Returns the ids of the jobs finished and of those started
        (one missing: the lease is lost, or the attempt is not ours to start). A kind
        with a ``result_field`` stores each finished job's result (a database value);
        one with a ``workers_field`` appends *worker* to each started job's.

        The token, not the attempt, fences what the worker does next (finish, renew,
        record a failure): a started job handed back with its attempt not counted (its
        group crashed while another job of it ran) runs that attempt number again, under
        another token, and the stalled worker of the first run changes nothing.

        Stamping the start frees a job's unique key (it leaves the index of jobs not
        started): from then on an enqueue of that key creates a new job. Every job of
        *starts* frees its key in this statement, also those that will run after others.

        *resumed*: the same statement (with the same *token*) runs again after a
        connection error left unknown whether it committed. A finish then also matches
        a job already processed under its token, and a start a job already started
        with *token* (either is its own doing), without changing either again.

        Run on its own (not inside a transaction of the caller's), the statement commits
        without waiting for the log flush (:attr:`Dialect.no_flush_wait`): a server crash
        right after can lose the step, and the jobs then run again (at least once), never
        less; any later synchronous commit (a dispatch, the job's own writes) makes it
        durable.
        """
        if starts and not token:
            raise ValueError("Starting jobs takes a fresh token (new_token()).")
        # Named parameters, each id sent once however often the SQL names it (in ten
        # places): a group of 8 takes 44 parameters, and psycopg caches the parsed form
        # of a statement of at most 50 (143 positional ones were parsed on every call).
        named = _Named()
        expiry = named.sql(*self.dialect.seconds_from_now(self.options.lease_seconds))
        now = self.now
        flush = "" if self.connection.in_atomic_block else self.dialect.no_flush_wait
        # An empty list stands as one NULL id, which matches no row.
        none: list[tuple[int | None, int | None]] = [(None, None)]
        finish_pairs = [(pk, fence) for pk, fence, _ in finishes] or none
        start_pairs = list(starts) or none
        finish_ids = [pk for pk, _ in finish_pairs]
        finish_names = [named(pk) for pk in finish_ids]
        start_names = [named(pk) for pk, _ in start_pairs]
        done = f"id IN ({', '.join(finish_names)})"
        extra = ""
        if self.options.result_field:
            column = self.columns([self.options.result_field])[0]
            results = [result for _, _, result in finishes] or [None]
            cases = " ".join(
                f"WHEN id = {name} THEN {named(result)}"
                for name, result in zip(finish_names, results, strict=True)
            )
            extra += f", {column} = CASE {cases} ELSE {column} END"
        if self.options.workers_field:
            column = self.columns([self.options.workers_field])[0]
            extra += (
                f", {column} = CASE WHEN {done} OR started_at IS NOT NULL THEN {column} "
                f"ELSE {column} || {named(f'{worker}{chr(10)}')} END"
            )
        # A running job's finished_at is NULL and a job to start has no started_at: the
        # COALESCEs keep the times of a step *resumed* after its commit went through.
        finishing = f"state = '{RUNNING}'"
        starting = "started_at IS NULL"
        if resumed:
            finishing = f"state IN ('{RUNNING}', '{PROCESSED}')"
            starting = f"(started_at IS NULL OR token = {named(token)})"
        finish_fence = _fence(finish_names, [f for _, f in finish_pairs], "token", named)
        start_fence = _fence(start_names, [a for _, a in start_pairs], "attempt", named)
        # The conditions sit inside a CASE so that the planner finds the rows by primary
        # key: a plain "state = 'running'" lets it pick the partial index of running
        # jobs and walk all of them.
        sql = (
            f"UPDATE {self.table} SET "
            f"state = CASE WHEN {done} THEN '{PROCESSED}' ELSE state END, "
            f"finished_at = CASE WHEN {done} THEN COALESCE(finished_at, {now}) "
            "ELSE finished_at END, "
            f"last_error = CASE WHEN {done} THEN '' ELSE last_error END, "
            f"lease_expires_at = CASE WHEN {done} THEN NULL ELSE {expiry} END, "
            f"started_at = CASE WHEN {done} THEN started_at ELSE COALESCE(started_at, {now}) END, "
            f"token = CASE WHEN {done} THEN token ELSE {named(token)} END, "
            f"worker = CASE WHEN {done} THEN worker ELSE {named(worker)} END{extra} "
            f"WHERE id IN ({', '.join([*finish_names, *start_names])}) "
            f"AND CASE WHEN {done} THEN {finishing} AND {finish_fence} "
            f"ELSE state = '{RUNNING}' AND {start_fence} AND {starting} END "
            f"RETURNING id{flush}"
        )
        params = named.params
        matched = {int(row[0]) for row in self._rows(sql, params)}
        return (
            {pk for pk in finish_ids if pk in matched},
            {pk for pk, _ in starts if pk in matched},
        )

    def renew(self, jobs: Sequence[tuple[int, int]]) -> set[int]:
        """Extend the leases of running jobs, (id, token) pairs, by ``lease_seconds``
        from now; return the ids still ours (the others' lease is lost)."""
        if not jobs:
            return set()
        named = _Named()
        expiry = named.sql(*self.dialect.seconds_from_now(self.options.lease_seconds))
        names = [named(pk) for pk, _ in jobs]
        fence = _fence(names, [value for _, value in jobs], "token", named)
        rows = self._rows(
            f"UPDATE {self.table} SET lease_expires_at = {expiry} "
            f"WHERE id IN ({', '.join(names)}) "
            f"AND CASE WHEN id IS NOT NULL THEN state = '{RUNNING}' AND {fence} END "
            "RETURNING id",
            named.params,
        )
        return {int(row[0]) for row in rows}


class _Named:
    """Named parameters for one statement: ``named(value)`` is a new placeholder for
    *value*; the caller repeats a placeholder where the SQL names a value again (each
    is then sent once). Values are never shared by equality: with server-side binding
    a parameter has one type, and a NULL of one column is not a NULL of another."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:
        name = f"p{len(self.params)}"
        self.params[name] = value
        return f"%({name})s"

    def sql(self, sql: str, params: Sequence[Any]) -> str:
        """*sql* with its positional ``%s`` parameters named."""
        parts = sql.split("%s")
        if len(parts) != len(params) + 1:
            raise ValueError(f"{len(params)} parameters for {len(parts) - 1} placeholders")
        return "".join(
            part + (self(value) if index < len(params) else "")
            for index, (part, value) in enumerate(zip(parts, [*params, None], strict=True))
        )


def _fence(names: Sequence[str], values: Sequence[Any], column: str, named: _Named) -> str:
    """SQL true for a row whose id is one of the placeholders *names* and whose *column*
    (``attempt`` or ``token``) is the value of *values* at the same place."""
    cases = " ".join(
        f"WHEN {name} THEN {column} = {named(value)}"
        for name, value in zip(names, values, strict=True)
    )
    return f"CASE id {cases} ELSE FALSE END"
