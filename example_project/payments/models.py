"""The transfer-funds scenario: balances moved once per transfer request."""

from __future__ import annotations

from django.db import models


class Account(models.Model):
    owner = models.CharField(max_length=100)
    balance = models.BigIntegerField(help_text="In cents.")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(balance__gte=0), name="payments_balance_not_negative"
            )
        ]

    def __str__(self) -> str:
        return f"{self.owner}: {self.balance / 100:.2f}"


class Transfer(models.Model):
    """One applied transfer; the request id is what a client retries with."""

    request_id = models.CharField(max_length=64, unique=True)
    source = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+")
    target = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+")
    amount = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.request_id}: {self.amount} from {self.source_id} to {self.target_id}"
