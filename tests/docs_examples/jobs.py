"""The staged-jobs guide's task functions (``marketing/jobs.py`` in the guide)."""

from __future__ import annotations

DONE: list[tuple[str, int]] = []


def send_welcome(lead_id: int) -> None:
    DONE.append(("welcome", lead_id))


def charge_signup_fee(lead_id: int) -> None:
    DONE.append(("charge", lead_id))


def ask_for_feedback(lead_id: int) -> None:
    DONE.append(("feedback", lead_id))
