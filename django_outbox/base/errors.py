"""Errors as they are stored and shown: clipped to a bound, the traceback's ends kept."""

from __future__ import annotations

import traceback

#: Stored errors keep at most this many characters (their first line and their end).
ERROR_LIMIT = 4000
#: A cut error keeps at most this many characters of its first line.
HEAD_LIMIT = 200


def _cut_mark(characters: int) -> str:
    return f"\n… [{characters} characters cut] …\n"


def clip(error: str, limit: int = ERROR_LIMIT) -> str:
    """*error* cut to at most *limit* characters: its first line (a caller's label, or a
    traceback's first line; at most ``HEAD_LIMIT`` characters of it) and its end (a
    traceback's last line names the exception) are kept, and the cut between them says
    how many characters it took out. An error that fits is returned as it is, so
    clipping twice to the same limit changes nothing."""
    error = str(error)
    if len(error) <= limit:
        return error
    head = error.split("\n", 1)[0][: min(HEAD_LIMIT, limit // 4)]
    room = limit - len(head) - len(_cut_mark(len(error)))  # the mark's longest form
    if room <= 0:
        return error[-limit:]
    tail = error[-room:]
    return head + _cut_mark(len(error) - len(head) - len(tail)) + tail


def describe(exc: BaseException, limit: int = ERROR_LIMIT, *, label: str = "") -> str:
    """*label* followed by the traceback of *exc*, as it is stored with the failed
    attempt: clipped once, as a whole, so the label survives a long traceback."""
    return clip(label + "".join(traceback.format_exception(exc)).strip(), limit)


def last_line(error: str) -> str:
    """The last line of an error (a traceback's exception line), for logs and lists."""
    lines = (error or "").strip().splitlines()
    return lines[-1] if lines else ""
