"""The package's layout: a feature lives in one folder, and a module's layer is read
from its path.

Read with docs/explanation/architecture.md, whose claims these tests check. An import
inside a function counts like one at the top of the module (a lazy import is still a
dependency); a relative import counts as the absolute import it stands for.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_outbox"
TESTS = Path(__file__).resolve().parent

#: Layers, lowest first.
LAYERS = ("base", "config", "models", "sql", "engine", "interface")
#: The feature packages, lowest first: within a layer, a module imports only from its own
#: feature or the ones before it (the streams use jobs' row locks, not the other way).
FEATURES = (
    "signals",
    "lease",
    "transport",
    "jobs",
    "streams",
    "unique",
    "archive",
    "tasks_backend",
)
#: Modules at the root of the package besides ``__init__``, by layer.
ROOT_MODULES = {
    "exceptions": "base",
    "conf": "config",
    "signals": "engine",
    "admin": "interface",
    "apps": "interface",
    "checks": "interface",
    "metrics": "interface",
    "operations": "interface",
    "tasks": "interface",
    "urls": "interface",
}
#: File names that put a module of a feature package in a layer of its own.
ROLE_FILES = {
    "options": "config",
    "models": "models",
    "sql": "sql",
    "admin": "interface",
    "apps": "interface",
    "checks": "interface",
}
#: Packages that are interfaces as a whole (their models and options aside).
INTERFACE_PACKAGES = ("management", "tasks_backend")
#: The most modules one import cycle may hold.
MAX_CYCLE = 5

#: The seams: a model's method that starts engine work imports it inside the method.
#: These are the only imports that point up; every cycle of the package goes through one.
SEAMS = {
    "UniqueJob.enqueue()": ("django_outbox.models.unique", "django_outbox.unique.enqueue"),
    "UniqueJob.dispatch()": ("django_outbox.models.unique", "django_outbox.unique.dispatch"),
    "TaskRecord.perform()": (
        "django_outbox.tasks_backend.models",
        "django_outbox.tasks_backend.execute",
    ),
}
ALLOWED = set(SEAMS.values())


def parts_of(module: str) -> list[str]:
    return module.split(".")[1:]


def layer_name(module: str) -> str:
    """The layer of *module*, read from its path."""
    parts = parts_of(module)
    if not parts or parts[0] == "base":
        return "base"
    if len(parts) == 1 and parts[0] in ROOT_MODULES:
        return ROOT_MODULES[parts[0]]
    if parts[0] == "models":
        return "models"
    if "sql" in parts[1:]:
        return "sql"
    role = ROLE_FILES.get(parts[-1]) if len(parts) > 1 else None
    if role is not None:
        return role
    if parts[0] in INTERFACE_PACKAGES:
        return "interface"
    return "engine"


def layer(module: str) -> int:
    return LAYERS.index(layer_name(module))


def feature(module: str) -> int:
    """The rank of *module*'s feature package in :data:`FEATURES` (-1: none)."""
    parts = parts_of(module)
    return FEATURES.index(parts[0]) if parts and parts[0] in FEATURES else -1


def allowed(a: str, b: str) -> bool:
    """Whether module *a* may import module *b*."""
    if (a, b) in ALLOWED or layer(b) < layer(a):
        return True
    if layer(b) > layer(a):
        return False
    return feature(b) <= feature(a) or layer_name(a) == "interface"


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


def test_no_module_imports_from_a_layer_above_or_a_later_feature():
    refused = sorted(
        f"{a} ({layer_name(a)}) imports {b} ({layer_name(b)})"
        for a, targets in graph().items()
        for b in targets
        if not allowed(a, b)
    )
    assert refused == []


def test_no_module_below_the_interface_imports_the_models_package():
    """Below the interface a model is imported from its own module, so importing one
    model does not import them all (and the engine behind ``UniqueJob``'s methods)."""
    found = sorted(
        a
        for a, targets in graph().items()
        if "django_outbox.models" in targets and layer_name(a) != "interface"
    )
    assert found == []


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles of *edges*: each set of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_largest_import_cycle_is_small_and_goes_through_a_seam():
    cycles = strongly_connected(graph())
    largest = max(cycles, key=len, default=set())
    assert len(largest) <= MAX_CYCLE, f"largest import cycle: {sorted(largest)}"
    for cycle in cycles:
        assert [seam for seam in ALLOWED if set(seam) <= cycle], sorted(cycle)


def test_without_the_seams_the_imports_have_no_cycle():
    edges = {a: {b for b in targets if (a, b) not in ALLOWED} for a, targets in graph().items()}
    assert strongly_connected(edges) == []


@pytest.mark.parametrize("name", sorted(SEAMS))
def test_each_seam_is_an_import_inside_a_method_of_the_model(name):
    model, engine = SEAMS[name]
    tree = ast.parse(modules()[model].read_text())
    top = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert engine not in top and engine in graph()[model]


def test_a_cycle_is_found():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("django_outbox.models.fake", "from django_outbox.streams.run import wake"),
        ("django_outbox.models.fake", "from ..streams.run import wake"),  # relative, too
        ("django_outbox.models.fake", "from ..streams import run"),
        ("django_outbox.jobs.fake", "from django_outbox.streams.run import wake"),  # feature
        ("django_outbox.streams.sql.fake", "from django_outbox.streams.run import wake"),
    ],
)
def test_the_rules_catch_an_import_they_refuse(tmp_path, module, statement):
    """The tests above can fail: an import across the line is reported."""
    fake = tmp_path / "fake.py"
    fake.write_text(f"{statement}\n")
    known = {**modules(), module: fake}
    assert imports(fake, known, module) == {"django_outbox.streams.run"}
    assert not allowed(module, "django_outbox.streams.run")


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("django_outbox", "base"),
        ("django_outbox.base.routing", "base"),
        ("django_outbox.conf", "config"),
        ("django_outbox.unique.options", "config"),
        ("django_outbox.models.groups", "models"),
        ("django_outbox.tasks_backend.models", "models"),
        ("django_outbox.streams.sql.wake_guard", "sql"),
        ("django_outbox.unique.sql", "sql"),
        ("django_outbox.streams.run", "engine"),
        ("django_outbox.unique.checks", "interface"),
        ("django_outbox.tasks_backend.backend", "interface"),
        ("django_outbox.management.commands.outbox_run", "interface"),
    ],
)
def test_the_layer_is_read_from_the_path(module, expected):
    assert layer_name(module) == expected


def test_the_package_root_holds_the_modules_django_users_expect_and_the_features():
    """At the root: the modules a Django app has (apps, models, admin, checks, urls,
    management, migrations) and the public ones; every other module is in a package."""
    root = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert root == set(ROOT_MODULES)
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == {*FEATURES[1:], "base", "models", "management", "migrations"}


# -- the architecture page -------------------------------------------------------------

PAGE = PACKAGE.parent / "docs" / "explanation" / "architecture.md"


def package_of(module: str) -> str:
    """The node of *module* in the page's diagram: the layer for the base, config, models
    and interface layers; the feature package for the SQL and the engine."""
    name = layer_name(module)
    if name in ("sql", "engine"):
        parts = parts_of(module)
        return parts[0] if len(parts) > 1 else name if parts[0] != "signals" else "signals"
    return name


def package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph().items():
        for b in targets:
            if (a, b) not in ALLOWED and package_of(a) != package_of(b):
                edges[package_of(a)].add(package_of(b))
    return edges


def reduced(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The arrows of *edges* not implied by a longer path (its transitive reduction)."""

    def reach(start: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for target in edges.get(node, ()):
                if (node, target) != skip and target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    return {(a, b) for a, targets in edges.items() for b in targets if b not in reach(a, (a, b))}


def test_the_page_draws_every_package_arrow():
    """The mermaid diagram's arrows are the package imports, each drawn once (an arrow
    implied by a longer path is left out)."""
    drawn = set(re.findall(r"^\s+(\w+) --> (\w+)$", PAGE.read_text(), flags=re.M))
    assert drawn == reduced(package_graph())


def test_the_page_lists_every_package_and_root_module_in_its_layers():
    page = PAGE.read_text()
    rows = dict(re.findall(r"^\| `([\w/.]+)` \| ([\w, ]+) \|", page, flags=re.M))
    listed: dict[str, set[str]] = defaultdict(set)
    for name, path in modules().items():
        relative = path.relative_to(PACKAGE)
        key = f"{relative.parts[0]}/" if len(relative.parts) > 1 else relative.as_posix()
        if key != "__init__.py":
            listed[key].add(layer_name(name))
    order = {name: index for index, name in enumerate(LAYERS)}
    assert rows == {k: ", ".join(sorted(v, key=order.__getitem__)) for k, v in listed.items()}


def test_the_page_states_the_largest_cycle():
    largest = max(strongly_connected(graph()), key=len, default=set())
    assert f"at most {MAX_CYCLE} modules (today {len(largest)})" in PAGE.read_text()


def test_every_test_file_lives_with_its_package_or_tier():
    """Tests follow the packages: ``tests/<package>/`` for a feature, ``tests/`` for the
    root modules, ``tests/processes/`` for the process tier, ``tests/docs/`` for the docs."""
    folders = {p.parent.name for p in TESTS.rglob("test_*.py")} - {TESTS.name}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders <= packages | {"processes", "docs"}
    for path in TESTS.glob("test_*.py"):
        stem = path.stem.removeprefix("test_")
        expected = {*ROOT_MODULES, "architecture", "pg", "commands", "migrations"}
        assert stem.split("_")[0] in expected, path


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
    "django_outbox.streams.batch",
    "django_outbox.exceptions",
    "django_outbox.jobs.idempotency",
    "django_outbox.streams.inline",
    "django_outbox.jobs.locking",
    "django_outbox.metrics",
    "django_outbox.models",
    "django_outbox.models.unique",
    "django_outbox.operations",
    "django_outbox.streams.publish",
    "django_outbox.archive.replay",
    "django_outbox.streams.run",
    "django_outbox.streams.steer",
    "django_outbox.signals",
    "django_outbox.jobs.staging",
    "django_outbox.tasks",
    "django_outbox.tasks_backend",
    "django_outbox.tasks_backend.backend",
    "django_outbox.base.tracing",
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
    from django_outbox.streams.run import _wake_on_save

    def ours(signal, sender):
        sync, asynchronous = signal._live_receivers(sender)
        return [r for r in [*sync, *asynchronous] if r.__module__.startswith("django_outbox")]

    for signal in (signals.pre_save, signals.post_save, signals.pre_delete, signals.post_delete):
        assert ours(signal, ContentType) == []
    assert ours(signals.post_save, OutboxEvent) == [_wake_on_save]


def test_every_public_name_of_the_package_is_importable_from_it():
    """``from django_outbox import stage_task``: each name of ``__all__`` resolves, to the
    object of the module that defines it."""
    import importlib

    import django_outbox

    for name in django_outbox.__all__:
        module = importlib.import_module(django_outbox._LAZY[name])
        assert getattr(django_outbox, name) is getattr(module, name), name
