"""One cached accessor over the ``DJANGO_OUTBOX`` settings dict.

Settings are read on first use, never at import time, and the cache is dropped on
Django's ``setting_changed`` signal so ``override_settings`` works. Values are not
validated here: the system checks in :mod:`django_outbox.checks` report bad ones.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_outbox.exceptions import UnknownStream

SETTING_NAME = "DJANGO_OUTBOX"
GENERIC_MODEL = "django_outbox.OutboxEvent"
#: A stream's name: 1 to 64 lowercase letters, digits, "_" or "-" (no trailing newline).
STREAM_NAME = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,63}\Z")

#: The largest batch a stream may claim (``BATCH_SIZE``, or an operator's override):
#: one claim statement holds this many row locks and one handler call this many rows.
MAX_BATCH_SIZE = 100_000

STREAM_DEFAULTS: dict[str, Any] = {
    "HANDLER": None,
    "MODEL": GENERIC_MODEL,
    "BATCH_SIZE": 1000,
    "CHAINS": 4,
    "EVERY_MINUTES": 1,
    "MAX_ATTEMPTS": 8,
    "BACKOFF_SECONDS": 10,
    "BACKOFF_MAX_SECONDS": 3600,
    "LEASE_SECONDS": 300,
    "ARCHIVE": True,
    "TRANSACTIONAL": False,
    "CLUSTER": None,
    "ON_EXHAUSTED": None,
    "ARCHIVE_RETENTION_DAYS": None,
    "ARCHIVE_FAILED_RETENTION_DAYS": None,
}

#: Stream options of earlier versions that the run loop made unnecessary, with what to
#: do instead (system check W003).
REMOVED_STREAM_OPTIONS: dict[str, str] = {
    "KICK": "Every commit wakes its stream now; remove KICK.",
    "MAX_BATCHES": "Runs continue while rows wait, up to CHAINS per stream; remove "
    "MAX_BATCHES (raise CHAINS for more parallel runs).",
}

STAGING_DEFAULTS: dict[str, Any] = {
    "ALLOWED_MODULES": [],
    "BATCH_SIZE": 500,
    "EVERY_MINUTES": 1,
    "DRAIN_SECONDS": 30,
    "FORWARD_ON_COMMIT": True,
    "CLUSTER": None,
}

IDEMPOTENCY_DEFAULTS: dict[str, Any] = {
    "RETENTION_DAYS": 7,
}

GLOBAL_DEFAULTS: dict[str, Any] = {
    "STREAMS": {},
    "ARCHIVE_RETENTION_DAYS": 30,
    "ARCHIVE_FAILED_RETENTION_DAYS": 90,
    "STAGING": {},
    "IDEMPOTENCY": {},
    "PRUNE_EVERY_MINUTES": 1440,
    "METRICS_TOKEN": None,
}


@dataclass(frozen=True)
class StreamConfig:
    """The effective options of one stream (settings merged over the defaults)."""

    name: str
    handler: str | None
    model: str
    batch_size: int
    chains: int
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
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_options(cls, name: str, options: dict[str, Any]) -> StreamConfig:
        merged = {**STREAM_DEFAULTS, **options}
        return cls(
            name=name,
            handler=merged["HANDLER"],
            model=merged["MODEL"],
            batch_size=merged["BATCH_SIZE"],
            chains=merged["CHAINS"],
            every_minutes=merged["EVERY_MINUTES"],
            max_attempts=merged["MAX_ATTEMPTS"],
            backoff_seconds=merged["BACKOFF_SECONDS"],
            backoff_max_seconds=merged["BACKOFF_MAX_SECONDS"],
            lease_seconds=merged["LEASE_SECONDS"],
            archive=merged["ARCHIVE"],
            transactional=merged["TRANSACTIONAL"],
            cluster=merged["CLUSTER"],
            on_exhausted=merged["ON_EXHAUSTED"],
            archive_retention_days=merged["ARCHIVE_RETENTION_DAYS"],
            archive_failed_retention_days=merged["ARCHIVE_FAILED_RETENTION_DAYS"],
            raw=dict(options),
        )

    @property
    def model_class(self) -> type:
        """The buffer model class (``app_label.ModelName`` resolved through the registry)."""
        from django.apps import apps

        return apps.get_model(self.model)

    @property
    def is_generic(self) -> bool:
        """True when the stream uses the shared ``OutboxEvent`` table."""
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

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> StagingConfig:
        merged = {**STAGING_DEFAULTS, **options}
        allowed = merged["ALLOWED_MODULES"]
        return cls(
            allowed_modules=tuple(allowed) if isinstance(allowed, (list, tuple)) else (),
            batch_size=merged["BATCH_SIZE"],
            every_minutes=merged["EVERY_MINUTES"],
            drain_seconds=merged["DRAIN_SECONDS"],
            forward_on_commit=merged["FORWARD_ON_COMMIT"],
            cluster=merged["CLUSTER"],
        )

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
        merged = {**IDEMPOTENCY_DEFAULTS, **options}
        return cls(retention_days=merged["RETENTION_DAYS"])


@dataclass(frozen=True)
class OutboxSettings:
    streams: dict[str, StreamConfig]
    archive_retention_days: int
    archive_failed_retention_days: int
    staging: StagingConfig
    idempotency: IdempotencyConfig
    prune_every_minutes: int
    metrics_token: str | None
    raw: dict[str, Any]

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

    def buffer_models(self) -> list[type]:
        """Return the buffer model of every stream whose ``MODEL`` is one.

        A stream whose model is not installed (check E020) or is not a buffer model
        (E021) is left out, not raised for: this runs while Django starts, before the
        checks can report the stream with their hint.
        """
        from django_outbox.models import BufferEvent  # the app registry is ready here

        models = []
        for config in self.streams.values():
            try:
                model = config.model_class
            except (LookupError, ValueError, TypeError, AttributeError):
                continue
            if isinstance(model, type) and issubclass(model, BufferEvent):
                models.append(model)
        return models

    def stream(self, name: str) -> StreamConfig:
        """Return the stream called *name* or raise :class:`UnknownStream`."""
        try:
            return self.streams[name]
        except (KeyError, TypeError):
            raise UnknownStream(name, list(self.streams)) from None


@functools.cache
def outbox_settings() -> OutboxSettings:
    """Return the effective settings, cached until ``DJANGO_OUTBOX`` changes."""
    raw = getattr(settings, SETTING_NAME, {})
    if not isinstance(raw, dict):
        raw = {}
    merged = {**GLOBAL_DEFAULTS, **raw}
    streams_raw = merged["STREAMS"] if isinstance(merged["STREAMS"], dict) else {}
    streams = {
        name: StreamConfig.from_options(name, options if isinstance(options, dict) else {})
        for name, options in streams_raw.items()
    }
    return OutboxSettings(
        streams=streams,
        archive_retention_days=merged["ARCHIVE_RETENTION_DAYS"],
        archive_failed_retention_days=merged["ARCHIVE_FAILED_RETENTION_DAYS"],
        staging=StagingConfig.from_options(_as_dict(merged["STAGING"])),
        idempotency=IdempotencyConfig.from_options(_as_dict(merged["IDEMPOTENCY"])),
        prune_every_minutes=merged["PRUNE_EVERY_MINUTES"],
        metrics_token=merged["METRICS_TOKEN"],
        raw=raw,
    )


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


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "Q_CLUSTER"):
        outbox_settings.cache_clear()
        _import_handler.cache_clear()
