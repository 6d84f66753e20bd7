"""Exceptions raised by django_outbox at the call site."""

from __future__ import annotations

__all__ = [
    "DurationError",
    "IdempotencyError",
    "JobError",
    "LeaseLost",
    "NotInTransaction",
    "OutboxError",
    "PayloadError",
    "PermanentFailure",
    "RetryAfter",
    "StagingError",
    "UnknownStream",
    "WrongBufferModel",
]


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


class RetryAfter(OutboxError):
    """Raise (or return) from a handler when the service asks to wait: a 429, a 503 with
    ``Retry-After``.

    The whole stream pauses for *seconds*: no handler call of the stream starts before
    the pause ends, in any worker. Each call is preceded by a read of the pause in the
    database's clock right before the handler is called, besides the check in the
    statement that hands its worker the group (a claim, a lease's take, a budget's
    slot): a group another run holds and has not handed to the handler goes back to
    the queue instead. Calls that had started when the pause
    began finish. The group goes back to the queue, due when the pause ends, with its
    attempt unchanged (a pause is not a failure: it spends no attempt and never splits
    the group), and so do the groups held back by it. *seconds* is a number of seconds
    greater than 0 (at most a day).
    """

    #: The longest pause a handler may ask for.
    MAX_SECONDS = 86_400.0

    def __init__(self, seconds: float, reason: str = "") -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not (0 < seconds <= self.MAX_SECONDS)
        ):
            raise ValueError(
                f"RetryAfter takes a number of seconds greater than 0 and at most "
                f"{self.MAX_SECONDS:,.0f}, not {seconds!r}."
            )
        self.seconds = float(seconds)
        self.reason = reason
        super().__init__(f"retry after {self.seconds:g} s" + (f": {reason}" if reason else ""))


class LeaseLost(OutboxError):
    """The lease of an attempt was lost: another worker took the work over, or it was
    finalized. The worker must stop and change nothing.

    ``key`` is the id of what ran (a group id, a job id), ``attempt`` the attempt whose
    lease was lost, ``what`` the kind of thing (``"group"``, a unique-job kind's label).
    """

    def __init__(self, key: object, attempt: int, *, what: str = "group") -> None:
        self.key = key
        self.attempt = attempt
        self.what = what
        super().__init__(
            f"Lease of {what} {key} (attempt {attempt}) is lost: another worker took it "
            "over or it was finalized. This worker must stop without side effects."
        )


class StagingError(OutboxError, ValueError):
    """A job that cannot be staged: a function outside the allow-list, or non-JSON input."""


class JobError(OutboxError, ValueError):
    """A unique job that cannot be enqueued as asked (a managed field, a naive datetime)."""


class IdempotencyError(OutboxError, TypeError):
    """An idempotency key or result that cannot be used: the guarded work is rolled back."""


class NotInTransaction(OutboxError, RuntimeError):
    """A helper that must run inside (or outside) a transaction was called otherwise."""


class DurationError(OutboxError, ValueError):
    """A duration (a ``ttl``, a delay) that is negative, not a finite number, or too long."""
