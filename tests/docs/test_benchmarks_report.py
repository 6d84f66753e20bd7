"""The benchmarks page opens with what ``python -m benchmarks.report`` renders from the
committed artifacts (``benchmarks/results/``), so its figures are the measured ones."""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import report


def test_the_page_holds_what_the_committed_artifacts_render():
    rendered = report.render(report.load(report.RESULTS))
    on_the_page = report.page_block(report.PAGE.read_text())
    assert on_the_page == rendered, (
        "docs/explanation/benchmarks.md is out of date with benchmarks/results/: run "
        "`python -m benchmarks.report --artifacts benchmarks/results --save`"
    )


def test_the_block_names_the_date_command_and_machine_of_the_run():
    main = report.load(report.RESULTS)[report.MAIN]
    block = report.page_block(report.PAGE.read_text())
    assert f"**Measured {report.day(main['date'])}** by `python3 dev.py bench" in block
    assert f"{main['machine']['cores']} cores" in block
    assert f"PostgreSQL {main['postgresql'].split()[0]}" in block
    assert f"Python {main['machine']['python']}" in block


def test_save_writes_the_block_into_the_page_between_its_markers(tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    shutil.copy(report.RESULTS / report.MAIN, artifacts / report.MAIN)
    (artifacts / "bench-later.json").write_text(json.dumps({"date": "2026-12-01T08:00:00"}))
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nbefore\n\n{report.START}\nold\n{report.END}\n\nafter\n")
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(report, "PAGE", page)

    assert report.main(["--artifacts", str(artifacts), "--save"]) == 0

    saved = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert saved == ["bench-later.json", "bench.json"]
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n\n")
    assert text.endswith(f"{report.END}\n\nafter\n")
    block = report.page_block(text)
    assert block == report.render(report.load(artifacts))
    # An artifact the report does not summarize is still listed, with its date.
    assert "| `bench-later.json` | 2026-12-01 08:00 UTC |" in block


def test_without_bench_json_it_says_which_command_writes_it(tmp_path):
    with pytest.raises(SystemExit, match=r"python3 dev\.py bench"):
        report.load(tmp_path)


def test_the_report_needs_only_the_standard_library():
    tree = ast.parse(Path(report.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_ordered_benchmark_renders_a_section_of_its_own(tmp_path):
    """``python3 dev.py bench ordered`` writes each number of keys' rates and pairs."""
    shutil.copy(report.RESULTS / report.MAIN, tmp_path / report.MAIN)
    main = json.loads((tmp_path / report.MAIN).read_text())
    measured = {
        "keys": 1000,
        "unordered_per_s": 20000,
        "ordered_per_s": 19000,
        "ordered_over_unordered": 0.95,
        "pair_ratios": [0.95, 0.9, 1.02],
        "all_rates": {"keyed": [20000] * 3, "keyed_ordered": [19000] * 3},
        "groups": {"keyed": [200] * 3, "keyed_ordered": [200, 201, 201]},
        "load_averages": [1.5] * 6,
    }
    ordered = {
        "date": "2026-12-01T08:00:00+00:00",
        "machine": main["machine"],
        "postgresql": main["postgresql"],
        "arguments": ["ordered"],
        "events": 200000,
        "runs": 3,
        "target": {"keys": 1000, "ratio": 0.85, "met": True},
        "by_keys": [measured],
    }
    (tmp_path / "bench-ordered.json").write_text(json.dumps(ordered))

    block = report.render(report.load(tmp_path))

    assert "### Ordered streams" in block
    assert "| 1,000 | 20,000 | 19,000 | **0.95** | 0.95, 0.9, 1.02 | 200; 201 |" in block
    assert "`ORDER_KEY` / unordered: 0.95 at 1,000 keys" in block


def with_sizes_and_first_calls(b_over_c_at_100k: float) -> dict:
    """The committed bench.json with what a run records since B/C is paired at two
    backlogs and the first call after a commit is timed (figures made up)."""
    main = json.loads((report.RESULTS / report.MAIN).read_text())
    main["ratios"]["B/C_by_events"] = {
        "20000": {
            "events": 20000,
            "B/C": 0.756,
            "B/C_runs": [0.71, 0.756, 0.944],
            "B_events_per_s": [41851, 44585, 50048],
            "C_events_per_s": [58962, 60012, 53030],
        },
        "100000": {
            "events": 100000,
            "B/C": b_over_c_at_100k,
            "B/C_runs": [0.9, b_over_c_at_100k, 1.01],
            "B_events_per_s": [52000, 55000, 57000],
            "C_events_per_s": [58000, 57500, 56500],
        },
    }
    main["ratios"]["B/C_target"] = {
        "events": 100000,
        "at_least": 0.95,
        "median": b_over_c_at_100k,
        "passed": b_over_c_at_100k >= 0.95,
    }
    main["first_call"] = {
        broker: {
            "broker": broker,
            "poll_s": 0.05 if broker == "orm" else None,
            "workers": 2,
            "cold": {"rows": 20000, "first_call_s": first + 0.1, "archived_s": 0.75},
            "by_rows": {
                "1": {
                    "rows": 1,
                    "first_call_median_s": first,
                    "first_call_runs_s": [first] * 7,
                    "archived_median_s": first + 0.01,
                },
                "20000": {
                    "rows": 20000,
                    "first_call_median_s": first + 0.02,
                    "first_call_runs_s": [first + 0.02] * 7,
                    "archived_median_s": 0.61,
                },
            },
        }
        for broker, first in (("orm", 0.061), ("redis", 0.012))
    }
    return main


@pytest.mark.parametrize(("ratio", "verdict"), [(0.97, "met"), (0.93, "**missed**")])
def test_b_over_c_at_each_backlog_and_its_target_at_100000(ratio, verdict):
    block = report.render({report.MAIN: with_sizes_and_first_calls(ratio)})

    assert "| 20,000 | 41,851 · 44,585 · 50,048 | 58,962 · 60,012 · 53,030 | **0.756** |" in block
    assert f"| 100,000 | 52,000 · 55,000 · 57,000 | 58,000 · 57,500 · 56,500 | **{ratio:g}** |" in (
        block
    )
    assert (
        f"B / C at 100,000 events: {ratio:g} against the target of at least 0.95 (median of "
        f"pairs): {verdict}." in block
    )


def test_the_first_call_after_a_commit_with_each_broker():
    block = report.render({report.MAIN: with_sizes_and_first_calls(0.97)})

    header = (
        "| commit → handler's first call (idle stream) | 1 row | 20,000 rows "
        "| 20,000 rows: all archived | fresh cluster, 20,000 rows: first call; all archived "
        "| samples |"
    )
    assert header in block
    assert (
        "| ORM broker (PostgreSQL), poll 0.05 s | 0.061 s | 0.081 s | 0.610 s "
        "| 0.161 s; 0.750 s | 7 |" in block
    )
    assert "| Redis broker | 0.012 s | 0.032 s | 0.610 s | 0.112 s; 0.750 s | 7 |" in block


def test_a_run_from_before_either_figure_renders_without_them():
    older = with_sizes_and_first_calls(0.97)
    del older["ratios"]["B/C_by_events"], older["ratios"]["B/C_target"], older["first_call"]
    block = report.render({report.MAIN: older})
    assert f"B / C **{older['ratios']['B/C']:g}**" in block
    assert "B / C at 100,000 events" not in block
    assert "handler's first call" not in block
