"""Application code: record an activity and its outbox event in one transaction."""

from __future__ import annotations

from django.db import transaction

from django_outbox.jobs.staging import stage_task
from marketing.models import ContactActivity, ContactActivityEvent, Lead


# --8<-- [start:record_activity]
def record_activity(lead: Lead, kind: str, comment: str = "") -> ContactActivity:
    """Save the activity; its sync to the marketing service happens later, in bulk."""
    with transaction.atomic():
        activity = ContactActivity.objects.create(lead=lead, kind=kind, comment=comment)
        ContactActivityEvent.objects.create(activity=activity)
    return activity


# --8<-- [end:record_activity]


def sign_up_lead(name: str, email: str) -> Lead:
    """Create a lead and stage its welcome email: sent only if the lead is committed."""
    with transaction.atomic():
        lead = Lead.objects.create(name=name, email=email)
        stage_task("marketing.tasks.send_welcome_email", lead.pk)
    return lead
