# ruff: noqa: RUF001
"""Render the reference pages from the code, at build time (an MkDocs hook).

A page holds a marker such as ``<!-- reference:stream-options -->``; the hook replaces
it with a table built from where the thing is defined:

- settings: the option tables (``django_outbox.conf``, ``django_outbox.unique.options``,
  ``django_outbox.tasks_backend.options``): names, types (from each option's kind),
  defaults and check ids come from there; the one-line meaning of each option from
  :data:`OPTION_DOCS` below;
- the settings examples: the sections of :data:`EXAMPLES`, a tested file that must set
  every option, and the hooks it names, each with how the code calls it
  (:data:`CALLABLE_DOCS`);
- system checks: every id the check modules and option tables use, with the hints
  written in the code; the one-line problem of each id from :data:`CHECK_DOCS`;
- management commands: each command's own argparse arguments and help;
- signals: the ``Signal`` objects of ``django_outbox.signals`` and its docstring;
- metrics: the metric families ``django_outbox.metrics`` declares.

An option, a kind, a hook or a check id the code has and this file does not describe (or
the reverse), or an option the examples do not set, stops the build with its name: the
reference cannot drift from the code.
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
    ("global", "DISPATCH_ON_COMMIT"): "who dispatches the unique jobs and `django.tasks` tasks "
    'a transaction enqueued, right after its commit: `"inline"`, the committing thread (1 to '
    '2 ms of the request); `"thread"`, a worker, handed the dispatch by a dispatcher thread '
    "of the process ([how each works](how-to/unique-jobs.md#who-dispatches-after-the-commit))",
    # a stream
    ("stream", "HANDLER"): "**required.** The stream's handler, called with each group's rows "
    "([signature](reference/settings.md#handler))",
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
    ("stream", "ON_EXHAUSTED"): "a hook run before a group's rows become dead letters "
    "([signature](reference/settings.md#on_exhausted))",
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
    "none of a group's jobs an attempt; 1 records each job before the next starts "
    "([groups, crashes and leases](how-to/unique-jobs.md#several-jobs-per-statement))",
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
    ("stream", "ORDER_KEY"): ("E023",),
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


def _kind_types() -> dict[Any, str]:
    """The type shown for each kind of option (a :func:`choice` shows its values)."""
    from django_outbox.base import option_table as t

    return {
        t.POSITIVE_INT: "`int ≥ 1`",
        t.POSITIVE_NUMBER: "`float > 0`",
        t.OPTIONAL_POSITIVE_INT: "`int ≥ 1` or `None`",
        t.OPTIONAL_POSITIVE_NUMBER: "`float > 0` or `None`",
        t.BOOL: "`bool`",
        t.CLUSTER: "`str` (cluster name) or `None`",
        t.MODULE_LIST: "`list[str]` (module paths)",
        t.TOKEN: "`str` (16+ characters) or `None`",
        t.CALLABLE_PATH: "`str` (dotted path)",
        t.OPTIONAL_CALLABLE_PATH: "`str` (dotted path) or `None`",
        t.MODEL_LABEL: "`str` (`app_label.Model`)",
        t.DATABASE_ALIAS: "`str` (database alias) or `None`",
        t.OPTIONAL_FIELD_NAME: "`str` (field name) or `None`",
        t.FIELD_NAMES: "`list[str]` (field names)",
        t.OPTIONAL_FIELD_NAMES: "`list[str]` (field names) or `None`",
        t.BLOCKS_BY_NAME: "`dict[str, dict]`",
        t.BLOCK: "`dict`",
    }


def type_of(table: str, option: Any) -> str:
    """The type of *option* as the settings tables show it, from its declared kind."""
    if option.kind.choices:
        shown = " or ".join(f'`"{value}"`' for value in option.kind.choices)
    else:
        shown = _kind_types().get(option.kind, "")
    if not shown:
        raise ReferenceDrift(
            f"{table} option {option.name}: its kind has no type in docs/hooks/reference.py "
            "_kind_types() (or the option declares no kind: give it one of "
            "django_outbox.base.option_table's)"
        )
    if option.maximum is not None:
        shown += f", at most {option.maximum:,}"
    return shown


def render_options(table: str, *, defaults: dict[str, Any] | None = None) -> str:
    _check_option_docs()
    rows = ["| option | type | default | meaning | check |", "|---|---|---|---|---|"]
    for option in _tables()[table]:
        name = option.name.upper() if defaults is not None else option.name
        default = (defaults or {}).get(option.name, option.default)
        meaning = OPTION_DOCS[(table, option.name)]
        rows.append(
            f"| `{name}` | {_cell(type_of(table, option))} | {_value(default)} | "
            f"{_cell(meaning)} | {_checks_of(table, option)} |"
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
    rows = ["| `OPTIONS` key | type | default | meaning |", "|---|---|---|---|"]
    for name in tunable_task_options():
        option = OPTIONS.by_name[name]
        default = own.get(name, option.default)
        meaning = OPTION_DOCS[("kind", name)]
        rows.append(
            f"| `{name.upper()}` | {_cell(type_of('kind', option))} | {_value(default)} | "
            f"{_cell(meaning)} |"
        )
    return "\n".join(rows)


# -------------------------------------------------------------------------- examples

#: The settings reference's examples (``tests/docs/test_docs_reference.py`` runs them):
#: ``DJANGO_OUTBOX`` and ``Q_CLUSTER``, a kind's ``class Job:``, ``TASKS``.
EXAMPLES = "tests/docs_examples/reference_settings.py"
#: Where the examples' hooks live: a dotted path the example gives must name a function
#: of a module there, shown by a snippet section of its own name.
HOOK_MODULES = "tests.docs_examples."

#: How the code calls each option that names a callable. Its example is the function
#: the settings example names, shown as written.
CALLABLE_DOCS: dict[tuple[str, str], str] = {
    ("stream", "HANDLER"): "Called by a worker for each group, with one argument: the "
    "group's `Batch` (`batch.events`, a queryset of its rows in id order; "
    "`batch.rows(*fields)`, the rows as dicts in one query; `batch.stream`, "
    "`batch.group_id`, `batch.attempt`). It runs outside any transaction, or inside the "
    "one that finishes the group with `TRANSACTIONAL`, and under the group's lease "
    "(`LEASE_SECONDS`; `AUTO_HEARTBEAT`). Return `None` when every row is done, or a "
    "`BatchResult({row id: reason})` naming the rows that failed (they are retried "
    "alone). Raise to fail the whole group: it is retried after a backoff; "
    "`PermanentFailure` says retrying cannot help, `RetryAfter(seconds)` pauses the "
    "stream without spending an attempt ([Failure isolation and dead "
    "letters](how-to/failures-and-dead-letters.md), [Rate limits](how-to/rate-limits.md)).",
    ("stream", "ON_EXHAUSTED"): "Called as `hook(batch, error)` when a group runs out of "
    "attempts, or its handler raised `PermanentFailure` and the group is not split (one "
    "row, or `ISOLATE_FAILURES` off), before its rows are archived as dead letters: "
    "`batch` is the group's `Batch`, its rows still in the buffer; `error` is the group's "
    "last error, a `str`. Its return value is ignored. It runs in a savepoint of the "
    "dead-lettering transaction: when it cannot be imported or raises, its writes are "
    "rolled back, the error is logged and the rows are dead-lettered all the same ([dead "
    "letters](how-to/failures-and-dead-letters.md#when-a-group-runs-out-of-attempts-dead-letters)).",
}


def _example_section(name: str) -> ast.Module:
    """The snippet section *name* of the examples file, parsed."""
    text = (ROOT / EXAMPLES).read_text()
    match = re.search(
        rf"^# --8<-- \[start:{name}\]\n(.*?)^[ \t]*# --8<-- \[end:{name}\]",
        text,
        flags=re.M | re.S,
    )
    if match is None:
        raise ReferenceDrift(f"{EXAMPLES} has no section {name!r}")
    return ast.parse(match.group(1))


def _keys(node: ast.AST | None, where: str) -> dict[str, ast.expr]:
    """A dict literal's values by its (string) keys."""
    if not isinstance(node, ast.Dict):
        raise ReferenceDrift(f"{EXAMPLES}: {where} is not a dict literal")
    return {ast.literal_eval(k): v for k, v in zip(node.keys, node.values, strict=True) if k}


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and getattr(statement.targets[0], "id", "") == name:
            return statement.value
    return None


_NOT_LITERAL = object()


def _literal(node: ast.expr) -> Any:
    """The value of a literal, or a marker that it is none (``os.environ[…]``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NOT_LITERAL


def _drift(where: str, names: list[str], given: dict[str, Any]) -> list[str]:
    """What *given* lacks of *names*, and what it has besides them."""
    missing = [name for name in names if name not in given]
    unknown = [name for name in given if name not in names]
    return [
        *([f"{where} lacks {missing}"] if missing else []),
        *([f"{where} has unknown {unknown}"] if unknown else []),
    ]


def _names(table: Any) -> list[str]:
    return [option.name for option in table]


def example_settings() -> dict[str, dict[str, ast.expr]]:
    """The example's ``DJANGO_OUTBOX`` blocks, each an option → value-node dict.

    The keys are ``""`` (the top level), ``STREAMS['name']`` for each stream, ``STAGING``
    and ``IDEMPOTENCY``. Stops with :class:`ReferenceDrift` when an option of the code is
    missing or unknown, a stream leaves one at its default, or a hook it names is not
    shown by a snippet section of ours.
    """
    from django_outbox import conf

    tree = _example_section("settings")
    top = _keys(_assigned(tree, "DJANGO_OUTBOX"), "DJANGO_OUTBOX")
    streams = {
        f"STREAMS[{name!r}]": _keys(node, name)
        for name, node in _keys(top.get("STREAMS"), "STREAMS").items()
    }
    blocks = {
        "": top,
        **streams,
        "STAGING": _keys(top.get("STAGING"), "STAGING"),
        "IDEMPOTENCY": _keys(top.get("IDEMPOTENCY"), "IDEMPOTENCY"),
    }
    problems = _drift("DJANGO_OUTBOX", _names(conf.GLOBAL_OPTIONS), top)
    problems += _drift("STAGING", _names(conf.STAGING_OPTIONS), blocks["STAGING"])
    problems += _drift("IDEMPOTENCY", _names(conf.IDEMPOTENCY_OPTIONS), blocks["IDEMPOTENCY"])
    if not streams:
        problems.append("STREAMS has no stream")
    for where, given in streams.items():
        problems += _drift(where, _names(conf.STREAM_OPTIONS), given)
        defaults = [
            option.name
            for option in conf.STREAM_OPTIONS
            if option.name in given and _literal(given[option.name]) == option.default
        ]
        if defaults:
            problems.append(f"{where} leaves {defaults} at the default")
    if problems:
        raise ReferenceDrift(f"{EXAMPLES}: {'; '.join(problems)}")
    hooks = [name for table, name in _callable_options() if table == "stream"]
    for given in streams.values():
        for name in hooks:
            _hook_file(_literal(given[name]))
    return blocks


def _hook_file(path: Any) -> tuple[str, str]:
    """The file and snippet section that show the function at dotted *path*."""
    if not (isinstance(path, str) and path.startswith(HOOK_MODULES)):
        raise ReferenceDrift(f"{EXAMPLES}: the hook {path!r} is not in {HOOK_MODULES}")
    module, function = path.rsplit(".", 1)
    file = module.replace(".", "/") + ".py"
    text = (ROOT / file).read_text()
    if f"# --8<-- [start:{function}]" not in text or f"\ndef {function}(" not in text:
        raise ReferenceDrift(f"{file} has no section {function!r} defining {path}")
    return file, function


def example_kind() -> list[str]:
    """The options the example kind's ``class Job:`` sets (every one, or drift)."""
    from django_outbox.unique.options import OPTIONS

    jobs = [
        node
        for node in ast.walk(_example_section("kind"))
        if isinstance(node, ast.ClassDef) and node.name == "Job"
    ]
    if len(jobs) != 1:
        raise ReferenceDrift(f"{EXAMPLES}: section 'kind' declares {len(jobs)} class Job")
    given = {
        statement.targets[0].id: statement.value
        for statement in jobs[0].body
        if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name)
    }
    problems = _drift("class Job", _names(OPTIONS), given)
    if problems:
        raise ReferenceDrift(f"{EXAMPLES}: {'; '.join(problems)}")
    return list(given)


def example_task_options() -> list[str]:
    """The ``OPTIONS`` keys the example's ``TASKS`` alias sets (every tunable one, or drift)."""
    tasks = _keys(_assigned(_example_section("tasks"), "TASKS"), "TASKS")
    tunable = [name.upper() for name in tunable_task_options()]
    problems = [] if tasks else ["TASKS has no alias"]
    given: dict[str, ast.expr] = {}
    for alias, node in tasks.items():
        where = f"TASKS[{alias!r}]['OPTIONS']"
        given = _keys(_keys(node, alias).get("OPTIONS"), where)
        problems += _drift(where, tunable, given)
    if problems:
        raise ReferenceDrift(f"{EXAMPLES}: {'; '.join(problems)}")
    return list(given)


def _fence(*sections: str, title: str) -> str:
    includes = "\n".join(f'--8<-- "{EXAMPLES}:{section}"' for section in sections)
    return f'```python title="{title}"\n{includes}\n```'


def render_settings_example() -> str:
    example_settings()
    return _fence("settings-imports", "settings", title="settings.py")


def render_kind_example() -> str:
    example_kind()
    return _fence("kind-imports", "kind", title="models.py")


def render_tasks_example() -> str:
    example_task_options()
    return _fence("tasks", title="settings.py")


def _callable_options() -> list[tuple[str, str]]:
    from django_outbox.base.option_table import CALLABLE_PATH, OPTIONAL_CALLABLE_PATH

    return [
        (table, option.name)
        for table, options in _tables().items()
        for option in options
        if option.kind in (CALLABLE_PATH, OPTIONAL_CALLABLE_PATH)
    ]


def render_hooks() -> str:
    """Each option that names a callable: how the code calls it, and the example's."""
    declared = _callable_options()
    missing = sorted(set(declared) - set(CALLABLE_DOCS))
    stale = sorted(set(CALLABLE_DOCS) - set(declared))
    if missing or stale:
        raise ReferenceDrift(
            f"docs/hooks/reference.py CALLABLE_DOCS: undescribed hooks {missing}, "
            f"hooks no longer in the code {stale}"
        )
    blocks = example_settings()
    stream = next(key for key in blocks if key.startswith("STREAMS["))
    out = []
    for table, name in declared:
        path = _literal(blocks[stream][name])
        file, function = _hook_file(path)
        out.append(
            f"### `{name}`\n\n{CALLABLE_DOCS[(table, name)]} The example's "
            f"`{name}` is `{path}`:\n\n"
            f'```python\n--8<-- "{file}:{function}"\n```\n'
        )
    return "\n".join(out)


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
    "settings-example": render_settings_example,
    "kind-example": render_kind_example,
    "tasks-example": render_tasks_example,
    "hooks": render_hooks,
    "checks": render_checks,
    "commands": render_commands,
    "signals": render_signals,
    "metrics": render_metrics,
}


LINK = re.compile(r"\]\(([a-z-]+/[a-z-]+\.md(?:#[a-z0-9_-]*)?)\)")


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
