"""The release as a user meets it: build, check, install the wheel, run the tutorial's project.

``python tests/package_check.py`` (CI runs it after the test suite, with the ``.venv``
of ``dev.py``):

1. builds the sdist and the wheel (``python -m build``) and checks their metadata
   (``twine check --strict``);
2. installs the wheel into a fresh virtualenv outside the source tree (its
   dependencies from the package index) and checks that the installed package carries
   its migrations and admin templates;
3. creates the tutorial's project there (``django-admin startproject``, ``startapp
   marketing``, the tutorial's models, service, handler and settings, read from the
   files the tutorial's pages include), runs ``makemigrations``, ``migrate`` and
   ``check``, starts a real ``qcluster``, records the tutorial's 1,000 activities and
   waits (bounded) until every one is archived as delivered.

Exits 0 when all of it held, else prints what failed and exits 1. Only the standard
library here; ``build`` and ``twine`` come from the ``dev`` dependency group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: How long the cluster may take to deliver the tutorial's 1,000 activities.
DELIVERY_TIMEOUT = 180.0


class CheckFailed(Exception):
    """One step of the check failed; the message says which and why."""


def run(cmd: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run *cmd*; return its output, or raise :class:`CheckFailed` with it."""
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CheckFailed(
            f"{' '.join(map(str, cmd))} exited with {done.returncode}:\n"
            f"{done.stdout[-4000:]}{done.stderr[-4000:]}"
        )
    return done.stdout


def snippet(path: str, section: str) -> str:
    """The lines between ``--8<-- [start:section]`` and ``[end:section]`` of *path*: what
    the tutorial's pages include."""
    text = (ROOT / path).read_text()
    match = re.search(
        rf"^[^\n]*--8<-- \[start:{section}\]\n(.*?)^[^\n]*--8<-- \[end:{section}\]",
        text,
        re.DOTALL | re.MULTILINE,
    )
    if match is None:
        raise CheckFailed(f"{path} has no section {section!r}")
    return textwrap.dedent(match.group(1))


def build(out: Path) -> tuple[Path, Path]:
    """Build the sdist and the wheel into *out*, check their metadata; return both."""
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=ROOT)
    sdist, wheel = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    if len(sdist) != 1 or len(wheel) != 1:
        raise CheckFailed(f"expected one sdist and one wheel in {out}: {list(out.iterdir())}")
    run([sys.executable, "-m", "twine", "check", "--strict", sdist[0], wheel[0]], cwd=out)
    return sdist[0], wheel[0]


def install(wheel: Path, where: Path) -> Path:
    """A fresh virtualenv in *where* with the wheel installed; return its python."""
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel], where)
    package = Path(
        run([python, "-c", "import django_outbox; print(django_outbox.__file__)"], where).strip()
    ).parent
    if ROOT in package.parents:
        raise CheckFailed(f"django_outbox was imported from the source tree: {package}")
    carried = {
        "migrations": sorted(p.name for p in (package / "migrations").glob("0*.py")),
        "templates": sorted(p.name for p in (package / "templates").rglob("*.html")),
        "py.typed": [p.name for p in package.glob("py.typed")],
    }
    if not all(carried.values()):
        raise CheckFailed(f"the installed package lacks some of its files: {carried}")
    return python


def tutorial_project(python: Path, project: Path) -> None:
    """Create the tutorial's project in *project* with the installed package."""
    project.mkdir()
    run([python.parent / "django-admin", "startproject", "mysite", "."], cwd=project)
    run([python, "manage.py", "startapp", "marketing"], cwd=project)
    app = project / "marketing"
    (app / "models.py").write_text(snippet("example_project/marketing/models.py", "models"))
    (app / "services.py").write_text(
        "from django.db import transaction\n\n"
        "from marketing.models import ContactActivity, ContactActivityEvent, Lead\n\n\n"
        + snippet("example_project/marketing/services.py", "record_activity")
    )
    (app / "outbox.py").write_text(snippet("tests/docs_examples/tutorial_outbox.py", "handler"))
    settings = project / "mysite" / "settings.py"
    apps = snippet("tests/docs_examples/tutorial_settings.py", "apps")
    added = "\n".join(
        (
            f"INSTALLED_APPS += [\n{apps}]\n",
            snippet("tests/docs_examples/tutorial_settings.py", "database"),
            snippet("tests/docs_examples/tutorial_settings.py", "cluster"),
            snippet("tests/docs_examples/tutorial_settings.py", "outbox"),
        )
    )
    settings.write_text(settings.read_text() + "\n" + added)


def deliver(python: Path, project: Path) -> int:
    """Migrate, check, start a qcluster, record the tutorial's activities; return how many
    were archived as delivered within :data:`DELIVERY_TIMEOUT`."""
    manage = [python, "manage.py"]
    run([*manage, "makemigrations", "marketing"], cwd=project)
    run([*manage, "migrate"], cwd=project)
    run([*manage, "check", "--fail-level", "WARNING"], cwd=project)
    run([*manage, "outbox_schedules"], cwd=project)
    log = (project / "qcluster.log").open("w")
    cluster = subprocess.Popen(
        [*map(str, manage), "qcluster"],
        cwd=project,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        record = snippet("tests/docs_examples/tutorial_verify.py", "record")
        run([*manage, "shell", "-c", record], cwd=project)
        count = (
            "from django_outbox.models import ArchivedEvent; "
            "print(ArchivedEvent.objects.filter(stream='marketing', outcome='done').count())"
        )
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while True:
            done = int(run([*manage, "shell", "-c", count], cwd=project).split()[-1])
            if done >= 1000 or time.monotonic() > deadline or cluster.poll() is not None:
                return done
            time.sleep(1)  # the poll of a separate process: one `shell` a second
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()
        log.close()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="outbox-package-") as tmp:
        where = Path(tmp)
        try:
            sdist, wheel = build(where / "dist")
            print(f"package_check: built and checked {sdist.name}, {wheel.name}", flush=True)
            python = install(wheel, where / "venv")
            print("package_check: the wheel installs with its migrations and templates")
            tutorial_project(python, where / "project")
            delivered = deliver(python, where / "project")
            if delivered != 1000:
                log = (where / "project" / "qcluster.log").read_text()[-4000:]
                raise CheckFailed(f"{delivered} of 1,000 activities delivered; qcluster:\n{log}")
        except CheckFailed as exc:
            print(f"package_check: FAILED: {exc}", file=sys.stderr)
            return 1
    print("package_check: the tutorial's project delivered 1,000 activities from the wheel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
