from __future__ import annotations

import json
import textwrap
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_outbox.exceptions import UnknownStream
from django_outbox.jobs.staging import staging_databases
from django_outbox.streams.status import all_statuses, staged_status

#: A kept staged job's error is shortened to this many characters in the text output.
ERROR_WIDTH = 160


class Command(BaseCommand):
    help = (
        "Show each stream's backlog, lag, groups in flight and recent throughput, and the "
        "staged jobs kept with an error."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("streams", nargs="*", help="Streams to show (default: all).")
        parser.add_argument("--json", action="store_true", help="Print JSON for machines.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            statuses = all_statuses(options["streams"] or None)
        except UnknownStream as exc:
            raise CommandError(str(exc)) from exc
        staged = staged_status()
        if options["json"]:
            data = {"streams": [s.as_json() for s in statuses], "staged_jobs": staged}
            self.stdout.write(json.dumps(data, indent=2))
            return
        header = (
            f"{'stream':<20} {'state':<7} {'backlog':>9} {'lag':>8} {'claimed':>7} "
            f"{'running':>7} {'retrying':>8} {'done 1h':>9} {'failed 1h':>9}"
        )
        self.stdout.write(header)
        for s in statuses:
            backlog = f"{s.backlog:,}" + ("+" if s.backlog_capped else "")
            lag = "-" if s.lag_seconds is None else f"{s.lag_seconds:.0f}s"
            self.stdout.write(
                f"{s.stream:<20} {'paused' if s.paused else 'active':<7} {backlog:>9} {lag:>8} "
                f"{s.groups_claimed:>7} {s.groups_running:>7} {s.groups_retrying:>8} "
                f"{s.archived_last_hour:>9,} {s.failed_last_hour:>9,}"
            )
            if s.paused_until is not None:
                self.stdout.write(
                    f"  {s.stream} is paused for {s.pause_seconds:.0f}s more (until "
                    f"{s.paused_until:%H:%M:%S}): its handler asked to retry later (RetryAfter)."
                )
            if s.calls_per_second is not None:
                self.stdout.write(
                    f"  {s.stream} has a rate budget of {s.calls_per_second:g} handler calls/s "
                    f"({s.budget_calls:,} calls made under it)."
                )
            if s.rows_per_second is not None:
                self.stdout.write(
                    f"  {s.stream} has a row budget of {s.rows_per_second:g} rows/s "
                    f"({s.budget_rows:,} rows handed over under it)."
                )
            if s.claim_floor_off:
                self.stdout.write(f"  {s.stream} keeps no claim floor: {s.claim_floor_off}.")
            if s.groups_isolating:
                self.stdout.write(
                    f"  {s.groups_isolating} group(s) of {s.stream} were split from a group "
                    "that failed as a whole, to isolate the failing rows (admin: groups, "
                    "split depth)."
                )
            if s.held_keys:
                self.stdout.write(
                    f"  {s.held_keys:,} key(s) of {s.stream} are held by a dead letter: their "
                    "later rows wait (admin: held keys, release)."
                )
            if s.groups_dead_lettering:
                self.stdout.write(
                    f"  {s.groups_dead_lettering} group(s) of {s.stream} could not be "
                    "dead-lettered and are kept with their rows: see their last_error "
                    "(admin: groups, state dead_lettering)."
                )
        if staged["kept"]:
            self.stdout.write(
                f"{staged['kept']:,} staged job(s) kept with an error and not forwarded: see "
                "their last_error (admin: staged jobs), fix the cause, then 'Forward now'."
            )
            self._name_kept(staged)

    def _name_kept(self, staged: dict[str, Any]) -> None:
        many_databases = len(staging_databases()) > 1
        for job in staged["kept_jobs"]:
            where = f" (database {job['database']})" if many_databases else ""
            error = textwrap.shorten(job["error"], ERROR_WIDTH, placeholder=" …")
            self.stdout.write(f"  #{job['id']}{where} {job['func']}: {error}")
        more = staged["kept"] - len(staged["kept_jobs"])
        if more > 0:
            self.stdout.write(f"  … and {more:,} more.")
