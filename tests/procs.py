"""Helpers of the process tier: run Django code in real subprocesses on the test database.

* :func:`child_env` builds the environment of a child that talks to *this* test run's
  database (the one pytest-django created), not the development database;
* :func:`running` / :func:`qcluster` start a child in its own session and always stop it:
  SIGTERM to the child itself, a bounded wait, then SIGKILL to its whole process group;
* :func:`wait_until` polls a condition against a deadline and fails with the last
  observed state, and fails at once if a watched child died;
* :func:`in_forked_child` runs a function in a child forked from the test process, and
  :func:`held` holds a lock from another thread meanwhile;
* :func:`claim_until_empty` is the body of a concurrent claimer process;
* :func:`kill_one_in_handler` SIGKILLs a worker caught in a crash handler.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent

#: How long a stopped child may take to exit after SIGTERM before its group is killed.
STOP_TIMEOUT = 30.0


def database_url() -> str:
    """The URL of the test database (PostgreSQL), from the live connection's settings."""
    from django.db import connection

    settings = connection.settings_dict
    user = quote(settings.get("USER") or "", safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings.get("HOST") or ""
    if host.startswith("/"):  # a Unix socket directory
        host = quote(host, safe="")
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgres://{credentials}{host}{port}/{quote(str(settings['NAME']), safe='')}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that uses this test run's databases."""
    from django.db import connection, connections

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project")]),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OUTBOX_REQUIRE_POSTGRES", None)
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = database_url()
        env.pop("OUTBOX_TEST_SQLITE", None)
    elif connection.vendor == "sqlite":
        # tests/settings.py names the file after the pid by default: pass ours explicitly.
        env["DATABASE_URL"] = ""
        env["OUTBOX_TEST_SQLITE"] = str(connection.settings_dict["NAME"])
    else:  # pragma: no cover - the suite runs on SQLite and PostgreSQL only
        raise RuntimeError(f"no child environment for {connection.vendor!r}")
    # The second database (tests/settings.py): the test copy, when this run made one.
    env["OUTBOX_TEST_OTHER_NAME"] = str(connections["other"].settings_dict["NAME"])
    env.update(extra)
    return env


def log_tail(process: subprocess.Popen, chars: int = 6000) -> str:
    path = getattr(process, "log_path", None)
    if path is None or not Path(path).exists():
        return ""
    return Path(path).read_text(errors="replace")[-chars:]


@contextlib.contextmanager
def running(
    args: list[str], name: str, log: Path | None = None, **env: str
) -> Iterator[subprocess.Popen]:
    """Run ``python *args`` (cwd: the project root) until the block ends, then stop it.

    The child starts a new session, so it and everything it forks (qcluster's sentinel,
    monitor and workers) form one process group that :func:`stop` can kill as a whole.
    Its output goes to *log* (a temporary file by default; ``process.log_path``), printed
    when the block raised or the child did not exit cleanly.
    """
    if log is None:
        fd, path = tempfile.mkstemp(prefix=f"outbox-test-{name}-", suffix=".log")
        os.close(fd)
        log = Path(path)
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    process.log_path = log  # type: ignore[attr-defined]
    failed = False
    try:
        yield process
    except BaseException:
        failed = True
        raise
    finally:
        stop(process)
        if failed or process.returncode not in (0, -signal.SIGTERM):
            print(
                f"\n--- {name} (pid {process.pid}, exit {process.returncode}) log {log} ---\n"
                f"{log_tail(process)}"
            )


def stop(process: subprocess.Popen, timeout: float | None = None) -> None:
    """SIGTERM the child itself, wait up to *timeout*, then SIGKILL its process group.

    Whatever the child left behind in its group (a worker that outlived its parent) is
    killed too, so no test leaves a process running.
    """
    timeout = STOP_TIMEOUT if timeout is None else timeout
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"\n{process.args} did not exit {timeout:.0f}s after SIGTERM: SIGKILL")
    _kill_group(process.pid)
    process.wait()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def qcluster(
    name: str = "qcluster", log: Path | None = None, log_level: str = "INFO", **env: str
) -> Iterator[subprocess.Popen]:
    """A real ``qcluster`` on the test database (tests/settings.py ``Q_CLUSTER``).

    The settings are those of tests/settings.py except that the cluster's log goes to the
    child's output (``process.log_path``); see :func:`log_problems`.
    """
    code = f"from tests.procs import run_qcluster; run_qcluster({log_level!r})"
    with running(["-c", code], name, log=log, **env) as process:
        yield process


#: Lines of a cluster log that mean something went wrong underneath the tasks.
PROBLEMS = ("Traceback", "ERROR", "CRITICAL", "database is locked", "deadlock")


def log_problems(process: subprocess.Popen) -> list[str]:
    """The lines of *process*'s log that report an error (empty when all went well)."""
    path = getattr(process, "log_path", None)
    if path is None or not Path(path).exists():
        return []
    lines = Path(path).read_text(errors="replace").splitlines()
    return [line for line in lines if any(word in line for word in PROBLEMS)]


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    interval: float = 0.05,
    *,
    describe: Callable[[], Any] | None = None,
    watch: Iterable[subprocess.Popen] = (),
    check: Callable[[], None] | None = None,
) -> float:
    """Poll *predicate* until it holds; return the seconds it took.

    Fails with the last observed state (``describe()``) when *timeout* passes, at once
    when a process in *watch* has exited (it was supposed to keep running), and at once
    when *check* raises (for example: a queue task failed, nothing will change anymore).
    """
    watch = list(watch)
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if predicate():
            return time.monotonic() - started
        if check is not None:
            check()
        for process in watch:
            if process.poll() is not None:
                raise AssertionError(
                    f"{process.args} exited with {process.returncode} while waiting; "
                    f"state: {describe() if describe else ''}\n{log_tail(process)}"
                )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"condition not met within {timeout:.0f}s; last state: "
                f"{describe() if describe else '(no description)'}"
            )
        time.sleep(interval)


def kill_one_in_handler(
    busy: Path, rng: Any, within: float = 0.0, interval: float = 0.01
) -> int | None:
    """SIGKILL one worker found in its handler, waiting up to *within* seconds for one.

    The crash handlers write a marker named after their worker's pid into *busy* while
    they run; the marker is removed here (a killed worker cannot remove its own). Returns
    the killed pid, or None when no worker was in its handler within the time (or the
    one chosen finished in between).
    """
    deadline = time.monotonic() + within
    while True:
        in_handler = sorted(busy.iterdir())
        if in_handler:
            marker = rng.choice(in_handler)
            marker.unlink(missing_ok=True)
            try:
                os.kill(int(marker.name), signal.SIGKILL)
            except ProcessLookupError:
                return None  # it finished (and was recycled) in between
            return int(marker.name)
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


@contextlib.contextmanager
def held(lock: threading.Lock, while_held: Callable[[], None] = lambda: None) -> Iterator[None]:
    """*lock* held by another thread (which runs *while_held* holding it) during the block."""
    taken, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            while_held()
            taken.set()
            done.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def in_forked_child(body: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Run *body* in a child forked from this process (``os.fork``); return its result.

    The child inherits this process as it is, locks held by other threads included. It
    never returns into the caller: it writes what *body* returned (JSON) or the error it
    raised to a pipe and leaves with ``os._exit``. A child that has not finished within
    *timeout* (stuck on a lock it inherited held) is killed and the call fails.
    """
    read, write = os.pipe()
    with warnings.catch_warnings():  # forking a process with threads is the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's side, measured in the child only
        try:
            os.close(read)
            try:
                message = {"result": body()}
            except BaseException:
                import traceback

                message = {"error": traceback.format_exc()[-4000:]}
            os.write(write, json.dumps(message).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        wait_until(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, timeout, interval=0.01)
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(
            f"the forked child did not finish within {timeout:.0f}s (stuck on a lock it "
            "inherited held?)"
        ) from None
    finally:
        with os.fdopen(read, "rb") as pipe:
            output = pipe.read()
    message = json.loads(output or b'{"error": "the child wrote nothing"}')
    if "error" in message:
        raise AssertionError(f"the forked child failed:\n{message['error']}")
    return message["result"]


def queue_failures() -> list[str]:
    """django-q2 tasks that raised in the cluster (saved as failures even with save=False).

    Our task functions always return normally after recording the outcome, so any
    entry here is a bug or an infrastructure error (e.g. ``database is locked``).
    """
    from django_q.models import Failure

    return [f"{task.func}{tuple(task.args or ())}: {task.result}" for task in Failure.objects.all()]


def fail_on_queue_failures() -> None:
    failures = queue_failures()
    if failures:
        raise AssertionError(
            f"{len(failures)} django-q2 task(s) failed in the cluster:\n"
            + "\n---\n".join(failures[:5])
        )


# -- child process bodies -------------------------------------------------------------


def claim_until_empty(stream: str, start_file: str, wait_seconds: float = 300) -> None:
    """Child process: wait for *start_file*, claim groups until a claim is empty, print them.

    The process job of each claim is captured in memory (``handoff.capture``), so only
    the claims themselves touch the database. The last line printed is a JSON list of
    ``[group_id, size]``. A worker whose start signal never comes exits with status 3.
    """
    import django

    django.setup()
    from django.db import connection

    from django_outbox.streams.run import claim_group
    from django_outbox.transport import handoff

    connection.ensure_connection()  # connect before the start, not during the race
    print("ready", flush=True)
    deadline = time.monotonic() + wait_seconds
    while not os.path.exists(start_file):
        if time.monotonic() > deadline:
            print("no start signal", flush=True)
            sys.exit(3)
        time.sleep(0.002)
    claimed: list[list[Any]] = []
    with handoff.capture():
        while True:
            result = claim_group(stream)
            if result.size == 0:
                break
            claimed.append([str(result.group_id), result.size])
    print(json.dumps(claimed), flush=True)


def run_stream_until_empty(stream: str, start_file: str, wait_seconds: float = 120) -> None:
    """Child process: wait for *start_file*, then run *stream* here until its buffer and
    groups are empty (the jobs its runs enqueue run here too, and due groups are handed
    over again as distribute would). Prints "ready", then "done"."""
    import django

    django.setup()
    from django.db import connection

    from django_outbox.conf import get_stream
    from django_outbox.models import OutboxEvent, OutboxGroup
    from django_outbox.streams.rescue import requeue_due_groups
    from django_outbox.streams.run import run_stream
    from django_outbox.transport import handoff

    connection.ensure_connection()
    print("ready", flush=True)
    deadline = time.monotonic() + wait_seconds
    while not os.path.exists(start_file):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.002)
    config = get_stream(stream)
    while OutboxEvent.objects.filter(stream=stream).exists() or OutboxGroup.objects.exists():
        if time.monotonic() > deadline:
            print("not drained", flush=True)
            sys.exit(4)
        with handoff.capture() as queue:
            did = run_stream(stream)
            requeue_due_groups(config)
            while queue:
                did += queue.popleft().run() or []
        if not did:
            time.sleep(0.01)  # the other process holds the rows left
    print("done", flush=True)


def run_qcluster(log_level: str) -> None:
    """Child process: ``manage.py qcluster`` with django-q2's log written to stdout.

    tests/settings.py silences the ``django-q`` logger; the cluster of a test logs to its
    output instead, so a failing test shows what the cluster did and
    :func:`log_problems` can look for errors that never reach a task's result.
    """
    import tests.settings as test_settings  # before Django reads it

    test_settings.LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "line": {"format": "%(asctime)s %(processName)s %(levelname)s %(name)s %(message)s"}
        },
        "handlers": {
            "out": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "line",
            }
        },
        "loggers": {
            name: {"handlers": ["out"], "level": log_level, "propagate": False}
            for name in ("django-q", "django_outbox")
        },
    }
    import django

    django.setup()
    apply_kind_options()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["django", "qcluster"])


def apply_kind_options() -> None:
    """Child process: apply ``OUTBOX_TEST_KIND_OPTIONS`` (JSON: kind label -> options),
    as the ``kind_options`` fixture does in the test process."""
    import dataclasses
    import json

    from django_outbox.models.unique import get_kind

    for label, options in json.loads(os.environ.get("OUTBOX_TEST_KIND_OPTIONS", "{}")).items():
        model = get_kind(label)
        model._kind_options = dataclasses.replace(model.job_options(), **options)
