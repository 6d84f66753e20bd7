"""idempotent(): once per key, the stored result, rollback, expiry, real concurrency."""

from __future__ import annotations

import threading
from datetime import timedelta
from hashlib import sha256

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_outbox.exceptions import IdempotencyError
from django_outbox.jobs.idempotency import SCOPE_MAX, function_scope, idempotent
from django_outbox.models import IdempotencyKey
from tests import procs
from tests.testapp.models import JobEffect

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


@idempotent(key="charge:{order_id}:{currency}")
def charge(order_id: int, amount: int, currency: str = "EUR") -> dict:
    """Charge an order (the docstring survives the decorator)."""
    JobEffect.objects.create(label=f"charge {order_id}", value=amount)
    return {"order": order_id, "amount": amount, "effects": JobEffect.objects.count()}


def effects() -> list[str]:
    return list(JobEffect.objects.order_by("id").values_list("label", flat=True))


def test_the_second_call_returns_the_stored_result_without_running_again():
    first = charge(7, 1200)
    second = charge(7, 1200)

    assert first == second == {"order": 7, "amount": 1200, "effects": 1}
    assert effects() == ["charge 7"]
    stored = IdempotencyKey.objects.get()
    assert (stored.scope, stored.key) == ("tests.jobs.test_idempotency.charge", "charge:7:EUR")
    assert stored.result == first
    assert stored.completed_at is not None and stored.expires_at > stored.completed_at


def test_the_key_template_sees_arguments_by_name_and_their_defaults():
    charge(7, 100)
    charge(order_id=7, amount=100, currency="USD")
    charge(8, 100)

    assert sorted(IdempotencyKey.objects.values_list("key", flat=True)) == [
        "charge:7:EUR",
        "charge:7:USD",
        "charge:8:EUR",
    ]
    assert charge.__name__ == "charge" and "docstring survives" in charge.__doc__


def test_a_callable_key_and_an_explicit_scope():
    @idempotent(key=lambda user, **kw: f"user-{user['id']}", scope="welcome-mails")
    def welcome(user: dict, *, tone: str = "warm") -> str:
        JobEffect.objects.create(label="welcome")
        return tone

    assert welcome({"id": 3}, tone="dry") == "dry"
    assert welcome({"id": 3}) == "dry"  # the stored result, not a new run
    assert effects() == ["welcome"]
    assert IdempotencyKey.objects.get().scope == "welcome-mails"


def test_a_failure_rolls_the_key_back_and_a_retry_runs_again():
    @idempotent(key="flaky:{n}")
    def flaky(n: int, fail: bool) -> int:
        JobEffect.objects.create(label=f"try {fail}")
        if fail:
            raise Boom
        return n

    with pytest.raises(Boom):
        flaky(1, True)
    assert IdempotencyKey.objects.count() == 0
    assert effects() == []  # the work rolled back with the key

    assert flaky(1, False) == 1
    assert effects() == ["try False"]


def test_a_result_that_is_not_json_is_a_clear_error_and_nothing_is_kept():
    @idempotent(key="obj:{n}")
    def returns_an_object(n: int) -> object:
        JobEffect.objects.create(label="made")
        return object()

    with pytest.raises(IdempotencyError, match="is not JSON"):
        returns_an_object(1)
    assert IdempotencyKey.objects.count() == 0
    assert effects() == []


def test_store_result_false_keeps_only_the_fact_of_the_run():
    @idempotent(key="fire:{n}", store_result=False)
    def fire(n: int) -> object:
        JobEffect.objects.create(label="fired")
        return object()

    assert fire(1) is not None
    assert fire(1) is None
    assert effects() == ["fired"]


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "non-empty string"), ("x" * 256, "at most 255"), (5, "string or a callable")],
)
def test_bad_keys_are_clear_errors(key, message):
    with pytest.raises(IdempotencyError, match=message):
        with idempotent(key=key):
            pass


def test_a_function_whose_path_is_longer_than_a_scope_is_guarded_under_its_hash():
    def send(n: int) -> int:
        JobEffect.objects.create(label=f"send {n}")
        return n

    send.__qualname__ = "Mailer" + "x" * 220 + ".send"  # a path longer than SCOPE_MAX
    guarded = idempotent(key="send:{n}")(send)

    assert guarded(1) == guarded(1) == 1
    assert effects() == ["send 1"]
    path = f"{__name__}.{send.__qualname__}"
    assert IdempotencyKey.objects.get().scope == f"sha256:{sha256(path.encode()).hexdigest()}"


def test_a_function_scope_is_its_path_unless_too_long_then_its_own_hash():
    assert function_scope("shop.tasks.charge", "django.tasks") == "django.tasks:shop.tasks.charge"
    long_paths = [f"shop.{'x' * 240}.{name}" for name in ("charge", "refund")]
    scopes = [function_scope(path, "django.tasks") for path in long_paths]
    assert all(scope.startswith("django.tasks:sha256:") for scope in scopes)
    assert all(len(scope) <= SCOPE_MAX for scope in scopes)
    assert scopes[0] != scopes[1]


def test_a_template_naming_an_unknown_argument_is_a_clear_error():
    @idempotent(key="x:{missing}")
    def f(n: int) -> int:
        return n

    with pytest.raises(IdempotencyError, match="names 'missing' which is not an argument"):
        f(1)


def test_the_context_manager_guards_a_block():
    for _ in range(3):
        with idempotent(key="welcome:9", scope="emails") as guard:
            if not guard.done:
                JobEffect.objects.create(label="sent")
                guard.result = {"sent": True}

    assert effects() == ["sent"]
    assert guard.done and guard.result == {"sent": True}


def test_an_expired_key_runs_again():
    charge(5, 10)
    IdempotencyKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    assert charge(5, 10)["effects"] == 2
    assert effects() == ["charge 5", "charge 5"]
    assert IdempotencyKey.objects.get().expires_at > timezone.now()


def test_ttl_sets_the_expiry():
    @idempotent(key="short:{n}", ttl=timedelta(minutes=5))
    def short(n: int) -> int:
        return n

    short(1)
    stored = IdempotencyKey.objects.get()
    assert timedelta(minutes=4) < stored.expires_at - stored.completed_at <= timedelta(minutes=5)


def test_inside_an_outer_transaction_the_key_rolls_back_with_it():
    with pytest.raises(Boom), transaction.atomic():
        charge(11, 1)
        raise Boom

    assert IdempotencyKey.objects.count() == 0
    assert charge(11, 1)["effects"] == 1


def test_a_decorated_django_q2_task_runs_once_per_key():
    from django_q.tasks import async_task

    for _ in range(2):
        async_task("tests.jobs.test_idempotency.charge", 21, 300, sync=True, save=False)

    assert effects() == ["charge 21"]


@pytest.mark.postgres
def test_fifty_threads_with_one_key_make_one_effect_and_share_its_result():
    started = threading.Barrier(50)
    results: list[dict] = []
    errors: list[BaseException] = []

    @idempotent(key="payout:{n}")
    def payout(n: int) -> dict:
        JobEffect.objects.create(label="payout")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(0.2)")  # the others arrive while this one runs
        return {"payout": n, "by": threading.get_ident()}

    def call() -> None:
        try:
            started.wait()
            results.append(payout(1))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert effects() == ["payout"]
    assert len(results) == 50 and all(result == results[0] for result in results)


@pytest.mark.postgres
def test_a_concurrent_duplicate_runs_after_the_first_rolled_back():
    first_inside = threading.Event()
    release_first = threading.Event()
    outcome: dict[str, object] = {}

    @idempotent(key="once:{n}")
    def once(n: int, fail: bool) -> str:
        JobEffect.objects.create(label=f"fail={fail}")
        if fail:
            first_inside.set()
            release_first.wait(30)
            raise Boom
        return "second"

    def first() -> None:
        try:
            once(1, True)
        except Boom:
            outcome["first"] = "rolled back"
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_inside.wait(30)
    second = threading.Thread(
        target=lambda: (outcome.update(second=once(1, False)), connection.close())
    )
    second.start()
    procs.wait_until(lambda: sessions_waiting_on_a_lock() == 1, timeout=30)  # on the key
    release_first.set()
    thread.join()
    second.join()

    assert outcome == {"first": "rolled back", "second": "second"}
    assert effects() == ["fail=False"]


def sessions_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])
