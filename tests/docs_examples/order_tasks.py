"""The tasks-backend guide's per-call keys (``using(unique_key=…)``, ``idempotency_key``).

Django 6.0+ (django.tasks); ``tests/docs/test_docs_examples.py`` runs it.
"""

from __future__ import annotations

from typing import Any

from django.tasks import TaskResult, task

from tests.testapp.models import JobEffect


@task
def send_receipt(order_id: int) -> None:
    JobEffect.objects.create(label="receipt", value=order_id)


@task
def charge(order_id: int) -> None:
    JobEffect.objects.create(label="charge", value=order_id)


def place(order: Any) -> tuple[TaskResult, TaskResult]:
    # --8<-- [start:keys]
    receipt = send_receipt.using(unique_key=f"receipt:{order.pk}").enqueue(order.pk)
    payment = charge.using(idempotency_key=f"charge:{order.pk}").enqueue(order.pk)
    # --8<-- [end:keys]
    return receipt, payment
