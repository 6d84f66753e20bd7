"""Declarative option tables: each option's name, default, type, bounds, check id and hint.

The effective configuration (:mod:`django_outbox.conf`, :mod:`django_outbox.unique.options`)
and the system checks (:mod:`django_outbox.checks`, :mod:`django_outbox.unique.checks`)
both come from these tables. An option whose value needs more than a test to check (a
dotted path, a model, field names) has a kind made by :func:`checked_apart`: its check is
written out where it is checked, and its default and type come from here. Every option
declares its kind: the settings reference shows it as the option's type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, eq=False)
class Kind:
    """A type of option: its test, and the message and hint of a value that fails it.

    ``{value}``, ``{default}`` and ``{name}`` are filled in; the message is prefixed
    with where the option is set. *choices* are the values of a :func:`choice`. Two
    kinds are the same kind only if they are the same object.
    """

    test: Callable[[Any], bool]
    message: str
    hint: str
    choices: tuple[str, ...] = ()


POSITIVE_INT = Kind(
    is_positive_int,
    "must be a positive integer, not {value!r}.",
    "Remove it to use the default ({default}) or give a whole number greater than 0.",
)
POSITIVE_NUMBER = Kind(
    is_positive_number,
    "must be a positive number of seconds, not {value!r}.",
    "Remove it to use the default ({default}) or give a number greater than 0.",
)
OPTIONAL_POSITIVE_NUMBER = Kind(
    lambda value: value is None or is_positive_number(value),
    "must be a positive number or None, not {value!r}.",
    "Remove it to use the default ({default}) or give a number greater than 0.",
)
OPTIONAL_POSITIVE_INT = Kind(
    lambda value: value is None or is_positive_int(value),
    "must be a positive integer or None, not {value!r}.",
    "Remove it to use the default ({default}) or give a whole number greater than 0.",
)
BOOL = Kind(
    lambda value: isinstance(value, bool),
    "must be True or False, not {value!r}.",
    "Remove it to use the default ({default}).",
)
CLUSTER = Kind(
    lambda value: value is None or (isinstance(value, str) and bool(value)),
    "must be a django-q2 cluster name or None, not {value!r}.",
    "Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
)
MODULE_LIST = Kind(
    lambda value: (
        isinstance(value, (list, tuple))
        and all(isinstance(prefix, str) and prefix.strip(".") for prefix in value)
    ),
    "must be a list of module paths, not {value!r}.",
    'List the modules whose functions may be staged, for example ["shop.tasks", "billing.jobs"].',
)
TOKEN = Kind(
    lambda value: value is None or (isinstance(value, str) and len(value) >= 16),
    "must be None or a string of at least 16 characters.",
    "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe())' and read "
    "it from the environment, not from the source.",
)


def checked_apart() -> Kind:
    """A kind whose values are checked by code of their own where the table is used."""
    return Kind(lambda value: True, "", "")


#: The dotted path of a callable (HANDLER: checks E010 to E012).
CALLABLE_PATH = checked_apart()
#: The dotted path of a callable, or None (ON_EXHAUSTED: checks E013, E014).
OPTIONAL_CALLABLE_PATH = checked_apart()
#: ``app_label.ModelName`` of a model (a stream's buffer model: checks E020 to E022).
MODEL_LABEL = checked_apart()
#: An alias of ``settings.DATABASES``, or None (check E025).
DATABASE_ALIAS = checked_apart()
#: The name of a field of the model, or None (ORDER_KEY, a kind's priority, result and
#: workers fields: checks E023, E080 to E082).
OPTIONAL_FIELD_NAME = checked_apart()
#: Names of fields of the model (a kind's unique fields: checks E071 to E073).
FIELD_NAMES = checked_apart()
#: Names of fields of the model, or None (a kind's exclusive fields: checks E071 to E073).
OPTIONAL_FIELD_NAMES = checked_apart()
#: A dict of option blocks by name (``STREAMS``: checks E003 to E006).
BLOCKS_BY_NAME = checked_apart()
#: A dict of options (``STAGING``, ``IDEMPOTENCY``: checks E050, E051).
BLOCK = checked_apart()
#: An option declared without a kind: the settings reference refuses it.
CUSTOM = checked_apart()


def choice(*choices: str, hint: str) -> Kind:
    """One of *choices*."""
    listed = " or ".join(repr(c) for c in choices)
    return Kind(
        lambda value: value in choices, f"must be {listed}, not {{value!r}}.", hint, choices
    )


@dataclass(frozen=True)
class Option:
    """One option: *name* as written in settings, its default, kind and check id.

    *hint* replaces the kind's hint; *maximum* bounds a number, checked as
    *maximum_check* with *maximum_hint*.
    """

    name: str
    default: Any
    kind: Kind = CUSTOM
    check: str = ""
    hint: str | None = None
    maximum: int | None = None
    maximum_check: str = ""
    maximum_hint: str = ""

    @property
    def attr(self) -> str:
        """The attribute of the effective configuration that holds it."""
        return self.name.lower()


@dataclass(frozen=True)
class Problem:
    """A bad option value: its check id, message and hint."""

    check: str
    message: str
    hint: str


class OptionTable:
    """The options of one settings block (a stream, ``STAGING``, a job kind…)."""

    def __init__(self, *options: Option) -> None:
        self.options = options
        self.by_name = {option.name: option for option in options}

    def __iter__(self) -> Iterator[Option]:
        return iter(self.options)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    @property
    def defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.options}

    def merged(self, given: dict[str, Any]) -> dict[str, Any]:
        """*given* over the defaults, by option name."""
        return {**self.defaults, **given}

    def effective(self, given: dict[str, Any]) -> dict[str, Any]:
        """The merged values by attribute name, for the configuration's dataclass."""
        merged = self.merged(given)
        return {option.attr: merged[option.name] for option in self.options}

    def unknown(self, given: dict[str, Any], *, also: tuple[str, ...] = ()) -> list[str]:
        """The names in *given* that are not options (nor in *also*), sorted."""
        return sorted(str(name) for name in set(given) - set(self.by_name) - set(also))

    def unknown_problems(
        self, given: dict[str, Any], *, where: str, check: str, noun: str = "options", **kw: Any
    ) -> list[Problem]:
        """The names in *given* that are not options, as one problem (or none)."""
        unknown = self.unknown(given, **kw)
        if not unknown:
            return []
        known = ", ".join(sorted(self.by_name))
        return [
            Problem(
                check,
                f"{where} has unknown {noun}: {', '.join(unknown)}.",
                f"Known {noun}: {known}.",
            )
        ]

    def problems(self, given: dict[str, Any], where: Callable[[str], str]) -> list[Problem]:
        """Every value of *given* (over the defaults) its kind or bound refuses.

        *where* turns an option's name into the place it is set, for the message:
        ``DJANGO_OUTBOX['STREAMS']['audit']['BATCH_SIZE']``, ``blogs.Rebuild.Job.concurrency``.
        """
        merged = self.merged(given)
        found = []
        for option in self.options:
            value = merged[option.name]
            fill = {"value": value, "default": option.default, "name": option.name}
            if not option.kind.test(value):
                found.append(
                    Problem(
                        option.check,
                        f"{where(option.name)} {option.kind.message.format(**fill)}",
                        (option.hint or option.kind.hint).format(**fill),
                    )
                )
            elif option.maximum is not None and value is not None and value > option.maximum:
                found.append(
                    Problem(
                        option.maximum_check,
                        f"{where(option.name)} is {value:,}, above the most allowed "
                        f"({option.maximum:,}).",
                        option.maximum_hint.format(maximum=f"{option.maximum:,}"),
                    )
                )
        return found
