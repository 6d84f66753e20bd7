"""The benchmark's broker, as the benchmarks page states it: ``BENCH_REDIS_URL`` names
the Redis of the steps measured on Redis (each in a child with ``BENCH_BROKER=redis``);
the main run stays on django-q2's ORM broker, which its staged-jobs step needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS = "redis://127.0.0.1:6379/9"


def broker_of(**env: str) -> dict[str, str]:
    """The broker keys of benchmarks.settings' Q_CLUSTER under *env*, read in a child
    (the settings choose the broker at import)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, benchmarks.settings as s; "
            "print(json.dumps({k: s.Q_CLUSTER[k] for k in ('orm', 'redis') if k in s.Q_CLUSTER}))",
        ],
        cwd=ROOT,
        env={**base, "BENCH_DATABASE_URL": "postgres://bench@127.0.0.1:5432/bench", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"orm": "default"}),
        ({"BENCH_REDIS_URL": REDIS}, {"orm": "default"}),
        ({"BENCH_REDIS_URL": REDIS, "BENCH_BROKER": "redis"}, {"redis": REDIS}),
    ],
    ids=["default", "redis-url-alone", "redis-child"],
)
def test_only_a_redis_child_of_the_benchmark_runs_on_redis(env, expected):
    assert broker_of(**env) == expected
