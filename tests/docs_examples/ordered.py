"""The ordered-streams guide's settings (``tests/test_ordering.py`` checks them)."""

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
