"""Errors as they are stored: one clipping rule that keeps the label and the end."""

from __future__ import annotations

import re

from django_outbox.base.errors import ERROR_LIMIT, clip, describe


def long_failure() -> ValueError:
    """A ValueError raised from a cause whose message makes the traceback long."""
    try:
        try:
            raise KeyError("x" * (3 * ERROR_LIMIT))
        except KeyError as cause:
            raise ValueError("the exception's own line") from cause
    except ValueError as exc:
        return exc


def test_a_long_traceback_keeps_its_label_and_its_last_line_and_says_what_was_cut():
    error = describe(long_failure(), label="finalize failed: ")

    assert len(error) <= ERROR_LIMIT
    assert error.startswith("finalize failed: Traceback (most recent call last):\n")
    assert error.endswith("ValueError: the exception's own line")
    mark = re.search(r"\n… \[(\d+) characters cut\] …\n", error)
    head, tail = error[: mark.start()], error[mark.end() :]
    whole = describe(long_failure(), 10 * ERROR_LIMIT, label="finalize failed: ")
    assert whole == head + whole[len(head) : len(whole) - len(tail)] + tail
    assert int(mark.group(1)) == len(whole) - len(head) - len(tail)


def test_clipping_a_clipped_error_again_changes_nothing():
    error = describe(long_failure(), label="finalize failed: ")

    assert clip(error) == error


def test_a_shorter_limit_still_keeps_the_label():
    error = clip(describe(long_failure(), label="Dead-lettering failed: "), 500)

    assert len(error) <= 500
    assert error.startswith("Dead-lettering failed: Traceback")
    assert error.endswith("ValueError: the exception's own line")


def test_an_error_that_fits_is_stored_as_it_is():
    assert clip("finalize failed: boom") == "finalize failed: boom"
