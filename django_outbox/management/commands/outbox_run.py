from __future__ import annotations

import math
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_outbox.exceptions import UnknownStream
from django_outbox.streams.inline import RunReport, run_inline
from django_outbox.streams.status import StreamStatus


class Command(BaseCommand):
    help = "Run distribute, claim and process inline (without a django-q2 cluster)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("streams", nargs="*", help="Streams to run (default: all).")
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="Repeat until no rows or groups are left, waiting for due retries.",
        )
        parser.add_argument(
            "--max-wait",
            type=float,
            default=300.0,
            help="With --until-empty, give up after waiting this many seconds in all for "
            "retries whose backoff has not passed (default: %(default).0f).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tty = self.stdout.isatty()
        progress: dict[str, Any] = {"line": "", "said_at": -math.inf}

        def on_round(report: RunReport, statuses: list[StreamStatus]) -> None:
            line = "  ".join(
                f"{s.stream}: backlog {s.backlog:,} in flight "
                f"{s.groups_claimed + s.groups_running + s.groups_retrying}"
                for s in statuses
            )
            progress["line"] = (
                f"round {report.rounds}: {sum(report.outcomes.values()):,} groups  {line}"
            )
            if tty:
                self.stdout.write(f"\r{progress['line']}", ending="")
                sys.stdout.flush()

        def on_wait(delay: float, waited: float) -> None:
            """Say why the command waits: on a terminal at every wait, else every 5 s."""
            why = (
                f"waiting for retries: the next is due in {delay:.1f} s (waited {waited:.0f} s "
                f"of --max-wait {options['max_wait']:.0f} s)"
            )
            if tty:
                self.stdout.write(f"\r{progress['line']}  {why}", ending="")
                sys.stdout.flush()
            elif waited - progress["said_at"] >= 5:
                progress["said_at"] = waited
                self.stdout.write(f"{progress['line']}; {why}")

        try:
            report = run_inline(
                options["streams"] or None,
                until_empty=options["until_empty"],
                max_wait_seconds=options["max_wait"],
                on_round=on_round,
                on_wait=on_wait,
            )
        except UnknownStream as exc:
            raise CommandError(str(exc)) from exc
        if tty:
            self.stdout.write("")
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "none"
        self.stdout.write(
            f"Processed {sum(report.outcomes.values()):,} groups ({outcomes}) in "
            f"{report.jobs['run']:,} run job(s); "
            f"{report.rounds} round(s), stopped: {report.stopped_because}."
        )
        if report.stopped_because in ("timeout", "paused"):
            raise CommandError(
                "Rows are left: "
                + (
                    "a stream is paused."
                    if report.stopped_because == "paused"
                    else "retries were not due within --max-wait."
                )
            )
