"""Jobs: transactionally staged jobs, idempotency keys, row locks in a fixed order."""
