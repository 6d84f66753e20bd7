"""System checks of unique-job kinds: ids ``django_outbox.E070`` to ``E083``.

Each concrete subclass of ``UniqueJob`` is checked for the options of its ``class Job:``
and for a ``perform()`` of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.checks import CheckMessage, Error, register
from django.db import models

from django_outbox.base.option_table import is_positive_number
from django_outbox.checks import errors_of
from django_outbox.models.unique import BOOKKEEPING_FIELDS, UniqueJob, all_kinds
from django_outbox.transport.handoff import cluster_options
from django_outbox.unique.options import OPTIONS, declared_options

FIELD_OPTIONS = ("unique_fields", "unique_while_executing")


@register()
def check_unique_kinds(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:

    errors: list[CheckMessage] = []
    for model in all_kinds():
        if app_configs is None or model._meta.app_config in app_configs:
            errors.extend(check_kind(model))
    return errors


def check_kind(model: type[UniqueJob]) -> list[CheckMessage]:
    """Return the errors of one kind's options and ``perform()``."""
    label = model._meta.label
    job = getattr(model, "Job", None)
    if job is not None and not inspect.isclass(job):
        return [
            Error(
                f"{label}.Job must be a class of options, not {type(job).__name__}.",
                hint='Declare "class Job:" inside the model with options as class attributes, '
                'for example unique_fields = ["blog"].',
                obj=model,
                id="django_outbox.E079",
            )
        ]
    declared = declared_options(model)
    merged = OPTIONS.merged(declared)
    errors = errors_of(
        OPTIONS.unknown_problems(declared, where=f"{label}.Job", check="E070"), obj=model
    )
    for option in FIELD_OPTIONS:
        errors.extend(_check_fields(model, option, merged[option], merged["nullable_keys"]))
    problems = OPTIONS.problems(declared, lambda option: f"{label}.Job.{option}")
    errors.extend(errors_of(problems, obj=model))
    errors.extend(_check_backoff(model, merged["backoff_seconds"], merged["backoff_max_seconds"]))
    errors.extend(_check_cluster(model, merged["cluster"]))
    for option, check in NAMED_FIELDS.items():
        errors.extend(_check_named_field(model, option, merged[option], check))
    if getattr(model.perform, "__qualname__", "") == "UniqueJob.perform":
        errors.append(
            Error(
                f"{label} does not override perform().",
                hint="Define perform(self, heartbeat) on the model with the job's work.",
                obj=model,
                id="django_outbox.E078",
            )
        )
    return errors


def _check_fields(
    model: type[UniqueJob], option: str, value: Any, nullable_keys: Any
) -> list[CheckMessage]:
    label = model._meta.label
    if value is None and option == "unique_while_executing":
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return [
            Error(
                f"{label}.Job.{option} must be a list of field names, not {value!r}.",
                hint=f'For example {option} = ["blog"] (a list, even for one field).',
                obj=model,
                id="django_outbox.E071",
            )
        ]
    errors: list[CheckMessage] = []
    concrete = {field.name: field for field in model._meta.concrete_fields}
    for name in value:
        field = concrete.get(name)
        if field is None or name in BOOKKEEPING_FIELDS:
            own = sorted(set(concrete) - set(BOOKKEEPING_FIELDS))
            errors.append(
                Error(
                    f"{label}.Job.{option} names {name!r}, which is not a payload field of "
                    "the model.",
                    hint=f"Use the model's own fields: {', '.join(own) or 'none declared'}.",
                    obj=model,
                    id="django_outbox.E072",
                )
            )
        elif field.null and nullable_keys is not True:
            errors.append(
                Error(
                    f"{label}.Job.{option} names {name!r}, which is nullable: jobs whose "
                    f"{name} is NULL never conflict, so they would not be unique.",
                    hint=f"Declare {name} with null=False, or set nullable_keys = True if a "
                    "job without a key (NULL) is meant to run unconstrained.",
                    obj=model,
                    id="django_outbox.E073",
                )
            )
    return errors


@dataclass(frozen=True)
class FieldOption:
    """An option that names one payload field of a kind of model field."""

    check: str
    what: str
    fits: Callable[[models.Field], bool]
    hint: str


NAMED_FIELDS = {
    "priority_field": FieldOption(
        "E080",
        "a non-null integer",
        lambda f: isinstance(f, models.IntegerField) and not f.null,
        "Name an integer field declared with null=False (higher values start first)",
    ),
    "result_field": FieldOption(
        "E081",
        "a nullable JSON",
        lambda f: isinstance(f, models.JSONField) and f.null,
        "Name a JSONField declared with null=True (perform()'s return value is stored in it)",
    ),
    "workers_field": FieldOption(
        "E082",
        "a non-null text",
        lambda f: isinstance(f, models.TextField) and not f.null,
        'Name a TextField declared with default="" (each attempt appends its worker)',
    ),
}


def _check_named_field(
    model: type[UniqueJob], option: str, name: Any, kind: FieldOption
) -> list[CheckMessage]:
    """``priority_field``, ``result_field``, ``workers_field``: a fitting payload field, or None."""
    if name is None:
        return []
    payload = {f.name: f for f in model._meta.concrete_fields if f.name not in BOOKKEEPING_FIELDS}
    field = payload.get(name) if isinstance(name, str) else None
    if field is not None and kind.fits(field):
        return []
    fitting = sorted(n for n, f in payload.items() if kind.fits(f))
    return [
        Error(
            f"{model._meta.label}.Job.{option} is {name!r}, which is not {kind.what} "
            "payload field of the model.",
            hint=f"{kind.hint}: {', '.join(fitting) or 'none declared'}; or remove the option.",
            obj=model,
            id=f"django_outbox.{kind.check}",
        )
    ]


def _check_backoff(model: type[UniqueJob], base: Any, cap: Any) -> list[CheckMessage]:
    if not (is_positive_number(base) and is_positive_number(cap)) or cap >= base:
        return []  # a bad value is reported by the option table
    return [
        Error(
            f"{model._meta.label}.Job.backoff_max_seconds ({cap}) is below backoff_seconds "
            f"({base}).",
            hint="The cap of the exponential backoff must be at least its base delay.",
            obj=model,
            id="django_outbox.E076",
        )
    ]


def _check_cluster(model: type[UniqueJob], cluster: Any) -> list[CheckMessage]:
    if not (isinstance(cluster, str) and cluster) or cluster_options(cluster) is not None:
        return []  # None, a defined cluster, or a bad value the option table reports
    return [
        Error(
            f"{model._meta.label}.Job.cluster names {cluster!r}, which "
            "Q_CLUSTER['ALT_CLUSTERS'] does not define.",
            hint=f"Add it to Q_CLUSTER['ALT_CLUSTERS'] and run a qcluster with "
            f"Q_CLUSTER_NAME={cluster}, or remove cluster.",
            obj=model,
            id="django_outbox.E077",
        )
    ]
