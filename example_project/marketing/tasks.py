"""django-q2 task functions of the marketing app, staged with ``stage_task``."""

from __future__ import annotations

from marketing.models import Lead, WelcomeEmail


def send_welcome_email(lead_id: int) -> int:
    """Pretend to email the lead; record the send so the demo can count them."""
    lead = Lead.objects.get(pk=lead_id)
    return WelcomeEmail.objects.create(lead=lead).pk
