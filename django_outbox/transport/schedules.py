"""Keep django-q2 ``Schedule`` rows in line with the settings, by name.

Each stream gets one schedule, ``django_outbox:distribute:<stream>``, running
``django_outbox.tasks.distribute`` every ``EVERY_MINUTES`` on the stream's cluster.
``django_outbox:drain`` forwards staged jobs (when ``STAGING["ALLOWED_MODULES"]`` is
set), ``django_outbox:dispatch:<app_label>.<model>`` dispatches each unique-job kind
every ``dispatch_every_minutes`` on its cluster, and ``django_outbox:prune`` deletes
what outlived its retention.
Schedules whose name starts with ``django_outbox:`` and that the settings no longer
ask for are removed; other schedules are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from django.db import transaction
from django_q.models import Schedule

from django_outbox.conf import outbox_settings
from django_outbox.models.unique import all_kinds
from django_outbox.transport import handoff

PREFIX = "django_outbox:"


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    func: str
    args: str
    minutes: int
    cluster: str | None

    def fields(self) -> dict[str, Any]:

        return {
            "func": self.func,
            "args": self.args,
            "kwargs": None,
            "schedule_type": Schedule.MINUTES,
            "minutes": self.minutes,
            "repeats": -1,
            "cluster": self.cluster,
        }


@dataclass(frozen=True)
class ScheduleChange:
    action: Literal["create", "update", "delete"]
    name: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.action} {self.name}" + (f" ({self.detail})" if self.detail else "")


DRAIN_STAGED = "django_outbox.tasks.drain_staged"
PRUNE = "django_outbox.tasks.prune"
DISPATCH_UNIQUE = "django_outbox.tasks.dispatch_unique"


def desired_schedules() -> list[ScheduleSpec]:
    config = outbox_settings()
    specs = [
        ScheduleSpec(
            name=f"{PREFIX}distribute:{stream.name}",
            func=handoff.DISTRIBUTE,
            args=repr((stream.name,)),
            minutes=stream.every_minutes,
            cluster=stream.cluster,
        )
        for stream in config.streams.values()
    ]
    if config.staging.enabled:
        specs.append(
            ScheduleSpec(
                name=f"{PREFIX}drain",
                func=DRAIN_STAGED,
                args="()",
                minutes=config.staging.every_minutes,
                cluster=config.staging.cluster,
            )
        )
    specs.extend(
        ScheduleSpec(
            name=f"{PREFIX}dispatch:{kind._meta.label_lower}",
            func=DISPATCH_UNIQUE,
            args=repr((kind._meta.label_lower,)),
            minutes=kind.job_options().dispatch_every_minutes,
            cluster=kind.job_options().cluster,
        )
        for kind in all_kinds()
    )
    specs.append(
        ScheduleSpec(
            name=f"{PREFIX}prune",
            func=PRUNE,
            args="()",
            minutes=config.prune_every_minutes,
            cluster=None,
        )
    )
    return specs


def sync_schedules(*, apply: bool = True) -> list[ScheduleChange]:
    """Return the changes that bring the schedules in line; make them when *apply*."""

    changes: list[ScheduleChange] = []
    wanted = {spec.name: spec for spec in desired_schedules()}
    with transaction.atomic(using=Schedule.objects.db):
        existing: dict[str, Schedule] = {}
        for schedule in Schedule.objects.filter(name__startswith=PREFIX).order_by("pk"):
            if schedule.name in wanted and schedule.name not in existing:
                existing[schedule.name] = schedule
                continue
            reason = "duplicate" if schedule.name in wanted else "not in settings"
            changes.append(ScheduleChange("delete", schedule.name, reason))
            if apply:
                schedule.delete()
        for name, spec in wanted.items():
            schedule = existing.get(name)
            if schedule is None:
                changes.append(ScheduleChange("create", name, f"every {spec.minutes} min"))
                if apply:
                    Schedule.objects.create(name=name, **spec.fields())
                continue
            drift = {
                key: value
                for key, value in spec.fields().items()
                if getattr(schedule, key) != value
            }
            if drift:
                detail = ", ".join(
                    f"{key}: {getattr(schedule, key)!r} -> {value!r}"
                    for key, value in drift.items()
                )
                changes.append(ScheduleChange("update", name, detail))
                if apply:
                    for key, value in drift.items():
                        setattr(schedule, key, value)
                    schedule.save()
    return changes
