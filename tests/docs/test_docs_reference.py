"""The reference pages are rendered from the code and cover all of it.

The docs build runs ``docs/hooks/reference.py``; these tests run the same renderers,
in a fraction of a second, so an option or a check id added without its description
fails here before it fails the docs build.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from django_outbox import conf
from django_outbox.base.option_table import Option
from django_outbox.unique import options as kind_options

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"


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
