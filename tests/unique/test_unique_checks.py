"""System checks of unique-job kinds (E070-E079): each id, its exact message and hint."""

from __future__ import annotations

from unittest import mock

import pytest
from django.core.checks import run_checks
from django.db import models
from django.test.utils import isolate_apps

from django_outbox.models import UniqueJob
from django_outbox.unique import checks as unique_checks
from django_outbox.unique.checks import check_kind

KNOWN = (
    "Known options: backoff_max_seconds, backoff_seconds, chunk_size, cluster, concurrency, "
    "dispatch_every_minutes, jobs_per_statement, lease_seconds, max_attempts, nullable_keys, "
    "ordering, "
    "priority_field, result_field, retention_days, unique_fields, unique_while_executing, "
    "workers_field."
)


def messages(model: type) -> list[tuple[str, str, str]]:
    return [(m.id, m.msg, m.hint) for m in check_kind(model)]


def kind(
    job: object = None, *, perform: bool = True, nullable: bool = False, **fields: models.Field
) -> type:
    """Declare a kind ``uniqueapp.Probe`` with *job* as its ``Job`` (in isolated apps)."""
    attrs: dict[str, object] = {
        "__module__": "tests.uniqueapp.models",
        "blog": models.IntegerField(null=nullable),
        **fields,
        "Meta": type("Meta", (), {"app_label": "uniqueapp"}),
    }
    if job is not None:
        attrs["Job"] = job
    if perform:
        attrs["perform"] = lambda self, heartbeat: None
    return type("Probe", (UniqueJob,), attrs)


def options(**values: object) -> type:
    return type("Job", (), values)


@pytest.fixture(autouse=True)
def _isolated():
    with isolate_apps("tests.uniqueapp"):
        yield


def test_a_well_declared_kind_has_no_errors():
    assert messages(kind(options(unique_fields=["blog"], ordering="ready", cluster=None))) == []


def test_a_kind_without_job_options_uses_the_defaults():
    assert messages(kind()) == []


def test_the_test_kinds_pass_and_checks_are_registered():
    assert [m for m in run_checks() if m.id and m.id.startswith("django_outbox.E07")] == []


def test_registered_check_reports_a_bad_kind():
    bad = kind(options(ordering="fifo"))
    with mock.patch("django_outbox.unique.checks.all_kinds", return_value=[bad]):
        found = [m.id for m in unique_checks.check_unique_kinds()]
    assert found == ["django_outbox.E074"]


def test_e070_unknown_options():
    assert messages(kind(options(unique_field=["blog"], retries=3))) == [
        (
            "django_outbox.E070",
            "uniqueapp.Probe.Job has unknown options: retries, unique_field.",
            KNOWN,
        )
    ]


@pytest.mark.parametrize("option", ["unique_fields", "unique_while_executing"])
def test_e071_field_options_must_be_lists_of_names(option):
    assert messages(kind(options(**{option: "blog"}))) == [
        (
            "django_outbox.E071",
            f"uniqueapp.Probe.Job.{option} must be a list of field names, not 'blog'.",
            f'For example {option} = ["blog"] (a list, even for one field).',
        )
    ]


@pytest.mark.parametrize("name", ["title", "state"])
def test_e072_unknown_or_managed_fields(name):
    assert messages(kind(options(unique_fields=[name]))) == [
        (
            "django_outbox.E072",
            f"uniqueapp.Probe.Job.unique_fields names {name!r}, which is not a payload field "
            "of the model.",
            "Use the model's own fields: blog.",
        )
    ]


def test_e073_nullable_unique_field():
    assert messages(kind(options(unique_fields=["blog"]), nullable=True)) == [
        (
            "django_outbox.E073",
            "uniqueapp.Probe.Job.unique_fields names 'blog', which is nullable: jobs whose blog "
            "is NULL never conflict, so they would not be unique.",
            "Declare blog with null=False, or set nullable_keys = True if a job without a "
            "key (NULL) is meant to run unconstrained.",
        )
    ]


def test_nullable_keys_allows_a_nullable_unique_field():
    assert messages(kind(options(unique_fields=["blog"], nullable_keys=True), nullable=True)) == []


def test_e083_nullable_keys_must_be_a_bool():
    assert [m[0] for m in messages(kind(options(nullable_keys="yes")))] == ["django_outbox.E083"]


def test_e074_ordering():
    assert messages(kind(options(ordering="fifo"))) == [
        (
            "django_outbox.E074",
            "uniqueapp.Probe.Job.ordering must be 'created' or 'ready', not 'fifo'.",
            "'created': jobs of a key run in creation order, each after the previous one "
            "finished; 'ready': the first ready job of a key runs first.",
        )
    ]


@pytest.mark.parametrize(
    ("option", "value", "default"),
    [
        ("max_attempts", 0, 5),
        ("concurrency", -1, 10),
        ("lease_seconds", 2.5, 300),
        ("retention_days", True, 7),
        ("dispatch_every_minutes", "1", 1),
    ],
)
def test_e075_positive_integers(option, value, default):
    assert messages(kind(options(**{option: value}))) == [
        (
            "django_outbox.E075",
            f"uniqueapp.Probe.Job.{option} must be a positive integer, not {value!r}.",
            f"Remove it to use the default ({default}) or give a whole number greater than 0.",
        )
    ]


def test_e076_backoff_must_be_positive():
    assert messages(kind(options(backoff_seconds=0))) == [
        (
            "django_outbox.E076",
            "uniqueapp.Probe.Job.backoff_seconds must be a positive number of seconds, not 0.",
            "Remove it to use the default (10) or give a number greater than 0.",
        )
    ]


def test_e076_backoff_cap_below_base():
    assert messages(kind(options(backoff_seconds=60, backoff_max_seconds=30))) == [
        (
            "django_outbox.E076",
            "uniqueapp.Probe.Job.backoff_max_seconds (30) is below backoff_seconds (60).",
            "The cap of the exponential backoff must be at least its base delay.",
        )
    ]


def test_e077_cluster_not_defined():
    assert messages(kind(options(cluster="feeds"))) == [
        (
            "django_outbox.E077",
            "uniqueapp.Probe.Job.cluster names 'feeds', which Q_CLUSTER['ALT_CLUSTERS'] does "
            "not define.",
            "Add it to Q_CLUSTER['ALT_CLUSTERS'] and run a qcluster with Q_CLUSTER_NAME=feeds, "
            "or remove cluster.",
        )
    ]


def test_e077_cluster_of_the_wrong_type():
    assert messages(kind(options(cluster=3))) == [
        (
            "django_outbox.E077",
            "uniqueapp.Probe.Job.cluster must be a django-q2 cluster name or None, not 3.",
            "Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
        )
    ]


def test_e078_perform_not_overridden():
    assert messages(kind(perform=False)) == [
        (
            "django_outbox.E078",
            "uniqueapp.Probe does not override perform().",
            "Define perform(self, heartbeat) on the model with the job's work.",
        )
    ]


def test_e079_job_must_be_a_class():
    assert messages(kind({"unique_fields": ["blog"]})) == [
        (
            "django_outbox.E079",
            "uniqueapp.Probe.Job must be a class of options, not dict.",
            'Declare "class Job:" inside the model with options as class attributes, for '
            'example unique_fields = ["blog"].',
        )
    ]


@pytest.mark.parametrize("name", ["blog", None])
def test_a_priority_field_naming_an_integer_field_passes(name):
    assert messages(kind(options(priority_field=name))) == []


@pytest.mark.parametrize("name", ["rank", "attempt", 3])
def test_e080_priority_field_must_name_a_non_null_integer_payload_field(name):
    assert messages(kind(options(priority_field=name))) == [
        (
            "django_outbox.E080",
            f"uniqueapp.Probe.Job.priority_field is {name!r}, which is not a non-null "
            "integer payload field of the model.",
            "Name an integer field declared with null=False (higher values start first): "
            "blog; or remove the option.",
        )
    ]


def test_e080_a_nullable_priority_field_is_refused():
    assert [m[0] for m in messages(kind(options(priority_field="blog"), nullable=True))] == [
        "django_outbox.E080"
    ]


def test_result_and_workers_fields_naming_fitting_fields_pass():
    model = kind(
        options(result_field="outcome", workers_field="workers"),
        outcome=models.JSONField(null=True),
        workers=models.TextField(default=""),
    )
    assert messages(model) == []


@pytest.mark.parametrize(
    ("option", "field", "check", "what", "hint"),
    [
        (
            "result_field",
            models.JSONField(),
            "E081",
            "a nullable JSON",
            "Name a JSONField declared with null=True (perform()'s return value is stored in "
            "it): none declared; or remove the option.",
        ),
        (
            "workers_field",
            models.CharField(max_length=10),
            "E082",
            "a non-null text",
            'Name a TextField declared with default="" (each attempt appends its worker): '
            "none declared; or remove the option.",
        ),
    ],
)
def test_e081_e082_result_and_workers_fields_must_fit(option, field, check, what, hint):
    assert messages(kind(options(**{option: "extra"}), extra=field)) == [
        (
            f"django_outbox.{check}",
            f"uniqueapp.Probe.Job.{option} is 'extra', which is not {what} payload field of "
            "the model.",
            hint,
        )
    ]
