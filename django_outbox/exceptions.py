"""Exceptions raised by django_outbox at the call site."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error django_outbox raises on purpose."""


class UnknownStream(OutboxError, LookupError):
    """A stream name that is not configured in ``DJANGO_OUTBOX["STREAMS"]``."""

    def __init__(self, name: str, known: list[str] | tuple[str, ...] = ()) -> None:
        self.name = name
        hint = f" Configured streams: {', '.join(sorted(known))}." if known else ""
        super().__init__(f"Unknown outbox stream {name!r}.{hint}")


class PayloadError(OutboxError, TypeError):
    """A payload that cannot be stored as JSON."""


class WrongBufferModel(OutboxError):
    """``publish()`` called for a stream whose buffer is a custom model."""


class PermanentFailure(OutboxError):
    """Raise from a handler when retrying cannot help: the group is dead-lettered now.

    The remaining attempts are skipped; the rows are archived as ``failed`` with this
    error (after the stream's ``ON_EXHAUSTED`` hook), ready for ``outbox_replay``.
    """


class LeaseLost(OutboxError):
    """The group's lease was taken over by another worker; stop and change nothing."""

    def __init__(self, group_id: object, attempt: int) -> None:
        self.group_id = group_id
        self.attempt = attempt
        super().__init__(
            f"Lease of group {group_id} (attempt {attempt}) is lost: another worker took it "
            "over or it was finalized. This worker must stop without side effects."
        )


class StagingError(OutboxError, ValueError):
    """A job that cannot be staged: a function outside the allow-list, or non-JSON input."""


class JobError(OutboxError, ValueError):
    """A unique job that cannot be enqueued as asked (a managed field, a naive datetime)."""


class JobLeaseLost(LeaseLost):
    """A unique job's lease was lost: another attempt took over, or the job finished."""

    def __init__(self, kind: str, job_id: int, attempt: int) -> None:
        self.kind = kind
        self.job_id = job_id
        self.group_id = job_id
        self.attempt = attempt
        OutboxError.__init__(
            self,
            f"Lease of {kind} #{job_id} (attempt {attempt}) is lost: the job was rescued "
            "and started again, or finished. This worker must stop without side effects.",
        )


class IdempotencyError(OutboxError, TypeError):
    """An idempotency key or result that cannot be used: the guarded work is rolled back."""


class NotInTransaction(OutboxError, RuntimeError):
    """A helper that must run inside (or outside) a transaction was called otherwise."""


class DurationError(OutboxError, ValueError):
    """A duration (a ``ttl``, a delay) that is negative, not a finite number, or too long."""
