"""Move money once per transfer request, without deadlocks, whatever retries happen."""

from __future__ import annotations

from typing import Any

# --8<-- [start:transfer]
from django_outbox.jobs.idempotency import idempotent
from django_outbox.jobs.locking import lock_rows, retry_on_conflict
from payments.models import Account, Transfer


class InsufficientFunds(Exception):
    pass


@retry_on_conflict
@idempotent(key="transfer:{request_id}")
def transfer_funds(request_id: str, source_id: int, target_id: int, amount: int) -> dict[str, Any]:
    """Move *amount* cents from one account to another, once per *request_id*.

    A repeated request (a client retry, a job delivered twice) returns the first result.
    Both accounts are locked in primary-key order, so two opposite transfers wait for
    each other instead of deadlocking. Insufficient funds raise; nothing is kept, and the
    same request may be retried later.
    """
    if amount <= 0 or source_id == target_id:
        raise ValueError("A transfer moves a positive amount between two accounts.")
    accounts = {account.pk: account for account in lock_rows(Account, [source_id, target_id])}
    source, target = accounts[source_id], accounts[target_id]
    if source.balance < amount:
        raise InsufficientFunds(f"Account {source_id} holds {source.balance}, not {amount}.")
    source.balance -= amount
    target.balance += amount
    Account.objects.bulk_update([source, target], ["balance"])
    transfer = Transfer.objects.create(
        request_id=request_id, source=source, target=target, amount=amount
    )
    return {"transfer": transfer.pk, "source_balance": source.balance}


# --8<-- [end:transfer]
