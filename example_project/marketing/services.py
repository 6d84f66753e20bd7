"""Application code: record an activity and its outbox event in one transaction."""

from __future__ import annotations

from django.db import transaction

from marketing.models import ContactActivity, ContactActivityEvent, Lead


def record_activity(lead: Lead, kind: str, comment: str = "") -> ContactActivity:
    """Save the activity; its sync to the marketing service happens later, in bulk."""
    with transaction.atomic():
        activity = ContactActivity.objects.create(lead=lead, kind=kind, comment=comment)
        ContactActivityEvent.objects.create(activity=activity)
    return activity
