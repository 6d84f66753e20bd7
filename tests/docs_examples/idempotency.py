"""The idempotency guide's guarded block (``with idempotent(...)``).

``tests/docs/test_docs_examples.py`` runs it twice and sees one email.
"""

from __future__ import annotations

from typing import Any

from django_outbox.jobs.idempotency import idempotent

SENT: list[int] = []  # the users the stand-in mailer wrote to


def send_welcome_email(user: Any) -> None:
    SENT.append(user.pk)


def welcome(user: Any) -> None:
    # --8<-- [start:guard]
    with idempotent(key=f"welcome:{user.pk}", scope="emails") as guard:
        if not guard.done:
            send_welcome_email(user)
            guard.result = {"sent": True}
    # --8<-- [end:guard]
