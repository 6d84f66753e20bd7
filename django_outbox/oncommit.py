"""After-commit actions that run once per transaction, whatever the number of requests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

from django.db import connections, transaction

logger = logging.getLogger("django_outbox")


class _Once:
    """An on-commit callback remembered by *key*, so a transaction registers it once."""

    def __init__(self, key: Hashable, action: Callable[[], object]) -> None:
        self.key = key
        self.action = action

    def __call__(self) -> None:
        try:
            self.action()
        except Exception:
            # Whatever the action did not do is picked up by the schedules; a failing
            # action must neither break the caller's commit nor the callbacks after it.
            logger.exception("After-commit action %r failed", self.key)


def on_commit_once(key: Hashable, action: Callable[[], object], *, using: str) -> None:
    """Run *action* once the current transaction on *using* commits, once per *key*.

    Within one transaction, later calls with the same *key* do nothing; a rolled-back
    transaction runs nothing. Outside a transaction the action runs at once. An action
    that raises is logged and does not stop the callbacks registered after it.
    """
    connection = connections[using]
    if connection.in_atomic_block:
        for entry in connection.run_on_commit:
            callback = entry[1]
            if isinstance(callback, _Once) and callback.key == key:
                return
    transaction.on_commit(_Once(key, action), using=using)
