"""The async entry points of the guides: async views that publish, stage and enqueue.

``tests/streams/test_async.py`` calls them through ``AsyncClient`` (``tests/urls.py`` routes
them) and, in the process tier, with a real qcluster behind them.
"""

from __future__ import annotations

# --8<-- [start:imports]
from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from django_outbox import apublish, publish
from django_outbox.jobs.staging import astage_task

# --8<-- [end:imports]
from tests.testapp.models import JobEffect
from tests.uniqueapp.models import KeyedJob


# --8<-- [start:apublish]
async def audit_login(request: HttpRequest) -> JsonResponse:
    """One event, committed at once (autocommit): the commit wakes the stream."""
    event_id = await apublish("audit", {"user": request.GET["user"], "at": timezone.now()})
    return JsonResponse({"event": event_id}, status=201)


# --8<-- [end:apublish]


# --8<-- [start:atomic]
@sync_to_async  # thread_sensitive=True: the request's thread and connection
def record_and_publish(label: str) -> int:
    with transaction.atomic():  # the row and its event commit or roll back together
        effect = JobEffect.objects.create(label=label)
        publish("audit", {"effect": effect.pk, "label": label})
    return effect.pk


async def record(request: HttpRequest) -> JsonResponse:
    effect = await record_and_publish(request.POST["label"])
    return JsonResponse({"effect": effect}, status=201)


# --8<-- [end:atomic]


# --8<-- [start:astage_task]
async def stage_receipt(request: HttpRequest) -> JsonResponse:
    staged = await astage_task("tests.testapp.jobs.record", "receipt", {"at": timezone.now()})
    return JsonResponse({"staged": staged}, status=201)


# --8<-- [end:astage_task]


# --8<-- [start:aenqueue]
async def rebuild(request: HttpRequest, key: str) -> JsonResponse:
    job, created = await KeyedJob.aenqueue(key=key)
    return JsonResponse({"job": job.pk, "created": created}, status=201 if created else 200)


# --8<-- [end:aenqueue]
