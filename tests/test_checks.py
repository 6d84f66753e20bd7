"""System checks: every misconfiguration gets its stable id, its exact message and a hint."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.admin import AdminSite
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.db.utils import ConnectionHandler
from django.test import override_settings

from django_outbox.admin import register_stream_buffers
from django_outbox.checks import check_django_q, check_sqlite_transactions
from django_outbox.conf import get_stream
from django_outbox.transport import handoff
from marketing.models import ContactActivityEvent
from tests.testapp.handlers import record

HANDLER = "tests.testapp.handlers.record"
WHERE = "DJANGO_OUTBOX['STREAMS']['audit']"
TEST_Q_CLUSTER = settings.Q_CLUSTER

KNOWN_OPTIONS = (
    "Known options: ARCHIVE, ARCHIVE_FAILED_RETENTION_DAYS, ARCHIVE_RETENTION_DAYS, "
    "AUTO_HEARTBEAT, BACKOFF_MAX_SECONDS, BACKOFF_SECONDS, BATCH_SIZE, CALLS_PER_SECOND, "
    "CLUSTER, DATABASE, "
    "EVERY_MINUTES, HANDLER, HANDOFF_SECONDS, ISOLATE_FAILURES, LEASE_SECONDS, MAX_ATTEMPTS, "
    "MODEL, ON_EXHAUSTED, ORDER_AFTER_DEAD_LETTER, ORDER_KEY, ROWS_PER_SECOND, RUNS, "
    "TRANSACTIONAL."
)
NAME_HINT = "Use 1 to 64 lowercase letters, digits, '_' or '-', starting with a letter or digit."
TIMEOUT_RETRY_HINT = (
    "Set Q_CLUSTER['timeout'] below Q_CLUSTER['retry'] so django-q2 never hands a job that "
    "is still running to a second worker."
)
TIMEOUT_LEASE_HINT = (
    "Raise LEASE_SECONDS to at least the timeout, lower the timeout, or turn AUTO_HEARTBEAT "
    "back on: a lease that expires while its handler may still run lets a second worker take "
    "the group over."
)


def outbox_messages() -> list[tuple[str, str, str]]:
    """Run every registered check and keep django_outbox's messages, as (id, msg, hint)."""
    return [
        (m.id, m.msg, m.hint) for m in run_checks() if m.id and m.id.startswith("django_outbox.")
    ]


def one_stream(**options: object) -> dict:
    """A DJANGO_OUTBOX setting with one valid ``audit`` stream, plus *options*."""
    return {"STREAMS": {"audit": {"HANDLER": HANDLER, **options}}}


def q_cluster(**options: object) -> dict:
    """The test Q_CLUSTER with *options* changed."""
    return {**TEST_Q_CLUSTER, **options}


# Valid configurations ------------------------------------------------------------------


def test_test_settings_produce_no_outbox_messages():
    assert outbox_messages() == []


def test_minimal_stream_with_only_a_handler_is_valid():
    with override_settings(DJANGO_OUTBOX=one_stream()):
        assert outbox_messages() == []


def test_project_without_the_setting_gets_no_messages():
    with override_settings():
        del settings.DJANGO_OUTBOX
        assert outbox_messages() == []


@pytest.mark.parametrize("name", ["a", "audit-2", "0_x", "a" * 64])
def test_valid_stream_names_are_accepted(name):
    with override_settings(DJANGO_OUTBOX={"STREAMS": {name: {"HANDLER": HANDLER}}}):
        assert outbox_messages() == []


def test_generic_model_may_be_shared_by_many_streams():
    streams = {
        "audit": {"HANDLER": HANDLER},
        "billing": {"HANDLER": HANDLER, "MODEL": "django_outbox.OutboxEvent"},
        "emails": {"HANDLER": HANDLER, "MODEL": "django_outbox.OutboxEvent"},
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        assert outbox_messages() == []


# E00x: the shape of the setting ----------------------------------------------------------


def test_setting_that_is_not_a_dict_is_e001():
    with override_settings(DJANGO_OUTBOX=["audit"]):
        assert outbox_messages() == [
            (
                "django_outbox.E001",
                "DJANGO_OUTBOX must be a dict, not list.",
                'Set DJANGO_OUTBOX = {"STREAMS": {...}} in your settings.',
            )
        ]


def test_unknown_top_level_key_is_e002():
    with override_settings(DJANGO_OUTBOX={**one_stream(), "STREAM": {}, "BATCH_SIZE": 5}):
        assert outbox_messages() == [
            (
                "django_outbox.E002",
                "DJANGO_OUTBOX has unknown keys: BATCH_SIZE, STREAM.",
                "Known keys: ARCHIVE_FAILED_RETENTION_DAYS, ARCHIVE_RETENTION_DAYS, "
                "DISPATCH_ON_COMMIT, IDEMPOTENCY, METRICS_TOKEN, PRUNE_EVERY_MINUTES, STAGING, "
                "STREAMS.",
            )
        ]


def test_dispatch_on_commit_is_e007():
    with override_settings(DJANGO_OUTBOX={**one_stream(), "DISPATCH_ON_COMMIT": "later"}):
        assert outbox_messages() == [
            (
                "django_outbox.E007",
                "DJANGO_OUTBOX['DISPATCH_ON_COMMIT'] must be 'inline' or 'thread', not 'later'.",
                "'inline': the committing thread dispatches the jobs it enqueued right after "
                "its commit; 'thread': a dispatcher thread of the process hands the dispatch "
                "to a worker.",
            )
        ]


def test_streams_not_a_dict_is_e003():
    with override_settings(DJANGO_OUTBOX={"STREAMS": ["audit"]}):
        assert outbox_messages() == [
            (
                "django_outbox.E003",
                "DJANGO_OUTBOX['STREAMS'] must be a dict of stream name to options, not list.",
                'For example {"marketing": {"HANDLER": "crm.outbox.sync"}}.',
            )
        ]


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("Bad Name", "'Bad Name'"),
        ("", "''"),
        ("-audit", "'-audit'"),
        ("a" * 65, repr("a" * 65)),
        (7, "7"),
        ("audit\n", "'audit\\n'"),
        ("\naudit", "'\\naudit'"),
    ],
)
def test_invalid_stream_name_is_e004(name, shown):
    with override_settings(DJANGO_OUTBOX={"STREAMS": {name: {"HANDLER": HANDLER}}}):
        assert outbox_messages() == [
            ("django_outbox.E004", f"Invalid stream name {shown}.", NAME_HINT)
        ]


def test_stream_options_not_a_dict_is_e005():
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": HANDLER}}):
        assert outbox_messages() == [
            (
                "django_outbox.E005",
                f"{WHERE} must be a dict of options, not str.",
                'For example {"HANDLER": "crm.outbox.sync", "BATCH_SIZE": 1000}.',
            )
        ]


def test_unknown_stream_option_is_e006():
    with override_settings(DJANGO_OUTBOX=one_stream(BATCHSIZE=10, handler="x")):
        assert outbox_messages() == [
            (
                "django_outbox.E006",
                f"{WHERE} has unknown options: BATCHSIZE, handler.",
                KNOWN_OPTIONS,
            )
        ]


# E01x: handlers ------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"HANDLER": ""}, {"HANDLER": None}])
def test_missing_handler_is_e010(options):
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": options}}):
        assert outbox_messages() == [
            (
                "django_outbox.E010",
                f"{WHERE} has no HANDLER.",
                "Set HANDLER to the dotted path of a callable that takes a Batch, for example "
                "'crm.outbox.sync_activities'.",
            )
        ]


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tests.testapp.nope.record", "No module named 'tests.testapp.nope'"),
        (
            "tests.testapp.handlers.missing",
            'Module "tests.testapp.handlers" does not define a "missing" attribute/class',
        ),
        ("record", "record doesn't look like a module path"),
    ],
)
def test_handler_that_cannot_be_imported_is_e011(path, reason):
    with override_settings(DJANGO_OUTBOX=one_stream(HANDLER=path)):
        assert outbox_messages() == [
            (
                "django_outbox.E011",
                f"{WHERE}['HANDLER'] {path!r} cannot be imported: {reason}",
                "Check the dotted path and that its module imports without errors.",
            )
        ]


@pytest.mark.parametrize("handler", ["django_outbox.conf.SETTING_NAME", record])
def test_handler_that_is_not_a_dotted_path_of_a_callable_is_e012(handler):
    with override_settings(DJANGO_OUTBOX=one_stream(HANDLER=handler)):
        assert outbox_messages() == [
            (
                "django_outbox.E012",
                f"{WHERE}['HANDLER'] must be the dotted path of a callable, not {handler!r}.",
                "Give a string such as 'crm.outbox.sync_activities'.",
            )
        ]


# E02x: buffer models -------------------------------------------------------------------


@pytest.mark.parametrize("label", ["nope.Missing", "marketing.Missing", "marketing", None])
def test_model_that_is_not_installed_is_e020(label):
    with override_settings(DJANGO_OUTBOX=one_stream(MODEL=label)):
        assert outbox_messages() == [
            (
                "django_outbox.E020",
                f"{WHERE}['MODEL'] {label!r} is not an installed model.",
                "Give 'app_label.ModelName' of a BufferEvent subclass in an installed app.",
            )
        ]


@pytest.mark.parametrize(
    ("label", "check_id"),
    [("nope.Missing", "E020"), ("not a label", "E020"), ("auth.User", "E021")],
)
def test_a_stream_whose_model_is_not_a_buffer_model_lets_django_start_and_check_report_it(
    label, check_id
):
    streams = {**settings.DJANGO_OUTBOX["STREAMS"], "ghost": {"HANDLER": HANDLER, "MODEL": label}}
    site = AdminSite()
    with override_settings(DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": streams}):
        register_stream_buffers(site)  # what the app's ready() runs at startup
        with pytest.raises(SystemCheckError) as error:
            call_command("check", stdout=io.StringIO(), stderr=io.StringIO())

    assert site.is_registered(ContactActivityEvent), "the other streams' buffers are registered"
    report = str(error.value)
    assert f"(django_outbox.{check_id}) DJANGO_OUTBOX['STREAMS']['ghost']['MODEL'] {label!r}" in (
        report
    )
    assert "HINT:" in report and "BufferEvent" in report
    assert "System check identified 1 issue" in report


@pytest.mark.parametrize("label", ["auth.User", "marketing.ContactActivity"])
def test_model_that_is_not_a_buffer_model_is_e021(label):
    with override_settings(DJANGO_OUTBOX=one_stream(MODEL=label)):
        assert outbox_messages() == [
            (
                "django_outbox.E021",
                f"{WHERE}['MODEL'] {label!r} is not a buffer model.",
                "Subclass django_outbox.models.BufferEvent, which carries the group_id column "
                "and the two buffer indexes.",
            )
        ]


def test_custom_model_bound_to_two_streams_is_e022():
    streams = {
        "marketing": {"HANDLER": HANDLER, "MODEL": "marketing.ContactActivityEvent"},
        "audit": {"HANDLER": HANDLER},
        "marketing-copy": {"HANDLER": HANDLER, "MODEL": "marketing.contactactivityevent"},
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        assert outbox_messages() == [
            (
                "django_outbox.E022",
                "marketing.ContactActivityEvent is bound to two streams: 'marketing' and "
                "'marketing-copy'.",
                "A custom buffer model belongs to one stream on each database; give the other "
                "stream its own model or DATABASE, or use the generic "
                "django_outbox.OutboxEvent.",
            )
        ]


def test_streams_on_distinct_databases_may_share_a_custom_model():
    streams = {
        "marketing": {"HANDLER": HANDLER, "MODEL": "marketing.ContactActivityEvent"},
        "marketing-eu": {
            "HANDLER": HANDLER,
            "MODEL": "marketing.ContactActivityEvent",
            "DATABASE": "other",
        },
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        assert outbox_messages() == []


ORDER_KEY_HINT = (
    "Give the name of a field of the stream's buffer model whose value groups the rows that "
    "must stay in order (an aggregate's id, say); docs/how-to/ordered-streams.md shows the "
    "model."
)


@pytest.mark.parametrize("key", ["nope", "group_id", "id", 7])
def test_order_key_that_is_not_a_field_of_the_buffer_model_is_e023(key):
    with override_settings(DJANGO_OUTBOX=one_stream(MODEL="testapp.OrderedEvent", ORDER_KEY=key)):
        assert outbox_messages() == [
            (
                "django_outbox.E023",
                f"{WHERE}['ORDER_KEY'] {key!r} is not a field of testapp.OrderedEvent.",
                ORDER_KEY_HINT,
            )
        ]


@pytest.mark.parametrize("key", [7, "", ["order_id"]])
def test_order_key_on_the_generic_buffer_must_name_a_payload_key_e023(key):
    with override_settings(DJANGO_OUTBOX=one_stream(ORDER_KEY=key)):
        assert outbox_messages() == [
            (
                "django_outbox.E023",
                f"{WHERE}['ORDER_KEY'] {key!r} is not the name of a payload key.",
                "On the generic OutboxEvent buffer, ORDER_KEY names a top-level key of the "
                "payloads whose value groups the rows that must stay in order, for example "
                '"order_id"; publish() and publish_many() store its value.',
            )
        ]
    with override_settings(DJANGO_OUTBOX=one_stream(ORDER_KEY="order_id")):
        assert outbox_messages() == []


def test_an_order_key_naming_a_field_passes_and_the_policy_is_e024():
    ordered = {"MODEL": "testapp.OrderedEvent", "ORDER_KEY": "aggregate_id"}
    with override_settings(DJANGO_OUTBOX=one_stream(**ordered)):
        assert outbox_messages() == []
    with override_settings(DJANGO_OUTBOX=one_stream(**ordered, ORDER_AFTER_DEAD_LETTER="skip")):
        assert outbox_messages() == [
            (
                "django_outbox.E024",
                f"{WHERE}['ORDER_AFTER_DEAD_LETTER'] must be 'hold' or 'continue', not 'skip'.",
                "'hold': a dead-lettered row's key waits for an operator to release it; "
                "'continue': the key's later rows go on.",
            )
        ]


# E03x: option values -------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, "10", 1.5, True, None])
def test_batch_size_that_is_not_a_positive_integer_is_e030(value):
    with override_settings(DJANGO_OUTBOX=one_stream(BATCH_SIZE=value)):
        assert outbox_messages() == [
            (
                "django_outbox.E030",
                f"{WHERE}['BATCH_SIZE'] must be a positive integer, not {value!r}.",
                "Remove it to use the default (1000) or give a whole number greater than 0.",
            )
        ]


def test_a_batch_size_above_the_bound_is_e039_and_the_bound_itself_is_accepted():
    with override_settings(DJANGO_OUTBOX=one_stream(BATCH_SIZE=100_000)):
        assert outbox_messages() == []
    with override_settings(DJANGO_OUTBOX=one_stream(BATCH_SIZE=100_001)):
        assert outbox_messages() == [
            (
                "django_outbox.E039",
                f"{WHERE}['BATCH_SIZE'] is 100,001, above the most allowed (100,000).",
                "One claim locks and one handler call holds that many rows: give at most "
                "100,000 (a few hundred to a few thousand is usual).",
            )
        ]


@pytest.mark.parametrize(
    ("option", "default"),
    [
        ("RUNS", 4),
        ("EVERY_MINUTES", 1),
        ("MAX_ATTEMPTS", 8),
        ("BACKOFF_SECONDS", 10),
        ("BACKOFF_MAX_SECONDS", 3600),
        ("LEASE_SECONDS", 300),
        ("HANDOFF_SECONDS", 30),
    ],
)
def test_every_count_option_must_be_a_positive_integer_e030(option, default):
    with override_settings(DJANGO_OUTBOX=one_stream(**{option: 0})):
        assert outbox_messages() == [
            (
                "django_outbox.E030",
                f"{WHERE}['{option}'] must be a positive integer, not 0.",
                f"Remove it to use the default ({default}) or give a whole number greater than 0.",
            )
        ]


@pytest.mark.parametrize(
    ("option", "value", "default"),
    [
        ("ARCHIVE", "yes", True),
        ("ARCHIVE", 1, True),
        ("TRANSACTIONAL", "false", False),
        ("ISOLATE_FAILURES", "yes", True),
        ("AUTO_HEARTBEAT", 0, True),
    ],
)
def test_flag_that_is_not_a_bool_is_e031(option, value, default):
    with override_settings(DJANGO_OUTBOX=one_stream(**{option: value})):
        assert outbox_messages() == [
            (
                "django_outbox.E031",
                f"{WHERE}['{option}'] must be True or False, not {value!r}.",
                f"Remove it to use the default ({default}).",
            )
        ]


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("KICK", True, "Every commit wakes its stream now; remove KICK."),
        (
            "MAX_BATCHES",
            50,
            "Runs continue while rows wait, up to RUNS per stream; remove MAX_BATCHES "
            "(raise RUNS for more parallel runs).",
        ),
    ],
)
def test_an_option_of_an_earlier_version_is_w003_and_ignored(option, value, hint):
    with override_settings(DJANGO_OUTBOX=one_stream(**{option: value})):
        assert outbox_messages() == [
            (
                "django_outbox.W003",
                f"{WHERE}['{option}'] is no longer used: it is ignored.",
                hint,
            )
        ]
        assert get_stream("audit").runs == 4


def test_a_renamed_option_is_w008_and_its_value_is_used_under_the_new_name():
    with override_settings(DJANGO_OUTBOX=one_stream(CHAINS=2)):
        assert outbox_messages() == [
            (
                "django_outbox.W008",
                f"{WHERE}['CHAINS'] is now called 'RUNS'; its value is used as RUNS.",
                "Rename CHAINS to RUNS (the old name works in 0.1 only).",
            )
        ]
        assert get_stream("audit").runs == 2


def test_a_renamed_option_given_with_its_new_name_is_ignored_w008():
    with override_settings(DJANGO_OUTBOX=one_stream(CHAINS=2, RUNS=3)):
        [(check, message, _)] = outbox_messages()
        assert (check, message) == (
            "django_outbox.W008",
            f"{WHERE}['CHAINS'] is now called 'RUNS'; its value is ignored: the stream gives both.",
        )
        assert get_stream("audit").runs == 3


def test_a_renamed_option_is_checked_under_its_new_name():
    with override_settings(DJANGO_OUTBOX=one_stream(CHAINS=0)):
        assert [check for check, *_ in outbox_messages()] == [
            "django_outbox.W008",
            "django_outbox.E030",
        ]


@pytest.mark.parametrize("value", [5, "", ["fast"]])
def test_cluster_that_is_not_a_name_or_none_is_e032(value):
    with override_settings(DJANGO_OUTBOX=one_stream(CLUSTER=value)):
        assert outbox_messages() == [
            (
                "django_outbox.E032",
                f"{WHERE}['CLUSTER'] must be a django-q2 cluster name or None, not {value!r}.",
                "Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
            )
        ]


def test_backoff_cap_below_its_base_is_e033():
    with override_settings(DJANGO_OUTBOX=one_stream(BACKOFF_SECONDS=10, BACKOFF_MAX_SECONDS=5)):
        assert outbox_messages() == [
            (
                "django_outbox.E033",
                f"{WHERE}['BACKOFF_MAX_SECONDS'] (5) is below BACKOFF_SECONDS (10).",
                "The cap of the backoff must be at least its base.",
            )
        ]


def test_backoff_base_above_the_default_cap_is_e033():
    with override_settings(DJANGO_OUTBOX=one_stream(BACKOFF_SECONDS=7200)):
        assert [m[:2] for m in outbox_messages()] == [
            (
                "django_outbox.E033",
                f"{WHERE}['BACKOFF_MAX_SECONDS'] (3600) is below BACKOFF_SECONDS (7200).",
            )
        ]


def test_backoff_cap_equal_to_its_base_is_valid():
    with override_settings(DJANGO_OUTBOX=one_stream(BACKOFF_SECONDS=10, BACKOFF_MAX_SECONDS=10)):
        assert outbox_messages() == []


@pytest.mark.parametrize("value", [0, -3, "30", None])
def test_archive_retention_that_is_not_a_positive_integer_is_e034(value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), "ARCHIVE_RETENTION_DAYS": value}):
        assert outbox_messages() == [
            (
                "django_outbox.E034",
                f"DJANGO_OUTBOX['ARCHIVE_RETENTION_DAYS'] must be a positive integer, "
                f"not {value!r}.",
                "Give the number of days archived rows are kept, for example 30.",
            )
        ]


def test_every_problem_of_a_stream_is_reported_at_once():
    options = {"HANDLER": "tests.testapp.handlers.missing", "BATCH_SIZE": 0, "ARCHIVE": "no"}
    streams = {"Bad Name": options, "audit": {"HANDLER": HANDLER}}
    where = "DJANGO_OUTBOX['STREAMS']['Bad Name']"
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        assert [(m[0], m[1]) for m in outbox_messages()] == [
            ("django_outbox.E004", "Invalid stream name 'Bad Name'."),
            (
                "django_outbox.E011",
                f"{where}['HANDLER'] 'tests.testapp.handlers.missing' cannot be imported: "
                'Module "tests.testapp.handlers" does not define a "missing" attribute/class',
            ),
            ("django_outbox.E030", f"{where}['BATCH_SIZE'] must be a positive integer, not 0."),
            ("django_outbox.E031", f"{where}['ARCHIVE'] must be True or False, not 'no'."),
        ]


# E04x and W002: the django-q2 cluster ----------------------------------------------------


def test_django_q_missing_from_installed_apps_is_e040():
    without_q = [app for app in settings.INSTALLED_APPS if app != "django_q"]
    with override_settings(INSTALLED_APPS=without_q):
        messages = check_django_q()
    assert [(m.id, m.msg, m.hint) for m in messages] == [
        (
            "django_outbox.E040",
            "django_q is not in INSTALLED_APPS.",
            "django_outbox runs its jobs on django-q2: add 'django_q' to INSTALLED_APPS.",
        )
    ]


def test_django_q_installed_gives_no_e040():
    assert check_django_q() == []


@pytest.mark.parametrize(
    ("cluster", "shown"),
    [
        ({"timeout": 90, "retry": 90}, "timeout=90, which is not below retry=90"),
        ({"timeout": 120, "retry": 90}, "timeout=120, which is not below retry=90"),
        ({"timeout": None}, "timeout=None, which is not below retry=90"),
    ],
)
def test_cluster_timeout_not_below_retry_is_e041(cluster, shown):
    with (
        override_settings(Q_CLUSTER=q_cluster(**cluster)),
        override_settings(DJANGO_OUTBOX=one_stream()),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E041",
                f"The django-q2 Q_CLUSTER used by stream 'audit' has {shown}.",
                TIMEOUT_RETRY_HINT,
            )
        ]


def test_cluster_without_retry_is_compared_with_django_q_default_of_60():
    cluster = {k: v for k, v in TEST_Q_CLUSTER.items() if k != "retry"}
    with override_settings(Q_CLUSTER=cluster, DJANGO_OUTBOX=one_stream()):
        assert outbox_messages() == [
            (
                "django_outbox.E041",
                "The django-q2 Q_CLUSTER used by stream 'audit' has timeout=60, "
                "which is not below retry=60.",
                TIMEOUT_RETRY_HINT,
            )
        ]


def test_cluster_timeout_longer_than_the_lease_is_e042_without_the_automatic_heartbeat():
    with override_settings(
        Q_CLUSTER=q_cluster(timeout=200, retry=300),
        DJANGO_OUTBOX=one_stream(LEASE_SECONDS=120, AUTO_HEARTBEAT=False),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E042",
                "The django-q2 Q_CLUSTER used by stream 'audit' has timeout=200, longer than "
                "the stream's LEASE_SECONDS=120.",
                TIMEOUT_LEASE_HINT,
            )
        ]


def test_cluster_timeout_longer_than_the_lease_is_valid_with_the_automatic_heartbeat():
    with override_settings(
        Q_CLUSTER=q_cluster(timeout=200, retry=300),
        DJANGO_OUTBOX=one_stream(LEASE_SECONDS=120),
    ):
        assert outbox_messages() == []


def test_cluster_timeout_equal_to_the_lease_is_valid():
    with override_settings(
        Q_CLUSTER=q_cluster(timeout=120, retry=300),
        DJANGO_OUTBOX=one_stream(LEASE_SECONDS=120),
    ):
        assert outbox_messages() == []


def test_e041_and_e042_are_reported_for_each_stream_on_the_cluster():
    streams = {
        "audit": {"HANDLER": HANDLER, "LEASE_SECONDS": 100, "AUTO_HEARTBEAT": False},
        "b": {"HANDLER": HANDLER, "AUTO_HEARTBEAT": False},
    }
    with override_settings(
        Q_CLUSTER=q_cluster(timeout=200, retry=100), DJANGO_OUTBOX={"STREAMS": streams}
    ):
        assert [m[:2] for m in outbox_messages()] == [
            (
                "django_outbox.E041",
                "The django-q2 Q_CLUSTER used by stream 'audit' has timeout=200, "
                "which is not below retry=100.",
            ),
            (
                "django_outbox.E042",
                "The django-q2 Q_CLUSTER used by stream 'audit' has timeout=200, longer than "
                "the stream's LEASE_SECONDS=100.",
            ),
            (
                "django_outbox.E041",
                "The django-q2 Q_CLUSTER used by stream 'b' has timeout=200, "
                "which is not below retry=100.",
            ),
        ]


def test_stream_cluster_missing_from_alt_clusters_is_w002():
    with override_settings(
        Q_CLUSTER=q_cluster(ALT_CLUSTERS={"slow": {"timeout": 30}}),
        DJANGO_OUTBOX=one_stream(CLUSTER="fast"),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.W002",
                f"{WHERE}['CLUSTER'] names 'fast', which Q_CLUSTER['ALT_CLUSTERS'] does not "
                "define.",
                "Add it to Q_CLUSTER['ALT_CLUSTERS'] and run a qcluster with "
                "Q_CLUSTER_NAME=fast, or remove CLUSTER.",
            )
        ]


def test_stream_cluster_naming_the_main_cluster_is_valid():
    with override_settings(DJANGO_OUTBOX=one_stream(CLUSTER=TEST_Q_CLUSTER["name"])):
        assert outbox_messages() == []


def test_alt_cluster_with_valid_options_is_valid_even_if_the_main_cluster_is_not():
    alt = {"fast": {"timeout": 30, "retry": 60}}
    streams = {"audit": {"HANDLER": HANDLER, "CLUSTER": "fast", "LEASE_SECONDS": 30}}
    with override_settings(
        Q_CLUSTER=q_cluster(timeout=600, retry=900, ALT_CLUSTERS=alt),
        DJANGO_OUTBOX={"STREAMS": streams},
    ):
        assert outbox_messages() == []


def test_alt_cluster_timeout_is_used_for_e041():
    with override_settings(
        Q_CLUSTER=q_cluster(ALT_CLUSTERS={"slow": {"timeout": 100}}),
        DJANGO_OUTBOX=one_stream(CLUSTER="slow"),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E041",
                "The django-q2 cluster 'slow' used by stream 'audit' has timeout=100, "
                "which is not below retry=90.",
                TIMEOUT_RETRY_HINT,
            )
        ]


def test_alt_cluster_timeout_is_used_for_e042():
    with override_settings(
        Q_CLUSTER=q_cluster(ALT_CLUSTERS={"slow": {"timeout": 600, "retry": 900}}),
        DJANGO_OUTBOX=one_stream(CLUSTER="slow", LEASE_SECONDS=120, AUTO_HEARTBEAT=False),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E042",
                "The django-q2 cluster 'slow' used by stream 'audit' has timeout=600, longer "
                "than the stream's LEASE_SECONDS=120.",
                TIMEOUT_LEASE_HINT,
            )
        ]


# W001: SQLite transactions ---------------------------------------------------------------


def w001(alias: str) -> tuple[str, str, str]:
    return (
        "django_outbox.W001",
        f"SQLite database {alias!r} does not use IMMEDIATE transactions.",
        f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" so concurrent '
        "workers claim groups one at a time instead of failing with 'database is locked'.",
    )


@pytest.mark.parametrize("mode", ["DEFERRED", "EXCLUSIVE", None])
def test_default_database_without_immediate_transactions(mode):
    """W001 for the test database when it is SQLite; never for PostgreSQL."""
    with mock.patch.dict(connection.settings_dict["OPTIONS"], {"transaction_mode": mode}):
        messages = [(m.id, m.msg, m.hint) for m in check_sqlite_transactions()]
    if connection.vendor == "sqlite":
        assert messages == [w001("default")]
    else:
        assert messages == []


def test_default_database_without_any_transaction_mode():
    """A SQLite database that leaves transaction_mode out gets W001 too."""
    options = connection.settings_dict["OPTIONS"]
    with mock.patch.dict(options):
        options.pop("transaction_mode", None)
        messages = [(m.id, m.msg, m.hint) for m in check_sqlite_transactions()]
    assert messages == ([w001("default")] if connection.vendor == "sqlite" else [])


@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate"])
def test_default_database_with_immediate_transactions_has_no_w001(mode):
    with mock.patch.dict(connection.settings_dict["OPTIONS"], {"transaction_mode": mode}):
        assert check_sqlite_transactions() == []


def test_w001_names_each_sqlite_alias_without_immediate_and_skips_other_vendors():
    """Whatever the test database, a project with several databases is checked alias by alias."""
    handler = ConnectionHandler(
        {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": ":memory:",
                "OPTIONS": {"transaction_mode": "IMMEDIATE"},
            },
            "reports": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
            "warehouse": {"ENGINE": "django.db.backends.postgresql", "NAME": "warehouse"},
        }
    )
    with mock.patch("django_outbox.checks.connections", handler):
        messages = [(m.id, m.msg, m.hint) for m in check_sqlite_transactions()]
    assert messages == [w001("reports")]


# Through manage.py check -----------------------------------------------------------------


def test_check_command_fails_on_an_outbox_error():
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"audit": {}}}):
        with pytest.raises(SystemCheckError) as excinfo:
            call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    assert "?: (django_outbox.E010) DJANGO_OUTBOX['STREAMS']['audit'] has no HANDLER." in str(
        excinfo.value
    )


def test_check_command_prints_an_outbox_warning_without_failing():
    out, err = io.StringIO(), io.StringIO()
    with override_settings(DJANGO_OUTBOX=one_stream(CLUSTER="fast")):
        call_command("check", stdout=out, stderr=err)
    err = err.getvalue()
    assert "WARNINGS:" in err
    assert (
        "?: (django_outbox.W002) DJANGO_OUTBOX['STREAMS']['audit']['CLUSTER'] names 'fast', "
        "which Q_CLUSTER['ALT_CLUSTERS'] does not define." in err
    )


def test_check_command_passes_with_the_test_settings():
    out, err = io.StringIO(), io.StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "django_outbox" not in out.getvalue() + err.getvalue()


@pytest.mark.parametrize(
    ("hook", "check_id", "message"),
    [
        (
            "tests.nowhere.hook",
            "django_outbox.E013",
            "DJANGO_OUTBOX['STREAMS']['audit']['ON_EXHAUSTED'] 'tests.nowhere.hook' cannot be "
            "imported: No module named 'tests.nowhere'",
        ),
        (
            "django_outbox.conf.SETTING_NAME",
            "django_outbox.E014",
            "DJANGO_OUTBOX['STREAMS']['audit']['ON_EXHAUSTED'] must be the dotted path of a "
            "callable, not 'django_outbox.conf.SETTING_NAME'.",
        ),
    ],
)
def test_on_exhausted_must_be_an_importable_callable(hook, check_id, message):
    streams = {"audit": {"HANDLER": "tests.testapp.handlers.record", "ON_EXHAUSTED": hook}}
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        messages = [m for m in run_checks() if m.id.startswith("django_outbox")]
    assert [(m.id, m.msg) for m in messages] == [(check_id, message)]


@pytest.mark.parametrize("value", [0, -1, "daily", 1.5, True])
def test_prune_interval_that_is_not_a_positive_integer_is_e035(value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), "PRUNE_EVERY_MINUTES": value}):
        assert outbox_messages() == [
            (
                "django_outbox.E035",
                f"DJANGO_OUTBOX['PRUNE_EVERY_MINUTES'] must be a positive integer, not {value!r}.",
                "Give the minutes between two runs of the prune schedule, for example "
                "1440 (daily).",
            )
        ]


@pytest.mark.parametrize("section", ["STAGING", "IDEMPOTENCY"])
def test_section_that_is_not_a_dict_is_e050(section):
    with override_settings(DJANGO_OUTBOX={**one_stream(), section: ["x"]}):
        [(check_id, msg, _hint)] = outbox_messages()
    assert (check_id, msg) == (
        "django_outbox.E050",
        f"DJANGO_OUTBOX['{section}'] must be a dict of options, not list.",
    )


def test_unknown_staging_option_is_e051():
    staging = {"ALLOWED_MODULES": ["tests"], "BATCH": 5}
    with override_settings(DJANGO_OUTBOX={**one_stream(), "STAGING": staging}):
        assert outbox_messages() == [
            (
                "django_outbox.E051",
                "DJANGO_OUTBOX['STAGING'] has unknown options: BATCH.",
                "Known options: ALLOWED_MODULES, BATCH_SIZE, CLUSTER, DRAIN_SECONDS, "
                "EVERY_MINUTES, FORWARD_ON_COMMIT, MAX_FORWARDS, REDELIVER_SECONDS.",
            )
        ]


@pytest.mark.parametrize(
    ("section", "option", "value"),
    [
        ("STAGING", "BATCH_SIZE", 0),
        ("STAGING", "EVERY_MINUTES", "1"),
        ("STAGING", "DRAIN_SECONDS", -5),
        ("STAGING", "MAX_FORWARDS", 0),
        ("STAGING", "MAX_FORWARDS", 2.5),
        ("IDEMPOTENCY", "RETENTION_DAYS", 0),
        ("IDEMPOTENCY", "RETENTION_DAYS", 2.5),
    ],
)
def test_section_integer_that_is_not_positive_is_e052(section, option, value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), section: {option: value}}):
        [(check_id, msg, hint)] = outbox_messages()
    assert check_id == "django_outbox.E052"
    assert (
        msg == f"DJANGO_OUTBOX['{section}']['{option}'] must be a positive integer, not {value!r}."
    )
    assert hint.startswith("Remove it to use the default (")


def test_forward_on_commit_that_is_not_a_boolean_is_e053():
    staging = {"FORWARD_ON_COMMIT": "yes"}
    with override_settings(DJANGO_OUTBOX={**one_stream(), "STAGING": staging}):
        assert outbox_messages() == [
            (
                "django_outbox.E053",
                "DJANGO_OUTBOX['STAGING']['FORWARD_ON_COMMIT'] must be True or False, not 'yes'.",
                "Remove it to use the default (True).",
            )
        ]


@pytest.mark.parametrize("value", ["shop.tasks", ["shop.tasks", ""], [3], ["."]])
def test_allowed_modules_that_are_not_module_paths_are_e054(value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), "STAGING": {"ALLOWED_MODULES": value}}):
        assert outbox_messages() == [
            (
                "django_outbox.E054",
                "DJANGO_OUTBOX['STAGING']['ALLOWED_MODULES'] must be a list of module paths, "
                f"not {value!r}.",
                "List the modules whose functions may be staged, for example "
                '["shop.tasks", "billing.jobs"].',
            )
        ]


def test_staging_cluster_that_is_not_a_name_is_e055():
    with override_settings(DJANGO_OUTBOX={**one_stream(), "STAGING": {"CLUSTER": 5}}):
        assert outbox_messages() == [
            (
                "django_outbox.E055",
                "DJANGO_OUTBOX['STAGING']['CLUSTER'] must be a django-q2 cluster name or None, "
                "not 5.",
                "Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
            )
        ]


def test_drain_budget_not_below_the_cluster_timeout_is_e056():
    staging = {"DRAIN_SECONDS": 60}
    with override_settings(
        DJANGO_OUTBOX={**one_stream(), "STAGING": staging},
        Q_CLUSTER=q_cluster(timeout=60, retry=90),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E056",
                "DJANGO_OUTBOX['STAGING']['DRAIN_SECONDS'] (60) is not below the django-q2 "
                "timeout (60) of the cluster that runs the drain schedule.",
                "Lower DRAIN_SECONDS, or raise the cluster's timeout: the scheduled drain "
                "must end before django-q2 kills it.",
            )
        ]


REDELIVER_HINT = (
    "Raise REDELIVER_SECONDS above the longest timeout of the clusters staged jobs run on, "
    "or lower that timeout: with a broker that can lose jobs, a staged job is forwarded "
    "again after REDELIVER_SECONDS, and only after the timeout is its delivery surely over."
)


@pytest.fixture
def lossy_broker(monkeypatch):
    """A broker outside the staged jobs' transaction (Redis…): staged rows are redelivered."""
    monkeypatch.setattr(handoff, "in_transaction_hand_off", lambda alias=None: False)


def test_redelivery_not_after_a_cluster_timeout_is_e057_with_a_broker_that_can_lose_jobs(
    lossy_broker,
):
    staging = {"ALLOWED_MODULES": ["tests.testapp.jobs"], "REDELIVER_SECONDS": 300}
    alt = {"slow": {"timeout": 900, "retry": 1000}, "quick": {"timeout": 30, "retry": 60}}
    with override_settings(
        DJANGO_OUTBOX={**one_stream(), "STAGING": staging},
        Q_CLUSTER=q_cluster(timeout=300, retry=400, ALT_CLUSTERS=alt),
    ):
        assert outbox_messages() == [
            (
                "django_outbox.E057",
                "DJANGO_OUTBOX['STAGING']['REDELIVER_SECONDS'] (300) does not exceed the "
                "django-q2 timeout (300) of Q_CLUSTER.",
                REDELIVER_HINT,
            ),
            (
                "django_outbox.E057",
                "DJANGO_OUTBOX['STAGING']['REDELIVER_SECONDS'] (300) does not exceed the "
                "django-q2 timeout (900) of cluster 'slow'.",
                REDELIVER_HINT,
            ),
        ]


def test_redelivery_after_every_cluster_timeout_passes(lossy_broker):
    staging = {"ALLOWED_MODULES": ["tests.testapp.jobs"], "REDELIVER_SECONDS": 901}
    alt = {"slow": {"timeout": 900, "retry": 1000}}
    with override_settings(
        DJANGO_OUTBOX={**one_stream(), "STAGING": staging},
        Q_CLUSTER=q_cluster(timeout=300, retry=400, ALT_CLUSTERS=alt),
    ):
        assert outbox_messages() == []


def test_redelivery_is_not_checked_where_no_staged_job_is_redelivered():
    # django-q2's ORM broker on the staged jobs' database takes each job exactly once
    staging = {"ALLOWED_MODULES": ["tests.testapp.jobs"], "REDELIVER_SECONDS": 300}
    with override_settings(
        DJANGO_OUTBOX={**one_stream(), "STAGING": staging},
        Q_CLUSTER=q_cluster(timeout=600, retry=900),
    ):
        assert outbox_messages() == []


def test_valid_staging_and_idempotency_sections_pass():
    outbox = {
        **one_stream(),
        "STAGING": {"ALLOWED_MODULES": ["tests.testapp"], "DRAIN_SECONDS": 20},
        "IDEMPOTENCY": {"RETENTION_DAYS": 3},
        "PRUNE_EVERY_MINUTES": 60,
    }
    with override_settings(DJANGO_OUTBOX=outbox):
        assert outbox_messages() == []


@pytest.mark.parametrize("value", ["short", 12345678901234567, ""])
def test_metrics_token_that_is_not_a_long_string_is_e036(value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), "METRICS_TOKEN": value}):
        [(check_id, msg, hint)] = outbox_messages()
    assert check_id == "django_outbox.E036"
    assert msg == (
        "DJANGO_OUTBOX['METRICS_TOKEN'] must be None or a string of at least 16 characters."
    )
    assert "secrets.token_urlsafe()" in hint


@pytest.mark.parametrize("option", ["ARCHIVE_RETENTION_DAYS", "ARCHIVE_FAILED_RETENTION_DAYS"])
@pytest.mark.parametrize("value", [0, -3, "30", 2.5])
def test_a_stream_retention_that_is_not_a_positive_integer_is_e037(option, value):
    with override_settings(DJANGO_OUTBOX=one_stream(**{option: value})):
        assert outbox_messages() == [
            (
                "django_outbox.E037",
                f"DJANGO_OUTBOX['STREAMS']['audit']['{option}'] must be a positive integer or "
                f"None, not {value!r}.",
                f"Remove it to use the global DJANGO_OUTBOX['{option}'], or give the number of "
                "days archived rows of this stream are kept.",
            )
        ]


@pytest.mark.parametrize("value", [0, None, "90"])
def test_a_dead_letter_retention_that_is_not_a_positive_integer_is_e038(value):
    with override_settings(DJANGO_OUTBOX={**one_stream(), "ARCHIVE_FAILED_RETENTION_DAYS": value}):
        assert outbox_messages() == [
            (
                "django_outbox.E038",
                "DJANGO_OUTBOX['ARCHIVE_FAILED_RETENTION_DAYS'] must be a positive integer, "
                f"not {value!r}.",
                "Give the number of days dead letters are kept for replay, for example 90.",
            )
        ]


def test_an_ordered_streams_key_needs_no_index_of_its_own():
    """Any field of the model orders the stream: the ordered claim scans the waiting rows
    from the claim floor and reads no key's first row, so no index on the key is asked."""
    from tests.testapp.models import OrderedEvent

    assert not any(index.fields[:1] == ["seq"] for index in OrderedEvent._meta.indexes)
    with override_settings(DJANGO_OUTBOX=one_stream(MODEL="testapp.OrderedEvent", ORDER_KEY="seq")):
        assert outbox_messages() == []


# W006 (a stream's database lacks the library's migrations) ----------------------------


def test_migrate_on_a_fresh_database_does_not_tell_the_user_to_run_migrate(tmp_path):
    """``check --database`` names the missing migrations; ``migrate``, which applies
    them, does not warn about them first."""
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "example_project")]),
        "DATABASE_URL": "",  # SQLite on both tiers: a fresh file of this test's own
        "OUTBOX_TEST_SQLITE": str(tmp_path / "fresh.sqlite3"),
    }
    for name in ("OUTBOX_TEST_OTHER_NAME", "OUTBOX_TEST_OTHER_URL", "OUTBOX_REQUIRE_POSTGRES"):
        env.pop(name, None)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done

    assert "django_outbox.W006" in manage("check", "--database", "default").stderr
    migrate = manage("migrate")
    assert "Applying django_outbox.0001_initial... OK" in migrate.stdout
    assert "W006" not in migrate.stdout + migrate.stderr
    after = manage("check", "--database", "default")
    assert "W006" not in after.stdout + after.stderr


def test_a_module_imported_by_its_old_path_is_that_module_and_w009(monkeypatch):
    from django_outbox.base import moved
    from django_outbox.jobs import locking

    monkeypatch.delitem(sys.modules, "django_outbox.locking", raising=False)
    monkeypatch.setattr(moved, "USED", {})
    with pytest.warns(DeprecationWarning, match="django_outbox.locking moved to"):
        old = importlib.import_module("django_outbox.locking")
    assert old is locking
    assert outbox_messages() == [
        (
            "django_outbox.W009",
            "django_outbox.locking moved to django_outbox.jobs.locking: the old path works in "
            "0.1 only.",
            "Import django_outbox.jobs.locking instead (in migration files too, where "
            "makemigrations wrote the old path).",
        )
    ]
