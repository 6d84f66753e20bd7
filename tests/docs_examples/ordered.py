"""The ordered-streams guide's settings (``tests/streams/test_ordering.py`` checks them)."""

from __future__ import annotations

# --8<-- [start:settings]
DJANGO_OUTBOX = {
    "STREAMS": {
        "ordered": {
            "HANDLER": "tests.testapp.handlers.record_ordered",
            "MODEL": "testapp.OrderedEvent",
            "ORDER_KEY": "aggregate_id",  # rows of one aggregate reach the handler in order
            "ORDER_AFTER_DEAD_LETTER": "hold",  # the default: a dead letter holds its key
        },
    },
}
# --8<-- [end:settings]

# --8<-- [start:generic]
GENERIC_OUTBOX = {
    "STREAMS": {
        "orders": {
            "HANDLER": "tests.testapp.handlers.record",
            "ORDER_KEY": "order_id",  # a top-level key of the payloads
        },
    },
}


def order_paid(order_id: int) -> int:
    from django_outbox import publish

    return publish("orders", {"order_id": order_id, "status": "paid"})


# --8<-- [end:generic]
