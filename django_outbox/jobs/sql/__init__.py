"""The SQL of staged jobs and idempotency keys."""
