"""One cached accessor over the ``DJANGO_OUTBOX`` settings dict.

Settings are read on first use, never at import time, and the cache is dropped on
Django's ``setting_changed`` signal so ``override_settings`` works. Every option is
declared once, in the tables below (:mod:`django_outbox.base.option_table`): the effective
configuration and the system checks (:mod:`django_outbox.checks`) both come from them.
Values are not validated here: the checks report bad ones.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from django.apps import apps
from django.conf import settings
from django.core.signals import setting_changed
from django.db import router
from django.db.models import Model
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_outbox.base.option_table import (
    BLOCK,
    BLOCKS_BY_NAME,
    BOOL,
    CALLABLE_PATH,
    CLUSTER,
    DATABASE_ALIAS,
    MODEL_LABEL,
    MODULE_LIST,
    OPTIONAL_CALLABLE_PATH,
    OPTIONAL_FIELD_NAME,
    OPTIONAL_POSITIVE_INT,
    OPTIONAL_POSITIVE_NUMBER,
    POSITIVE_INT,
    TOKEN,
    Option,
    OptionTable,
    choice,
)
from django_outbox.base.routing import enter_database, leave_database, on_database
from django_outbox.exceptions import UnknownStream

F = TypeVar("F", bound=Callable[..., Any])

SETTING_NAME = "DJANGO_OUTBOX"
GENERIC_MODEL = "django_outbox.OutboxEvent"
#: A stream's name: 1 to 64 lowercase letters, digits, "_" or "-" (no trailing newline).
STREAM_NAME = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,63}\Z")

#: The largest batch a stream may claim (``BATCH_SIZE``, or an operator's override):
#: one claim statement holds this many row locks and one handler call this many rows.
MAX_BATCH_SIZE = 100_000
#: A worker whose database goes away mid-run waits at most this long for it.
OUTAGE_SECONDS_MAX = 60.0


def outage_seconds(lease_seconds: float) -> float:
    """How long a worker holding a lease of *lease_seconds* (a group's, a job's) waits
    mid-run for the database to answer again
    (:func:`~django_outbox.base.transient.outlast_outage`).

    Half the lease, at most ``OUTAGE_SECONDS_MAX``: the lease outlives the wait, so the
    work is resumed by the worker that holds it, not rescued by another.
    """
    return min(OUTAGE_SECONDS_MAX, lease_seconds / 2)


STREAM_OPTIONS = OptionTable(
    Option("HANDLER", None, CALLABLE_PATH),  # required: checks E010 to E012
    Option("MODEL", GENERIC_MODEL, MODEL_LABEL),  # a buffer model: checks E020 to E022
    Option(
        "BATCH_SIZE",
        1000,
        POSITIVE_INT,
        "E030",
        maximum=MAX_BATCH_SIZE,
        maximum_check="E039",
        maximum_hint="One claim locks and one handler call holds that many rows: give at "
        "most {maximum} (a few hundred to a few thousand is usual).",
    ),
    Option("RUNS", 4, POSITIVE_INT, "E030"),  # runs of the stream in flight at most
    Option("EVERY_MINUTES", 1, POSITIVE_INT, "E030"),
    Option("MAX_ATTEMPTS", 8, POSITIVE_INT, "E030"),
    Option("BACKOFF_SECONDS", 10, POSITIVE_INT, "E030"),
    Option("BACKOFF_MAX_SECONDS", 3600, POSITIVE_INT, "E030"),  # at least the base: E033
    Option("LEASE_SECONDS", 300, POSITIVE_INT, "E030"),  # against the timeout: E042
    Option("HANDOFF_SECONDS", 30, POSITIVE_INT, "E030"),  # a lost job's rescue (Redis &c.)
    Option("ARCHIVE", True, BOOL, "E031"),
    Option("TRANSACTIONAL", False, BOOL, "E031"),
    Option("CLUSTER", None, CLUSTER, "E032"),  # defined in Q_CLUSTER: W002, E041
    Option("DATABASE", None, DATABASE_ALIAS),  # check E025; its tables: W006
    Option("ON_EXHAUSTED", None, OPTIONAL_CALLABLE_PATH),  # checks E013, E014
    Option("ISOLATE_FAILURES", True, BOOL, "E031"),  # split groups that fail as a whole
    Option("AUTO_HEARTBEAT", True, BOOL, "E031"),  # keep a long handler's lease alive
    Option("ORDER_KEY", None, OPTIONAL_FIELD_NAME),  # of the buffer model: check E023
    Option(
        "ORDER_AFTER_DEAD_LETTER",
        "hold",
        choice(
            "hold",
            "continue",
            hint="'hold': a dead-lettered row's key waits for an operator to release it; "
            "'continue': the key's later rows go on.",
        ),
        "E024",
    ),
    Option(
        "CALLS_PER_SECOND",
        None,
        OPTIONAL_POSITIVE_NUMBER,
        "E060",
        hint="Remove it for no budget, or give the most handler calls a second the service "
        "accepts, for example 20 (0.5: one call every 2 seconds).",
    ),
    Option(
        "ROWS_PER_SECOND",
        None,
        OPTIONAL_POSITIVE_NUMBER,
        "E061",
        hint="Remove it for no row budget, or give the most rows a second the service "
        "accepts, for example 500 (claims then take at most that many rows).",
    ),
    Option(
        "ARCHIVE_RETENTION_DAYS",
        None,
        OPTIONAL_POSITIVE_INT,
        "E037",
        hint=f"Remove it to use the global {SETTING_NAME}['{{name}}'], or give the number of "
        "days archived rows of this stream are kept.",
    ),
    Option(
        "ARCHIVE_FAILED_RETENTION_DAYS",
        None,
        OPTIONAL_POSITIVE_INT,
        "E037",
        hint=f"Remove it to use the global {SETTING_NAME}['{{name}}'], or give the number of "
        "days archived rows of this stream are kept.",
    ),
)
STREAM_DEFAULTS = STREAM_OPTIONS.defaults

#: Stream options of earlier versions that the run loop made unnecessary, with what to
#: do instead (system check W003).
REMOVED_STREAM_OPTIONS: dict[str, str] = {
    "KICK": "Every commit wakes its stream now; remove KICK.",
    "MAX_BATCHES": "Runs continue while rows wait, up to RUNS per stream; remove "
    "MAX_BATCHES (raise RUNS for more parallel runs).",
}

#: Stream options renamed in this release: old name -> new name. The old name still
#: works (its value is used under the new name) and system check W008 says to rename it.
RENAMED_STREAM_OPTIONS: dict[str, str] = {"CHAINS": "RUNS"}


def current_names(options: dict[str, Any]) -> dict[str, Any]:
    """*options* with each renamed option under its new name (the new name wins when a
    stream gives both)."""
    renamed = {
        RENAMED_STREAM_OPTIONS[key]: value
        for key, value in options.items()
        if key in RENAMED_STREAM_OPTIONS
    }
    current = {k: v for k, v in options.items() if k not in RENAMED_STREAM_OPTIONS}
    return {**renamed, **current}


STAGING_OPTIONS = OptionTable(
    Option("ALLOWED_MODULES", [], MODULE_LIST, "E054"),
    Option("BATCH_SIZE", 500, POSITIVE_INT, "E052"),
    Option("EVERY_MINUTES", 1, POSITIVE_INT, "E052"),
    Option("DRAIN_SECONDS", 30, POSITIVE_INT, "E052"),  # below the cluster's timeout: E056
    Option("FORWARD_ON_COMMIT", True, BOOL, "E053"),
    # Redis &c.: a lost job's rescue, after the clusters' timeout (E057), at most MAX_FORWARDS
    Option("REDELIVER_SECONDS", 300, POSITIVE_INT, "E052"),
    Option("MAX_FORWARDS", 5, POSITIVE_INT, "E052"),
    Option("CLUSTER", None, CLUSTER, "E055"),
)

IDEMPOTENCY_OPTIONS = OptionTable(
    Option("RETENTION_DAYS", 7, POSITIVE_INT, "E052"),
)

GLOBAL_OPTIONS = OptionTable(
    Option("STREAMS", {}, BLOCKS_BY_NAME),  # stream options by name: E003 to E006
    Option(
        "ARCHIVE_RETENTION_DAYS",
        30,
        POSITIVE_INT,
        "E034",
        hint="Give the number of days archived rows are kept, for example 30.",
    ),
    Option(
        "ARCHIVE_FAILED_RETENTION_DAYS",
        90,
        POSITIVE_INT,
        "E038",
        hint="Give the number of days dead letters are kept for replay, for example 90.",
    ),
    Option("STAGING", {}, BLOCK),  # STAGING_OPTIONS: E050 to E057
    Option("IDEMPOTENCY", {}, BLOCK),  # IDEMPOTENCY_OPTIONS: E050 to E053
    Option(
        "PRUNE_EVERY_MINUTES",
        1440,
        POSITIVE_INT,
        "E035",
        hint="Give the minutes between two runs of the prune schedule, for example 1440 (daily).",
    ),
    Option("METRICS_TOKEN", None, TOKEN, "E036"),
    Option(
        "DISPATCH_ON_COMMIT",
        "inline",
        choice(
            "inline",
            "thread",
            hint="'inline': the committing thread dispatches the jobs it enqueued right "
            "after its commit; 'thread': a dispatcher thread of the process hands the "
            "dispatch to a worker.",
        ),
        "E007",
    ),
)


@dataclass(frozen=True)
class StreamConfig:
    """The effective options of one stream (settings merged over the defaults)."""

    name: str
    handler: str | None
    model: str
    batch_size: int
    runs: int
    every_minutes: int
    max_attempts: int
    backoff_seconds: int
    backoff_max_seconds: int
    lease_seconds: int
    archive: bool
    transactional: bool
    cluster: str | None
    on_exhausted: str | None = None
    archive_retention_days: int | None = None
    archive_failed_retention_days: int | None = None
    isolate_failures: bool = True
    handoff_seconds: int = 30
    auto_heartbeat: bool = True
    order_key: str | None = None
    order_after_dead_letter: str = "hold"
    calls_per_second: float | None = None
    rows_per_second: float | None = None
    database: str | None = None

    @classmethod
    def from_options(cls, name: str, options: dict[str, Any]) -> StreamConfig:
        return cls(name=name, **STREAM_OPTIONS.effective(current_names(options)))

    @property
    def model_class(self) -> type[Model]:
        """The buffer model class (``app_label.ModelName`` resolved through the registry)."""

        return apps.get_model(self.model)

    @functools.cached_property
    def alias(self) -> str:
        """The database the stream lives on: its rows, groups, state and archive.

        Its ``DATABASE`` option, else the database the router picks for writes of its
        buffer model (read once per configuration: the settings cache is dropped when
        ``DATABASE_ROUTERS`` changes too).
        """
        return self.database or router.db_for_write(self.model_class)

    @property
    def outage_seconds(self) -> float:
        """How long a worker waits mid-run for the database to answer again
        (:func:`outage_seconds` of the lease)."""
        return outage_seconds(self.lease_seconds)

    @property
    def budgeted(self) -> bool:
        """Whether the stream has a rate budget (``CALLS_PER_SECOND``, ``ROWS_PER_SECOND``)."""
        return self.calls_per_second is not None or self.rows_per_second is not None

    @property
    def ordered(self) -> bool:
        """Whether the rows of one ``ORDER_KEY`` value reach the handler in order."""
        return self.order_key is not None

    @property
    def holds_dead_keys(self) -> bool:
        """Whether a dead-lettered row holds back its key's later rows (ordered streams)."""
        return self.ordered and self.order_after_dead_letter == "hold"

    @functools.cached_property
    def is_generic(self) -> bool:
        """True when the stream uses the shared ``OutboxEvent`` table (read once per
        configuration, as :attr:`alias`)."""
        return self.model_class._meta.label == GENERIC_MODEL

    def handler_func(self) -> Callable[..., Any]:
        """Import the handler by its dotted path."""
        return _import_handler(self.handler)

    def on_exhausted_func(self) -> Callable[..., Any] | None:
        """Import the ``ON_EXHAUSTED`` hook, if the stream has one."""
        return _import_handler(self.on_exhausted) if self.on_exhausted else None


@dataclass(frozen=True)
class StagingConfig:
    """Options of staged jobs (``DJANGO_OUTBOX["STAGING"]``)."""

    allowed_modules: tuple[str, ...]
    batch_size: int
    every_minutes: int
    drain_seconds: int
    forward_on_commit: bool
    cluster: str | None
    redeliver_seconds: int = 300
    max_forwards: int = 5

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> StagingConfig:
        values = STAGING_OPTIONS.effective(options)
        allowed = values["allowed_modules"]
        values["allowed_modules"] = tuple(allowed) if isinstance(allowed, (list, tuple)) else ()
        return cls(**values)

    @property
    def enabled(self) -> bool:
        """Staging is in use once a module is allowed to receive staged jobs."""
        return bool(self.allowed_modules)

    def allows(self, path: str) -> bool:
        """Whether the task at dotted *path* lies under one of the allowed modules."""
        return any(
            path == prefix or path.startswith(prefix.rstrip(".") + ".")
            for prefix in self.allowed_modules
        )


@dataclass(frozen=True)
class IdempotencyConfig:
    """Options of idempotency keys (``DJANGO_OUTBOX["IDEMPOTENCY"]``)."""

    retention_days: int

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> IdempotencyConfig:
        return cls(**IDEMPOTENCY_OPTIONS.effective(options))


@dataclass(frozen=True)
class OutboxSettings:
    streams: dict[str, StreamConfig]
    archive_retention_days: int
    archive_failed_retention_days: int
    staging: StagingConfig
    idempotency: IdempotencyConfig
    prune_every_minutes: int
    metrics_token: str | None
    dispatch_on_commit: str

    def retention_days(self, stream: str, outcome: str) -> int:
        """Days archived rows of *stream* with *outcome* are kept (a stream's own, or global)."""
        config = self.streams.get(stream)
        if outcome == "failed":
            own = config.archive_failed_retention_days if config else None
            return own or self.archive_failed_retention_days
        own = config.archive_retention_days if config else None
        return own or self.archive_retention_days

    @functools.cached_property
    def streams_by_model(self) -> dict[str, tuple[str, ...]]:
        """The streams of each buffer model, by lower-case ``app_label.modelname``."""
        found: dict[str, tuple[str, ...]] = {}
        for name, config in self.streams.items():
            if isinstance(config.model, str):
                label = config.model.lower()
                found[label] = (*found.get(label, ()), name)
        return found

    def stream(self, name: str) -> StreamConfig:
        """Return the stream called *name* or raise :class:`UnknownStream`."""
        try:
            return self.streams[name]
        except (KeyError, TypeError):
            raise UnknownStream(name, list(self.streams)) from None


def raw_settings() -> Any:
    """``settings.DJANGO_OUTBOX`` as written (the system checks read it through here)."""
    return getattr(settings, SETTING_NAME, {})


@functools.cache
def outbox_settings() -> OutboxSettings:
    """Return the effective settings, cached until ``DJANGO_OUTBOX`` changes."""
    raw = raw_settings()
    values = GLOBAL_OPTIONS.effective(raw if isinstance(raw, dict) else {})
    streams_raw = _as_dict(values.pop("streams"))
    values["streams"] = {
        name: StreamConfig.from_options(name, _as_dict(options))
        for name, options in streams_raw.items()
    }
    values["staging"] = StagingConfig.from_options(_as_dict(values["staging"]))
    values["idempotency"] = IdempotencyConfig.from_options(_as_dict(values["idempotency"]))
    return OutboxSettings(**values)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@functools.cache
def _import_handler(path: str | None) -> Callable[..., Any]:
    if not path:
        raise ImportError("The stream has no HANDLER.")
    return import_string(path)


def get_stream(name: str) -> StreamConfig:
    """Return the configuration of stream *name* or raise :class:`UnknownStream`."""
    return outbox_settings().stream(name)


def stream_databases() -> dict[str, list[str]]:
    """The configured streams by the database each lives on (aliases in settings order).

    A stream whose ``MODEL`` does not resolve is left out (checks E020 &c. report it).
    """
    found: dict[str, list[str]] = {}
    for name, config in outbox_settings().streams.items():
        try:
            alias = config.alias
        except (LookupError, ValueError, TypeError, AttributeError):
            continue
        found.setdefault(alias, []).append(name)
    order = list(settings.DATABASES)
    return dict(sorted(found.items(), key=lambda item: _position(order, item[0])))


def _position(order: list[str], alias: str) -> int:
    return order.index(alias) if alias in order else len(order)


@contextlib.contextmanager
def stream_database(stream: str | StreamConfig) -> Iterator[StreamConfig]:
    """Run the block on the database *stream* lives on (:mod:`django_outbox.base.routing`)."""
    config = stream if isinstance(stream, StreamConfig) else get_stream(stream)
    with on_database(config.alias):
        yield config


def on_stream_database(func: F) -> F:
    """Run *func* on the database of the stream named (or configured) by its first argument."""

    @functools.wraps(func)
    def wrapper(stream: Any, *args: Any, **kwargs: Any) -> Any:
        config = stream if isinstance(stream, StreamConfig) else get_stream(stream)
        token = enter_database(config.alias)
        try:
            return func(stream, *args, **kwargs)
        finally:
            leave_database(token)

    return wrapper  # type: ignore[return-value]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "Q_CLUSTER", "DATABASES", "DATABASE_ROUTERS"):
        outbox_settings.cache_clear()
        _import_handler.cache_clear()
