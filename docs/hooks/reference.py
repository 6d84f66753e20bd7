# ruff: noqa: RUF001
"""Render the reference pages from the code, at build time (an MkDocs hook).

A page holds a marker such as ``<!-- reference:stream-options -->``; the hook replaces
it with a table built from where the thing is defined:

- settings: the option tables (``django_outbox.conf``, ``django_outbox.unique.options``,
  ``django_outbox.tasks_backend.options``): names, defaults and check ids come from
  there; the one-line meaning of each option from :data:`OPTION_DOCS` below;
- system checks: every id the check modules and option tables use, with the hints
  written in the code; the one-line problem of each id from :data:`CHECK_DOCS`;
- management commands: each command's own argparse arguments and help;
- signals: the ``Signal`` objects of ``django_outbox.signals`` and its docstring;
- metrics: the metric families ``django_outbox.metrics`` declares.

An option or a check id the code has and this file does not describe (or the reverse)
stops the build with its name: the reference cannot drift from the code.
``tests/docs/test_docs_reference.py`` renders every marker the same way.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_outbox"
MARKER = re.compile(r"<!-- reference:([a-z-]+) -->")


class ReferenceDrift(Exception):
    """The code and the reference's descriptions disagree."""


# --------------------------------------------------------------------------- options

#: The meaning of every option, by (table, name). Names, defaults and check ids are
#: read from the option tables.
OPTION_DOCS: dict[tuple[str, str], str] = {
    # DJANGO_OUTBOX top level
    ("global", "STREAMS"): "stream name → its options (below). Names: 1–64 of `a-z 0-9 _ -`, "
    "starting with a letter or digit.",
    ("global", "ARCHIVE_RETENTION_DAYS"): "days archived `done` rows are kept (`outbox_prune`)",
    ("global", "ARCHIVE_FAILED_RETENTION_DAYS"): "days dead letters are kept, for replay",
    ("global", "STAGING"): "staged jobs: [`STAGING` options](reference/settings.md#staging)",
    ("global", "IDEMPOTENCY"): "idempotency keys: [`IDEMPOTENCY` "
    "options](reference/settings.md#idempotency)",
    ("global", "PRUNE_EVERY_MINUTES"): "interval of the `django_outbox:prune` schedule",
    ("global", "METRICS_TOKEN"): "bearer token accepted by the metrics view (besides users "
    "with `view_streamstate`); at least 16 characters",
    ("global", "DISPATCH_ON_COMMIT"): "who dispatches the unique jobs (and `django.tasks` "
    'tasks) a transaction enqueued, right after its commit: `"inline"`, the committing '
    "thread (a dispatch transaction of its own, 1 to 2 ms of the request; on PostgreSQL "
    "with the ORM broker a one-job enqueue instead queues the kind's wake in its own "
    'INSERT, and nothing runs after the commit); `"thread"`, a '
    "worker: the commit wakes a dispatcher thread of the process, which gathers kicks for "
    "10 ms and sends each kind one django-q2 task (`run_unique_jobs` with no jobs; none "
    "while the kind is at its concurrency) that dispatches in the worker taking it and runs "
    "the chunk it keeps there. The request writes nothing more than its rows; the task "
    "passes through the broker as a dispatched chunk would. The thread keeps its "
    "connections while kicks come and closes them when idle. When the process ends, the "
    "exiting thread hands over the kinds still wanted, after the round the thread may be "
    "in: at interpreter exit and at the end of a `multiprocessing` child (a django-q2 worker "
    "that recycles, stops with its cluster or returns after a task's timeout), where "
    "`atexit` does not run. A process killed first (SIGKILL, or the SIGTERM django-q2 sends "
    "a timed-out worker arriving during the hand-off) leaves them to the kind's schedule, "
    "like any lost kick. A forked child starts with a dispatcher of its own: nothing "
    "inherited from the parent, no lock the parent's threads held",
    # a stream
    ("stream", "HANDLER"): "**required.** Dotted path of `handler(batch) -> None | BatchResult`",
    ("stream", "MODEL"): "the buffer model (`app_label.Model`, a `BufferEvent` subclass). A "
    "custom model belongs to one stream; the generic one is shared",
    ("stream", "BATCH_SIZE"): "rows per group (one handler call)",
    ("stream", "RUNS"): "runs of the stream in flight at most (a full claim starts more, "
    "up to this)",
    ("stream", "EVERY_MINUTES"): "interval of the stream's distribute schedule "
    "(`outbox_schedules`)",
    ("stream", "MAX_ATTEMPTS"): "attempts per group before its rows become dead letters",
    ("stream", "BACKOFF_SECONDS"): "base of the exponential backoff (`base × 2^(n-1)`, "
    "jittered to 80–100 %)",
    ("stream", "BACKOFF_MAX_SECONDS"): "cap of the backoff; at least `BACKOFF_SECONDS`",
    ("stream", "LEASE_SECONDS"): "lease of a claimed or running group; `heartbeat()` and "
    "`AUTO_HEARTBEAT` extend it ([choosing it](how-to/leases-and-timeouts.md))",
    ("stream", "HANDOFF_SECONDS"): "with a broker that can lose jobs (Redis): how long a "
    "queued group waits for its run job before it is handed over again (with the ORM broker "
    "on our database the job commits with the group and `LEASE_SECONDS` applies)",
    ("stream", "ARCHIVE"): "archive done rows (dead letters are always archived)",
    ("stream", "TRANSACTIONAL"): "run the handler inside the finalize transaction: its "
    "database writes commit with the archive, exactly once",
    ("stream", "CLUSTER"): 'django-q2 cluster (`Q_CLUSTER["ALT_CLUSTERS"]`) for the '
    "stream's jobs; `None`: the default cluster",
    ("stream", "DATABASE"): "alias of `settings.DATABASES` the stream lives on: its buffer "
    "rows, groups, state and archive; `None`: the database the router picks for writes of "
    "its buffer model ([streams on many databases](how-to/many-databases.md))",
    ("stream", "ON_EXHAUSTED"): "dotted path of `hook(batch, error)`, run before a group's "
    "rows become dead letters",
    ("stream", "ISOLATE_FAILURES"): "split a group that fails as a whole in halves until the "
    "bad row is alone ([failure isolation](how-to/failures-and-dead-letters.md))",
    ("stream", "ORDER_KEY"): "a field of the stream's buffer model (on the generic buffer: "
    "a top-level key of the payloads, stored by `publish()`): rows with the same value "
    "reach the handler in id order, never overtaking each other; `None`: no order "
    "([ordered streams](how-to/ordered-streams.md))",
    ("stream", "ORDER_AFTER_DEAD_LETTER"): '`"hold"`: a dead-lettered row holds back its '
    "key's later rows until an operator releases the key (admin, *held keys*); "
    '`"continue"`: they go on',
    ("stream", "AUTO_HEARTBEAT"): "extend a running group's lease every `LEASE_SECONDS / 3` "
    "from a thread of the worker while its handler runs",
    ("stream", "CALLS_PER_SECOND"): "rate budget: at most this many handler calls of the "
    "stream start per second, across every worker and cluster (`None`: no budget); see "
    "[rate limits](how-to/rate-limits.md)",
    ("stream", "ROWS_PER_SECOND"): "row budget: at most this many rows of the stream reach "
    "its handler per second, across every worker and cluster; claims take at most one "
    "second's rows (`None`: no row budget); see [rate limits](how-to/rate-limits.md)",
    ("stream", "ARCHIVE_RETENTION_DAYS"): "this stream's own retention of archived `done` "
    "rows; `None`: the global one",
    ("stream", "ARCHIVE_FAILED_RETENTION_DAYS"): "this stream's own retention of dead "
    "letters; `None`: the global one",
    # STAGING
    ("staging", "ALLOWED_MODULES"): "module paths whose functions may be staged; empty: "
    "staging is off (no drain schedule)",
    ("staging", "BATCH_SIZE"): "staged jobs per drain transaction",
    ("staging", "EVERY_MINUTES"): "interval of the `django_outbox:drain` schedule",
    ("staging", "DRAIN_SECONDS"): "time budget of one scheduled drain; below the cluster's "
    "`timeout`",
    ("staging", "FORWARD_ON_COMMIT"): "hand a job due now to django-q2 right after the "
    "commit instead of leaving it to the drainer",
    ("staging", "REDELIVER_SECONDS"): "with a broker that can lose jobs (Redis): a staged "
    "job whose row is still there this long after it was forwarded is forwarded again "
    "(never while it runs); above every cluster's `timeout` (E057)",
    ("staging", "MAX_FORWARDS"): "with a broker that can lose jobs: a staged job forwarded "
    "this many times that is due again is kept with an error (admin, `outbox_status`, "
    'metrics) instead of being forwarded again; the admin\'s "Forward now" re-queues it',
    ("staging", "CLUSTER"): "django-q2 cluster that runs the drain schedule",
    # IDEMPOTENCY
    ("idempotency", "RETENTION_DAYS"): "how long a completed key is kept (the default `ttl` "
    "of `@idempotent`)",
    # class Job: of a unique-job kind
    ("kind", "unique_fields"): "fields whose values make a job unique until a worker starts "
    "it (one job per key pending or dispatched); empty: every `enqueue` creates a job",
    ("kind", "unique_while_executing"): "fields of the exclusive key: one running job per "
    "key; also what relates jobs for `ordering`. `None`: the unique fields",
    ("kind", "ordering"): '`"created"` (related jobs start in creation order, each after '
    'the previous one finished) or `"ready"` (first ready, first served)',
    ("kind", "max_attempts"): "attempts before a job is failed; a crash counts as one",
    ("kind", "backoff_seconds"): "base of the exponential retry delay (jitter 0.8–1×)",
    ("kind", "backoff_max_seconds"): "cap of the retry delay",
    ("kind", "concurrency"): "jobs of the kind running or queued on django-q2 at once; a "
    "chunk of n jobs counts n (its jobs run one at a time, so at most `concurrency` jobs "
    "perform at once, usually fewer)",
    ("kind", "chunk_size"): "most jobs in one django-q2 task; dispatch makes chunks of "
    "`min(chunk_size, ceil(concurrency / workers))`",
    ("kind", "jobs_per_statement"): "jobs of a chunk started by one statement (a group), "
    "whose successes the next one records: fewer statements for short jobs. A crash costs "
    "none of a group's jobs an attempt (which one was running is not known): each runs "
    "again alone, where a crash counts. 1 records each job before the next starts. The "
    "group's leases run "
    "from its statement: a job that waited in its group for a third of `lease_seconds` has "
    "them checked and extended first; a heartbeat extends the leases of the jobs started "
    "with its own",
    ("kind", "priority_field"): "a non-null integer field of the kind: among ready jobs, "
    "higher values start first (equal ones in the kind's `ordering`); related jobs still "
    "follow `ordering`",
    ("kind", "result_field"): "a `JSONField(null=True)` of the kind: what `perform()` "
    "returns is stored there, by the statement that marks the job processed; a value that "
    "is not JSON fails the job at once",
    ("kind", "workers_field"): 'a `TextField(default="")` of the kind: every attempt '
    "appends its worker (`host:pid`), one per line",
    ("kind", "nullable_keys"): "allow nullable unique fields: a job whose key holds a NULL "
    "has no key, so it is never deduplicated nor kept from running beside another",
    ("kind", "lease_seconds"): "lease of an attempt from its start, renewed by "
    "`heartbeat()`; must cover the wait in django-q2's queue and the time between heartbeats",
    ("kind", "cluster"): 'django-q2 cluster (`Q_CLUSTER["ALT_CLUSTERS"]`) of the kind\'s jobs',
    ("kind", "retention_days"): "processed and failed jobs older than this are pruned",
    ("kind", "dispatch_every_minutes"): "interval of the kind's dispatch schedule",
}


def _tables() -> dict[str, Any]:
    from django_outbox import conf
    from django_outbox.unique import options as kind

    return {
        "global": conf.GLOBAL_OPTIONS,
        "stream": conf.STREAM_OPTIONS,
        "staging": conf.STAGING_OPTIONS,
        "idempotency": conf.IDEMPOTENCY_OPTIONS,
        "kind": kind.OPTIONS,
    }


def _check_option_docs() -> None:
    declared = {(table, o.name) for table, options in _tables().items() for o in options}
    missing = sorted(declared - set(OPTION_DOCS))
    stale = sorted(set(OPTION_DOCS) - declared)
    if missing or stale:
        raise ReferenceDrift(
            f"docs/hooks/reference.py OPTION_DOCS: undocumented options {missing}, "
            f"options no longer in the code {stale}"
        )


def _value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`".replace("|", "\\|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


#: Check ids of the options whose value is checked by code of its own (kind CUSTOM).
CUSTOM_CHECKS: dict[tuple[str, str], tuple[str, ...]] = {
    ("global", "STREAMS"): ("E003", "E004", "E005", "E006"),
    ("global", "STAGING"): ("E050", "E051", "E056"),
    ("global", "IDEMPOTENCY"): ("E050", "E051"),
    ("stream", "HANDLER"): ("E010", "E011", "E012"),
    ("stream", "MODEL"): ("E020", "E021", "E022"),
    ("stream", "ON_EXHAUSTED"): ("E013", "E014"),
    ("stream", "ORDER_KEY"): ("E023", "W005"),
    ("stream", "BACKOFF_MAX_SECONDS"): ("E033",),
    ("stream", "CLUSTER"): ("W002", "E041"),
    ("stream", "DATABASE"): ("E025", "W006", "W007"),
    ("stream", "LEASE_SECONDS"): ("E042",),
    ("staging", "DRAIN_SECONDS"): ("E056",),
    ("staging", "REDELIVER_SECONDS"): ("E057",),
    ("kind", "unique_fields"): ("E071", "E072", "E073"),
    ("kind", "unique_while_executing"): ("E071", "E072", "E073"),
    ("kind", "priority_field"): ("E080",),
    ("kind", "result_field"): ("E081",),
    ("kind", "workers_field"): ("E082",),
    ("kind", "cluster"): ("E077",),
}


def _checks_of(table: str, option: Any) -> str:
    ids = [i for i in (option.check, option.maximum_check) if i]
    ids += [i for i in CUSTOM_CHECKS.get((table, option.name), ()) if i not in ids]
    return ", ".join(f"[{i}](reference/checks.md#{i.lower()})" for i in ids)


def render_options(table: str, *, defaults: dict[str, Any] | None = None) -> str:
    _check_option_docs()
    rows = ["| option | default | meaning | check |", "|---|---|---|---|"]
    for option in _tables()[table]:
        name = option.name.upper() if defaults is not None else option.name
        default = (defaults or {}).get(option.name, option.default)
        meaning = OPTION_DOCS[(table, option.name)]
        if option.maximum is not None:
            meaning += f"; at most {option.maximum:,}"
        rows.append(
            f"| `{name}` | {_value(default)} | {_cell(meaning)} | {_checks_of(table, option)} |"
        )
    return "\n".join(rows)


def _task_record_defaults() -> dict[str, Any]:
    """The ``class Job:`` values of ``TaskRecord``, read from its source (the model needs
    Django 6.0; the docs build runs on any supported Django)."""
    tree = ast.parse((PACKAGE / "tasks_backend" / "models.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Job":
            return {
                stmt.targets[0].id: ast.literal_eval(stmt.value)
                for stmt in node.body
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
            }
    raise ReferenceDrift("TaskRecord has no class Job")


def tunable_task_options() -> list[str]:
    """The kind options a ``TASKS`` alias's ``OPTIONS`` may set (``TUNABLE``), read from
    the source for the same reason."""
    tree = ast.parse((PACKAGE / "tasks_backend" / "options.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TUNABLE":
            names = next(n for n in ast.walk(node.value) if isinstance(n, ast.Tuple))
            return [ast.literal_eval(element) for element in names.elts]
    raise ReferenceDrift("django_outbox/tasks_backend/options.py has no TUNABLE")


def render_task_options() -> str:
    from django_outbox.unique.options import OPTIONS

    _check_option_docs()
    own = _task_record_defaults()
    rows = ["| `OPTIONS` key | default | meaning |", "|---|---|---|"]
    for name in tunable_task_options():
        default = own.get(name, OPTIONS.by_name[name].default)
        meaning = OPTION_DOCS[("kind", name)]
        rows.append(f"| `{name.upper()}` | {_value(default)} | {_cell(meaning)} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------- checks

#: What each check id reports. The ids themselves and their hints are read from the code.
CHECK_DOCS: dict[str, str] = {
    "E001": "`DJANGO_OUTBOX` is not a dict",
    "E002": "unknown top-level key",
    "E003": "`STREAMS` is not a dict",
    "E004": "invalid stream name",
    "E005": "a stream's options are not a dict",
    "E006": "unknown stream option (a typo)",
    "E007": '`DISPATCH_ON_COMMIT` is not `"inline"` or `"thread"`',
    "E010": "a stream has no `HANDLER`",
    "E011": "`HANDLER` cannot be imported",
    "E012": "`HANDLER` is not a callable's dotted path",
    "E013": "`ON_EXHAUSTED` cannot be imported",
    "E014": "`ON_EXHAUSTED` is not a callable's dotted path",
    "E020": "`MODEL` is not an installed model",
    "E021": "`MODEL` is not a `BufferEvent` subclass",
    "E022": "a custom buffer model is bound to two streams on one database",
    "E023": "`ORDER_KEY` is not a field of the stream's own buffer model, or (generic "
    "buffer) not the name of a payload key",
    "E024": '`ORDER_AFTER_DEAD_LETTER` is not `"hold"` or `"continue"`',
    "E025": "`DATABASE` does not name a database of `settings.DATABASES`",
    "E030": "a stream's size or duration option is not a positive integer",
    "E031": "`ARCHIVE`, `TRANSACTIONAL`, `ISOLATE_FAILURES` or `AUTO_HEARTBEAT` is not a boolean",
    "E032": "a stream's `CLUSTER` is not a name or `None`",
    "E033": "`BACKOFF_MAX_SECONDS` is below `BACKOFF_SECONDS`",
    "E034": "`ARCHIVE_RETENTION_DAYS` is not a positive integer",
    "E035": "`PRUNE_EVERY_MINUTES` is not a positive integer",
    "E036": "`METRICS_TOKEN` is not `None` or a string of at least 16 characters",
    "E037": "a stream's `ARCHIVE_RETENTION_DAYS`/`ARCHIVE_FAILED_RETENTION_DAYS` is not a "
    "positive integer or `None`",
    "E038": "`ARCHIVE_FAILED_RETENTION_DAYS` is not a positive integer",
    "E039": "a stream's `BATCH_SIZE` is above 100,000 (one claim locks, one handler call "
    "holds that many rows)",
    "E040": "`django_q` is not installed",
    "E041": "the stream's django-q2 cluster has no `timeout` below its `retry`",
    "E042": "that `timeout` is longer than the stream's `LEASE_SECONDS` while "
    "`AUTO_HEARTBEAT` is off",
    "E050": "`STAGING` or `IDEMPOTENCY` is not a dict",
    "E051": "unknown `STAGING`/`IDEMPOTENCY` option",
    "E052": "a `STAGING`/`IDEMPOTENCY` size, duration or count is not a positive integer",
    "E053": "`FORWARD_ON_COMMIT` is not a boolean",
    "E054": "`ALLOWED_MODULES` is not a list of module paths",
    "E055": '`STAGING["CLUSTER"]` is not a name or `None`',
    "E056": "`DRAIN_SECONDS` is not below the drain cluster's `timeout`",
    "E057": "with a broker that can lose jobs, `REDELIVER_SECONDS` does not exceed the "
    "`timeout` of `Q_CLUSTER` or of a cluster in `ALT_CLUSTERS`",
    "E060": "a stream's `CALLS_PER_SECOND` is not a positive number or `None`",
    "E061": "a stream's `ROWS_PER_SECOND` is not a positive number or `None`",
    "E070": "a kind's `class Job` has an unknown option",
    "E071": "`unique_fields`/`unique_while_executing` is not a list of field names",
    "E072": "`unique_fields`/`unique_while_executing` names a field the kind does not have",
    "E073": "a unique field is nullable (without `nullable_keys = True`)",
    "E074": '`ordering` is not `"created"` or `"ready"`',
    "E075": "a kind's count or duration option is not a positive integer",
    "E076": "`backoff_seconds`/`backoff_max_seconds` is not a positive number, or the cap "
    "is below the base",
    "E077": "a kind's `cluster` is not a name, or names a cluster `Q_CLUSTER` does not define",
    "E078": "a kind does not override `perform()`",
    "E079": "a kind's `Job` is not a class",
    "E080": "`priority_field` is not a non-null integer field of the kind",
    "E081": "`result_field` is not a nullable JSON field of the kind",
    "E082": "`workers_field` is not a non-null text field of the kind",
    "E083": "`nullable_keys` is not a boolean",
    "E084": "a `TASKS` alias uses `OutboxTaskBackend` but `django_outbox.tasks_backend` is "
    "not installed (a plain `check` reports it)",
    "E085": "an unknown or bad option in a `TASKS` alias's `OPTIONS`",
    "E086": "two `TASKS` aliases of the backend set an option differently",
    "E090": "the partitioned archive's table records no valid interval (on any database "
    "that holds a stream; the message names it)",
    "E091": "the partitioned archive has no partition for rows archived now (on any database "
    "that holds a stream; the message names it)",
    "W001": 'a SQLite database without `"transaction_mode": "IMMEDIATE"`',
    "W002": '`CLUSTER` names a cluster missing from `Q_CLUSTER["ALT_CLUSTERS"]`',
    "W003": "a stream option of an earlier version (`KICK`, `MAX_BATCHES`): ignored, remove it",
    "W004": "the partitioned archive's partitions end before the next prune run is due (on "
    "any database that holds a stream; the message names it)",
    "W005": "an ordered stream's own buffer model has no index on `(key, id)` of its waiting rows",
    "W006": "a stream's database lacks migrations of django_outbox (database check: "
    "`check --database` runs it; `migrate`, which applies them, does not warn)",
    "W007": "a stream's database could not be read to check its migrations",
    "W008": "a stream option under its old name (`CHAINS`, now `RUNS`): its value is used, "
    "rename it",
    "W009": "a module imported by the path it had before 0.1's layout (`django_outbox.staging`, "
    "now `django_outbox.jobs.staging`): it works in 0.1 only, import the new path",
}

#: The modules whose source holds check ids (as string literals).
CHECK_SOURCES = (
    "checks.py",
    "conf.py",
    "base/option_table.py",
    "unique/checks.py",
    "unique/options.py",
    "tasks_backend/checks.py",
)
CHECK_ID = re.compile(r"""["'](?:django_outbox\.)?([EW]\d{3})["']""")


def check_ids_in_code() -> set[str]:
    """Every check id written in the check modules and option tables."""
    found: set[str] = set()
    for name in CHECK_SOURCES:
        found.update(CHECK_ID.findall((PACKAGE / name).read_text()))
    return found


def _text(node: ast.AST | None) -> str | None:
    """A string literal or f-string as text, its placeholders shown as ``…``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "…" for part in node.values
        )
    return None


def hints_in_code() -> dict[str, list[str]]:
    """The hints the code gives with each check id: literal ``Error``/``Warning``/
    ``Problem`` calls, and the option tables' kinds."""
    hints: dict[str, list[str]] = {}

    def add(check: str, hint: str | None) -> None:
        if hint and hint not in hints.setdefault(check, []):
            hints[check].append(hint)

    for name in CHECK_SOURCES:
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            if node.func.id in ("Error", "Warning"):
                check = _text(keywords.get("id"))
                if check and "…" not in check:
                    add(check.removeprefix("django_outbox."), _text(keywords.get("hint")))
            elif node.func.id in ("Problem", "FieldOption") and len(node.args) >= 3:
                check = _text(node.args[0])
                hint = _text(node.args[-1] if node.func.id == "FieldOption" else node.args[2])
                if check:
                    add(check, hint)
    for options in _tables().values():
        for option in options:
            if option.check and option.kind.hint:
                hint = option.hint or option.kind.hint
                add(option.check, hint.format(default="…", name=option.name))
            if option.maximum_check:
                add(option.maximum_check, option.maximum_hint.format(maximum=f"{option.maximum:,}"))
    return hints


def _escape(text: str) -> str:
    """Plain text as Markdown: brackets, stars and underscores taken literally."""
    return re.sub(r"([\\\[\]*_<>])", r"\\\1", text)


def render_checks() -> str:
    ids = check_ids_in_code()
    missing = sorted(ids - set(CHECK_DOCS))
    stale = sorted(set(CHECK_DOCS) - ids)
    if missing or stale:
        raise ReferenceDrift(
            f"docs/hooks/reference.py CHECK_DOCS: undescribed check ids {missing}, "
            f"ids no longer in the code {stale}"
        )
    hints = hints_in_code()
    out = []
    for check in sorted(ids, key=lambda i: (i[0] != "E", i)):
        level = "Error" if check.startswith("E") else "Warning"
        out.append(f"### {check}\n\n`django_outbox.{check}` ({level}): {CHECK_DOCS[check]}.\n")
        for hint in hints.get(check, []):
            out.append(f"- *Hint:* {_escape(hint)}")
        out.append("")
    return "\n".join(out)


# -------------------------------------------------------------------------- commands


def _django() -> None:
    """Set up Django with the app installed, unless a caller (pytest) already has."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=[
                "django.contrib.contenttypes",
                "django.contrib.auth",
                "django_q",
                "django_outbox",
            ],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            USE_TZ=True,
            Q_CLUSTER={"name": "docs", "orm": "default", "timeout": 60, "retry": 120},
        )
    django.setup()


def command_names() -> list[str]:
    folder = PACKAGE / "management" / "commands"
    return sorted(p.stem for p in folder.glob("outbox_*.py"))


def render_commands() -> str:
    from django.core.management import load_command_class
    from django.core.management.base import BaseCommand

    _django()
    common = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    out = []
    for name in command_names():
        command = load_command_class("django_outbox", name)
        parser = command.create_parser("manage.py", name)
        out.append(f"## {name}\n\n{command.help}\n")
        rows = ["| argument | meaning | default |", "|---|---|---|"]
        for action in parser._actions:
            if action.dest in common:
                continue
            flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
            default = action.default
            shown = "" if default in (None, False, [], "==SUPPRESS==") else _value(default)
            rows.append(f"| {flags} | {_cell(action.help or '')} | {shown} |")
        if len(rows) > 2:
            out.append("\n".join(rows) + "\n")
    out.append(
        "Every command also takes Django's common options (`--verbosity`, `--settings`, "
        "`--pythonpath`, `--traceback`, `--no-color`, `--force-color`, `--skip-checks`)."
    )
    return "\n".join(out)


# --------------------------------------------------------------------------- signals


def render_signals() -> str:
    from django.dispatch import Signal

    _django()
    module = importlib.import_module("django_outbox.signals")
    signals = [name for name, value in vars(module).items() if isinstance(value, Signal)]
    doc = inspect.getdoc(module) or ""
    described = dict(re.findall(r"^``(\w+)``\n((?:    .*\n?)+)", doc, flags=re.M))
    described["staged_jobs_forwarded"] = (
        'sender `"django_outbox.staged"`; `count` (jobs handed to django-q2), `duration` '
        "(seconds of the batch)"
    )
    missing = sorted(set(signals) - set(described))
    if missing:
        raise ReferenceDrift(f"django_outbox.signals does not describe {missing}")
    rows = ["| signal | keyword arguments |", "|---|---|"]
    for name in signals:
        text = " ".join(described[name].split()).replace("``", "`")
        rows.append(f"| `django_outbox.signals.{name}` | {_cell(text)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- metrics


def metric_families() -> list[tuple[str, str, list[str]]]:
    """(name, help, labels) of every ``GaugeMetricFamily`` in ``metrics.py``."""
    from django_outbox.streams.status import COUNT_CAP

    tree = ast.parse((PACKAGE / "metrics.py").read_text())
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "GaugeMetricFamily"
        ):
            name = _text(node.args[0])
            help_text = (_text(node.args[1]) or "").replace("…", f"{COUNT_CAP:,}")
            labels = next(
                (ast.literal_eval(k.value) for k in node.keywords if k.arg == "labels"), []
            )
            found.append((name, help_text, labels))
    return found


def render_metrics() -> str:
    _django()
    rows = ["| metric | labels | meaning |", "|---|---|---|"]
    for name, help_text, labels in metric_families():
        shown = ", ".join(f"`{label}`" for label in labels)
        rows.append(f"| `{name}` | {shown} | {_cell(help_text)} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------ hook

RENDERERS = {
    "global-options": lambda: render_options("global"),
    "stream-options": lambda: render_options("stream"),
    "staging-options": lambda: render_options("staging"),
    "idempotency-options": lambda: render_options("idempotency"),
    "kind-options": lambda: render_options("kind"),
    "task-options": render_task_options,
    "checks": render_checks,
    "commands": render_commands,
    "signals": render_signals,
    "metrics": render_metrics,
}


LINK = re.compile(r"\]\(([a-z-]+/[a-z-]+\.md(?:#[a-z0-9-]*)?)\)")


def render(markdown: str, page: str = "reference/settings.md") -> str:
    """*markdown* with every reference marker replaced by its table.

    Links in the tables are written from the docs root; they are made relative to
    *page* (the page's path under docs/).
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in RENDERERS:
            raise ReferenceDrift(f"unknown reference marker {name!r}")
        here = posixpath.dirname(page) or "."
        return LINK.sub(
            lambda link: f"]({posixpath.relpath(link.group(1), here)})", RENDERERS[name]()
        )

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return render(markdown, page.file.src_uri)
