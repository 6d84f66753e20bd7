"""claim_group(): one group of the oldest unclaimed rows, its group row and process job."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_outbox import publish_many, transport
from django_outbox.claim import claim_group, run_claim_chain_link
from django_outbox.models import GroupState, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams import set_paused

pytestmark = pytest.mark.django_db


def test_claim_takes_the_oldest_rows_up_to_the_batch_size_and_enqueues_one_process_job():
    publish_many("audit", [{"n": i} for i in range(25)])
    ids = list(OutboxEvent.objects.order_by("id").values_list("id", flat=True))

    with transport.capture() as jobs:
        result = claim_group("audit")

    assert result.size == 10 and result.full
    claimed = OutboxEvent.objects.filter(group_id=result.group_id)
    assert sorted(claimed.values_list("id", flat=True)) == ids[:10]
    group = OutboxGroup.objects.get(pk=result.group_id)
    assert (group.stream, group.size, group.state, group.attempt) == (
        "audit",
        10,
        GroupState.CLAIMED,
        0,
    )
    assert group.lease_expires_at is not None
    assert list(jobs) == [transport.Job(transport.PROCESS, ("audit", str(result.group_id)))]


def test_claims_never_overlap_and_the_last_one_is_partial():
    publish_many("audit", [{"n": i} for i in range(25)])

    with transport.capture():
        results = [claim_group("audit") for _ in range(4)]

    assert [r.size for r in results] == [10, 10, 5, 0]
    assert results[3].group_id is None
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 0
    assert len({r.group_id for r in results[:3]}) == 3
    assert OutboxGroup.objects.count() == 3


def test_a_generic_stream_claims_only_its_own_rows():
    streams = {
        "audit": {"HANDLER": "tests.testapp.handlers.record", "BATCH_SIZE": 10},
        "mail": {"HANDLER": "tests.testapp.handlers.record", "BATCH_SIZE": 10},
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        publish_many("mail", [{"to": i} for i in range(3)])
        publish_many("audit", [{"n": i} for i in range(4)])
        with transport.capture():
            result = claim_group("audit")

    assert result.size == 4
    claimed = OutboxEvent.objects.filter(group_id=result.group_id)
    assert set(claimed.values_list("stream", flat=True)) == {"audit"}
    assert OutboxEvent.objects.filter(stream="mail", group_id__isnull=True).count() == 3


def test_a_paused_stream_claims_nothing():
    publish_many("audit", [{"n": i} for i in range(5)])
    set_paused("audit", True)

    with transport.capture() as jobs:
        result = claim_group("audit")

    assert not result.claimed_any
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5
    assert not jobs


def test_the_batch_size_override_of_the_state_row_wins_over_settings():
    publish_many("audit", [{"n": i} for i in range(10)])
    StreamState.objects.create(stream="audit", batch_size_override=3)

    with transport.capture():
        assert claim_group("audit").size == 3


def test_a_full_claim_continues_the_chain_and_a_short_one_ends_it():
    publish_many("audit", [{"n": i} for i in range(15)])
    StreamState.objects.create(stream="audit", claims_in_flight=1)

    with transport.capture() as jobs:
        first = run_claim_chain_link("audit")
        assert first.size == 10
        assert [j.func for j in jobs] == [transport.PROCESS, transport.CLAIM]
        assert StreamState.objects.get(stream="audit").claims_in_flight == 1
        jobs.clear()
        second = run_claim_chain_link("audit")

    assert second.size == 5
    assert [j.func for j in jobs] == [transport.PROCESS]
    assert StreamState.objects.get(stream="audit").claims_in_flight == 0


def test_a_full_claim_leaves_the_chain_to_the_claims_still_in_flight():
    publish_many("audit", [{"n": i} for i in range(30)])
    StreamState.objects.create(stream="audit", claims_in_flight=5)  # CHAINS is 4

    with transport.capture() as jobs:
        result = run_claim_chain_link("audit")

    assert result.full
    assert [j.func for j in jobs] == [transport.PROCESS]
    assert StreamState.objects.get(stream="audit").claims_in_flight == 4


def test_up_to_chains_full_claims_carry_on_past_the_wave():
    publish_many("audit", [{"n": i} for i in range(30)])
    StreamState.objects.create(stream="audit", claims_in_flight=4)

    with transport.capture() as jobs:
        result = run_claim_chain_link("audit")

    assert result.full
    assert [j.func for j in jobs] == [transport.PROCESS, transport.CLAIM]
    assert StreamState.objects.get(stream="audit").claims_in_flight == 4


def test_claim_uses_a_constant_number_of_queries(django_assert_max_num_queries):
    publish_many("audit", [{"n": i} for i in range(10)])
    with override_settings(
        DJANGO_OUTBOX={"STREAMS": {"audit": {"HANDLER": "tests.testapp.handlers.record"}}}
    ):
        publish_many("audit", [{"n": i} for i in range(990)])
        with django_assert_max_num_queries(8):
            result = claim_group("audit")
    assert result.size == 1000
