from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_outbox.archive.prune import DEFAULT_BATCH_SIZE, prune_all
from django_outbox.conf import outbox_settings
from django_outbox.models import ArchivedEvent


def _batch_size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100_000:
        raise ValueError(text)
    return value


_batch_size.__name__ = "batch size from 1 to 100000"


class Command(BaseCommand):
    help = (
        "Delete expired idempotency keys, archived rows past their retention (done and "
        "dead letters separately, per stream) and finished unique jobs, in bounded batches."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=_batch_size,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows per transaction (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--stream",
            action="append",
            dest="streams",
            help="Prune only the archive of this stream (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        streams = options["streams"]
        if streams:
            known = set(outbox_settings().streams) | set(
                ArchivedEvent.objects.filter(stream__in=streams)
                .values_list("stream", flat=True)
                .distinct()
            )
            unknown = sorted(set(streams) - known)
            if unknown:
                raise CommandError(
                    f"Unknown stream(s): {', '.join(unknown)}. Configured: "
                    f"{', '.join(sorted(outbox_settings().streams)) or 'none'}."
                )
        tty = self.stdout.isatty()

        def progress(label: str, deleted: int) -> None:
            if tty:
                self.stdout.write(f"\r  {label}: {deleted:,} deleted", ending="")
                sys.stdout.flush()

        results = prune_all(
            dry_run=options["dry_run"],
            batch_size=options["batch_size"],
            streams=streams,
            progress=progress,
        )
        if tty:
            self.stdout.write("")
        verb = "would delete" if options["dry_run"] else "deleted"
        for result in results:
            rate = (
                f" ({result.rows / result.seconds:,.0f} rows/s)"
                if result.rows and not result.dry_run and result.seconds
                else ""
            )
            self.stdout.write(f"{result.target}: {verb} {result.rows:,}{rate}")
        total = sum(result.rows for result in results)
        self.stdout.write(f"Total: {verb} {total:,} row(s).")
