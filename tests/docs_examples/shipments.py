"""The settings reference's hooks: the ``shipments`` stream's HANDLER and ON_EXHAUSTED.

``docs/reference/settings.md`` shows them under the options that name them (the settings
example in ``reference_settings.py`` does); ``tests/docs/test_docs_reference.py`` runs the
stream with that example, through both, against the stand-in service below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django_outbox import Batch, BatchResult, PermanentFailure


@dataclass
class Response:
    status_code: int
    rejected: dict[int, str] = field(default_factory=dict)  # row id -> reason

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")


@dataclass
class WarehouseStandIn:
    """Stand-in for your warehouse's client: answers with the next of *answers*."""

    answers: list[Response] = field(default_factory=list)
    received: list[list[dict]] = field(default_factory=list)
    cancelled: list[tuple[list[str], str]] = field(default_factory=list)

    def post(self, path: str, json: list[dict]) -> Response:
        self.received.append(json)
        return self.answers.pop(0) if self.answers else Response(200)

    def cancel(self, orders: list[str], reason: str) -> None:
        self.cancelled.append((orders, reason))


warehouse = WarehouseStandIn()


# --8<-- [start:ship]
def ship(batch: Batch) -> BatchResult | None:
    response = warehouse.post("/shipments", json=batch.rows("id", "aggregate_id", "seq"))
    if response.status_code == 422:  # the request is invalid: retrying cannot help
        raise PermanentFailure(f"the warehouse refused the batch: HTTP {response.status_code}")
    response.raise_for_status()  # any other error: the group is retried after a backoff
    if response.rejected:  # only these rows are retried; the others are done
        return BatchResult(response.rejected)
    return None


# --8<-- [end:ship]


# --8<-- [start:cancel]
def cancel(batch: Batch, error: str) -> None:
    orders = sorted({row["aggregate_id"] for row in batch.rows("aggregate_id")})
    warehouse.cancel(orders, reason=error)  # compensate: these orders will not ship


# --8<-- [end:cancel]
