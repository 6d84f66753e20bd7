"""Transient database errors, and a bounded retry of a transaction that hit one.

Deadlocks and serialization failures (PostgreSQL SQLSTATE 40P01 and 40001), a dropped
connection, and SQLite's "database is locked" all mean: the same transaction may well
succeed if run again. Anything else is a real error and is raised at once.

A database that restarts (an upgrade, a failover) refuses connections for seconds:
longer than the quick retries. :func:`outlast_outage` waits for it to answer again
(:func:`await_database`) and then runs the transaction once more, so work interrupted
by the outage goes on within a second of the database coming back instead of waiting
for its lease to expire.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_SQLSTATES = {
    "40P01",  # deadlock_detected
    "40001",  # serialization_failure
    "57P01",  # admin_shutdown: the session was terminated (failover, pooler, operator)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
}
CONNECTION_EXCEPTION_CLASS = "08"  # connection_exception and its subclasses
ATTEMPTS = 3
#: While waiting for a database to come back, ask it again at most this often.
POLL_SECONDS = 0.5
#: An attempt interrupted by the database going away is run again this many times at
#: most, each once the database answers again.
OUTAGE_RERUNS = 2


def is_transient(exc: BaseException, alias: str) -> bool:
    """Whether *exc* is worth running the same transaction again for."""
    if not isinstance(exc, DatabaseError):
        return False
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None) or ""
    if sqlstate in RETRYABLE_SQLSTATES or sqlstate.startswith(CONNECTION_EXCEPTION_CLASS):
        return True
    if isinstance(exc, OperationalError) and "database is locked" in str(exc):
        return True
    connection = connections[alias]
    return isinstance(exc, (OperationalError, InterfaceError)) and (
        connection.connection is None or not connection.is_usable()
    )


def retry_transient(
    fn: Callable[[], T],
    alias: str,
    *,
    what: str,
    attempts: int = ATTEMPTS,
    base_delay: float = 0.02,
    max_delay: float = 0.2,
) -> T:
    """Run the transaction *fn*, again after a transient error, at most *attempts* times.

    Between tries it sleeps a jittered exponential backoff: a random 50 to 100 % of
    ``min(max_delay, base_delay * 2 ** (try - 1))``, so two transactions that deadlocked
    do not collide again in step. Only at the top level: inside a caller's transaction
    a retry would repeat only part of it, so the error is raised unchanged.
    """
    connection = connections[alias]
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except DatabaseError as exc:
            if attempt == attempts or connection.in_atomic_block or not is_transient(exc, alias):
                raise
            logger.warning(
                "Transient error during %s (try %s of %s): %s", what, attempt, attempts, exc
            )
            connection.close_if_unusable_or_obsolete()
            if connection.connection is not None and not connection.is_usable():
                connection.close()
            delay = min(max_delay, base_delay * 2 ** (attempt - 1))
            time.sleep(random.uniform(delay / 2, delay))
    raise AssertionError("unreachable")


def database_answers(alias: str) -> bool:
    """Whether the database *alias* answers a new connection now (the old one is dropped)."""
    connection = connections[alias]
    try:
        connection.close()
    except DatabaseError:
        pass
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        return False
    return True


def await_database(alias: str, seconds: float) -> bool:
    """Wait until the database *alias* answers again, up to *seconds*; whether it did.

    Asks with a new connection every ``POLL_SECONDS`` at most.
    """
    deadline = time.monotonic() + seconds
    delay = 0.05
    while not database_answers(alias):
        if time.monotonic() + delay > deadline:
            return False
        time.sleep(delay)
        delay = min(POLL_SECONDS, delay * 2)
    return True


def outlast_outage(fn: Callable[[], T], alias: str, *, what: str, wait_seconds: float) -> T:
    """:func:`retry_transient`, and when the database is unreachable, wait it out.

    When the quick retries fail on a transient error and the database does not answer
    a new connection (it is restarting, failing over), wait up to *wait_seconds* for it
    to answer again, then run *fn* once more (and so after each outage, within the same
    *wait_seconds* in all). A transient error while the database answers (a
    serialization failure that keeps coming back), any other error, and any error inside
    a caller's transaction are raised unchanged.
    """
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return retry_transient(fn, alias, what=what)
        except DatabaseError as exc:
            left = deadline - time.monotonic()
            if connections[alias].in_atomic_block or not is_transient(exc, alias) or left <= 0:
                raise
            if database_answers(alias):
                raise
            logger.warning(
                "The database is unreachable during %s (%s); waiting up to %.0f s for it",
                what,
                exc,
                left,
            )
            if not await_database(alias, left):
                raise
            logger.warning("The database answers again; resuming %s", what)
