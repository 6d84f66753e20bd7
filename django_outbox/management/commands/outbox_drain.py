from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from django_outbox.base.errors import last_line
from django_outbox.conf import outbox_settings
from django_outbox.jobs.staging import drain

logger = logging.getLogger(__name__)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


class Command(BaseCommand):
    help = (
        "Forward staged jobs to django-q2. Loops until SIGTERM/SIGINT, sleeping with "
        "exponential backoff while nothing is due or the broker or the database fails; "
        "--once drains one pass and exits."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--once", action="store_true", help="Drain until nothing is due, then exit."
        )
        parser.add_argument(
            "--batch-size",
            type=_positive(int),
            default=None,
            help="Jobs per transaction (default: STAGING['BATCH_SIZE']).",
        )
        parser.add_argument(
            "--min-sleep",
            type=_positive(float),
            default=0.05,
            help="First sleep in seconds after finding nothing due (default 0.05).",
        )
        parser.add_argument(
            "--max-sleep",
            type=_positive(float),
            default=5.0,
            help="Longest sleep in seconds while nothing is due (default 5).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["min_sleep"] > options["max_sleep"]:
            raise CommandError("--min-sleep must not be longer than --max-sleep.")
        limit = options["batch_size"] or outbox_settings().staging.batch_size
        stop = threading.Event()
        forwarded = kept = 0
        previous = {}
        if not options["once"]:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, lambda *_: stop.set())
        try:
            sleep = options["min_sleep"]
            failing: _Outage | None = None
            while not stop.is_set():
                try:
                    result = drain(limit=limit)
                except Exception as exc:
                    if options["once"]:
                        raise
                    # As django-q2's own loop does: the pass rolled back, its jobs stay due.
                    failing = failing or _Outage.begin(exc, options["max_sleep"])
                    failing.tries += 1
                    close_old_connections()  # a broken connection is opened anew
                    stop.wait(sleep)
                    sleep = min(sleep * 2, options["max_sleep"])
                    continue
                if failing is not None:
                    failing.end()
                    failing = None
                forwarded += result.forwarded
                kept += result.kept
                if result.forwarded or result.kept:
                    if options["verbosity"] >= 2:
                        self.stdout.write(f"forwarded {result.forwarded}, kept {result.kept}")
                    sleep = options["min_sleep"]
                    if result.forwarded + result.kept >= limit:
                        continue
                if options["once"]:
                    break
                stop.wait(sleep)
                sleep = min(sleep * 2, options["max_sleep"])
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        summary = f"Forwarded {forwarded:,} staged job(s)"
        if kept:
            summary += f"; kept {kept:,} with an error (see the staged job's last_error)"
        self.stdout.write(summary + ".")


class _Outage:
    """A run of failed drain passes (the broker or the database is away): logged once
    when it begins and once when a pass works again."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tries = 0

    @classmethod
    def begin(cls, exc: Exception, max_sleep: float) -> _Outage:
        logger.warning(
            "Draining staged jobs failed (%s); the due jobs stay staged and the drainer "
            "tries again with backoff, every %s s at most, until it works.",
            last_line(str(exc)) or type(exc).__name__,
            max_sleep,
            exc_info=exc,
        )
        return cls()

    def end(self) -> None:
        logger.warning(
            "Draining staged jobs works again, after %s failed pass(es) in %.1f s.",
            self.tries,
            time.monotonic() - self.started,
        )
