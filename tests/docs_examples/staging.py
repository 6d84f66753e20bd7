"""The staged-jobs guide's example (``marketing/services.py`` in the guide).

``tests/docs/test_docs_examples.py`` runs it.
"""

from __future__ import annotations

# --8<-- [start:imports]
from datetime import timedelta

from django.db import transaction

from django_outbox.jobs.staging import stage_task
from marketing.models import Lead

from .jobs import ask_for_feedback, charge_signup_fee, send_welcome

# --8<-- [end:imports]


# --8<-- [start:sign_up]
def sign_up(name: str, email: str) -> Lead:
    with transaction.atomic():
        lead = Lead.objects.create(name=name, email=email)
        stage_task(send_welcome, lead.pk)  # a function, or its dotted path
        stage_task(charge_signup_fee, lead.pk, idempotency_key=f"signup-fee:{lead.pk}")
        stage_task(ask_for_feedback, lead.pk, run_after=timedelta(days=3))
    return lead


# --8<-- [end:sign_up]
