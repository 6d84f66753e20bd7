"""The reference pages are rendered from the code and cover all of it.

The docs build runs ``docs/hooks/reference.py``; these tests run the same renderers,
in a fraction of a second, so an option or a check id added without its description
fails here before it fails the docs build. The settings page's examples
(``tests/docs_examples/reference_settings.py``) are run here too: they pass the system
checks, and the stream they configure runs through the hooks they name.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path
from types import SimpleNamespace

import django
import pytest
from django.core.checks import run_checks
from django.test import override_settings
from django.test.utils import isolate_apps

from django_outbox import conf
from django_outbox.base.option_table import Kind, Option
from django_outbox.models import ArchivedEvent, OutboxGroup
from django_outbox.streams.inline import run_inline
from django_outbox.unique import options as kind_options
from django_outbox.unique.checks import check_kind
from tests.docs_examples import shipments
from tests.testapp.models import OrderedEvent

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "reference.py"
SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_marker_renders(reference):
    page = "\n".join(f"<!-- reference:{name} -->" for name in reference.RENDERERS)
    rendered = reference.render(page)
    assert "<!-- reference:" not in rendered
    for option in [*conf.STREAM_OPTIONS, *conf.STAGING_OPTIONS, *kind_options.OPTIONS]:
        assert f"`{option.name}`" in rendered


def test_every_check_id_the_code_reports_is_listed(reference):
    rendered = reference.render_checks()
    ids = reference.check_ids_in_code()
    assert {"E001", "E039", "E056", "E080", "E086", "W001", "W003"} <= ids
    for check in ids:
        assert f"### {check}\n" in rendered


def test_every_metric_and_command_is_listed(reference):
    rendered = reference.render("<!-- reference:metrics -->\n<!-- reference:commands -->")
    for name in ("django_outbox_backlog_rows", "django_outbox_unique_jobs", "outbox_tune"):
        assert name in rendered
    assert "--until-empty" in rendered  # an argument of outbox_run, from its parser


def test_an_option_without_a_description_stops_the_build(reference, monkeypatch):
    table = conf.STAGING_OPTIONS
    extra = type(table)(*table, Option("NEW_OPTION", 1))
    monkeypatch.setattr(conf, "STAGING_OPTIONS", extra)
    with pytest.raises(reference.ReferenceDrift, match="NEW_OPTION"):
        reference.render("<!-- reference:staging-options -->")


def test_a_check_id_without_a_description_stops_the_build(reference, monkeypatch):
    monkeypatch.setattr(reference, "check_ids_in_code", lambda: {"E001", "E999"})
    with pytest.raises(reference.ReferenceDrift, match="E999"):
        reference.render_checks()


def test_links_are_made_relative_to_the_page(reference):
    on_settings = reference.render("<!-- reference:stream-options -->")
    on_guide = reference.render("<!-- reference:stream-options -->", "how-to/unique-jobs.md")
    assert "](checks.md#e030)" in on_settings
    assert "](../reference/checks.md#e030)" in on_guide


# -- The settings tables: a type for every option, short cells


def table_cells(markdown: str) -> list[tuple[str, str]]:
    """(row name, cell) of every body cell of the Markdown tables in *markdown*."""
    cells = []
    for line in markdown.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        row = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        cells += [(row[0], cell) for cell in row]
    return cells


def test_no_settings_cell_is_longer_than_60_words(reference):
    """A long meaning belongs in the how-to its cell links to, not in the table."""
    cells = table_cells(reference.render(SETTINGS_PAGE.read_text()))
    assert len(cells) > 300
    long = [(row, len(cell.split())) for row, cell in cells if len(cell.split()) > 60]
    assert long == []


def test_every_option_shows_the_type_its_kind_declares(reference):
    stream = reference.render("<!-- reference:stream-options -->")
    assert stream.splitlines()[0] == "| option | type | default | meaning | check |"
    assert "| `BATCH_SIZE` | `int ≥ 1`, at most 100,000 | `1000` |" in stream
    assert '| `ORDER_AFTER_DEAD_LETTER` | `"hold"` or `"continue"` | `\'hold\'` |' in stream
    assert "| `CALLS_PER_SECOND` | `float > 0` or `None` | `None` |" in stream
    assert "| `HANDLER` | `str` (dotted path) | `None` |" in stream
    tasks = reference.render("<!-- reference:task-options -->")
    assert "| `BACKOFF_SECONDS` | `float > 0` | `10` |" in tasks


@pytest.mark.parametrize("kind", [Kind(lambda value: True, "", ""), None])
def test_an_option_of_a_kind_without_a_type_stops_the_build(reference, monkeypatch, kind):
    table = conf.STAGING_OPTIONS
    new = Option("NEW_OPTION", 1) if kind is None else Option("NEW_OPTION", 1, kind)
    monkeypatch.setattr(conf, "STAGING_OPTIONS", type(table)(*table, new))
    monkeypatch.setitem(reference.OPTION_DOCS, ("staging", "NEW_OPTION"), "a new option")
    with pytest.raises(reference.ReferenceDrift, match="NEW_OPTION: its kind has no type"):
        reference.render("<!-- reference:staging-options -->")


# -- The settings page's examples

EXAMPLES = ROOT / "tests" / "docs_examples" / "reference_settings.py"


@pytest.fixture
def example(monkeypatch):
    """The examples' names, the file run as a settings module is, its token in the
    environment (its kind declared in isolated apps, not in the suite's)."""
    monkeypatch.setenv("OUTBOX_METRICS_TOKEN", "a-token-from-the-environment")
    with isolate_apps("tests.docs_examples"):
        names = runpy.run_path(str(EXAMPLES), run_name="tests.docs_examples.reference_settings")
        yield SimpleNamespace(**names)


def test_the_examples_set_every_option(reference):
    blocks = reference.example_settings()
    [stream] = [key for key in blocks if key.startswith("STREAMS[")]
    assert sorted(blocks[stream]) == sorted(o.name for o in conf.STREAM_OPTIONS)
    assert sorted(blocks[""]) == sorted(o.name for o in conf.GLOBAL_OPTIONS)
    assert sorted(blocks["STAGING"]) == sorted(o.name for o in conf.STAGING_OPTIONS)
    assert sorted(reference.example_kind()) == sorted(o.name for o in kind_options.OPTIONS)
    tunable = [name.upper() for name in reference.tunable_task_options()]
    assert sorted(reference.example_task_options()) == sorted(tunable)


def test_an_option_missing_from_the_example_stops_the_build(reference, monkeypatch):
    table = conf.STREAM_OPTIONS
    monkeypatch.setattr(conf, "STREAM_OPTIONS", type(table)(*table, Option("NEW_OPTION", 1)))
    with pytest.raises(reference.ReferenceDrift, match=r"lacks \['NEW_OPTION'\]"):
        reference.render("<!-- reference:settings-example -->")


def test_a_hook_option_without_its_call_described_stops_the_build(reference, monkeypatch):
    monkeypatch.delitem(reference.CALLABLE_DOCS, ("stream", "ON_EXHAUSTED"))
    with pytest.raises(reference.ReferenceDrift, match="ON_EXHAUSTED"):
        reference.render("<!-- reference:hooks -->")


def test_the_hooks_shown_are_the_functions_the_example_names(reference, example):
    rendered = reference.render("<!-- reference:hooks -->")
    stream = example.DJANGO_OUTBOX["STREAMS"]["shipments"]
    assert stream["HANDLER"] == "tests.docs_examples.shipments.ship"
    assert stream["ON_EXHAUSTED"] == "tests.docs_examples.shipments.cancel"
    assert '--8<-- "tests/docs_examples/shipments.py:ship"' in rendered
    assert '--8<-- "tests/docs_examples/shipments.py:cancel"' in rendered


def test_the_settings_example_passes_the_system_checks(example):
    with override_settings(DJANGO_OUTBOX=example.DJANGO_OUTBOX, Q_CLUSTER=example.Q_CLUSTER):
        messages = [m for m in run_checks() if m.id.startswith("django_outbox.")]
        assert messages == []
        assert check_kind(example.RecomputeTotals) == []


def test_the_tasks_example_passes_the_backend_checks(example):
    if django.VERSION < (6, 0):
        pytest.skip("django.tasks exists from Django 6.0 on (tox -e py312-dj61-*)")
    from django.tasks import task_backends

    with override_settings(TASKS=example.TASKS, Q_CLUSTER=example.Q_CLUSTER):
        assert list(task_backends["default"].check()) == []


@pytest.mark.django_db
def test_the_example_stream_runs_through_its_handler_and_its_exhausted_hook(example):
    """The code calls the hooks the page shows, as it shows them: ``ship(batch)``
    delivers, and a batch the warehouse refuses reaches ``cancel(batch, error)``."""
    warehouse = shipments.warehouse
    warehouse.received.clear()
    warehouse.cancelled.clear()
    warehouse.answers[:] = [shipments.Response(422)]
    with override_settings(DJANGO_OUTBOX=example.DJANGO_OUTBOX, Q_CLUSTER=example.Q_CLUSTER):
        refused = [OrderedEvent.objects.create(aggregate_id=key).id for key in "AAB"]
        assert run_inline(["shipments"], until_empty=True).stopped_because == "empty"

        shipped = [OrderedEvent.objects.create(aggregate_id=key).id for key in "CD"]
        assert run_inline(["shipments"], until_empty=True).stopped_because == "empty"

    assert [[row["id"] for row in rows] for rows in warehouse.received] == [refused, shipped]
    error = "PermanentFailure: the warehouse refused the batch: HTTP 422"
    [(orders, reason)] = warehouse.cancelled
    assert orders == ["A", "B"]
    assert error in reason
    dead = ArchivedEvent.objects.filter(stream="shipments", outcome="failed")
    assert sorted(dead.values_list("event_id", flat=True)) == refused
    assert not ArchivedEvent.objects.filter(outcome="done").exists()  # ARCHIVE is off
    assert not OrderedEvent.objects.exists() and not OutboxGroup.objects.exists()
