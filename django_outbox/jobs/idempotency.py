"""Idempotency keys: the effect of a job happens once, however often the job runs.

``idempotent`` runs a function (as a decorator) or a block (as a context manager)
inside one transaction that first claims a key row::

    @idempotent(key="charge:{order_id}")
    def charge(order_id: int) -> dict:
        ...
        return {"charge": charge.pk}

    with idempotent(key=f"welcome:{user.pk}", scope="emails") as guard:
        if not guard.done:
            send_welcome(user)
            guard.result = {"sent": True}

* A key that already completed returns its stored JSON result without running again.
* A concurrent call with the same key waits until the first one's transaction ends
  (PostgreSQL: on the unique index; SQLite: writers are serialized), then skips and
  returns the first one's result.
* If the function raises, the transaction rolls back, the key with it, and a later call
  runs again. A result that is not JSON raises :class:`IdempotencyError` and rolls back.
* Keys expire ``ttl`` (default ``IDEMPOTENCY["RETENTION_DAYS"]``) after completion; an
  expired key runs again; ``manage.py outbox_prune`` deletes expired keys.

Inside an outer ``transaction.atomic`` the guard is a savepoint: the key commits (or
rolls back) with the outer transaction. Run the guarded function outermost, or wrap it
in :func:`django_outbox.jobs.locking.retry_on_conflict` (outside the guard) to retry
deadlocks. Staged jobs use the guard with ``store_result=False``: their results need
not be JSON, only the fact that the work was done is kept.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from django.db import router, transaction

from django_outbox.base.durations import validate_duration
from django_outbox.base.jsondata import dumps
from django_outbox.conf import outbox_settings
from django_outbox.exceptions import IdempotencyError
from django_outbox.jobs.sql import idempotency as sql
from django_outbox.models.keys import IdempotencyKey

__all__ = [
    "Guard",
    "idempotent",
]

F = TypeVar("F", bound=Callable[..., Any])
KEY_MAX = 255
SCOPE_MAX = 200


def function_scope(path: str, prefix: str = "") -> str:
    """The scope of the keys of the function at dotted *path*: ``<prefix>:<path>``.

    Without *prefix* the scope is the path itself (the decorator's default). A scope
    longer than ``SCOPE_MAX`` names the function by the SHA-256 of its path instead
    (``<prefix>:sha256:<hex>``), so any function path has a scope, and one of its own.
    """
    head = f"{prefix}:" if prefix else ""
    scope = f"{head}{path}"
    if len(scope) > SCOPE_MAX:
        scope = f"{head}sha256:{hashlib.sha256(path.encode()).hexdigest()}"
    return scope


@dataclass
class Guard:
    """What a guarded block knows about its key; set ``result`` to store it."""

    scope: str
    key: str
    done: bool = False
    result: Any = None
    key_id: int | None = field(default=None, repr=False)


class idempotent:
    """Run a function or a block once per key; see the module's documentation."""

    def __init__(
        self,
        key: str | Callable[..., str],
        *,
        scope: str | None = None,
        ttl: timedelta | float | None = None,
        using: str | None = None,
        store_result: bool = True,
    ) -> None:
        if not (isinstance(key, str) or callable(key)):
            raise IdempotencyError(f"key must be a string or a callable, not {key!r}.")
        self.key = key
        self.scope = scope
        self.ttl = None if ttl is None else validate_duration("idempotent(ttl=...)", ttl)
        self.using = using
        self.store_result = store_result
        self._stack: list[tuple[Guard, Any]] = []

    # -- decorator ------------------------------------------------------------------

    def __call__(self, func: F) -> F:
        scope = self.scope or function_scope(f"{func.__module__}.{func.__qualname__}")
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = self._key_for(signature, args, kwargs)
            block = idempotent(
                key,
                scope=scope,
                ttl=self.ttl,
                using=self.using,
                store_result=self.store_result,
            )
            with block as guard:
                if guard.done:
                    return guard.result
                guard.result = func(*args, **kwargs)
                return guard.result

        wrapper.idempotent = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    def _key_for(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> str:
        if callable(self.key):
            return self.key(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        try:
            return self.key.format(**bound.arguments)
        except (KeyError, IndexError, AttributeError) as exc:
            raise IdempotencyError(
                f"The key template {self.key!r} names {exc} which is not an argument of "
                f"the function (arguments: {', '.join(bound.arguments)})."
            ) from exc

    # -- context manager ------------------------------------------------------------

    def __enter__(self) -> Guard:
        if callable(self.key):
            raise IdempotencyError(
                "As a context manager, idempotent() needs the key itself, not a callable."
            )
        guard = Guard(scope=self.scope or "", key=self.key)
        _check(guard)
        atomic = transaction.atomic(using=self._alias())
        atomic.__enter__()
        self._stack.append((guard, atomic))
        try:
            guard.key_id = sql.claim(guard.scope, guard.key)
            if guard.key_id is None:
                stored = sql.stored(guard.scope, guard.key)
                if stored is None or not stored.completed:
                    raise IdempotencyError(
                        f"The key {guard.scope}:{guard.key} exists but never completed; an "
                        "operator wrote it or an outer transaction is still running it."
                    )
                guard.done, guard.result = True, stored.result
        except BaseException as exc:
            self._stack.pop()
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return guard

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        guard, atomic = self._stack.pop()
        if exc_type is None and not guard.done:
            try:
                result = guard.result if self.store_result else None
                _check_json(guard, result)
                assert guard.key_id is not None  # claimed: a key that existed is done
                sql.complete(guard.key_id, result, self._ttl_seconds())
            except BaseException as error:
                atomic.__exit__(type(error), error, error.__traceback__)
                raise
        return bool(atomic.__exit__(exc_type, exc, tb))

    def _alias(self) -> str:

        return self.using or router.db_for_write(IdempotencyKey)

    def _ttl_seconds(self) -> float:
        if self.ttl is None:
            return outbox_settings().idempotency.retention_days * 86400.0
        if isinstance(self.ttl, timedelta):
            return self.ttl.total_seconds()
        return float(self.ttl)


def _check(guard: Guard) -> None:
    if not isinstance(guard.key, str) or not guard.key or len(guard.key) > KEY_MAX:
        raise IdempotencyError(
            f"An idempotency key must be a non-empty string of at most {KEY_MAX} characters, "
            f"not {guard.key!r}."
        )
    if len(guard.scope) > SCOPE_MAX:
        raise IdempotencyError(f"An idempotency scope has at most {SCOPE_MAX} characters.")


def _check_json(guard: Guard, result: Any) -> None:
    try:
        dumps(result)
    except (TypeError, ValueError) as exc:
        raise IdempotencyError(
            f"The result under key {guard.scope}:{guard.key} is not JSON ({exc}); the work was "
            "rolled back. Return ids, strings, numbers, booleans, None, lists and dicts, or "
            "pass store_result=False."
        ) from exc
