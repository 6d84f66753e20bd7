"""Process tier: a worker frozen past its lease (SIGSTOP) changes nothing when it wakes."""

from __future__ import annotations

import os
import signal

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.conf import get_stream
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup
from django_outbox.streams.attempt import AttemptOutcome, finalize, take_group_lease
from django_outbox.streams.batch import Batch
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.run import claim_group
from django_outbox.transport import handoff
from tests.conftest import unwoken
from tests.procs import running, wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("heartbeat", [False, True], ids=["finalize", "heartbeat"])
def test_a_worker_paused_past_its_lease_cannot_finalize_or_heartbeat(tmp_path, heartbeat):
    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "stall": settings.STALL_STREAM}
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        with unwoken():  # this test's claim below is the only one
            publish_many("stall", [{"n": i} for i in range(5)])
        with handoff.capture():
            group_id = claim_group("stall").group_id
        out = tmp_path / "stale.out"
        code = (
            f"from tests.testapp.workers import process_once; process_once('stall', '{group_id}')"
        )
        env = {
            "OUTBOX_TEST_CRASH": "1",
            "OUTBOX_TEST_STALL_DIR": str(tmp_path),
            "OUTBOX_TEST_HEARTBEAT": "1" if heartbeat else "0",
        }
        with running(["-c", code], "stale-worker", log=out, **env) as stale:
            wait_until(lambda: (tmp_path / "started").exists(), timeout=60)
            os.kill(stale.pid, signal.SIGSTOP)
            try:
                wait_until(
                    lambda: OutboxGroup.objects.filter(
                        pk=group_id, lease_expires_at__lt=Now()
                    ).exists(),
                    timeout=30,
                )
                with handoff.capture():
                    assert distribute_stream("stall").groups_enqueued == 1  # the rescue
                # Another worker takes the group over; it is still running when the
                # stale worker wakes up.
                config = get_stream("stall")
                fresh = Batch(config, group_id, take_group_lease(config, group_id))
            finally:
                (tmp_path / "go").touch()
                os.kill(stale.pid, signal.SIGCONT)
            wait_until(lambda: stale.poll() is not None, timeout=60)
            assert OutboxEvent.objects.filter(group_id=group_id).count() == 5, (
                "the stale worker changed the group"
            )
            assert finalize(fresh, None) is AttemptOutcome.DONE

    assert stale.returncode == 0
    assert out.read_text().strip().splitlines()[-1] == AttemptOutcome.LEASE_LOST.value
    archived = list(
        ArchivedEvent.objects.filter(group_id=group_id).values_list("event_id", "attempts")
    )
    assert len(archived) == len({event_id for event_id, _ in archived}) == 5
    assert {attempts for _, attempts in archived} == {2}
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()
