"""The documentation's code runs: the tutorial, followed as written, delivers its batch.

The pages show their code themselves (readable on GitHub as on the site): a block under a
``<!-- tested: FILE:SECTION -->`` marker is a copy of that section of a file in
``tests/docs_examples/`` or the example project, which these tests run against the test
database, and must stay identical to it (``python tests/docs/sync.py`` copies it afresh;
see that module). Every other ```python block of README.md and docs/ is checked here too:
it compiles; a settings block (only assignments to UPPERCASE names) passes the app's
system checks, or the check its setting has; the README's example and a block marked
``(lines)`` are made of lines of the tested files. A block none of this covers fails
``test_every_python_example_is_copied_or_checked``, named by page and line.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import io
import json
import logging
import re
import subprocess
import sys
import tokenize
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.urls import resolve
from django.utils.module_loading import import_string
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox import publish
from django_outbox.checks import check_settings
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, StagedJob
from django_outbox.streams.inline import run_inline
from django_outbox.transport import handoff
from tests.docs import sync
from tests.docs_examples import (
    alerts,
    idempotency,
    jobs,
    publishing,
    readme,
    staging,
    tutorial_outbox,
    tutorial_settings,
    tutorial_verify,
)
from tests.testapp.models import JobEffect

HANDLER = "tests.docs_examples.tutorial_outbox.sync_activities"


def tutorial_outbox_settings() -> dict:
    """The tutorial's DJANGO_OUTBOX, its handler path pointed at where the test keeps it."""
    stream = {**tutorial_settings.DJANGO_OUTBOX["STREAMS"]["marketing"], "HANDLER": HANDLER}
    return {**tutorial_settings.DJANGO_OUTBOX, "STREAMS": {"marketing": stream}}


def test_the_tutorial_settings_pass_the_system_checks():
    assert tutorial_settings.DATABASES["default"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    with override_settings(
        DJANGO_OUTBOX=tutorial_outbox_settings(), Q_CLUSTER=tutorial_settings.Q_CLUSTER
    ):
        assert check_settings() == []


@pytest.mark.django_db
def test_the_tutorial_delivers_every_activity_with_the_inline_runner(
    django_capture_on_commit_callbacks, monkeypatch
):
    sent: list[dict] = []  # what the stand-in service received
    upsert = tutorial_outbox.bulk_upsert
    monkeypatch.setattr(
        tutorial_outbox, "bulk_upsert", lambda records: sent.extend(records) or upsert(records)
    )
    with override_settings(DJANGO_OUTBOX=tutorial_outbox_settings()):
        # Step 7: record 1,000 activities, one transaction each; each commit wakes the
        # stream, which queues a run job for a cluster that is not running.
        with django_capture_on_commit_callbacks(execute=True):
            tutorial_verify.record()
        queued = list(OrmQ.objects.all())
        assert queued, "the commits queued run jobs for a cluster"

        report = run_inline(["marketing"], until_empty=True, max_wait_seconds=30)

        assert report.stopped_because == "empty"
        assert tutorial_verify.check() == 1000
        assert sorted(record["ref"] for record in sent) == sorted(
            ArchivedEvent.objects.filter(stream="marketing").values_list("event_id", flat=True)
        )
        status = io.StringIO()
        call_command("outbox_status", "marketing", stdout=status)
        line = status.getvalue().splitlines()[1]
        assert line.split() == ["marketing", "active", "0", "-", "0", "0", "0", "1,000", "0"]

        # The jobs the commits queued for a cluster find their groups done: a cluster
        # started later does nothing more.
        for row in queued:
            task = SignedPackage.loads(row.payload)
            import_string(task["func"])(*task["args"], **task["kwargs"])
        assert ArchivedEvent.objects.filter(stream="marketing").count() == 1000
        assert not OutboxGroup.objects.exists()


# --8<-- [start:testing]
@pytest.mark.django_db
def test_an_activity_of_a_lead_without_email_becomes_a_dead_letter():
    from marketing.models import Lead
    from marketing.services import record_activity

    stream = {
        "HANDLER": "tests.docs_examples.tutorial_outbox.sync_activities",
        "MODEL": "marketing.ContactActivityEvent",
        "MAX_ATTEMPTS": 1,  # no retries in the test
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"marketing": stream}}):
        record_activity(Lead.objects.create(name="Bo", email="bo@example.com"), "call")
        record_activity(Lead.objects.create(name="No Email", email=""), "call")

        run_inline(["marketing"], until_empty=True)  # the pipeline, in this process

    archived = ArchivedEvent.objects.filter(stream="marketing")
    assert sorted(archived.values_list("outcome", flat=True)) == ["done", "failed"]
    assert archived.get(outcome="failed").error == "no email address"


# --8<-- [end:testing]


def run_queued_django_q_tasks() -> None:
    """Run what django-q2's ORM queue holds, as a cluster's worker would, and empty it."""
    for row in OrmQ.objects.all():
        task = SignedPackage.loads(row.payload)
        import_string(task["func"])(*task["args"], **task["kwargs"])
        row.delete()


@pytest.mark.django_db
@override_settings(DJANGO_OUTBOX={"STAGING": {"ALLOWED_MODULES": ["tests.docs_examples.jobs"]}})
def test_the_staged_jobs_guide_stages_on_commit_only(django_capture_on_commit_callbacks):
    jobs.DONE.clear()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        staging.sign_up("Gone", "gone@example.com")
        raise Rollback
    assert not OrmQ.objects.exists() and not StagedJob.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        lead = staging.sign_up("Ada", "ada@example.com")
    run_queued_django_q_tasks()

    assert sorted(jobs.DONE) == [("charge", lead.pk), ("welcome", lead.pk)]
    delayed = StagedJob.objects.get()  # the feedback request waits three days
    assert delayed.func.endswith("ask_for_feedback")


def test_the_project_settings_pass_the_app_checks():
    # --8<-- [start:checks]
    from django.core.checks import run_checks

    assert [m for m in run_checks() if m.id.startswith("django_outbox.")] == []
    # --8<-- [end:checks]


@pytest.mark.django_db
def test_the_idempotency_guide_sends_the_welcome_email_once():
    idempotency.SENT.clear()
    user = User.objects.create(username="ada")

    idempotency.welcome(user)
    idempotency.welcome(user)  # a second delivery of the same job

    assert idempotency.SENT == [user.pk]


@pytest.mark.django_db
def test_the_metrics_guide_pages_when_a_group_is_dead_lettered(
    handler_mode, django_capture_on_commit_callbacks
):
    handler_mode("raise")
    alerts.alerts.pages.clear()
    audit = {**settings.DJANGO_OUTBOX["STREAMS"]["audit"], "MAX_ATTEMPTS": 1}
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": audit}}):
        # Receivers run after the change commits: the test's transaction never does.
        with django_capture_on_commit_callbacks(execute=True):
            publish("audit", {"n": 1})
            publish("audit", {"n": 2})
            run_inline(["audit"], until_empty=True)

    [page] = alerts.alerts.pages  # the error ends with the handler's traceback
    assert page.startswith("2 rows of stream audit dead-lettered: ")
    assert page.endswith("RuntimeError: handler exploded")


@pytest.mark.django_db
def test_the_publish_guide_writes_one_audit_row_per_payload():
    user = User.objects.create(username="ada")

    publishing.audit_login_and_export(user, [7, 8])

    payloads = list(OutboxEvent.objects.filter(stream="audit").values_list("payload", flat=True))
    assert sorted(payloads, key=str) == sorted(
        [
            {"user": user.pk, "action": "login"},
            {"user": 7, "action": "export"},
            {"user": 8, "action": "export"},
        ],
        key=str,
    )


def fail() -> None:
    raise RuntimeError("the request failed after publishing")


@pytest.mark.django_db
def test_the_readme_example_delivers_what_commits_and_retries_what_is_rejected(
    django_capture_on_commit_callbacks, monkeypatch
):
    stream = {**readme.DJANGO_OUTBOX["STREAMS"]["contacts"]}
    stream["HANDLER"] = "tests.docs_examples.readme.sync_contacts"  # myapp is the reader's
    monkeypatch.setattr(readme, "RECEIVED", [])
    contacts = [
        types.SimpleNamespace(pk=n, email=email, save=lambda: None)
        for n, email in ((1, "ada@example.com"), (2, ""))
    ]
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"contacts": stream}}):
        with django_capture_on_commit_callbacks(execute=True):
            for contact in contacts:
                readme.save_contact(contact)
            with pytest.raises(RuntimeError), transaction.atomic():
                readme.save_contact(types.SimpleNamespace(pk=3, email="x@example.com", save=fail))
        run_inline(["contacts"], until_empty=False)

    [records] = readme.RECEIVED  # one call for the group: the rolled-back contact is absent
    assert [(r["id"], r["email"]) for r in records] == [(1, "ada@example.com"), (2, "")]
    done = ArchivedEvent.objects.filter(stream="contacts", outcome="done")
    assert [row.data["payload"]["id"] for row in done] == [1]
    assert list(
        OutboxEvent.objects.filter(stream="contacts").values_list("payload", flat=True)
    ) == [{"id": 2, "email": ""}]  # rejected: kept for its retry


def test_the_metrics_guide_urlconf_serves_the_metrics():
    match = resolve("/outbox/metrics", urlconf="tests.docs_examples.urls")
    assert match.func.__module__.startswith("django_outbox.")


@pytest.mark.django_db(transaction=True)
def test_the_tasks_guide_keys_one_receipt_and_one_charge_per_order():
    if django.VERSION < (6, 0):
        pytest.skip("django.tasks exists from Django 6.0 on (tox -e py312-dj61-*)")
    from tests.docs_examples import order_tasks

    order = User.objects.create(username="order")  # anything with a pk
    with handoff.capture() as queue:
        with transaction.atomic():  # pending until the commit: the receipt is still unique
            first_receipt, first_payment = order_tasks.place(order)
            receipt, payment = order_tasks.place(order)  # the order placed twice
        assert receipt.id == first_receipt.id  # one pending receipt per order
        assert payment.id != first_payment.id  # two charge tasks, one guarded effect
        while queue:
            queue.popleft().run()

    effects = sorted(JobEffect.objects.values_list("label", flat=True))
    assert effects == ["charge", "receipt"]


# -- Every ```python block of README.md and docs/ is included from a tested file or checked


ROOT = sync.ROOT
PAGES = sync.PAGES
FENCE = sync.FENCE
PYTHON = {"python", "py", "python3"}
# Where the suite's code lives: a page copies Python only from there.
TESTED_DIRS = ("tests/", "example_project/")


@dataclass(frozen=True)
class Block:
    """One ```python block of a page: where it starts, its lines (fence indent removed)
    and the ``tested:`` marker above it, if any."""

    page: Path
    line: int  # the opening fence's, from 1
    lines: tuple[str, ...]
    marker: re.Match[str] | None = None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def refs(self) -> list[tuple[str, str | None]]:
        """The tested files (and sections) the marker names."""
        return sync.refs_of(self.marker["refs"]) if self.marker else []

    @property
    def is_copy(self) -> bool:
        """A copy of its sections, kept identical (a marker without ``(lines)``)."""
        return self.marker is not None and not self.marker["lines"]

    @property
    def source(self) -> str:
        return "\n".join(self.lines) + "\n"


def python_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if m is None:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(m["fence"]):
                j += 1
            if m["lang"].lower() in PYTHON:
                indent = len(m["indent"])
                body = tuple(
                    line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : j]
                )
                marker = sync.TESTED.match(lines[i - 1]) if i else None
                blocks.append(Block(page, i + 1, body, marker))
            i = j + 1
    return blocks


def assigned_names(source: str) -> list[str] | None:
    """The UPPERCASE settings a block assigns, or None if it does anything else."""
    names = []
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        elif isinstance(statement, ast.AugAssign):
            target = statement.target
        else:
            return None
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        if not (isinstance(target, ast.Name) and target.id.isupper()):
            return None
        names.append(target.id)
    return names


def code_lines(source: str) -> list[str | None]:
    """Each line's code without its comment, spaces collapsed (None for a line with none)."""
    comments = {
        token.start[0]: token.start[1]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    result: list[str | None] = []
    for row, line in enumerate(source.splitlines(), start=1):
        code = " ".join(line[: comments.get(row, len(line))].split())
        result.append(code or None)
    return result


def how_checked(block: Block) -> str | None:
    if block.is_copy:
        return "copy"
    if assigned_names(block.source) is not None:
        return "settings"
    if block.marker is not None:
        return "lines"
    return None


BLOCKS = python_blocks()


def blocks_checked_by(kind: str) -> list[pytest.param]:
    return [pytest.param(b, id=str(b)) for b in BLOCKS if how_checked(b) == kind]


def test_every_python_example_is_copied_or_checked():
    assert any(b.page.name == "README.md" for b in BLOCKS), "the README's example was not found"
    assert len([b for b in BLOCKS if how_checked(b) == "copy"]) > 10
    untested = [
        f"{b}: {path}" for b in BLOCKS for path, _ in b.refs if not path.startswith(TESTED_DIRS)
    ]
    assert untested == [], f"copied from outside {TESTED_DIRS}: {untested}"
    unchecked = [str(b) for b in BLOCKS if how_checked(b) is None]
    assert unchecked == [], (
        "These ```python blocks are neither copies of a tested file (a `<!-- tested: "
        "FILE:SECTION -->` line above them) nor a settings block (assignments to "
        "UPPERCASE names): move the code into tests/docs_examples/ (with a test) and copy "
        f"it, or fence what is not Python otherwise: {', '.join(unchecked)}"
    )


def test_no_page_includes_its_code_from_elsewhere():
    """A page shows its code itself: no ``--8<--`` include a reader on GitHub would see
    instead of the code (the changelog page, which includes CHANGELOG.md whole, aside)."""
    includes = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES
        if page.name != "changelog.md"
        for n, line in enumerate(page.read_text().splitlines(), start=1)
        if line.strip().startswith("--8<--")
    ]
    assert includes == []


@pytest.mark.parametrize("block", blocks_checked_by("copy"))
def test_python_example_is_a_copy_of_its_tested_file(block):
    expected = sync.copied_text(block.refs)
    assert list(block.lines) == expected, (
        f"{block} differs from {block.marker['refs']}: run python tests/docs/sync.py"
    )


@pytest.mark.parametrize("block", [pytest.param(b, id=str(b)) for b in BLOCKS])
def test_python_example_compiles(block):
    compile(block.source, str(block), "exec")


@pytest.mark.parametrize("block", blocks_checked_by("lines"))
def test_python_example_lines_come_from_tested_files(block):
    """A block that writes around tested lines (its marker ends in ``(lines)``) is made of
    lines of the files it names."""
    sources = list(dict.fromkeys(p for p, _ in block.refs))
    tested = {code for path in sources for code in code_lines((ROOT / path).read_text()) if code}
    written = [
        (n, code) for n, code in enumerate(code_lines(block.source), start=block.line + 1) if code
    ]
    assert written
    page = block.page.relative_to(ROOT)
    missing = [f"{page}:{n}: {code}" for n, code in written if code not in tested]
    assert missing == [], f"lines of {block} found in none of {sources}:\n" + "\n".join(missing)


def logger_exists(name: str) -> bool:
    """``django_outbox`` or one of its modules' ``getLogger(__name__)`` loggers."""
    if name == "django_outbox":
        return True
    try:
        module = importlib.import_module(name)
    except ImportError:
        return False
    logger = getattr(module, "logger", None)
    return isinstance(logger, logging.Logger) and logger.name == name


@pytest.mark.django_db  # a DATABASES block connects with its options
@pytest.mark.parametrize("block", blocks_checked_by("settings"))
def test_settings_example_is_valid(block):
    """A settings block, evaluated, passes the check its settings have."""
    namespace: dict[str, Any] = {"DATABASES": copy.deepcopy(settings.DATABASES)}
    exec(compile(block.source, str(block), "exec"), namespace)
    values = {name: namespace[name] for name in assigned_names(block.source) or []}
    known = {"DJANGO_OUTBOX", "Q_CLUSTER", "INSTALLED_APPS", "LOGGING", "DATABASES", "TASKS"}
    assert set(values) <= known, f"{block}: no check for {sorted(set(values) - known)}: add one"

    for app in values.get("INSTALLED_APPS", []):
        assert app is Ellipsis or importlib.util.find_spec(app), f"{block}: no app {app!r}"

    if "LOGGING" in values:
        config = values["LOGGING"]
        script = (
            "import json, logging.config, sys; logging.config.dictConfig(json.loads(sys.argv[1]))"
        )
        subprocess.run([sys.executable, "-c", script, json.dumps(config)], check=True)
        for name in config.get("loggers", {}):
            if name.startswith("django_outbox"):
                assert logger_exists(name), f"{block}: no logger named {name!r}"

    outbox = {k: v for k, v in values.items() if k in ("DJANGO_OUTBOX", "Q_CLUSTER")}
    if outbox:
        with override_settings(**outbox):
            messages = [m for m in run_checks() if m.id.startswith("django_outbox.")]
        assert messages == [], f"{block}: {messages}"

    if "DATABASES" in values:
        # Only options of the project's database engine can be tried on it.
        if connection.vendor != "postgresql":
            pytest.skip("PostgreSQL options: checked by the PostgreSQL tier (pytest --postgres)")
        options = values["DATABASES"]["default"]["OPTIONS"]
        default = connections["default"]
        wrapper = type(default)({**default.settings_dict, "OPTIONS": options}, alias="default")
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT 1")
                assert cursor.fetchone() == (1,)
        finally:
            wrapper.close()

    if "TASKS" in values:
        if django.VERSION < (6, 0):
            pytest.skip("django.tasks exists from Django 6.0 on (tox -e py312-dj61-*)")
        from django.tasks import task_backends

        with override_settings(TASKS=values["TASKS"]):
            for alias in values["TASKS"]:
                assert list(task_backends[alias].check()) == [], f"{block}: TASKS[{alias!r}]"
