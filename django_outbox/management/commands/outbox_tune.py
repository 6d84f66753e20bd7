from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from django_outbox.archive import tune


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise ValueError(text)
    return value


_ratio.__name__ = "ratio between 0 and 1"


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


_count.__name__ = "non-negative integer"


class Command(BaseCommand):
    help = (
        "PostgreSQL health of the app's tables: size, live and dead tuples, last "
        "autovacuum/autoanalyze, autovacuum parameters; --apply sets the recommended "
        "parameters, --check exits 1 on problems, --explain prints the pipeline's plans. "
        "Every database that holds a stream or a table of the app; --database: one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--apply", action="store_true", help="Set the recommended autovacuum parameters."
        )
        parser.add_argument(
            "--check", action="store_true", help="Exit 1 with one line per problem."
        )
        parser.add_argument(
            "--explain",
            action="store_true",
            help="Print the plans of the claim, group-fetch and finalize statements.",
        )
        parser.add_argument("--json", action="store_true", help="Machine-readable output.")
        parser.add_argument(
            "--database",
            help="Only this database alias (default: every database that holds a table "
            "of the app).",
        )
        parser.add_argument(
            "--max-dead-ratio",
            type=_ratio,
            default=0.2,
            help="--check: dead tuples over live+dead above this ratio are a problem (0.2).",
        )
        parser.add_argument(
            "--min-dead",
            type=_count,
            default=1000,
            help="--check: ignore the ratio below this many dead tuples (1000).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        database = options["database"]
        if database is not None and database not in connections.settings:
            raise CommandError(f"{database!r} is not a database of settings.DATABASES.")
        if not tune.postgres_tables(database):
            self.stdout.write("outbox_tune applies to PostgreSQL only; nothing to do here.")
            return
        changes = tune.apply(database) if options["apply"] else []
        reports = tune.report(database)
        servers = tune.servers(database)
        found = tune.problems(
            reports,
            max_dead_ratio=options["max_dead_ratio"],
            min_dead=options["min_dead"],
            server_reports=servers,
        )
        statements = tune.pipeline_statements(database) if options["explain"] else []
        if options["json"]:
            data: dict[str, Any] = {
                "servers": [s.as_json() for s in servers],
                "tables": [r.as_json() for r in reports],
                "changes": changes,
                "problems": found,
            }
            if statements:
                data["plans"] = [
                    {
                        "stream": s.stream,
                        "database": s.database,
                        "statement": s.name,
                        "plan": tune.plan(s),
                    }
                    for s in statements
                ]
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            for line in changes:
                self.stdout.write(line)
            for server in servers:
                self.stdout.write(_server_line(server))
            self._table(reports)
            for statement in statements:
                self.stdout.write(
                    f"\n-- {statement.stream}: {statement.name} (database {statement.database})"
                )
                self.stdout.write(tune.plan_text(statement))
        if options["check"]:
            if found:
                for line in found:
                    self.stderr.write(line)
                sys.exit(1)
            if not options["json"]:
                self.stdout.write("No problems found.")

    def _table(self, reports: list[tune.TableReport]) -> None:
        width = max([len("database"), *(len(r.database) for r in reports)])
        header = (
            f"{'database':<{width}} {'table':<36} {'size':>10} {'live':>10} {'dead':>9} "
            f"{'dead%':>6} {'last autovacuum':<20} {'tuned':<5} role"
        )
        self.stdout.write(header)
        for r in reports:
            vacuumed = (r.last_autovacuum or "never")[:19]
            tuned = "-" if not r.recommended else ("yes" if not r.missing else "no")
            self.stdout.write(
                f"{r.database:<{width}} {r.table:<36} {_size(r.total_bytes):>10} "
                f"{r.live_tuples:>10,} "
                f"{r.dead_tuples:>9,} {r.dead_ratio:>6.1%} {vacuumed:<20} {tuned:<5} {r.role}"
            )


def _server_line(server: tune.ServerReport) -> str:
    settings = server.settings
    return (
        f"database {server.database}: autovacuum {settings.get('autovacuum', '?')}, "
        f"naptime {settings.get('autovacuum_naptime', '?')} s, "
        f"{settings.get('autovacuum_max_workers', '?')} workers, "
        f"track_counts {settings.get('track_counts', '?')}"
    )


def _size(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


__all__ = ["Command", "CommandError"]
