"""The publish guide's generic stream (``publish`` and ``publish_many``).

``tests/docs/test_docs_examples.py`` runs it against the test settings' ``audit`` stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# --8<-- [start:imports]
from django_outbox import publish, publish_many

# --8<-- [end:imports]


def audit_login_and_export(user: Any, user_ids: Iterable[int]) -> None:
    # --8<-- [start:publish]
    publish("audit", {"user": user.pk, "action": "login"})
    publish_many("audit", [{"user": pk, "action": "export"} for pk in user_ids])
    # --8<-- [end:publish]
