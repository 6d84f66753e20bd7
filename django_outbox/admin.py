"""The Django admin of django_outbox: see and steer streams, groups, archive and jobs.

Rows the pipeline writes are read-only here; what an operator may do is an admin
action, each backed by a custom permission (``allowed_permissions``), so a view-only
staff user can look but not act. Changelists of the large tables never run an exact
``COUNT(*)``: counts stop at :data:`COUNT_CAP`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar, cast

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_outbox.archive.replay import replay_failed
from django_outbox.base.dialect import database_now
from django_outbox.base.errors import last_line
from django_outbox.base.routing import connection_for, current_alias, on_database
from django_outbox.conf import get_stream, outbox_settings, stream_databases
from django_outbox.jobs.staging import requeue
from django_outbox.models import (
    ArchivedEvent,
    HeldKey,
    IdempotencyKey,
    OutboxEvent,
    OutboxGroup,
    Outcome,
    StagedJob,
    StreamState,
)
from django_outbox.models.buffer import buffer_models
from django_outbox.models.unique import STAGES, all_kinds, stage_of
from django_outbox.streams import steer
from django_outbox.streams.status import COUNT_CAP, all_statuses, staged_counts, unique_job_counts
from django_outbox.streams.steer import set_paused

#: How many rows a filter's choices are read from and a text search looks through
#: (the newest ones): a page of a table of millions costs what one of 10,000 does.
#: Counts (pages, the dashboard) stop at :data:`django_outbox.streams.status.COUNT_CAP`.
SCAN_CAP = 10_000


class CappedCountPaginator(Paginator):
    """A paginator whose count is bounded (the last pages of a huge table are not listed)."""

    @cached_property
    def count(self) -> int:
        queryset = cast(QuerySet, self.object_list)  # the admin pages querysets
        return queryset.values("pk")[:COUNT_CAP].count()


class StreamFilter(admin.SimpleListFilter):
    """Filter by stream; the choices are the configured streams, not a DISTINCT scan."""

    title = "stream"
    parameter_name = "stream"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in outbox_settings().streams]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(stream=self.value()) if self.value() else queryset


#: The changelist parameter that picks the database of the streams shown.
DATABASE_PARAM = "database"


class DatabaseFilter(admin.SimpleListFilter):
    """Pick the database whose stream rows are listed (where streams live on several).

    The page itself runs on the chosen database (:class:`StreamDatabaseAdmin`); without
    a choice the rows come from where the router sends the model.
    """

    title = "database"
    parameter_name = DATABASE_PARAM

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = list(stream_databases())
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def has_output(self) -> bool:
        return len(self.lookup_choices) > 1

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset  # the page runs on the chosen database already


def chosen_database(request: HttpRequest) -> str | None:
    """The stream database a page shows: its ``database`` parameter (kept across the
    changelist's links to a row), when it names a database that holds streams."""
    alias = request.GET.get(DATABASE_PARAM)
    if alias is None:
        alias = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_PARAM)
    return alias if alias in stream_databases() else None


class StreamDatabaseAdmin(admin.ModelAdmin):
    """An admin of rows that live on their stream's database: each page runs on the
    database the ``database`` filter chose (:mod:`django_outbox.base.routing`)."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        with on_database(chosen_database(request)):
            return super().changelist_view(request, extra_context)

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with on_database(chosen_database(request)):
            return super().changeform_view(request, *args, **kwargs)

    def history_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with on_database(chosen_database(request)):
            return super().history_view(request, *args, **kwargs)

    def get_list_filter(self, request: HttpRequest) -> Any:
        return (*super().get_list_filter(request), DatabaseFilter)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        alias = current_alias()  # the chosen database (buffer models follow the router)
        return queryset.using(alias) if alias is not None else queryset


def recent_values_filter(field: str, label: str) -> type[admin.SimpleListFilter]:
    """Filter by *field*; its choices come from the newest ``SCAN_CAP`` rows only."""

    class RecentValuesFilter(admin.SimpleListFilter):
        title = label
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            newest = model_admin.model._default_manager.order_by("-pk")
            values = set(newest.values_list(field, flat=True)[:SCAN_CAP])
            return [(value, value) for value in sorted(values)]

        def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
            return queryset.filter(**{field: self.value()}) if self.value() else queryset

    return RecentValuesFilter


class ReadOnlyAdmin(admin.ModelAdmin):
    """Machine-written rows: viewable, never added, edited or deleted by hand.

    ``search_fields`` are exact matches on indexed columns (ids); ``text_search_fields``
    are substring matches (``"=name"``: exact) on columns without an index, looked for
    in the newest ``SCAN_CAP`` rows only, so a search never scans a whole archive.
    """

    text_search_fields: tuple[str, ...] = ()

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        # Non-empty whenever either kind exists, so the admin shows its search box.
        return (*self.search_fields, *self.text_search_fields)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(pk__in=[])
        for name in self.search_fields:
            field = self.model._meta.get_field(name.lstrip("="))
            try:
                match |= Q(**{field.name: field.to_python(term)})
            except (ValidationError, ValueError, TypeError):
                continue
        if self.text_search_fields:
            newest = self.model._default_manager.order_by("-pk").values("pk")[:SCAN_CAP]
            text = Q()
            for name in self.text_search_fields:
                if name.startswith("="):  # an exact match on a column without an index
                    field = self.model._meta.get_field(name[1:])
                    try:
                        text |= Q(**{field.name: field.to_python(term)})
                    except (ValidationError, ValueError, TypeError):
                        continue
                else:
                    text |= Q(**{f"{name}__icontains": term})
            if text:
                match |= text & Q(pk__in=newest)
        return queryset.filter(match), False

    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _has(codename: str) -> Callable[[admin.ModelAdmin, HttpRequest], bool]:
    def check(self: admin.ModelAdmin, request: HttpRequest) -> bool:
        return request.user.has_perm(f"django_outbox.{codename}")

    return check


# -- buffers ---------------------------------------------------------------------------


class BufferEventAdmin(StreamDatabaseAdmin, ReadOnlyAdmin):
    """Any buffer model: its rows, unclaimed or in a group."""

    list_display: tuple[str, ...] = ("id", "created_at", "group_id")
    list_filter: ClassVar[tuple[Any, ...]] = (("group_id", admin.EmptyFieldListFilter),)
    search_fields = ("=id", "=group_id")
    ordering = ("-id",)


@admin.register(OutboxEvent)
class OutboxEventAdmin(BufferEventAdmin):
    list_display = ("id", "stream", "created_at", "group_id")
    list_filter = (StreamFilter, ("group_id", admin.EmptyFieldListFilter))


class StageFilter(admin.SimpleListFilter):
    """Jobs by stage: their state, with dispatched jobs (not started) apart from running."""

    title = "state"
    parameter_name = "stage"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(stage, stage) for stage in STAGES]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        stage = STAGES.get(self.value() or "")
        return queryset if stage is None else queryset.filter(stage)


class UniqueJobAdmin(ReadOnlyAdmin):
    """Any unique-job kind: its jobs by state, attempt, schedule and lease.

    A dispatched job that no worker started shows as *dispatched*: it still holds its
    unique key (an enqueue of the key returns it)."""

    list_display: tuple[str, ...] = (
        "id",
        "stage",
        "attempt",
        "process_after",
        "lease_expires_at",
        "finished_at",
        "short_error",
    )
    list_filter: ClassVar[tuple[Any, ...]] = (StageFilter,)
    search_fields = ("=id",)
    text_search_fields: tuple[str, ...] = ("last_error",)
    ordering = ("-id",)

    @admin.display(description="state", ordering="state")
    def stage(self, job: Any) -> str:
        return stage_of(job)

    @admin.display(description="last error")
    def short_error(self, job: Any) -> str:
        return last_line(job.last_error)[:120]


def register_stream_buffers(site: admin.AdminSite = admin.site) -> None:
    """Register every custom buffer model bound to a stream and every unique-job kind,
    unless the project registered them itself."""

    for model in buffer_models():
        if not site.is_registered(model):
            site.register(model, BufferEventAdmin)
    for kind in all_kinds():
        if not site.is_registered(kind):
            site.register(kind, UniqueJobAdmin)


# -- groups ----------------------------------------------------------------------------


class IsolatingFilter(admin.SimpleListFilter):
    """Groups split from a group that failed as a whole (failure isolation)."""

    title = "failure isolation"
    parameter_name = "isolating"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "split from a failed group"), ("no", "claimed as they are")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(split_depth__gt=0)
        if self.value() == "no":
            return queryset.filter(split_depth=0)
        return queryset


@admin.register(OutboxGroup)
class OutboxGroupAdmin(StreamDatabaseAdmin, ReadOnlyAdmin):
    list_display = (
        "id",
        "stream",
        "state",
        "attempt",
        "size",
        "split_depth",
        "lease_expires_at",
        "next_attempt_at",
        "short_error",
    )
    list_filter = (StreamFilter, "state", IsolatingFilter)
    search_fields = ("=id",)
    text_search_fields = ("last_error",)
    ordering = ("-created_at",)
    actions = ("retry_now", "release_lease", "dead_letter")

    has_operate_permission = _has("operate_outboxgroup")

    @admin.display(description="last error")
    def short_error(self, group: OutboxGroup) -> str:
        return last_line(group.last_error)[:120]

    @admin.action(
        description="Retry now (retrying groups; dead-lettering groups: dead-letter again)",
        permissions=["operate"],
    )
    def retry_now(self, request: HttpRequest, queryset: QuerySet[OutboxGroup]) -> None:
        done = steer.retry_now(queryset.values_list("id", flat=True))
        self.message_user(
            request,
            f"{done.requeued} group(s) re-enqueued for their next attempt, "
            f"{done.exhausted} dead-lettered.",
        )
        self._report_locked(request, done, "retried")

    @admin.action(description="Release lease (claimed or running groups)", permissions=["operate"])
    def release_lease(self, request: HttpRequest, queryset: QuerySet[OutboxGroup]) -> None:
        done = steer.release_leases(queryset.values_list("id", flat=True))
        self.message_user(
            request,
            f"{done.chosen} lease(s) released; {done.requeued} group(s) re-enqueued, "
            f"{done.exhausted} dead-lettered (their last attempt). A worker still running "
            "one of them can no longer finalize it.",
        )
        self._report_locked(request, done, "released")

    @admin.action(description="Dead-letter now", permissions=["operate"])
    def dead_letter(self, request: HttpRequest, queryset: QuerySet[OutboxGroup]) -> None:
        error = f"dead-lettered from the admin by {request.user.get_username()}"
        done = steer.dead_letter(queryset.values_list("id", flat=True), error)
        message = (
            f"{done.dead_lettered} group(s), {done.rows} row(s) dead-lettered (see the archive)."
        )
        if done.kept:
            message += (
                f" {done.kept} group(s) could not be dead-lettered and are kept with the error "
                "(state dead_lettering)."
            )
        self.message_user(request, message, messages.WARNING if done.kept else messages.INFO)
        if done.running:
            self.message_user(
                request,
                f"{done.running} of them were running: their worker may still deliver their "
                "rows (its handler runs on; only its finalize finds the group gone). Check "
                "what was delivered before you replay them.",
                messages.WARNING,
            )
        self._report_locked(request, done, "dead-lettered")

    def _report_locked(self, request: HttpRequest, done: steer.Steered, verb: str) -> None:
        if done.locked:
            self.message_user(
                request,
                f"{len(done.locked)} group(s) not {verb}: a running attempt holds their row "
                "lock (a TRANSACTIONAL handler, whose writes commit or roll back with the "
                "group, or a finalize). Nothing was changed for them; try again once the "
                f"attempt has ended: {', '.join(str(pk) for pk in done.locked[:10])}.",
                messages.WARNING,
            )


# -- held keys -------------------------------------------------------------------------


@admin.register(HeldKey)
class HeldKeyAdmin(StreamDatabaseAdmin, ReadOnlyAdmin):
    """Keys of ordered streams held back by a dead letter; releasing one lets its later
    rows go on (replay the dead letter first if it must be delivered before them)."""

    list_display = ("stream", "key", "held_at", "group_id", "short_error")
    list_filter = (StreamFilter,)
    search_fields = ("=key",)
    ordering = ("-held_at",)
    actions = ("release",)

    has_operate_permission = _has("operate_heldkey")

    @admin.display(description="error")
    def short_error(self, held: HeldKey) -> str:
        return last_line(held.error)[:120]

    @admin.action(description="Release (the key's later rows go on)", permissions=["operate"])
    def release(self, request: HttpRequest, queryset: QuerySet[HeldKey]) -> None:
        by_stream: dict[str, list[str]] = {}
        for stream, key in queryset.values_list("stream", "key"):
            by_stream.setdefault(stream, []).append(key)
        released = sum(steer.release_keys(stream, keys) for stream, keys in by_stream.items())
        self.message_user(request, f"{released} key(s) released; their later rows go on.")


# -- archive ---------------------------------------------------------------------------


@admin.register(ArchivedEvent)
class ArchivedEventAdmin(StreamDatabaseAdmin, ReadOnlyAdmin):
    list_display = (
        "id",
        "stream",
        "event_id",
        "outcome",
        "attempts",
        "archived_at",
        "replayed_at",
        "short_error",
    )
    list_filter = (
        "outcome",
        StreamFilter,
        "archived_at",
        ("replayed_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("=id",)
    text_search_fields = ("=event_id", "=group_id", "error")
    date_hierarchy = None
    ordering = ("-archived_at", "-id")
    actions = ("replay",)

    has_replay_permission = _has("replay_archivedevent")

    @admin.display(description="error")
    def short_error(self, event: ArchivedEvent) -> str:
        return last_line(event.error)[:120]

    @admin.action(description="Replay failed rows (once each)", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[ArchivedEvent]) -> None:
        rows = queryset.filter(outcome=Outcome.FAILED, replayed_at__isnull=True)
        known = rows.filter(stream__in=list(outbox_settings().streams))
        replayed: Counter = replay_failed(known)
        total = sum(replayed.values())
        detail = ", ".join(f"{stream}: {n}" for stream, n in sorted(replayed.items()))
        self.message_user(
            request,
            f"{total} dead letter(s) published again" + (f" ({detail})." if detail else "."),
        )


# -- staged jobs and idempotency keys ----------------------------------------------------


@admin.register(StagedJob)
class StagedJobAdmin(StreamDatabaseAdmin, ReadOnlyAdmin):
    list_display = (
        "id",
        "func",
        "created_at",
        "run_after",
        "forwarded_at",
        "forward_count",
        "idempotency_key",
        "last_error",
    )
    list_filter = (
        ("run_after", admin.EmptyFieldListFilter),
        ("last_error", admin.EmptyFieldListFilter),
        recent_values_filter("func", "func"),
    )
    search_fields = ("=id",)
    text_search_fields = ("func", "idempotency_key")
    ordering = ("id",)
    actions = ("forward_now",)

    has_forward_permission = _has("forward_stagedjob")

    @admin.action(
        description="Forward now (due or not, kept with an error or not)", permissions=["forward"]
    )
    def forward_now(self, request: HttpRequest, queryset: QuerySet[StagedJob]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        result = requeue(ids)
        busy = len(ids) - result.forwarded - result.kept
        notes = [f"{result.kept} kept with an error"] if result.kept else []
        notes += [f"{busy} running now, left alone"] if busy else []
        self.message_user(
            request,
            f"{result.forwarded} job(s) handed to django-q2"
            + (f"; {'; '.join(notes)}." if notes else "."),
            messages.WARNING if notes else messages.SUCCESS,
        )


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ("scope", "key", "created_at", "completed_at", "expires_at")
    list_filter = (recent_values_filter("scope", "scope"),)
    search_fields = ("=id",)
    text_search_fields = ("key", "scope")
    ordering = ("-id",)


# -- streams and the dashboard -----------------------------------------------------------


@admin.register(StreamState)
class StreamStateAdmin(StreamDatabaseAdmin):
    """Runtime switches (operator-written): pause/resume, batch-size override."""

    list_display = (
        "stream",
        "paused",
        "batch_size_override",
        "paused_until",
        "calls_per_second",
        "rows_per_second",
        "wanted",
        "updated_at",
    )
    list_editable = ("batch_size_override",)
    readonly_fields = (
        "stream",
        "paused",
        "wanted",
        "paused_until",
        "calls_per_second",
        "rows_per_second",
        "next_call_at",
        "budget_calls",
        "budget_rows",
        "updated_at",
    )
    fields = ("stream", "paused", "batch_size_override", *readonly_fields[2:])
    actions = ("pause", "resume")

    has_operate_permission = _has("operate_streamstate")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="calls/s budget")
    def calls_per_second(self, obj: StreamState) -> str:
        """The stream's ``CALLS_PER_SECOND`` (settings), or a dash without a budget."""
        config = outbox_settings().streams.get(obj.stream)
        budget = config.calls_per_second if config else None
        return "-" if budget is None else f"{budget:g}"

    @admin.display(description="rows/s budget")
    def rows_per_second(self, obj: StreamState) -> str:
        """The stream's ``ROWS_PER_SECOND`` (settings), or a dash without a row budget."""
        config = outbox_settings().streams.get(obj.stream)
        budget = config.rows_per_second if config else None
        return "-" if budget is None else f"{budget:g}"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: StreamState, form: Any, change: bool) -> None:
        """Write only the fields the operator changed: the pipeline writes the others
        meanwhile (the claim floor's, the wake epoch), and an old value written back
        could let the floor pass a row."""
        obj.save(update_fields=list(form.changed_data))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Overriding a batch size changes what the pipeline does: operators only."""
        return super().has_change_permission(request, obj) and self.has_operate_permission(request)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # Rows are written by ``migrate`` and the pipeline, never by a page view.
        with on_database(chosen_database(request)):
            here = set(StreamState.objects.values_list("stream", flat=True))
        missing = sorted(set(_streams_shown(request)) - here)
        if missing and request.method == "GET":
            self.message_user(
                request,
                f"No state row yet for {', '.join(missing)}: it is written by the next "
                "`manage.py migrate` or when the stream first runs.",
                messages.INFO,
            )
        return super().changelist_view(request, extra_context)

    def _switch(self, request: HttpRequest, queryset: QuerySet[StreamState], paused: bool) -> None:
        streams = [
            s for s in queryset.values_list("stream", flat=True) if s in outbox_settings().streams
        ]
        for stream in streams:
            set_paused(stream, paused)
        verb = "paused" if paused else "resumed"
        self.message_user(request, f"{len(streams)} stream(s) {verb}: {', '.join(streams)}.")

    @admin.action(description="Pause", permissions=["operate"])
    def pause(self, request: HttpRequest, queryset: QuerySet[StreamState]) -> None:
        self._switch(request, queryset, True)

    @admin.action(description="Resume", permissions=["operate"])
    def resume(self, request: HttpRequest, queryset: QuerySet[StreamState]) -> None:
        self._switch(request, queryset, False)

    def get_urls(self) -> list[Any]:
        dashboard = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", dashboard, name="django_outbox_dashboard"), *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Outbox dashboard",
            "opts": self.model._meta,
            **dashboard_context(request.user.has_perm("django_outbox.operate_streamstate")),
        }
        return TemplateResponse(request, "admin/django_outbox/dashboard.html", context)


def _streams_shown(request: HttpRequest) -> list[str]:
    """The streams whose rows a page lists: those of the chosen (or routed) database."""
    alias = chosen_database(request) or connection_for(StreamState).alias
    return stream_databases().get(alias, [])


def dashboard_context(can_operate: bool) -> dict[str, Any]:
    """Everything the dashboard shows; every query bounded or served by an index."""
    statuses = all_statuses()
    now = database_now(connection_for(ArchivedEvent).alias)
    per_minute = throughput(now)
    streams = [
        {
            "status": status,
            "chart": chart_svg(per_minute.get(status.stream, {}), now),
            "done_last_hour": status.archived_last_hour,
            "failed_last_hour": status.failed_last_hour,
        }
        for status in statuses
    ]
    staged = staged_counts(COUNT_CAP)
    return {
        "streams": streams,
        "staged_waiting": staged["waiting"],
        "staged_kept": staged["kept"],
        "staged_forwarded": staged["forwarded"],
        "staged_url": reverse("admin:django_outbox_stagedjob_changelist"),
        "unique_jobs": unique_job_rows(),
        "count_cap": COUNT_CAP,
        "can_operate": can_operate,
        "state_url": reverse("admin:django_outbox_streamstate_changelist"),
    }


def throughput(now: Any, cap: int | None = None) -> dict[str, dict[tuple[int, str], int]]:
    """Rows archived per stream, minute (0 = the current one) and outcome, last hour.

    Each stream and outcome counts at most its newest ``COUNT_CAP`` rows of the hour
    (an index-only range of ``outbox_archive_outcome_at``): when the hour holds more,
    the minutes before the newest ``COUNT_CAP`` rows are left out, marked ``(m, "capped")``.
    """
    cap = COUNT_CAP if cap is None else cap
    hour_ago = now - timedelta(hours=1)
    current = now.replace(second=0, microsecond=0)
    result: dict[str, dict[tuple[int, str], int]] = {}
    for stream in outbox_settings().streams:
        counts = result.setdefault(stream, {})
        for outcome in (Outcome.DONE, Outcome.FAILED):
            rows = ArchivedEvent.objects.using(get_stream(stream).alias).filter(
                stream=stream, outcome=outcome, archived_at__gte=hour_ago
            )
            newest = rows.order_by("-archived_at").values_list("archived_at", flat=True)
            boundary = newest[cap : cap + 1].first()
            if boundary is not None:  # more than the cap: count the newest rows only
                rows = rows.filter(archived_at__gt=boundary)
                counts[(_minutes_ago(current, boundary), "capped")] = 1
            per_minute = (
                rows.annotate(minute=TruncMinute("archived_at"))
                .values_list("minute")
                .annotate(n=Count("id"))
                .order_by()
            )
            for minute, n in per_minute:
                ago = _minutes_ago(current, minute)
                if 0 <= ago < 60:
                    counts[(ago, str(outcome))] = n
    return result


def _minutes_ago(current: Any, moment: Any) -> int:
    return int((current - moment.replace(second=0, microsecond=0)).total_seconds() // 60)


def chart_svg(counts: dict[tuple[int, str], int], now: Any) -> SafeString:
    """A 60-bar SVG of rows archived per minute (done, failed stacked), numbers only."""
    width, height, bar = 600, 90, 10
    peak = max(
        (counts.get((m, "done"), 0) + counts.get((m, "failed"), 0) for m in range(60)), default=0
    )
    capped = min((m for m, kind in counts if kind == "capped"), default=None)
    note = (
        format_html(
            '<text x="2" y="22" font-size="10" fill="#666">not counted from {} min ago: '
            "more than {} rows</text>",
            capped,
            f"{COUNT_CAP:,}",
        )
        if capped is not None
        else ""
    )
    scale = (height - 14) / peak if peak else 0
    bars = []
    for minute in range(60):
        x = width - (minute + 1) * bar
        done = counts.get((minute, "done"), 0)
        failed = counts.get((minute, "failed"), 0)
        done_h, failed_h = round(done * scale, 1), round(failed * scale, 1)
        bars.append(
            (x, height - done_h, done_h, height - done_h - failed_h, failed_h, done, failed, minute)
        )
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="9" height="{}" fill="#417690">'
        "<title>{} min ago: {} done, {} failed</title></rect>"
        '<rect x="{}" y="{}" width="9" height="{}" fill="#ba2121"></rect>',
        (
            (x, y_done, h_done, minute, done, failed, x, y_failed, h_failed)
            for x, y_done, h_done, y_failed, h_failed, done, failed, minute in bars
        ),
    )
    return format_html(
        '<svg class="outbox-chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="rows archived per minute, last hour">'
        '<text x="2" y="10" font-size="10" fill="#666">peak {}/min</text>{}{}'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#ccc"/></svg>',
        width,
        height,
        width,
        height,
        peak,
        note,
        rects,
        height,
        width,
        height,
    )


def unique_job_rows() -> list[dict[str, Any]]:
    """Unique jobs per kind and state."""
    rows: dict[str, dict[str, int]] = {}
    for kind, state, count in unique_job_counts(COUNT_CAP):
        rows.setdefault(kind, {})[state] = count
    return [{"kind": kind, "states": states} for kind, states in sorted(rows.items())]
