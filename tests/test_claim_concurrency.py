"""Process tier, PostgreSQL: concurrent claimers in separate processes never overlap."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import pytest
from django.db.models import Count

from django_outbox.models import OutboxGroup
from marketing.models import ContactActivity, ContactActivityEvent, Lead
from tests.procs import running, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 20_000
WORKERS = 4


def test_concurrent_claimers_never_claim_a_row_twice_and_leave_none_behind(tmp_path):
    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    ContactActivityEvent.objects.bulk_create(
        (ContactActivityEvent(activity=activity) for _ in range(ROWS)), batch_size=5000
    )
    start_file = tmp_path / "start"
    outputs = [tmp_path / f"worker-{n}.out" for n in range(WORKERS)]
    code = (
        "from tests.procs import claim_until_empty; "
        f"claim_until_empty('marketing', {str(start_file)!r})"
    )

    with ExitStack() as stack:
        workers = [
            stack.enter_context(running(["-c", code], f"claimer-{n}", log=out))
            for n, out in enumerate(outputs)
        ]
        wait_until(
            lambda: all(out.read_text().startswith("ready") for out in outputs),
            timeout=60,
            describe=lambda: [out.read_text()[:40] for out in outputs],
        )
        started = time.perf_counter()
        start_file.touch()  # all workers start claiming at once
        wait_until(
            lambda: all(w.poll() is not None for w in workers),
            timeout=120,
            describe=lambda: [w.poll() for w in workers],
        )
        seconds = time.perf_counter() - started
    assert [w.returncode for w in workers] == [0] * WORKERS

    reports = [json.loads(out.read_text().splitlines()[-1]) for out in outputs]
    print(f"{WORKERS} processes claimed {ROWS:,} rows in {seconds:.2f}s")
    reported = [(group, size) for report in reports for group, size in report]
    sizes = dict(reported)

    assert len(sizes) == len(reported), "two claims reported the same group"
    assert sum(sizes.values()) == ROWS, "claimed sizes do not add up to the rows"
    assert not ContactActivityEvent.objects.filter(group_id__isnull=True).exists()
    in_buffer = ContactActivityEvent.objects.values_list("group_id").annotate(n=Count("id"))
    assert {str(g): n for g, n in in_buffer} == sizes, "a row was claimed twice"
    group_rows = OutboxGroup.objects.values_list("id", "size")
    assert {str(g): n for g, n in group_rows} == sizes
    assert sum(1 for report in reports if report) > 1, "the claims did not run concurrently"
