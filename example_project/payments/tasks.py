"""django-q2 tasks of the payments app (staged with ``stage_task``)."""

from __future__ import annotations

from typing import Any

from payments.services import transfer_funds


def transfer(request_id: str, source_id: int, target_id: int, amount: int) -> dict[str, Any]:
    return transfer_funds(request_id, source_id, target_id, amount)
