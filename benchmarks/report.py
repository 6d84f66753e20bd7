"""The benchmarks page's current figures, rendered from the benchmarks' JSON artifacts.

``python -m benchmarks.report`` reads ``artifacts/bench.json`` (written by ``python3
dev.py bench``) and the other ``artifacts/bench-*.json`` that exist (``bench-tasks.json``
of ``python3 dev.py bench tasks``, ``bench-pipeline.json`` of ``--only-pipeline``,
``bench-otel.json``, ``bench-ordered.json``, ``bench-retire.json``), and prints the
markdown block that opens docs/explanation/benchmarks.md: the tables, a chart and the
date, command and machine of every figure.

``--save`` copies the artifacts it read to ``benchmarks/results/`` (tracked) and writes
the block into the page, between ``<!-- report:start -->`` and ``<!-- report:end -->``;
``tests/docs/test_benchmarks_report.py`` checks that the page holds what those copies
render. ``--artifacts DIR`` reads another folder (``benchmarks/results`` prints the
page's block again).

The standard library only: no Django, no database.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "explanation" / "benchmarks.md"
START = "<!-- report:start -->"
END = "<!-- report:end -->"
MAIN = "bench.json"
TIMES = "\N{MULTIPLICATION SIGN}"

Artifacts = dict[str, dict[str, Any]]


# -- reading ------------------------------------------------------------------------


def load(folder: Path) -> Artifacts:
    """The artifacts of *folder* by file name: ``bench.json`` and every ``bench-*.json``."""
    if not (folder / MAIN).exists():
        raise SystemExit(f"No {folder / MAIN}: run `python3 dev.py bench` first.")
    paths = [folder / MAIN, *sorted(folder.glob("bench-*.json"))]
    return {path.name: json.loads(path.read_text()) for path in paths}


def page_block(text: str) -> str:
    """The generated block of the page *text*, between the markers (markers excluded)."""
    _, start, rest = text.partition(START)
    body, end, _ = rest.partition(END)
    if not start or not end:
        raise ValueError(f"The page has no {START} … {END} block.")
    return body.strip("\n") + "\n"


def with_block(text: str, block: str) -> str:
    """The page *text* with its generated block replaced by *block*."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{block}{END}{tail}"


# -- formatting ---------------------------------------------------------------------


def number(value: float, digits: int = 0) -> str:
    """*value* with thousands separators and *digits* decimals."""
    return f"{value:,.{digits}f}"


def seconds(value: float) -> str:
    return f"{value:.3f} s"


def day(stamp: str | None) -> str:
    """``2026-11-28T10:58:03+00:00`` as ``2026-11-28 10:58 UTC``."""
    if not stamp:
        return "not recorded"
    date, _, time = stamp.partition("T")
    return f"{date} {time[:5]} UTC" if time else date


def axis_top(values: list[float]) -> int:
    """A round upper bound for a chart's axis above every value."""
    top = max(values) * 1.1 or 1
    step = 10 ** math.floor(math.log10(top))
    return int(math.ceil(top / step) * step)


def bar_chart(title: str, unit: str, bars: list[tuple[str, float]]) -> list[str]:
    """A mermaid ``xychart-beta`` bar chart of *bars* (label, value)."""
    labels = ", ".join(f'"{label}"' for label, _ in bars)
    values = ", ".join(f"{value:g}" for _, value in bars)
    return [
        "```mermaid",
        "xychart-beta",
        f'    title "{title}"',
        f"    x-axis [{labels}]",
        f'    y-axis "{unit}" 0 --> {axis_top([v for _, v in bars])}',
        f"    bar [{values}]",
        "```",
    ]


def table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    """A markdown table; *align* has one letter per column, ``l`` or ``r``."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(rule) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


# -- the main run: bench.json -------------------------------------------------------

CONTENDERS = {
    "A": "A naive: one django-q2 task per event",
    "B": "B django_outbox, end to end",
    "C": "C raw-SQL floor (psycopg)",
}
SHORT = {"A": "A naive", "B": "B django_outbox", "C": "C raw SQL"}


def machine(report: dict[str, Any]) -> str:
    """Cores, PostgreSQL, Python and the load of the run that wrote *report*."""
    host = report["machine"]
    parts = [
        f"{host['cores']} cores",
        f"PostgreSQL {report['postgresql'].split()[0]}",
        f"Python {host['python']}",
    ]
    load = host.get("load_average")
    if load:
        parts.append(f"load average {load['before']} before, {load['after']} after")
    return ", ".join(parts)


def shared(report: dict[str, Any]) -> list[str]:
    """A warning when the load average before the run passed the machine's cores: other
    work shared the machine, and every rate of the run is lower for it. (The load after
    the run is the benchmark's own: its last runs use every core.)"""
    host = report["machine"]
    load = host.get("load_average")
    if not load or load["before"] <= host["cores"]:
        return []
    return [
        "",
        f"Other work shared the machine when this run began (a load average above its "
        f"{host['cores']} cores): its rates are likely lower than on a quiet machine. "
        "Compare them with each other, not with a quiet run's.",
    ]


def command(report: dict[str, Any]) -> str:
    return "`" + " ".join(["python3 dev.py bench", *report.get("arguments", [])]) + "`"


def throughput(report: dict[str, Any]) -> list[str]:
    rows = []
    rates: list[tuple[str, float]] = []
    for name, run in report["throughput"].items():
        key = name[:1]
        cost = run["per_event"]
        runs = run["runs_events_per_s"]
        rows.append(
            [
                CONTENDERS.get(key, name),
                number(run["events"]),
                f"**{number(run['events_per_s'])}**",
                " · ".join(number(r) for r in runs) if len(runs) > 1 else "one run",
                f"{cost['transactions']:.3g}",
                number(cost["rows_written"], 2),
                number(cost["wal_bytes"]),
            ]
        )
        rates.append((SHORT.get(key, name), run["events_per_s"]))
    ratios = report["ratios"]
    pairs = ", ".join(f"{r:g}" for r in ratios["B/C_runs"])
    return [
        *table(
            [
                "contender",
                "events",
                "events/s",
                "runs (events/s)",
                "transactions/event",
                "rows written/event",
                "WAL bytes/event",
            ],
            "lrrlrrr",
            rows,
        ),
        "",
        f"B / A **{ratios['B/A']:g}{TIMES}**; B / C **{ratios['B/C']:g}** (median of "
        f"{len(ratios['B/C_runs'])} paired runs: {pairs}).",
        *by_size(ratios),
        "",
        *bar_chart("Events per second, 2 workers each", "events/s", rates),
    ]


def by_size(ratios: dict[str, Any]) -> list[str]:
    """B / C at each backlog the run paired them at, and its target (runs that record
    them: ``B/C_by_events``, ``B/C_target``)."""
    sizes = ratios.get("B/C_by_events")
    if not sizes:
        return []
    rows = [
        [
            number(k["events"]),
            " · ".join(number(r) for r in k["B_events_per_s"]),
            " · ".join(number(r) for r in k["C_events_per_s"]),
            f"**{k['B/C']:g}**",
            ", ".join(f"{r:g}" for r in k["B/C_runs"]),
        ]
        for k in sizes.values()
    ]
    lines = [
        "",
        *table(
            ["events", "B runs (events/s)", "C runs (events/s)", "B / C", "paired runs"],
            "rllrl",
            rows,
        ),
    ]
    target = ratios.get("B/C_target")
    if target and target["passed"] is not None:
        verdict = "met" if target["passed"] else "**missed**"
        lines += [
            "",
            f"B / C at {number(target['events'])} events: {target['median']:g} against the "
            f"target of at least {target['at_least']:g} (median of pairs): {verdict}.",
        ]
    return lines


BROKERS = {"orm": "ORM broker (PostgreSQL)", "redis": "Redis broker"}


def first_call(report: dict[str, Any]) -> list[str]:
    """Commit to the handler's first call on an idle stream, per broker (runs that
    record it: ``first_call``)."""
    brokers = report.get("first_call")
    if not brokers:
        return []
    backlogs = [k["rows"] for k in next(iter(brokers.values()))["by_rows"].values()]
    rows = []
    for broker, measured in brokers.items():
        name = BROKERS.get(broker, broker)
        if measured.get("poll_s") is not None:
            name += f", poll {measured['poll_s']:g} s"
        largest = measured["by_rows"][str(backlogs[-1])]
        cold = measured["cold"]
        rows.append(
            [
                name,
                *(seconds(measured["by_rows"][str(n)]["first_call_median_s"]) for n in backlogs),
                seconds(largest["archived_median_s"]),
                f"{seconds(cold['first_call_s'])}; {seconds(cold['archived_s'])}",
                str(len(largest["first_call_runs_s"])),
            ]
        )
    header = [
        "commit → handler's first call (idle stream)",
        *(f"{number(n)} row{'s' if n > 1 else ''}" for n in backlogs),
        f"{number(backlogs[-1])} rows: all archived",
        f"fresh cluster, {number(backlogs[-1])} rows: first call; all archived",
        "samples",
    ]
    return [
        "",
        "From a commit to the stream's handler: one transaction commits to an idle stream of "
        "a running cluster (2 workers); median of the samples. The first commit to a cluster "
        "just started, whose workers have not run the stream's code yet, is apart: it is "
        "the start B's clock covers.",
        "",
        *table(header, "l" + "r" * (len(header) - 1), rows),
    ]


LATENCY_RUNS = {
    "trickle_300_per_s": "300 events/s, one per commit",
    "load_80_percent_of_B": "80 % of B, commits of 100 rows",
}


def latency(report: dict[str, Any]) -> list[str]:
    runs = report["latency"]
    rows = []
    for key, label in LATENCY_RUNS.items():
        k = runs[key]
        rows.append(
            [
                label,
                f"{number(k['achieved_events_per_s'])} of {number(k['target_events_per_s'])}",
                seconds(k["p50_s"]),
                seconds(k["p95_s"]),
                f"**{seconds(k['p99_s'])}**",
                seconds(k["max_s"]),
                f"{number(k['peak_backlog_rows'])} rows ({k['peak_backlog_s_of_inflow']} s)",
            ]
        )
    idle = runs["idle"]
    trickle = runs["trickle_300_per_s"]
    return [
        *table(
            [
                "commit → archived",
                "events/s (of asked)",
                "p50",
                "p95",
                "p99",
                "max",
                "peak backlog (of inflow)",
            ],
            "lrrrrrr",
            rows,
        ),
        "",
        f"An idle {idle['seconds']:g} s with the cluster and its schedules running: "
        f"{idle['scans_of_our_tables']} scans and {idle['rows_written_to_our_tables']} row "
        f"writes on the app's tables, {idle['groups_claimed']} groups claimed.",
        "",
        *bar_chart(
            "Commit to archive at 300 events/s, ms",
            "ms",
            [(p, round(trickle[f"{p}_s"] * 1000)) for p in ("p50", "p95", "p99", "max")],
        ),
        *first_call(report),
    ]


def publish_overhead(report: dict[str, Any]) -> list[str]:
    """A transaction saving one row, alone and with one event: ``publish()`` against the
    raw INSERT of the same row (the target: at most ``target`` times), on an idle and a
    busy stream, with the ORM broker and with Redis where measured."""
    o = report["publish_overhead"]
    rates = report["publish"]
    rates_line = (
        f"`publish()` rate: {number(rates['one_transaction_each_per_s'])}/s in one transaction "
        f"each, {number(rates['bulk_per_s'])}/s through `publish_many()`."
    )
    if "with_event_idle_median_ms" not in o:  # a run from before the idle/busy cases
        return [*_publish_table_before(o), "", rates_line]

    def rows(o: dict[str, Any], broker: str) -> list[list[str]]:
        plain, raw = o["plain_median_ms"], o["with_raw_insert_median_ms"]

        def row(label: str, key: str, bold: bool = False) -> list[str]:
            ms = o[key]
            to_raw = f"{ms / raw:.2f}{TIMES}"
            return [
                f"{broker}: {label}",
                f"{ms:.3f}",
                f"{ms / plain:.2f}{TIMES}",
                f"**{to_raw}**" if bold else to_raw,
            ]

        return [
            row("alone", "plain_median_ms"),
            row("and a raw INSERT of the event (the floor)", "with_raw_insert_median_ms"),
            row("and `publish()`, stream idle", "with_event_idle_median_ms", bold=True),
            row("and `publish()`, a run in flight", "with_event_busy_median_ms", bold=True),
            *(
                [
                    row("and the guarded INSERT alone, idle", "with_guarded_insert_idle_median_ms"),
                    row("and the guarded INSERT alone, busy", "with_guarded_insert_busy_median_ms"),
                ]
                if "with_guarded_insert_busy_median_ms" in o
                else []
            ),
            row("and a raw INSERT, then `wake()`, idle", "with_raw_insert_woken_idle_median_ms"),
            row("through a `PublishTrigger`", "with_trigger_median_ms"),
        ]

    body = rows(o, "ORM broker")
    notes = []
    if o.get("redis"):
        body += rows(o["redis"], "Redis")
        if o["redis"].get("note"):
            notes.append(f"Redis rows: {o['redis']['note']}.")
    target = o.get("target", 1.15)
    verdict = "met" if o["idle_ratio"] <= target >= o["busy_ratio"] else "**missed**"
    return [
        *table(
            [
                f"a transaction saving one row (median of {number(o['transactions'])} each)",
                "ms",
                f"{TIMES} alone",
                f"{TIMES} raw INSERT",
            ],
            "lrrr",
            body,
        ),
        "",
        f"Target `publish()` {TIMES} the raw INSERT of the same row at most {target:g}, "
        f"idle and busy, ORM broker: {verdict} ({o['idle_ratio']:g} and "
        f"{o['busy_ratio']:g}). {rates_line}",
        *(["", *notes] if notes else []),
    ]


def _publish_table_before(o: dict[str, Any]) -> list[str]:
    plain = o["plain_median_ms"]

    def row(label: str, ms: float, bold: bool = False) -> list[str]:
        ratio = f"{ms / plain:.2f}{TIMES}"
        return [label, f"{ms:.3f}", f"**{ratio}**" if bold else ratio]

    return table(
        [
            f"a transaction saving one row (median of {number(o['transactions'])} each)",
            "ms",
            "ratio",
        ],
        "lrr",
        [
            row("alone", plain),
            row("and `publish()`", o["with_event_median_ms"], bold=True),
            row("and a raw INSERT of the event", o["with_raw_insert_median_ms"]),
            row("and a raw INSERT and `wake()`", o["with_raw_insert_woken_median_ms"]),
            row("through a `PublishTrigger`", o["with_trigger_median_ms"]),
        ],
    )


def jobs(artifacts: Artifacts) -> list[str]:
    """Unique jobs against django-q2 (bench.json), the django.tasks backend against
    django-tasks-db (bench-tasks.json, when measured): jobs per second, end to end."""
    u = artifacts[MAIN]["unique_dispatch"]
    saved, unsaved = u["django_q2_one_task_per_job"], u["django_q2_one_task_per_job_unsaved"]
    narrow, wide = u["end_to_end"], u["end_to_end_wide"]
    rows = [
        ["django-q2, one task per job, results saved", number(saved["jobs_per_s"]), "—"],
        ["django-q2, one task per job, `save=False`", number(unsaved["jobs_per_s"]), "—"],
        [
            f"unique jobs, concurrency {narrow['concurrency']} (chunks of {narrow['chunk']})",
            number(narrow["jobs_per_s"]),
            "—",
        ],
        [
            f"unique jobs, concurrency {wide['concurrency']} (chunks of {wide['chunk']})",
            f"**{number(wide['jobs_per_s'])}**",
            f"{u['wide_vs_django_q2']:g}{TIMES} django-q2 saved, "
            f"{u['wide_vs_django_q2_unsaved']:g}{TIMES} unsaved",
        ],
    ]
    bars = [
        ("django-q2 saved", saved["jobs_per_s"]),
        ("django-q2 save=False", unsaved["jobs_per_s"]),
        (f"unique jobs ({wide['concurrency']})", wide["jobs_per_s"]),
    ]
    tasks = artifacts.get("bench-tasks.json")
    if tasks:
        measured = tasks.get("default_options") or tasks["prepared_statements"]
        ours = statistics.median(r["ours"]["tasks_per_s"] for r in measured["end_to_end"])
        theirs = statistics.median(
            r["django_tasks_db"]["tasks_per_s"] for r in measured["end_to_end"]
        )
        rows += [
            ["django-tasks-db, two `db_worker`", number(theirs), "—"],
            [
                "the `django.tasks` backend, end to end",
                f"**{number(ours)}**",
                f"{measured['end_to_end_ratio']:g}{TIMES} django-tasks-db (median of pairs)",
            ],
        ]
        bars += [("django-tasks-db", theirs), ("django.tasks backend", ours)]
    return [
        *table(["2 workers, no-op jobs", "jobs/s", "against the peer"], "lrl", rows),
        "",
        *bar_chart("Jobs per second, 2 workers", "jobs/s", bars),
    ]


def ordered(r: dict[str, Any]) -> list[str]:
    """``ORDER_KEY`` against the same stream unordered, by number of keys
    (bench-ordered.json): the medians of each side and of the pairs' ratios."""
    rows = []
    for m in r["by_keys"]:
        calls = m["groups"]
        rows.append(
            [
                number(m["keys"]),
                number(m["unordered_per_s"]),
                number(m["ordered_per_s"]),
                f"**{m['ordered_over_unordered']:g}**",
                ", ".join(f"{x:g}" for x in m["pair_ratios"]),
                f"{number(statistics.median(calls['keyed']))}; "
                f"{number(statistics.median(calls['keyed_ordered']))}",
                ", ".join(f"{x:g}" for x in m["load_averages"]),
            ]
        )
    target = r["target"]
    return [
        f"**Measured {day(r['date'])}** by {command(r)} on "
        f"{machine(r)}: {number(r['events'])} rows a drain, {r['runs']} alternating pairs. "
        f"Target: ordered at least {target['ratio']:g} of unordered with "
        f"{number(target['keys'])} keys ({'met' if target['met'] else 'not met'}).",
        "",
        *table(
            [
                "keys",
                "unordered events/s",
                "ordered events/s",
                "ordered / unordered",
                "pairs",
                "handler calls (unordered; ordered)",
                "load averages",
            ],
            "rrrrlrl",
            rows,
        ),
    ]


def more(report: dict[str, Any]) -> list[str]:
    """The other figures of the same run, one line each."""
    rows: list[list[str]] = []
    claim = report["claim_latency_ms"]
    small, large = (k for k in claim if k != "ratio")
    rows.append(
        [
            f"claim latency, {number(int(small))} → {number(int(large))} waiting rows",
            f"{claim[small]:g} → {claim[large]:g} ms ({claim['ratio']:g}{TIMES})",
        ]
    )
    st = report["library_statements"]
    rows.append(
        [
            f"SQL statements per group (inline, {number(st['events'])} events)",
            f"{st['statements_per_group']:g}; django-q2 tasks per group "
            f"{st['django_q2_tasks_per_group']:g}",
        ]
    )
    f = report["staged_forwarding"]
    rows.append(
        [
            f"staged jobs, one transaction each ({number(f['jobs'])})",
            f"`async_task` {number(f['async_task_per_s'])}/s; `stage_task` "
            f"{number(f['stage_forward_on_commit_per_s'])}/s; the drain alone "
            f"{number(f['drain_forwarded_per_s'])}/s",
        ]
    )
    u = report["unique_dispatch"]
    enqueue = u["enqueue"]
    rows.append(
        [
            "unique jobs: dispatch alone; `enqueue()`; `enqueue_many()`",
            f"{number(u['dispatch_only']['jobs_per_s'])}; "
            f"{number(enqueue['enqueue_one_transaction_each']['jobs_per_s'])}; "
            f"{number(enqueue['enqueue_many']['jobs_per_s'])} jobs/s",
        ]
    )
    o = report["operations"]
    rows.append(
        [
            f"metrics scrape, {number(o['archive_rows'])}-row archive (60 days; last hour)",
            f"{o['scrape_ms_archive_over_60_days']['median_ms']:g} ms; "
            f"{o['scrape_ms_archive_all_last_hour']['median_ms']:g} ms",
        ]
    )
    rows.append(
        [
            "`outbox_prune` on that archive",
            f"{number(o['prune']['deleted'])} rows at {number(o['prune']['rows_per_s'])} rows/s",
        ]
    )
    isolated = report["failure_isolation"]
    if isolated:
        sizes = " / ".join(number(k["group_rows"]) for k in isolated)
        calls = " / ".join(str(k["handler_calls"]) for k in isolated)
        times = " / ".join(f"{k['seconds_to_isolate']:g}" for k in isolated)
        rows.append(
            [
                f"failure isolation: one poison row in {sizes} rows",
                f"{calls} handler calls, {times} s",
            ]
        )
    scale = report["scale_out_redis"]
    if scale:
        counts = " / ".join(str(k["clusters"]) for k in scale)
        rates = " / ".join(number(k["events_per_s"]) for k in scale)
        rows.append([f"scale-out on one Redis queue, {counts} qcluster(s)", f"{rates} events/s"])
    h = report["buffer_after_run"]
    rows.append(
        [
            "the buffer table after B",
            f"{number(h['live_tuples'])} live, {number(h['dead_tuples'])} dead tuples, "
            f"{h['total_bytes'] / 2**20:.1f} MB",
        ]
    )
    return table(["measure", "result"], "ll", rows)


# -- the other artifacts ------------------------------------------------------------


def _tasks(r: dict[str, Any]) -> tuple[str, str, str]:
    measured = r.get("default_options") or r["prepared_statements"]
    enqueue = measured["enqueue"]["tasks_per_s"]
    return (
        "`python3 dev.py bench tasks`",
        f"Django {measured['django']}",
        f"end to end {measured['end_to_end_ratio']:g}{TIMES} django-tasks-db; `enqueue()` "
        f"{enqueue['ratio']:g}{TIMES} theirs; `enqueue_many()` "
        f"{number(enqueue['ours_enqueue_many'])}/s",
    )


def _pipeline(r: dict[str, Any]) -> tuple[str, str, str]:
    p99 = r["latency"]["trickle_300_per_s"]["p99_s"]
    larger = [k for k in r.get("B/C_by_events", {}).values() if k["events"] != r["events"]]
    return (
        "`python3 dev.py bench --only-pipeline`",
        "",
        f"B / C {r['B/C']:g} (pairs {', '.join(f'{x:g}' for x in r['B/C_runs'])}); "
        + "".join(f"at {number(k['events'])} events {k['B/C']:g}; " for k in larger)
        + f"`publish()` {_publish_ratio(r['publish_overhead'])}; p99 at 300 events/s {p99:g} s",
    )


def _publish_ratio(o: dict[str, Any]) -> str:
    """``publish()``'s ratio in a summary line: to the raw INSERT, idle and busy (since
    those cases are measured), else to the transaction alone."""
    if "idle_ratio" in o:
        idle, busy = o["idle_ratio"], o["busy_ratio"]
        return f"{idle:g}{TIMES} (idle) and {busy:g}{TIMES} (busy) a raw INSERT"
    return f"{o['ratio']:g}{TIMES}"


def _otel(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "`python3 dev.py bench --otel`",
        "",
        f"B with opentelemetry-api / without: {r['ratio_median']:g} (median of "
        f"{len(r['ratio_runs'])} pairs)",
    )


def _ordered(r: dict[str, Any]) -> tuple[str, str, str]:
    if "by_keys" in r:
        return (
            command(r),
            machine(r),
            "`ORDER_KEY` / unordered: "
            + ", ".join(
                f"{m['ordered_over_unordered']:g} at {number(m['keys'])} keys" for m in r["by_keys"]
            ),
        )
    return (
        f"`python3 dev.py bench ordered --keys {r['keys']}`",
        "",
        f"`ORDER_KEY`, {number(r['keys'])} keys: {number(r['ordered_per_s'])} against "
        f"{number(r['unordered_per_s'])} events/s ({r['ordered_over_unordered']:g}{TIMES})",
    )


def _retire(r: dict[str, Any]) -> tuple[str, str, str]:
    return (
        "`python3 dev.py bench retire`",
        f"{r['machine']}, PostgreSQL {r['postgres']}",
        f"{number(r['rows'])} rows retired: `DELETE` {r['delete']['seconds']:g} s, partition "
        f"drop {r['drop']['seconds']:g} s",
    )


OTHERS: dict[str, Callable[[dict[str, Any]], tuple[str, str, str]]] = {
    "bench-tasks.json": _tasks,
    "bench-pipeline.json": _pipeline,
    "bench-otel.json": _otel,
    "bench-ordered.json": _ordered,
    "bench-retire.json": _retire,
}


def sources(artifacts: Artifacts) -> list[str]:
    main = artifacts[MAIN]
    rows = [[f"`{MAIN}`", day(main["date"]), command(main), machine(main), "the tables above"]]
    for name, report in artifacts.items():
        if name == MAIN:
            continue
        summary = OTHERS.get(name)
        if summary is None:
            rows.append(
                [f"`{name}`", day(report.get("date")), "", "not recorded", "not summarized here"]
            )
            continue
        how, where, what = summary(report)
        when = day(report.get("date") or report.get("when"))
        rows.append([f"`{name}`", when, how, where or "not recorded", what])
    return table(["artifact", "measured", "command", "machine", "figures"], "lllll", rows)


# -- the block ----------------------------------------------------------------------


def render(artifacts: Artifacts) -> str:
    """The page's generated block: every table and chart, from *artifacts*."""
    main = artifacts[MAIN]
    lines = [
        "<!-- Rendered by `python -m benchmarks.report --save` from benchmarks/results/;"
        " edit those, not this block. -->",
        "",
        f"**Measured {day(main['date'])}** by {command(main)} on {machine(main)}.",
        *shared(main),
        "",
        "### Throughput",
        "",
        *throughput(main),
        "",
        "### Latency",
        "",
        *latency(main),
        "",
        "### Publish overhead",
        "",
        *publish_overhead(main),
        "",
        "### Jobs",
        "",
        *jobs(artifacts),
        "",
        "### More from the same run",
        "",
        *more(main),
        "",
        *(
            ["### Ordered streams", "", *ordered(artifacts["bench-ordered.json"]), ""]
            if "by_keys" in artifacts.get("bench-ordered.json", {})
            else []
        ),
        "### Sources",
        "",
        *sources(artifacts),
    ]
    return "\n".join(lines) + "\n"


def save(folder: Path, artifacts: Artifacts) -> None:
    """Copy the artifacts of *folder* to ``benchmarks/results/``, render the page's block."""
    if folder.resolve() != RESULTS.resolve():
        RESULTS.mkdir(parents=True, exist_ok=True)
        for stale in RESULTS.glob("bench*.json"):
            stale.unlink()
        for name in artifacts:
            shutil.copyfile(folder / name, RESULTS / name)
    PAGE.write_text(with_block(PAGE.read_text(), render(load(RESULTS))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, default=ARTIFACTS, help="the JSON's folder")
    parser.add_argument(
        "--save",
        action="store_true",
        help="copy the artifacts to benchmarks/results/ and write the block into the page",
    )
    args = parser.parse_args(argv)
    artifacts = load(args.artifacts)
    if args.save:
        save(args.artifacts, artifacts)
        print(f"{PAGE}: block rendered from {len(artifacts)} artifact(s)")
        return 0
    sys.stdout.write(render(artifacts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
