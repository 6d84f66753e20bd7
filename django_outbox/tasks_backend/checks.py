"""System checks of the ``django.tasks`` backend: ids ``django_outbox.E084`` to ``E086``.

Run by Django's task checks (``BaseTaskBackend.check``) for each ``TASKS`` alias that
uses :class:`~django_outbox.tasks_backend.OutboxTaskBackend`. E084 for a backend path
into this package comes from :func:`django_outbox.checks.check_tasks_app`, which a plain
``check`` runs: Django registers the task checks only once ``django.tasks`` is imported.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error

from django_outbox.base.option_table import Problem, is_positive_number
from django_outbox.checks import TASKS_APP, errors_of, names_tasks_backend, tasks_app_missing
from django_outbox.tasks_backend.options import TUNABLE, given, our_aliases
from django_outbox.transport.handoff import cluster_options


def check_backend(alias: str) -> list[CheckMessage]:
    """The errors of one alias: the app installed, its OPTIONS, agreement with the others."""
    params = our_aliases().get(alias, {})
    where = f"TASKS[{alias!r}]"
    errors: list[CheckMessage] = []
    if not apps.is_installed(TASKS_APP) and not names_tasks_backend(params):
        # A subclass elsewhere; a path into our package is django_outbox's own check's.
        errors.append(tasks_app_missing(alias))
    options = params.get("OPTIONS") or {}
    if not isinstance(options, dict):
        return [
            *errors,
            Error(
                f"{where}['OPTIONS'] must be a dict, not {type(options).__name__}.",
                hint='For example "OPTIONS": {"MAX_ATTEMPTS": 5}.',
                id="django_outbox.E085",
            ),
        ]
    values = given(params)
    upper = TUNABLE_UPPER
    problems: list[Problem] = []
    unknown = sorted(str(key) for key in options if str(key).lower() not in TUNABLE)
    if unknown:
        problems.append(
            Problem(
                "E085",
                f"{where}['OPTIONS'] has unknown options: {', '.join(unknown)}.",
                f"Known options: {', '.join(upper)}.",
            )
        )
    known = {name: value for name, value in values.items() if name in TUNABLE}
    for problem in TUNABLE.problems(known, lambda name: f"{where}['OPTIONS'][{name.upper()!r}]"):
        problems.append(Problem("E085", problem.message, problem.hint))
    merged = TUNABLE.merged(known)
    base, cap = merged["backoff_seconds"], merged["backoff_max_seconds"]
    if is_positive_number(base) and is_positive_number(cap) and cap < base:
        problems.append(
            Problem(
                "E085",
                f"{where}['OPTIONS']['BACKOFF_MAX_SECONDS'] ({cap}) is below BACKOFF_SECONDS "
                f"({base}).",
                "The cap of the exponential backoff must be at least its base delay.",
            )
        )
    cluster = merged["cluster"]
    if isinstance(cluster, str) and cluster and cluster_options(cluster) is None:
        problems.append(
            Problem(
                "E085",
                f"{where}['OPTIONS']['CLUSTER'] names {cluster!r}, which "
                "Q_CLUSTER['ALT_CLUSTERS'] does not define.",
                f"Add it to Q_CLUSTER['ALT_CLUSTERS'] and run a qcluster with "
                f"Q_CLUSTER_NAME={cluster}, or remove CLUSTER.",
            )
        )
    errors.extend(errors_of(problems))
    errors.extend(_disagreements(alias, known))
    return errors


def _disagreements(alias: str, known: dict[str, Any]) -> list[CheckMessage]:
    """E086: an option this alias sets differently from an earlier alias of ours."""
    errors: list[CheckMessage] = []
    for other, params in our_aliases().items():
        if other == alias:
            break
        theirs = given(params)
        for name, value in known.items():
            if name in theirs and theirs[name] != value:
                errors.append(
                    Error(
                        f"TASKS[{alias!r}]['OPTIONS'][{name.upper()!r}] is {value!r}, but "
                        f"TASKS[{other!r}] sets it to {theirs[name]!r}.",
                        hint="The aliases of OutboxTaskBackend share one task table and its "
                        "options: set each option once, or to the same value.",
                        id="django_outbox.E086",
                    )
                )
    return errors


TUNABLE_UPPER = tuple(option.name.upper() for option in TUNABLE)
