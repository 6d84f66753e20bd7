"""The metrics-and-logging guide's receiver: page someone when a group is dead-lettered.

``tests/docs/test_docs_examples.py`` dead-letters a group and sees the page.
"""

from __future__ import annotations

# --8<-- [start:imports]
from django.dispatch import receiver

from django_outbox.signals import group_exhausted

# --8<-- [end:imports]


class Pager:
    """Stand-in for your paging service's client."""

    def __init__(self) -> None:
        self.pages: list[str] = []

    def page(self, message: str) -> None:
        self.pages.append(message)


alerts = Pager()


# --8<-- [start:receiver]
@receiver(group_exhausted)
def page_on_dead_letters(sender, *, stream, group_id, rows, error, **kwargs):
    alerts.page(f"{rows} rows of stream {stream} dead-lettered: {error}")


# --8<-- [end:receiver]
