"""The tutorial's "verify it works" step, typed into ``python manage.py shell``.

``tests/docs/test_docs_examples.py`` runs both halves against the test database, with the
inline runner between them, as the tutorial does.
"""

from __future__ import annotations


def record() -> None:
    # --8<-- [start:record]
    from marketing.models import Lead
    from marketing.services import record_activity

    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    for n in range(1000):
        record_activity(lead, "call", comment=f"call {n}")
    # --8<-- [end:record]


def check() -> int:
    # --8<-- [start:check]
    from django_outbox.models import ArchivedEvent

    done = ArchivedEvent.objects.filter(stream="marketing", outcome="done").count()
    print(f"{done} activities delivered")  # 1000 activities delivered
    # --8<-- [end:check]
    return done
