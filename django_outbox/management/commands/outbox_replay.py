from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_outbox.archive.replay import archive_databases, dead_letters, replay_failed
from django_outbox.exceptions import UnknownStream

EXAMPLE_TIME = "2026-11-24T10:00:00+00:00"


def _datetime(option: str, value: str) -> datetime:
    """Parse an ISO 8601 date and time with its UTC offset, or raise CommandError."""
    try:
        parsed = parse_datetime(value)
    except ValueError:  # well formed, but no such date or time (month 13, hour 25)
        parsed = None
    if parsed is None:
        raise CommandError(
            f"{option} {value!r} is not a date and time; give one like {EXAMPLE_TIME}."
        )
    if timezone.is_naive(parsed):
        raise CommandError(
            f"{option} {value!r} has no UTC offset; give one like {EXAMPLE_TIME} (or end it "
            "with Z for UTC)."
        )
    return parsed


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise CommandError(f"{value!r} is not a group id (a UUID).") from None


class Command(BaseCommand):
    help = "Publish dead letters (failed archived rows) into their buffers again."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--stream", help="Only this stream.")
        parser.add_argument("--since", help="Only rows archived at or after this time.")
        parser.add_argument("--until", help="Only rows archived before this time.")
        parser.add_argument("--group", help="Only rows of this group id.")
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rows = dead_letters(
                stream=options["stream"],
                since=_datetime("--since", options["since"]) if options["since"] else None,
                until=_datetime("--until", options["until"]) if options["until"] else None,
                group_id=_uuid(options["group"]) if options["group"] else None,
            )
            found: Counter = Counter()
            for alias in archive_databases(options["stream"]):  # each stream database
                here = rows.using(alias)
                if options["dry_run"]:
                    found.update(
                        {
                            s: here.filter(stream=s).count()
                            for s in set(here.values_list("stream", flat=True))
                        }
                    )
                else:
                    found.update(replay_failed(here))
            counts = dict(sorted(found.items()))
        except UnknownStream as exc:
            raise CommandError(str(exc)) from exc
        verb = "Would replay" if options["dry_run"] else "Replayed"
        for stream, count in counts.items():
            self.stdout.write(f"{verb} {count:,} row(s) of stream {stream}.")
        if not counts:
            self.stdout.write("No dead letters match.")
