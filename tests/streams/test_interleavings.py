"""Interleavings tried by machine: the harness of ``tests/interleavings.py`` on PostgreSQL.

A short run here (a few seeds of each profile); the long run is a command
(CONTRIBUTING.md, "Testing")::

    OUTBOX_HARNESS_RUNS=2000 pytest --postgres tests/streams/test_interleavings.py -k long

A failure prints its profile, seed and step trace; ``OUTBOX_HARNESS_PROFILE=…
OUTBOX_HARNESS_SEED=… pytest --postgres tests/streams/test_interleavings.py -k replay`` replays it.
"""

from __future__ import annotations

import os

import pytest

from tests import interleavings
from tests.interleavings import PROFILES, run_scenario

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _harness():
    with interleavings.harness_settings(), interleavings.gates():
        yield


def test_replay():
    if not os.environ.get("OUTBOX_HARNESS_SEED"):
        pytest.skip("set OUTBOX_HARNESS_SEED (and OUTBOX_HARNESS_PROFILE) to replay a run")
    profile = PROFILES[os.environ.get("OUTBOX_HARNESS_PROFILE", "clean")]
    harness = run_scenario(profile, int(os.environ["OUTBOX_HARNESS_SEED"]))
    if os.environ.get("OUTBOX_HARNESS_TRACE"):
        print("\n".join(harness.trace))


@pytest.mark.parametrize("seed", range(int(os.environ.get("OUTBOX_HARNESS_CI_RUNS", "8"))))
def test_clean(seed):
    """Publish paths with sequence ids, claims, runs ending, fan-outs, reservations,
    distribute, rescue, pauses, the clock, partial and whole failures, crashed workers,
    on a generic and an ordered stream: every invariant holds."""
    run_scenario(PROFILES["clean"], seed)


@pytest.mark.parametrize("seed", range(int(os.environ.get("OUTBOX_HARNESS_CI_RUNS", "8"))))
def test_queued_wakes(seed):
    """Jobs through django-q2's queue table: publish() queues its stream's wake in its
    INSERT, later publishes rely on it while untaken, workers take wakes and runs from
    the table; every invariant holds."""
    run_scenario(PROFILES["queued_wake"], seed)


# -- the seeds that found a defect ------------------------------------------------------


def test_seed_a_transaction_publishing_across_a_runs_end_holds_one_guard_lock():
    run_scenario(PROFILES["wake_guard"], 7)


def test_seed_rows_with_explicit_low_ids_are_claimed():
    run_scenario(PROFILES["floor"], 1)


def test_seed_rows_of_a_cached_sequence_are_claimed():
    run_scenario(PROFILES["floor_cache"], 1)


def test_seed_a_retry_after_pause_stops_the_other_runs_handler_calls():
    run_scenario(PROFILES["retry_after"], 6)


def test_seed_a_row_re_keyed_while_claimed_is_not_overtaken_by_its_old_keys_rows():
    run_scenario(PROFILES["rekey"], 9)


def test_seed_a_run_that_read_its_stream_paused_processes_the_claim_it_took_after_a_resume():
    """Found here: a run read its stream paused, the stream was resumed, and the run's
    last claim took rows it then dropped (no handler, the stream blocked) until the
    group's lease ran out."""
    run_scenario(PROFILES["everything"], 7)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_long(profile):
    """The long run: ``OUTBOX_HARNESS_RUNS`` seeds of each profile."""
    if not interleavings.runs_wanted():
        pytest.skip("set OUTBOX_HARNESS_RUNS (the long run; CONTRIBUTING.md, Testing)")
    for seed in interleavings.seeds():
        run_scenario(PROFILES[profile], seed)
