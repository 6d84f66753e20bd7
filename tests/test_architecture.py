"""The package's layers: a module imports only from its own layer or the layers below.

Read with the Architecture section of docs/explanation/architecture.md. An import inside
a function counts like one at the top of the module: a lazy import is still a dependency.
A relative import counts as the absolute import it stands for.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_outbox"

#: Layers, lowest first. A module not named here belongs to the engine.
BASE = {
    "django_outbox",
    "django_outbox.exceptions",
    "django_outbox.options",
    "django_outbox.durations",
    "django_outbox.jsondata",
    "django_outbox.backoff",
    "django_outbox.oncommit",
    "django_outbox.tracing",
    "django_outbox.db.dialect",
    "django_outbox.db.transient",
    "django_outbox.routing",
    "django_outbox.unique",
}
CONFIG = {"django_outbox.conf", "django_outbox.unique.options"}
INTERFACE = {
    "django_outbox.admin",
    "django_outbox.apps",
    "django_outbox.checks",
    "django_outbox.unique.checks",
    "django_outbox.metrics",
    "django_outbox.tasks",
    "django_outbox.urls",
    "django_outbox.management",
    "django_outbox.management.commands",
}
LAYERS = ("base", "config", "models", "sql", "engine", "interface")

#: The import cycles allowed, by what closes each: one lazy import upward, from a model
#: to the engine. ``UniqueJob.enqueue()`` and ``UniqueJob.dispatch()`` reach the engine
#: through a lazy accessor; so do the task kind's ``perform()`` (the task runner) and its
#: options (read from ``TASKS``). Every other import points down, so every cycle of the
#: package goes through the first edge of one of these (the shortest such cycle is named).
ALLOWED_CYCLES = {
    "UniqueJob.enqueue()": (
        "django_outbox.models.unique",
        "django_outbox.unique.enqueue",
        "django_outbox.models.unique",
    ),
    "UniqueJob.dispatch()": (
        "django_outbox.models.unique",
        "django_outbox.unique.dispatch",
        "django_outbox.models.unique",
    ),
    "TaskRecord.perform()": (
        "django_outbox.tasks_backend.models",
        "django_outbox.tasks_backend.execute",
        "django_outbox.tasks_backend.backend",
        "django_outbox.tasks_backend.models",
    ),
    "the task kind's options": (
        "django_outbox.tasks_backend.models",
        "django_outbox.tasks_backend.options",
        "django_outbox.tasks_backend.models",
    ),
}
#: The upward imports allowed: the first edge of each allowed cycle.
ALLOWED = {(cycle[0], cycle[1]) for cycle in ALLOWED_CYCLES.values()}
#: The django.tasks backend is an interface over the engine, with a model of its own.
TASKS_BACKEND = "django_outbox.tasks_backend"


def layer(module: str) -> int:
    if module in BASE:
        return 0
    if module in CONFIG:
        return 1
    if module == "django_outbox.models" or module.startswith("django_outbox.models."):
        return 2
    if module == f"{TASKS_BACKEND}.models":
        return 2
    if module == TASKS_BACKEND or module.startswith(f"{TASKS_BACKEND}."):
        return 5
    if module == "django_outbox.db" or module.startswith("django_outbox.db."):
        return 3
    if module in INTERFACE or module.startswith("django_outbox.management."):
        return 5
    return 4


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, known: dict[str, Path], name: str) -> set[str]:
    """Every django_outbox module *path* (module *name*) imports at run time, anywhere in
    the file; a relative import counts as the absolute one it stands for.

    ``if TYPE_CHECKING:`` blocks are left out: they are never executed.
    """
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # a submodule, or a name of the module itself
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
    return found & set(known)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known, name) - {name} for name, path in known.items()}


def test_no_module_imports_from_a_layer_above_its_own():
    upward = sorted(
        f"{a} ({LAYERS[layer(a)]}) imports {b} ({LAYERS[layer(b)]})"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a) and (a, b) not in ALLOWED
    )
    assert upward == []


def cycles(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                found.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_the_imports_have_no_cycle_but_the_allowed_ones():
    """Without the first edge of each allowed cycle, the imports have no cycle at all."""
    edges = {a: {b for b in targets if (a, b) not in ALLOWED} for a, targets in graph().items()}
    assert cycles(edges) == []


def shortest_path(edges: dict[str, set[str]], source: str, target: str) -> tuple[str, ...]:
    paths, queue = {source: (source,)}, [source]
    while queue:
        node = queue.pop(0)
        for following in sorted(edges[node]):
            if following == target:
                return (*paths[node], following)
            if following not in paths:
                paths[following] = (*paths[node], following)
                queue.append(following)
    return ()


@pytest.mark.parametrize("name", sorted(ALLOWED_CYCLES))
def test_each_allowed_cycle_is_as_named(name):
    """The shortest way back from each allowed upward import is the cycle named above."""
    start, first, *_ = ALLOWED_CYCLES[name]
    edges = graph()
    assert first in edges[start]
    assert (start, *shortest_path(edges, first, start)) == ALLOWED_CYCLES[name]


def test_a_new_cycle_is_reported():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == ["a -> b -> c -> a"]


@pytest.mark.parametrize(
    "statement",
    [
        "from django_outbox.runs import wake",
        "from ..runs import wake",  # relative imports follow the same rules
        "from .. import runs",
    ],
)
def test_the_layer_rules_catch_an_upward_import(tmp_path, statement):
    """The test above can fail: a model importing the engine is reported."""
    fake = {"django_outbox.models.fake": tmp_path / "fake.py"}
    fake["django_outbox.models.fake"].write_text(f"{statement}\n")
    known = {**modules(), **fake}
    found = imports(fake["django_outbox.models.fake"], known, "django_outbox.models.fake")
    assert found == {"django_outbox.runs"}
    assert layer("django_outbox.runs") > layer("django_outbox.models.fake")


def test_the_architecture_page_lists_every_module_in_its_layer():
    """One row per module (``management/commands/`` as one), with the layer enforced here."""
    page = (PACKAGE.parent / "docs" / "explanation" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `([\w/.]+)` \| (\w+) \|", page, flags=re.M))
    listed = {}
    for name, path in modules().items():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("management/"):
            relative = "management/commands/"
        listed[relative] = LAYERS[layer(name)]
    assert rows == listed


@pytest.mark.parametrize("statement", ["import django_outbox"])
def test_importing_the_package_loads_nothing_else(statement):
    """``import django_outbox`` (a settings file, INSTALLED_APPS) stays cheap: no
    submodule, no Django ORM."""
    code = (
        f"{statement}; import sys; "
        "print(sorted(m for m in sys.modules if m.startswith('django_outbox') "
        "or m.startswith('django.db')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['django_outbox']"


# -- the public API ----------------------------------------------------------------

#: The modules a project imports from (the Python API reference, the task paths of
#: django-q2, the signals): each declares its public names in ``__all__``.
PUBLIC = (
    "django_outbox",
    "django_outbox.batch",
    "django_outbox.exceptions",
    "django_outbox.idempotency",
    "django_outbox.inline",
    "django_outbox.locking",
    "django_outbox.metrics",
    "django_outbox.models",
    "django_outbox.models.unique",
    "django_outbox.operations",
    "django_outbox.publishing",
    "django_outbox.replay",
    "django_outbox.runs",
    "django_outbox.signals",
    "django_outbox.staging",
    "django_outbox.tasks",
    "django_outbox.tasks_backend",
    "django_outbox.tasks_backend.backend",
    "django_outbox.tracing",
)


def declared(name: str) -> tuple[list[str] | None, set[str]]:
    """The ``__all__`` of module *name* and every name its top level binds (imports too)."""
    tree = ast.parse(modules()[name].read_text())
    public, bound = None, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            public = ast.literal_eval(node.value)
    for node in tree.body:
        inner = node.body if isinstance(node, ast.If) else [node]  # if TYPE_CHECKING
        for item in inner:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(item.name)
            elif isinstance(item, (ast.Import, ast.ImportFrom)):
                bound.update((alias.asname or alias.name).split(".")[0] for alias in item.names)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                bound.update(ast.unparse(target) for target in targets)
    return public, bound


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_module_declares_its_public_names(name):
    public, bound = declared(name)
    assert public is not None, f"{name} has no __all__"
    assert public == sorted(set(public))
    assert [attr for attr in public if attr not in bound] == []


def test_the_api_reference_documents_only_public_names():
    """Every ``::: module.name`` of the API reference is in its module's ``__all__``."""
    reference = (PACKAGE.parent / "docs" / "reference" / "api.md").read_text()
    entries = re.findall(r"^::: (django_outbox[\w.]*)$", reference, flags=re.M)
    assert entries
    outside = []
    for entry in entries:
        if entry in PUBLIC:
            continue
        module, _, attr = entry.rpartition(".")
        if module not in PUBLIC or attr not in (declared(module)[0] or []):
            outside.append(entry)
    assert outside == []


def test_every_module_logs_through_its_own_logger():
    """``getLogger(__name__)``: a child of ``django_outbox``, named after its module."""
    shared = sorted(
        f"{name}: {ast.unparse(node)}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("logging.getLogger", "getLogger")
        and [ast.unparse(arg) for arg in node.args] != ["__name__"]
    )
    assert shared == []


def test_the_model_signal_receivers_listen_to_buffer_models_only():
    """A save of any other model (a ContentType here) calls no receiver of the app."""
    from django.contrib.contenttypes.models import ContentType
    from django.db.models import signals

    from django_outbox.models import OutboxEvent
    from django_outbox.runs import _wake_on_save

    def ours(signal, sender):
        sync, asynchronous = signal._live_receivers(sender)
        return [r for r in [*sync, *asynchronous] if r.__module__.startswith("django_outbox")]

    for signal in (signals.pre_save, signals.post_save, signals.pre_delete, signals.post_delete):
        assert ours(signal, ContentType) == []
    assert ours(signals.post_save, OutboxEvent) == [_wake_on_save]
