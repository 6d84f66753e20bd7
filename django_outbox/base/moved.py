"""Modules that moved in 0.1's layout (one package per feature), found at their old path.

``import django_outbox.staging`` still works in this release: the old name is the new
module itself (not a copy), a :class:`DeprecationWarning` is issued, and system check
``django_outbox.W009`` names every old path that was imported, with where it moved.
``lease`` and ``transport`` are packages now: their old modules' names are taken (they
are now ``lease.engine`` and ``transport.handoff``).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

#: The old dotted path of each module that moved -> its path now.
MOVED: dict[str, str] = {
    "django_outbox.attempt": "django_outbox.streams.attempt",
    "django_outbox.backoff": "django_outbox.base.backoff",
    "django_outbox.batch": "django_outbox.streams.batch",
    "django_outbox.budget": "django_outbox.streams.budget",
    "django_outbox.claim_floor": "django_outbox.streams.claim_floor",
    "django_outbox.db": "django_outbox.streams.sql",
    "django_outbox.db.base": "django_outbox.streams.sql.base",
    "django_outbox.db.budget": "django_outbox.streams.sql.budget",
    "django_outbox.db.claim_floor": "django_outbox.streams.sql.claim_floor",
    "django_outbox.db.dialect": "django_outbox.base.dialect",
    "django_outbox.db.idempotency": "django_outbox.jobs.sql.idempotency",
    "django_outbox.db.lease": "django_outbox.lease.sql",
    "django_outbox.db.ordered": "django_outbox.streams.sql.ordered",
    "django_outbox.db.partitions": "django_outbox.archive.sql.partitions",
    "django_outbox.db.postgresql": "django_outbox.streams.sql.postgresql",
    "django_outbox.db.runs": "django_outbox.streams.sql.run",
    "django_outbox.db.sqlite": "django_outbox.streams.sql.sqlite",
    "django_outbox.db.staging": "django_outbox.jobs.sql.staging",
    "django_outbox.db.transient": "django_outbox.base.transient",
    "django_outbox.db.triggers": "django_outbox.streams.sql.triggers",
    "django_outbox.db.tune": "django_outbox.archive.sql.tune",
    "django_outbox.db.unique": "django_outbox.unique.sql",
    "django_outbox.db.wake_guard": "django_outbox.streams.sql.wake_guard",
    "django_outbox.distribute": "django_outbox.streams.distribute",
    "django_outbox.durations": "django_outbox.base.durations",
    "django_outbox.heartbeat": "django_outbox.lease.heartbeat",
    "django_outbox.idempotency": "django_outbox.jobs.idempotency",
    "django_outbox.inline": "django_outbox.streams.inline",
    "django_outbox.isolate": "django_outbox.streams.isolate",
    "django_outbox.jsondata": "django_outbox.base.jsondata",
    "django_outbox.locking": "django_outbox.jobs.locking",
    "django_outbox.oncommit": "django_outbox.base.oncommit",
    "django_outbox.options": "django_outbox.base.option_table",
    "django_outbox.ordering": "django_outbox.streams.ordering",
    "django_outbox.partitions": "django_outbox.archive.partitions",
    "django_outbox.prune": "django_outbox.archive.prune",
    "django_outbox.publishing": "django_outbox.streams.publish",
    "django_outbox.replay": "django_outbox.archive.replay",
    "django_outbox.rescue": "django_outbox.streams.rescue",
    "django_outbox.routing": "django_outbox.base.routing",
    "django_outbox.runs": "django_outbox.streams.run",
    "django_outbox.schedules": "django_outbox.transport.schedules",
    "django_outbox.staging": "django_outbox.jobs.staging",
    "django_outbox.status": "django_outbox.streams.status",
    "django_outbox.steer": "django_outbox.streams.steer",
    "django_outbox.tracing": "django_outbox.base.tracing",
    "django_outbox.tune": "django_outbox.archive.tune",
}

#: The old paths imported in this process -> where each moved (system check W009).
USED: dict[str, str] = {}


class _Alias:
    """Loads an old path as the module it moved to."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system gave it the old name's spec


def spec(fullname: str) -> ModuleSpec | None:
    """The spec of *fullname* if it is an old path (see :data:`MOVED`), else None."""
    new = MOVED.get(fullname)
    if new is None:
        return None
    USED[fullname] = new
    warnings.warn(
        f"{fullname} moved to {new}; the old path works in 0.1 only.",
        DeprecationWarning,
        stacklevel=3,
    )
    return importlib.util.spec_from_loader(fullname, _Alias(new))  # type: ignore[arg-type]
