"""What the payload encoder costs ``publish()``: plain JSON against DjangoJSONEncoder.

``python -m benchmarks.encoding`` times :func:`django_outbox.base.jsondata.dumps` on a
typical small payload with each encoder, interleaved (paired rounds, so that a busy
machine slows both alike), and prints the best and median microseconds per payload.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_outbox.base.jsondata import dumps

PAYLOAD = {"user": 7, "action": "login", "tags": ["a", "b"], "ip": "10.0.0.1", "ok": True}


def measure(rounds: int = 41, number: int = 5000) -> dict[str, Any]:
    """Microseconds per payload, best and median of *rounds* paired rounds."""
    cases = {
        "json": lambda: dumps(PAYLOAD),
        "DjangoJSONEncoder": lambda: dumps(PAYLOAD, cls=DjangoJSONEncoder),
    }
    timings: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, call in cases.items():
            best = min(timeit.repeat(call, number=number, repeat=3))
            timings[name].append(best / number * 1e6)
    result = {
        name: {"best_us": round(min(t), 2), "median_us": round(statistics.median(t), 2)}
        for name, t in timings.items()
    }
    ratios = [d / j for j, d in zip(timings["json"], timings["DjangoJSONEncoder"], strict=True)]
    result["ratio_median"] = round(statistics.median(ratios), 3)
    return result


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 41
    print(measure(rounds))
