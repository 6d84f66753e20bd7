"""Record activities one transaction each, then sync them in bulk through a real qcluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import django
from blogs.models import Blog, Post, RebuildBlogFeed
from blogs.services import publish_and_notify, tasks_available
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django_q.models import OrmQ, Task
from django_q.tasks import async_task
from payments.models import Account, Transfer

from django_outbox.jobs.staging import stage_task
from django_outbox.models import (
    ArchivedEvent,
    IdempotencyKey,
    JobState,
    OutboxGroup,
    Outcome,
    StagedJob,
    StreamState,
)
from django_outbox.streams.status import stream_status
from django_outbox.transport.schedules import sync_schedules
from marketing.models import ApiRequest, ContactActivity, ContactActivityEvent, Lead, WelcomeEmail
from marketing.services import record_activity, sign_up_lead

STREAM = "marketing"
ROLLED_BACK_SIGN_UPS = 5
ACCOUNTS, OPENING_BALANCE, TRANSFERS = 10, 100_000, 200
BLOGS, POSTS = 5, 100
KINDS = [ContactActivity.Kind.CALL, ContactActivity.Kind.EMAIL, ContactActivity.Kind.MEETING]


class Command(BaseCommand):
    help = (
        "Run the marketing-sync demo: record activities one by one, then let a real "
        "django-q2 cluster sync them to the fake bulk API in groups."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--events", type=int, default=10_000)
        parser.add_argument("--leads", type=int, default=200)
        parser.add_argument(
            "--leads-without-email",
            type=int,
            default=2,
            help="Leads the API rejects: their activities end as dead letters.",
        )
        parser.add_argument("--timeout", type=float, default=300.0)

    def handle(self, *args: Any, **options: Any) -> None:
        out = self.stdout
        db = f"{connection.vendor} ({connection.settings_dict['NAME']})"
        out.write(f"django_outbox demo on {db}")
        call_command("migrate", verbosity=0)
        self._reset()

        leads = [
            sign_up_lead(
                f"Lead {i}",
                "" if i < options["leads_without_email"] else f"lead{i}@example.com",
            )
            for i in range(options["leads"])
        ]
        self.rolled_back = 0
        for i in range(ROLLED_BACK_SIGN_UPS):
            try:
                with transaction.atomic():
                    sign_up_lead(f"Abandoned {i}", f"abandoned{i}@example.com")
                    raise RuntimeError("the sign-up form failed after the lead was saved")
            except RuntimeError:
                self.rolled_back += 1
        out.write(
            f"Signed up {len(leads)} leads, each staging its welcome email in the same "
            f"transaction; {self.rolled_back} more sign-ups rolled back."
        )
        started = time.perf_counter()
        for i in range(options["events"]):
            record_activity(leads[i % len(leads)], KINDS[i % 3], comment=f"touch #{i}")
        recorded = time.perf_counter() - started
        out.write(
            f"Recorded {options['events']:,} activities, one transaction each, in "
            f"{recorded:.1f}s ({options['events'] / recorded:,.0f}/s)."
        )
        self._stage_transfers()
        self._publish_posts()
        sync_schedules()

        cluster = self._start_cluster()
        started = time.perf_counter()
        try:
            self._wait_until_drained(started, options["timeout"])
            elapsed = time.perf_counter() - started
        finally:
            self._stop_cluster(cluster)
        self._report(options["events"], elapsed)

    def _stage_transfers(self) -> None:
        """Transfer requests staged as jobs, each twice (a client that retried)."""
        accounts = Account.objects.bulk_create(
            Account(owner=f"Account {i}", balance=OPENING_BALANCE) for i in range(ACCOUNTS)
        )
        for n in range(TRANSFERS):
            source, target = accounts[n % ACCOUNTS], accounts[(n + 1 + n % 3) % ACCOUNTS]
            if n % 2:  # every other transfer goes the opposite way
                source, target = target, source
            for _delivery in range(2):
                with transaction.atomic():
                    stage_task("payments.tasks.transfer", f"req-{n}", source.pk, target.pk, 100 + n)
        self.stdout.write(
            f"Staged {2 * TRANSFERS} transfer jobs: {TRANSFERS} requests between {ACCOUNTS} "
            "accounts, each sent twice, half of them in opposite directions."
        )

    def _publish_posts(self) -> None:
        """Posts published in bursts; each asks for its blog's feed rebuild."""
        blogs = Blog.objects.bulk_create(Blog(name=f"Blog {i}") for i in range(BLOGS))
        for n in range(POSTS):
            publish_and_notify(blogs[n % BLOGS], f"Post {n}")
        tasks = (
            " and a notify_followers task (django.tasks, in the same transaction)"
            if tasks_available()
            else ""
        )
        self.stdout.write(
            f"Published {POSTS} posts on {BLOGS} blogs; each post enqueued its blog's feed "
            f"rebuild (a unique job){tasks}."
        )

    def _reset(self) -> None:
        """Start from empty tables so the figures describe this run only."""
        ContactActivityEvent.objects.all().delete()
        ContactActivity.objects.all().delete()
        WelcomeEmail.objects.all().delete()
        Lead.objects.all().delete()
        StagedJob.objects.all().delete()
        IdempotencyKey.objects.all().delete()  # else a second demo finds its transfers done
        Transfer.objects.all().delete()
        Account.objects.all().delete()
        RebuildBlogFeed.objects.all().delete()
        if tasks_available():
            task_records().objects.all().delete()
        Post.objects.all().delete()
        Blog.objects.all().delete()
        ApiRequest.objects.all().delete()
        ArchivedEvent.objects.filter(stream=STREAM).delete()
        OutboxGroup.objects.filter(stream=STREAM).delete()
        StreamState.objects.filter(stream=STREAM).delete()
        OrmQ.objects.all().delete()
        Task.objects.all().delete()

    def _start_cluster(self) -> subprocess.Popen:
        log = Path(settings.BASE_DIR) / "qcluster.log"
        self.stdout.write(f"Starting a django-q2 cluster (qcluster, ORM broker); log: {log}")
        return subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=Path(settings.BASE_DIR),
            env=os.environ.copy(),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _stop_cluster(self, cluster: subprocess.Popen) -> None:
        # Signal the cluster's main process only; it stops its workers in order.
        cluster.send_signal(signal.SIGTERM)
        try:
            cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()

    def _wait_until_drained(self, started: float, timeout: float) -> None:
        """Enqueue a distribute job each second, as a fast schedule would, until empty.

        Claim chains drain the backlog by themselves; the repeated distribute only picks
        up groups whose retry backoff has passed.
        """
        tty = self.stdout.isatty()
        while True:
            status = stream_status(STREAM)
            in_flight = status.groups_claimed + status.groups_running + status.groups_retrying
            done = ArchivedEvent.objects.filter(stream=STREAM).count()
            if tty:
                self.stdout.write(
                    f"\r  {time.perf_counter() - started:5.1f}s  backlog {status.backlog:>6,}  "
                    f"groups in flight {in_flight:>3}  archived {done:>6,}",
                    ending="",
                )
                self.stdout.flush()
            jobs_pending = (
                WelcomeEmail.objects.count() < Lead.objects.count()
                or Transfer.objects.count() < TRANSFERS
                or StagedJob.objects.exists()
                or OrmQ.objects.exists()  # the last poke, duplicate deliveries
                or RebuildBlogFeed.objects.exclude(
                    state__in=[JobState.PROCESSED, JobState.FAILED]
                ).exists()
                or (
                    tasks_available()
                    and task_records()
                    .objects.exclude(state__in=[JobState.PROCESSED, JobState.FAILED])
                    .exists()
                )
            )
            if status.backlog == 0 and in_flight == 0 and not jobs_pending:
                break
            if time.perf_counter() - started > timeout:
                raise CommandError(f"The pipeline did not drain within {timeout:.0f}s.")
            async_task("django_outbox.tasks.distribute", STREAM, save=False)
            time.sleep(1.0)
        if tty:
            self.stdout.write("")

    def _report(self, events: int, elapsed: float) -> None:
        archived = ArchivedEvent.objects.filter(stream=STREAM)
        done = archived.filter(outcome=Outcome.DONE).count()
        failed = archived.filter(outcome=Outcome.FAILED).count()
        groups = archived.values("group_id").distinct().count()
        requests = ApiRequest.objects.count()
        failed_requests = ApiRequest.objects.filter(succeeded=False).count()
        retried_groups = archived.filter(attempts__gt=1).values("group_id").distinct().count()
        left = ContactActivityEvent.objects.count()
        leads = Lead.objects.count()
        emails = WelcomeEmail.objects.count()
        emailed_twice = leads - WelcomeEmail.objects.values("lead").distinct().count()
        transfers = Transfer.objects.count()
        total = sum(Account.objects.values_list("balance", flat=True))
        rebuilds = RebuildBlogFeed.objects.filter(state=JobState.PROCESSED).count()
        stale_feeds = sum(
            1
            for blog in Blog.objects.all()
            if not blog.feed or blog.feed[0]["id"] != blog.posts.order_by("-id")[0].pk
        )
        lines = [
            ("leads signed up", f"{leads:,} (+{self.rolled_back} rolled back)"),
            (
                "transfers applied",
                f"{transfers} of {2 * TRANSFERS} staged jobs (each request once); total "
                f"balance {total:,} (opening {ACCOUNTS * OPENING_BALANCE:,})",
            ),
            (
                "blog feed rebuilds",
                f"{rebuilds} for {POSTS} posts on {BLOGS} blogs; feeds up to date: "
                f"{BLOGS - stale_feeds} of {BLOGS}",
            ),
            ("django.tasks (notify_followers)", self._tasks_line()),
            ("welcome emails sent", f"{emails:,} (staged jobs; {emailed_twice} leads twice)"),
            ("events recorded", f"{events:,}"),
            ("archived done", f"{done:,}"),
            ("archived failed (dead letters)", f"{failed:,}"),
            ("groups", f"{groups:,}"),
            ("bulk API requests", f"{requests:,} (one per event would be {events:,})"),
            ("failed API requests (injected)", f"{failed_requests:,}"),
            ("groups that needed a retry", f"{retried_groups:,}"),
            ("left in the buffer", f"{left:,}"),
            ("pipeline time", f"{elapsed:.1f}s"),
            ("throughput", f"{events / elapsed:,.0f} events/s"),
        ]
        width = max(len(label) for label, _ in lines)
        for label, value in lines:
            self.stdout.write(f"  {label:<{width}}  {value}")
        if left or done + failed != events:
            raise CommandError("The buffer is not empty or the archive is incomplete.")
        if emails != leads or emailed_twice:
            raise CommandError("Welcome emails do not match the committed sign-ups one to one.")
        if transfers != TRANSFERS or total != ACCOUNTS * OPENING_BALANCE:
            raise CommandError("A transfer was applied twice or lost, or money appeared.")
        if stale_feeds:
            raise CommandError(f"{stale_feeds} blog feed(s) miss their latest post.")
        if tasks_available() and Post.objects.filter(followers_notified_at=None).exists():
            raise CommandError("A notify_followers task did not run.")
        self.stdout.write(self.style.SUCCESS("Buffer empty, archive complete."))

    def _tasks_line(self) -> str:
        if not tasks_available():
            return f"needs Django 6.0+ (this is {django.get_version()}); not shown"
        records = task_records().objects.all()
        done = records.filter(state=JobState.PROCESSED).count()
        notified = Post.objects.exclude(followers_notified_at=None).count()
        return (
            f"{done} of {records.count()} tasks successful; {notified} of {POSTS} posts "
            "notified (OutboxTaskBackend)"
        )


def task_records() -> Any:
    """The django.tasks backend's task model (Django 6.0+)."""
    from django_outbox.tasks_backend.models import TaskRecord

    return TaskRecord
