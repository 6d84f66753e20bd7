"""The database of the stream being worked on: where its library rows live.

A stream lives on one database (its ``DATABASE`` option, else the database the router
picks for its buffer model), and its groups, state row, archive and held keys live
there beside its rows. Work on a stream runs inside :func:`on_database` with that
alias (:func:`django_outbox.conf.on_stream_database` enters it from a stream's name),
and the library's stream tables follow it: their managers
(:class:`StreamScopedManager`) and :func:`connection_for` use the alias in force.
Staged jobs follow it too (a job staged in a handler commits with the handler's
transaction). Buffer models do not: the engine names the stream's database where it
reads or writes buffer rows, so a handler's writes to another buffer go where the
router sends them. Outside any stream's work every model follows the router.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any

from django.db import connections, models, router
from django.db.backends.base.base import BaseDatabaseWrapper

_alias: ContextVar[str | None] = ContextVar("django_outbox_stream_database", default=None)


def current_alias() -> str | None:
    """The database of the stream being worked on, or None outside any stream's work."""
    return _alias.get()


@contextlib.contextmanager
def on_database(alias: str | None) -> Iterator[None]:
    """Run the block with the library's stream tables on *alias* (None: the router)."""
    token = _alias.set(alias)
    try:
        yield
    finally:
        _alias.reset(token)


def enter_database(alias: str | None) -> Token[str | None]:
    """:func:`on_database` without a context manager (a hot path): pass what it returns
    to :func:`leave_database`."""
    return _alias.set(alias)


def leave_database(token: Token[str | None]) -> None:
    _alias.reset(token)


def is_stream_scoped(model: type[models.Model]) -> bool:
    """Whether *model*'s rows live on the database of the stream they belong to."""
    return isinstance(model._default_manager, StreamScopedManager)


class StreamScopedManager(models.Manager):
    """A manager whose querysets run on the database of the stream being worked on.

    An explicit ``using()`` or ``db_manager()`` still wins.
    """

    def get_queryset(self) -> models.QuerySet[Any]:
        queryset = super().get_queryset()
        alias = _alias.get()
        return queryset.using(alias) if alias is not None and self._db is None else queryset


def connection_for(model: type[models.Model]) -> BaseDatabaseWrapper:
    """Return the connection that writes *model*'s table.

    The library's stream tables are on the database of the stream being worked on;
    every other model goes where the router says.
    """
    alias = _alias.get()
    if alias is not None and is_stream_scoped(model):
        return connections[alias]
    return connections[router.db_for_write(model)]
