"""Transient database errors, and a bounded retry of a transaction that hit one.

Deadlocks and serialization failures (PostgreSQL SQLSTATE 40P01 and 40001), a dropped
connection, and SQLite's "database is locked" all mean: the same transaction may well
succeed if run again. Anything else is a real error and is raised at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger("django_outbox")

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
