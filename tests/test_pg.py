"""Which PostgreSQL the PostgreSQL tier, tox and the benchmark get (``tests/pg.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests import pg


class FakeServers:
    """Stands in for the probe and the throwaway server; records what was asked of them."""

    def __init__(self) -> None:
        self.local_answers = True
        self.asked: list[str] = []

    def answers(self, url: str) -> bool:
        self.asked.append(f"probe {url}")
        return self.local_answers

    @contextlib.contextmanager
    def throwaway(self, database: str) -> Iterator[str]:
        self.asked.append(f"throwaway {database}")
        yield f"postgresql://postgres@%2Ftmp%2Fx/{database}"


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> FakeServers:
    fake = FakeServers()
    monkeypatch.setattr(pg, "answers", fake.answers)
    monkeypatch.setattr(pg, "throwaway", fake.throwaway)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv(pg.NO_LOCAL, raising=False)
    return fake


def choose() -> pg.Postgres:
    with pg.postgres() as server:
        return server


def test_database_url_comes_first(servers: FakeServers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://me:secret@db.example:5433/mine")
    server = choose()
    assert server.url == "postgres://me:secret@db.example:5433/mine"
    assert server.describe() == (
        "DATABASE_URL from the environment: postgres://me:***@db.example:5433/mine"
    )
    assert servers.asked == []  # nothing probed, nothing started


def test_a_database_url_of_another_database_is_refused(
    servers: FakeServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:///tmp/x.sqlite3")
    with pytest.raises(RuntimeError, match="DATABASE_URL names another database"):
        choose()


def test_then_the_local_server(servers: FakeServers) -> None:
    server = choose()
    assert server.url == "postgres://postgres@127.0.0.1:5432/django_outbox"
    assert servers.asked == [f"probe {pg.LOCAL_URL}"]


def test_then_a_throwaway_server(servers: FakeServers) -> None:
    servers.local_answers = False
    server = choose()
    assert server.source == "throwaway pgserver (deleted afterwards)"
    assert servers.asked == [f"probe {pg.LOCAL_URL}", "throwaway django_outbox"]


def test_no_local_server_when_told_not_to(
    servers: FakeServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pg.NO_LOCAL, "1")
    choose()
    assert servers.asked == ["throwaway django_outbox"]


def test_pgserver_uri_becomes_a_django_url() -> None:
    uri = "postgresql://postgres:@/postgres?host=/tmp/outbox-pg-1/pgdata"
    assert pg.django_url(uri, "outbox_bench") == (
        "postgresql://postgres@%2Ftmp%2Foutbox-pg-1%2Fpgdata/outbox_bench"
    )


def test_the_plugin_chose_the_test_database(pytestconfig: pytest.Config) -> None:
    """Under ``pytest --postgres`` the settings saw the URL the plugin chose."""
    from django.db import connection

    from tests.postgres_plugin import _SOURCE

    if _SOURCE not in pytestconfig.stash:
        pytest.skip("this run did not ask for PostgreSQL (pytest --postgres)")
    assert connection.vendor == "postgresql"
