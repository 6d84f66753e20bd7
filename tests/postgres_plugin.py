"""pytest plugin: ``--postgres`` (or ``OUTBOX_DB=postgres``) runs the suite on PostgreSQL.

Loaded by ``-p tests.postgres_plugin`` (pyproject's ``addopts``), so that plain ``pytest``,
tox and an IDE's runner all get it. Before pytest-django loads ``tests.settings`` (which
reads ``DATABASE_URL``), it picks the server with :func:`tests.pg.postgres` and exports
it as ``DATABASE_URL``; a throwaway server is stopped when the run ends.

A run that asked for PostgreSQL (``--postgres``, ``OUTBOX_DB=postgres`` or
``OUTBOX_REQUIRE_POSTGRES=1``) fails at the start unless the test database is PostgreSQL:
the PostgreSQL tier never skips silently.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import pytest

from tests import pg

_SOURCE = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--postgres",
        action="store_true",
        help="run on PostgreSQL: DATABASE_URL, else 127.0.0.1:5432 (unless "
        "OUTBOX_NO_LOCAL_PG=1), else a throwaway pgserver (the same as OUTBOX_DB=postgres)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    options = parser.parse_known_args(args)
    if options.help or options.version:
        return
    if not (options.postgres or os.environ.get(pg.ASK) == "postgres"):
        return
    stack = contextlib.ExitStack()
    try:
        server = stack.enter_context(pg.postgres())
    except RuntimeError as exc:
        raise pytest.UsageError(str(exc)) from None
    early_config.add_cleanup(stack.close)
    os.environ["DATABASE_URL"] = server.url
    os.environ[pg.REQUIRE] = "1"
    early_config.stash[_SOURCE] = server.describe()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if _SOURCE in config.stash:
        return [f"postgresql: {config.stash[_SOURCE]}"]
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get(pg.REQUIRE) == "1":
        from django.db import connection

        if connection.vendor != "postgresql":
            raise pytest.UsageError(
                f"PostgreSQL was required ({pg.REQUIRE}=1) but the test database is "
                f"{connection.vendor!r}: set DATABASE_URL to a PostgreSQL server, or run "
                "pytest --postgres."
            )


@pytest.fixture(scope="session", autouse=True)
def _record_database(
    pytestconfig: pytest.Config, record_testsuite_property: Callable[[str, object], None]
) -> None:
    """Name the database in the junit report (``dev.py test`` prints it in its summary)."""
    from django.db import connection

    where = connection.vendor
    if _SOURCE in pytestconfig.stash:
        where += f": {pytestconfig.stash[_SOURCE]}"
    record_testsuite_property("database", where)
