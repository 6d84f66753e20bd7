"""Process tier, PostgreSQL: concurrent claimers in separate processes never overlap.

Four processes claim from one buffer at the same moment (``FOR UPDATE SKIP LOCKED``),
each until a claim comes back empty. A row claimed twice would carry only the last
claimer's group id, so the per-group row counts in the buffer would no longer match what
the claimers reported.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import pytest
from django.db.models import Count
from django_q.models import OrmQ

from django_outbox.conf import get_stream
from django_outbox.models import GroupState, OutboxGroup
from marketing.models import ContactActivity, ContactActivityEvent, Lead
from tests.conftest import unwoken
from tests.procs import log_tail, running, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 20_000
WORKERS = 4
STREAM = "marketing"  # BATCH_SIZE 100 in tests/settings.py: 200 groups


def test_concurrent_claimers_never_claim_a_row_twice_and_leave_none_behind(tmp_path):
    batch_size = get_stream(STREAM).batch_size
    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    with unwoken():  # the claimers below are the only ones
        ContactActivityEvent.objects.bulk_create(
            (ContactActivityEvent(activity=activity) for _ in range(ROWS)), batch_size=5_000
        )
    assert ContactActivityEvent.objects.filter(group_id__isnull=True).count() == ROWS

    start_file = tmp_path / "start"
    outputs = [tmp_path / f"claimer-{n}.out" for n in range(WORKERS)]
    code = (
        "from tests.procs import claim_until_empty; "
        f"claim_until_empty({STREAM!r}, {str(start_file)!r})"
    )

    def lines(out):
        return out.read_text().splitlines() if out.exists() else []

    with ExitStack() as stack:
        workers = [
            stack.enter_context(running(["-c", code], f"claimer-{n}", log=out))
            for n, out in enumerate(outputs)
        ]
        # Barrier: every claimer is set up and connected before any of them starts.
        wait_until(
            lambda: all(lines(out)[:1] == ["ready"] for out in outputs),
            timeout=90,
            describe=lambda: [lines(out)[:1] for out in outputs],
            watch=workers,
        )
        started = time.perf_counter()
        start_file.touch()
        wait_until(
            lambda: all(worker.poll() is not None for worker in workers),
            timeout=120,
            interval=0.01,
            describe=lambda: [
                (worker.returncode, ContactActivityEvent.objects.filter(group_id=None).count())
                for worker in workers
            ],
        )
        seconds = time.perf_counter() - started
        for worker in workers:
            assert worker.returncode == 0, log_tail(worker)

    reports = [json.loads(lines(out)[-1]) for out in outputs]
    claimed = [(group_id, size) for report in reports for group_id, size in report]
    sizes = dict(claimed)
    per_worker = [sum(size for _, size in report) for report in reports]
    print(
        f"\n{WORKERS} claimer processes claimed {ROWS:,} rows in {len(claimed)} groups "
        f"in {seconds:.2f}s ({ROWS / seconds:,.0f} rows/s); rows per worker: {per_worker}"
    )

    # Nothing left behind, nothing counted twice.
    assert not ContactActivityEvent.objects.filter(group_id__isnull=True).exists()
    assert len(sizes) == len(claimed), "two claims reported the same group id"
    assert sum(sizes.values()) == ROWS, "the claimed sizes do not add up to the rows"
    assert max(sizes.values()) <= batch_size, "a claim took more than its batch"
    # The buffer agrees with every claimer: a row claimed twice would carry only the last
    # group id, so the first group would have fewer rows than its claimer reported.
    in_buffer = dict(
        ContactActivityEvent.objects.values_list("group_id").annotate(n=Count("id")).order_by()
    )
    assert {str(group_id): n for group_id, n in in_buffer.items()} == sizes
    # Disjoint across workers.
    by_worker = [{group_id for group_id, _ in report} for report in reports]
    assert sum(len(groups) for groups in by_worker) == len(set().union(*by_worker))
    # Every group was recorded, claimed, with its size; its process job was only captured.
    groups = list(OutboxGroup.objects.values_list("id", "size", "state", "stream"))
    assert {str(group_id): size for group_id, size, _, _ in groups} == sizes
    assert {(state, stream) for _, _, state, stream in groups} == {(GroupState.CLAIMED, STREAM)}
    assert not OrmQ.objects.exists(), "a claimer sent a job to django-q2"
    # True concurrency: the work was shared.
    assert sum(1 for rows in per_worker if rows) > 1, f"one worker did everything: {per_worker}"
