"""The release as a user meets it: build, check, install the wheel, run the tutorial's project.

``python tests/package_check.py`` (CI runs it after the test suite, with the ``.venv``
of ``dev.py``):

1. builds the sdist and the wheel (``python -m build``) and checks their metadata
   (``twine check --strict``);
2. installs the wheel into a fresh virtualenv outside the source tree (its
   dependencies from the package index) and checks that the installed package carries
   its migrations and admin templates;
3. follows docs/tutorial.md literally in a new folder: every command of its ``bash``
   blocks in order (``pip install`` installs the wheel, ``qcluster`` starts in the
   background as in "another terminal"), every ``python`` block whose first line names
   a file (``# marketing/models.py``: the file's content; ``# append to
   mysite/settings.py``: added at its end) and every ``# python manage.py shell`` block,
   typed into ``manage.py shell``; then runs the page's last shell block (the count of
   delivered activities) until it prints 1,000 (bounded), and reports the time from
   the new virtualenv to the first delivered activity and the commands and edits it
   took.

Exits 0 when all of it held, else prints what failed and exits 1. Only the standard
library here; ``build`` and ``twine`` come from the ``dev`` dependency group.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
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


@dataclass
class Step:
    """One thing the tutorial asks for: a command, a file written or appended to, or
    code typed into ``manage.py shell``."""

    kind: str  # "command", "write", "append" or "shell"
    text: str
    path: str = ""


FENCE = re.compile(r"^[ \t]*(`{3,})[ \t]*(\w*)")


def tutorial_steps(page: Path = TUTORIAL) -> list[Step]:
    """The commands and code of *page*'s ``bash`` and ``python`` blocks, in order."""
    lines = page.read_text().splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence[1])
        body = textwrap.dedent("\n".join(lines[i + 1 : end])).splitlines()
        if fence[2] == "bash":
            for line in body:
                command = line.split("  #")[0].strip()
                if command and not command.startswith("#"):
                    steps.append(Step("command", command))
        elif fence[2] == "python" and body and body[0].startswith("# "):
            head, code = body[0][2:].strip(), "\n".join(body[1:]) + "\n"
            if head == "python manage.py shell":
                steps.append(Step("shell", code))
            elif head.startswith("append to "):
                steps.append(Step("append", code, head.removeprefix("append to ")))
            elif re.fullmatch(r"[\w/]+\.py", head):
                steps.append(Step("write", code, head))
        i = end + 1
    return steps


@dataclass
class Tutorial:
    """The tutorial followed in *folder*, with the package from *wheel*."""

    folder: Path
    wheel: Path
    started: float = field(default_factory=time.monotonic)
    commands: int = 0
    edits: int = 0
    cluster: subprocess.Popen[bytes] | None = None

    @property
    def python(self) -> Path:
        return self.folder / ".venv" / "bin" / "python"

    def do(self, step: Step) -> None:
        if step.kind == "command":
            self.commands += 1
            self.command(shlex.split(step.text))
        elif step.kind == "shell":
            self.commands += 1
            self.shell(step.text)
        else:
            self.edits += 1
            target = self.folder / step.path
            before = target.read_text() if step.kind == "append" and target.exists() else ""
            target.write_text(before + ("\n" if before else "") + step.text)

    def command(self, argv: list[str]) -> None:
        if argv[:3] == ["python3", "-m", "venv"]:
            venv.EnvBuilder(with_pip=True).create(self.folder / argv[3])
        elif argv[:1] == ["."]:  # activating the virtualenv: its bin/ comes first below
            pass
        elif argv[:2] == ["pip", "install"]:  # the wheel stands for the checkout
            quiet = ["--quiet", "--disable-pip-version-check"]
            run([self.python, "-m", "pip", "install", *quiet, self.wheel], self.folder)
        elif argv == ["python", "manage.py", "qcluster"]:
            log = (self.folder / "qcluster.log").open("w")
            self.cluster = subprocess.Popen(  # "in another terminal"
                [self.python, "manage.py", "qcluster"],
                cwd=self.folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        elif argv[:1] == ["python"]:
            run([self.python, *argv[1:]], self.folder)
        else:
            run([self.python.parent / argv[0], *argv[1:]], self.folder)

    def shell(self, code: str) -> str:
        return run([self.python, "manage.py", "shell", "-c", code], self.folder)

    def stop(self) -> None:
        if self.cluster is not None and self.cluster.poll() is None:
            os.killpg(self.cluster.pid, signal.SIGTERM)
            try:
                self.cluster.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.cluster.pid, signal.SIGKILL)
                self.cluster.wait()


def delivered(output: str) -> int:
    """The count the tutorial's last shell block prints ("1000 activities delivered")."""
    match = re.search(r"(\d+) activities delivered", output)
    if match is None:
        raise CheckFailed(f"the tutorial's count printed no count: {output!r}")
    return int(match.group(1))


def follow(wheel: Path, folder: Path) -> tuple[int, float, Tutorial]:
    """Follow the tutorial in *folder*; return the activities delivered, the seconds from
    the new virtualenv to the first one, and the run (its counts)."""
    steps = tutorial_steps()
    shells = [step for step in steps if step.kind == "shell"]
    if not shells or not any(step.kind == "command" for step in steps):
        raise CheckFailed(f"{TUTORIAL} has no commands or no shell step: {steps}")
    count = shells[-1]  # the verify step's count, run until every activity is in
    steps = steps[: steps.index(count)]  # what follows it is an alternative (no cluster)
    folder.mkdir()
    tutorial = Tutorial(folder, wheel)
    first = None
    try:
        for step in steps:
            tutorial.do(step)
        if tutorial.cluster is None:
            raise CheckFailed("the tutorial starts no qcluster")
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        while True:
            done = delivered(tutorial.shell(count.text))
            if done and first is None:
                first = time.monotonic() - tutorial.started
            if done >= 1000 or time.monotonic() > deadline or tutorial.cluster.poll() is not None:
                tutorial.commands += 1
                return done, first or float("nan"), tutorial
            time.sleep(1)  # the poll of a separate process: one `shell` a second
    finally:
        tutorial.stop()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="outbox-package-") as tmp:
        where = Path(tmp)
        try:
            sdist, wheel = build(where / "dist")
            print(f"package_check: built and checked {sdist.name}, {wheel.name}", flush=True)
            install(wheel, where / "venv")
            print("package_check: the wheel installs with its migrations and templates")
            done, first, tutorial = follow(wheel, where / "tutorial")
            if done != 1000:
                log = (where / "tutorial" / "qcluster.log").read_text()[-4000:]
                raise CheckFailed(f"{done} of 1,000 activities delivered; qcluster:\n{log}")
        except CheckFailed as exc:
            print(f"package_check: FAILED: {exc}", file=sys.stderr)
            return 1
    print(
        "package_check: docs/tutorial.md followed as written delivered 1,000 activities "
        f"from the wheel: {tutorial.commands} commands and {tutorial.edits} file edits, "
        f"{first:.1f} s from the new virtualenv to the first delivered activity"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
