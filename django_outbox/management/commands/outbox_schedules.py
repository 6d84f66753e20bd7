from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_outbox.transport.schedules import sync_schedules


class Command(BaseCommand):
    help = "Create, update and remove the django-q2 schedules of the outbox streams."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="Change nothing; list the drift and exit with status 1 if there is any.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        changes = sync_schedules(apply=not options["check"])
        for change in changes:
            self.stdout.write(("would " if options["check"] else "") + str(change))
        if not changes:
            self.stdout.write("Schedules are in sync.")
        elif options["check"]:
            self.stderr.write(f"{len(changes)} schedule(s) drifted from the settings.")
            raise SystemExit(1)
