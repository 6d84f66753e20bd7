"""The example's transfer-funds scenario: once per request, no deadlock, balance kept."""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import connection
from payments.models import Account, Transfer
from payments.services import InsufficientFunds, transfer_funds

from django_outbox.models import IdempotencyKey

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def accounts() -> tuple[Account, Account]:
    return Account.objects.create(owner="Ada", balance=10_000), Account.objects.create(
        owner="Bob", balance=10_000
    )


def balances() -> list[int]:
    return list(Account.objects.order_by("pk").values_list("balance", flat=True))


def test_a_transfer_moves_money_once_per_request(accounts):
    ada, bob = accounts

    first = transfer_funds("req-1", ada.pk, bob.pk, 2_500)
    again = transfer_funds("req-1", ada.pk, bob.pk, 2_500)

    assert first == again == {"transfer": Transfer.objects.get().pk, "source_balance": 7_500}
    assert balances() == [7_500, 12_500]


def test_insufficient_funds_keep_nothing_and_the_request_can_be_retried(accounts):
    ada, bob = accounts

    with pytest.raises(InsufficientFunds):
        transfer_funds("req-2", ada.pk, bob.pk, 20_000)
    assert balances() == [10_000, 10_000]
    assert not IdempotencyKey.objects.exists() and not Transfer.objects.exists()

    Account.objects.filter(pk=ada.pk).update(balance=30_000)
    transfer_funds("req-2", ada.pk, bob.pk, 20_000)
    assert balances() == [10_000, 30_000]


@pytest.mark.postgres
def test_opposite_transfers_in_parallel_loops_never_deadlock_and_keep_the_total(accounts, caplog):
    ada, bob = accounts
    caplog.set_level(logging.WARNING, logger="django_outbox")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def loop(direction: str, source: int, target: int) -> None:
        try:
            start.wait()
            for n in range(150):
                transfer_funds(f"{direction}-{n}", source, target, 7)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=loop, args=("ab", ada.pk, bob.pk)),
        threading.Thread(target=loop, args=("ba", bob.pk, ada.pk)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    # retry_on_conflict would hide a deadlock by running the transfer again: it logs each.
    assert [r.getMessage() for r in caplog.records if "Transient error" in r.getMessage()] == []
    assert Transfer.objects.count() == 300
    assert sum(balances()) == 20_000
    assert balances() == [10_000, 10_000]  # as much went each way
