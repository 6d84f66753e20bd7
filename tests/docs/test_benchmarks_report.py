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
