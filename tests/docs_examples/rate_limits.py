"""The rate-limits guide's handler: a 429 from the service pauses the stream.

``tests/streams/test_budget.py`` runs it against a stand-in service that answers 429.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Response:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")


@dataclass
class ServiceStandIn:
    """Stand-in for your service's client: answers with the next status in *answers*."""

    answers: list[int] = field(default_factory=list)
    bodies: list[object] = field(default_factory=list)

    def post(self, path: str, json: object) -> Response:
        self.bodies.append(json)
        status = self.answers.pop(0) if self.answers else 200
        return Response(status, {"Retry-After": "20"} if status == 429 else {})


crm = ServiceStandIn()

# --8<-- [start:handler]
from django_outbox import RetryAfter  # noqa: E402


def sync_contacts(batch):
    response = crm.post("/contacts/bulk", json=batch.rows("id", "payload"))
    if response.status_code == 429:  # the service's own rate limit: wait, spend nothing
        raise RetryAfter(float(response.headers.get("Retry-After", 30)), "429 from the CRM")
    response.raise_for_status()


# --8<-- [end:handler]
