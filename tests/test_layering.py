"""The layering, read from the import statements of every module of the library: the core
never reaches a concrete backend or runtime, the Scheduler stands on records alone, only the
command line imports the command line, the backend interface loads backends lazily, and no
import cycle (through any import: module-level, typing-only or inside a function) crosses a
package or runs through the fake pyACL."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "inferchain"
MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))

Import = tuple[int, str]  # (line, dotted name imported: a module, or module.attribute)


def module_name(rel: str) -> str:
    parts = ["inferchain", *rel.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """What the statement imports: `import a.b` -> a.b; `from a import b` -> a.b (also for
    relative imports, resolved against `module`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """The statements run when the module is imported: its body and `if TYPE_CHECKING:`."""
    for stmt in tree.body:
        yield stmt
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            yield from stmt.body


def imports_of(
    source: str, module: str, *, is_package: bool = False, top_level: bool = False
) -> list[Import]:
    """Every import in `source` (only module-level ones with `top_level`)."""
    tree = ast.parse(source)
    nodes: Iterable[ast.AST] = module_level(tree) if top_level else ast.walk(tree)
    found: list[Import] = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend((node.lineno, t) for t in targets(node, module, is_package))
    return found


def imports(rel: str, *, top_level: bool = False) -> list[Import]:
    source = (PACKAGE / rel).read_text(encoding="utf-8")
    return imports_of(
        source, module_name(rel), is_package=rel.endswith("__init__.py"), top_level=top_level
    )


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# -- the checker itself -----------------------------------------------------------------------


def test_the_checker_sees_every_kind_of_import_and_tells_module_level_from_local() -> None:
    source = (
        "import os.path\n"
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..errors import Boom\n"
        "if TYPE_CHECKING:\n"
        "    from inferchain.cli import main\n"
        "def f():\n"
        "    import onnxruntime\n"
    )
    everything = [t for _, t in imports_of(source, "inferchain.core.scheduler")]
    assert everything == [
        "os.path",
        "typing.TYPE_CHECKING",
        "inferchain.core.sibling",
        "inferchain.errors.Boom",
        "inferchain.cli.main",
        "onnxruntime",
    ]
    top = [t for _, t in imports_of(source, "inferchain.core.scheduler", top_level=True)]
    assert top == everything[:-1]
    from_init = imports_of("from .base import X\n", "inferchain.backends", is_package=True)
    assert from_init == [(1, "inferchain.backends.base.X")]


def test_every_layer_is_found() -> None:
    for rel in ("cli/__init__.py", "core/scheduler.py", "backends/base.py", "integrations/ray.py"):
        assert rel in MODULES


# -- the layering -----------------------------------------------------------------------------

CORE = [m for m in MODULES if m.startswith("core/")]


@pytest.mark.parametrize("rel", CORE)
def test_the_core_reaches_backends_only_through_the_interface(rel: str) -> None:
    """No concrete backend, no runtime: from `inferchain.backends` only `base`."""
    bad = [
        (line, name)
        for line, name in imports(rel)
        if within(name, "onnxruntime", "openvino", "acl")
        or (within(name, "inferchain.backends") and not within(name, "inferchain.backends.base"))
    ]
    assert not bad, f"inferchain/{rel} imports {bad}"


SCHEDULER_MAY_IMPORT = (
    "inferchain.core.request",
    "inferchain.core.work",
    "inferchain.core.records",
    "inferchain.config",
    "inferchain.errors",
)


def test_the_scheduler_imports_only_records_config_errors_and_the_stdlib() -> None:
    bad = [
        (line, name)
        for line, name in imports("core/scheduler.py")
        if not within(name, *SCHEDULER_MAY_IMPORT)
        and name.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not bad, f"inferchain/core/scheduler.py imports {bad}"


LIBRARY = [m for m in MODULES if not m.startswith("cli/")]


@pytest.mark.parametrize("rel", LIBRARY)
def test_only_the_command_line_imports_the_command_line(rel: str) -> None:
    bad = [(line, name) for line, name in imports(rel) if within(name, "inferchain.cli")]
    assert not bad, f"inferchain/{rel} imports {bad}"


CONCRETE = (
    "inferchain.backends.onnxruntime",
    "inferchain.backends.openvino",
    "inferchain.backends.acl",
    "onnxruntime",
    "openvino",
    "acl",
)


def test_the_backend_interface_imports_no_backend() -> None:
    """`backends/base.py` is the interface only: no concrete backend, not even lazily."""
    bad = [(line, name) for line, name in imports("backends/base.py") if within(name, *CONCRETE)]
    assert not bad, f"inferchain/backends/base.py imports {bad}"


def test_the_factory_loads_concrete_backends_only_when_asked() -> None:
    """`backends/factory.py` imports a backend inside `make_backend`, never at module level."""
    bad = [
        (line, name)
        for line, name in imports("backends/factory.py", top_level=True)
        if within(name, *CONCRETE)
    ]
    assert not bad, f"inferchain/backends/factory.py imports {bad} at module level"
    lazy = [name for _, name in imports("backends/factory.py")]
    for backend in CONCRETE[:3]:
        assert any(within(name, backend) for name in lazy), f"the factory never loads {backend}"


def resolve(name: str) -> str | None:
    """The inferchain module a dotted import target names, as a path relative to the package
    (`inferchain.a.b` and `inferchain.a.b.name` -> `a/b.py` or `a/b/__init__.py`); None for
    anything outside the package."""
    parts = name.split(".")
    while parts and parts[0] == "inferchain":
        path = "/".join(parts[1:])
        found = (f"{path}.py", f"{path}/__init__.py") if path else ("__init__.py",)
        hit = next((m for m in found if m in MODULES), None)
        if hit is not None:
            return hit
        parts = parts[:-1]  # `from a.b import name`: the module is a.b
    return None


def runtime_imports(rel: str) -> list[str]:
    """The inferchain modules `rel` imports when it is imported (its module-level imports,
    `if TYPE_CHECKING:` left out), each as a module path relative to the package."""
    tree = ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))
    module = module_name(rel)
    found = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Import | ast.ImportFrom):
            continue
        for name in targets(stmt, module, rel.endswith("__init__.py")):
            hit = resolve(name)
            if hit is not None:
                found.append(hit)
    return found


def closure(rel: str) -> set[str]:
    """Every inferchain module importing `rel` imports with it, itself included."""
    seen: set[str] = set()
    todo = [rel]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(runtime_imports(current))
    return seen


@pytest.mark.parametrize("rel", ["core/scheduler.py", "core/engine.py"])
def test_the_scheduler_and_the_engine_import_no_backend_module_even_indirectly(rel: str) -> None:
    reached = sorted(m for m in closure(rel) if m.startswith("backends/"))
    assert not reached, f"inferchain/{rel} imports {reached} (through its imports)"


def test_the_closure_follows_imports_through_modules() -> None:
    """The check above can fail: the worker reaches the backend interface through them."""
    assert "backends/base.py" in closure("core/worker.py")
    assert "core/request.py" in closure("core/engine.py")


# -- import cycles ----------------------------------------------------------------------------

Graph = dict[str, set[str]]  # module -> the modules it imports (paths relative to the package)


def import_graph() -> Graph:
    """Every module of the library -> the library's modules its import statements name:
    module-level, `if TYPE_CHECKING:` and inside functions alike (a lazy or typing-only
    import is still a dependency of one module on the other). Importing a submodule runs its
    packages' `__init__.py` too; those implicit imports are not edges (a package that
    re-exports its modules would be a cycle with each of them)."""
    graph: Graph = {}
    for rel in MODULES:
        named = (resolve(name) for _, name in imports(rel))
        graph[rel] = {m for m in named if m is not None and m != rel}
    return graph


def reachable(graph: Graph, start: str) -> set[str]:
    """`start` and every module it imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(graph.get(current, ()))
    return seen


def cycles(graph: Graph) -> list[set[str]]:
    """The import cycles of `graph`: its strongly connected components of two modules or
    more (each module of one imports every other, directly or through the others)."""
    reach = {m: reachable(graph, m) for m in graph}
    found: list[set[str]] = []
    done: set[str] = set()
    for module in sorted(graph):
        if module in done:
            continue
        component = {m for m in reach[module] if module in reach.get(m, ())}
        done |= component
        if len(component) > 1:
            found.append(component)
    return found


GRAPH = import_graph()


def package_of(rel: str) -> str:
    """The package folder of a module ("" for the modules at the top of the library)."""
    return rel.rpartition("/")[0]


def test_the_cycle_finder_finds_every_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e", "c"}, "e": set(), "f": {"a"}}
    assert sorted(sorted(c) for c in cycles(graph)) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [{"a", "b", "c"}]


def test_the_graph_has_module_level_typing_only_and_function_level_imports() -> None:
    assert "logs.py" in GRAPH["backends/onnxruntime.py"]  # at module level
    assert "config.py" in GRAPH["testing/fake_acl/__init__.py"]  # under TYPE_CHECKING
    assert "backends/onnxruntime.py" in GRAPH["backends/factory.py"]  # inside make_backend
    assert "handover.py" in GRAPH["__init__.py"]  # `from inferchain.handover import ...`


def test_no_import_cycle_crosses_a_package() -> None:
    """A cycle between packages is a layer reaching up: `logs.py` setting onnxruntime's log
    level (the backend imports `logs.py`), or `handover.py` typing its check with the
    registry, which imports the core, which imports `handover.py` (both gone). A cycle inside
    one package is its own affair (the fake's is ruled out below)."""
    crossing = [sorted(c) for c in cycles(GRAPH) if len({package_of(m) for m in c}) > 1]
    assert not crossing, f"import cycles across packages: {crossing}"


def test_the_loggers_import_no_backend_not_even_lazily() -> None:
    """The applications set onnxruntime's log level (`backends.factory`), not `logs.py`."""
    bad = [(line, name) for line, name in imports("logs.py") if within(name, *CONCRETE)]
    assert not bad, f"inferchain/logs.py imports {bad}"


def test_the_device_tensor_module_imports_nothing_of_the_library() -> None:
    """`handover.py` holds DeviceTensor only; the `from:` checks are in the registry."""
    assert not GRAPH["handover.py"], f"inferchain/handover.py imports {GRAPH['handover.py']}"


FAKE = "testing/fake_acl/"


def test_the_fake_acls_modules_import_each_other_without_a_cycle() -> None:
    """Its bottom is `_calls` (pyACL's codes, `Fail`, `api()`); the ledger `_core` and the
    objects it holds (`_objects`) import none of the modules that make the calls."""
    found = [sorted(c) for c in cycles(GRAPH) if any(m.startswith(FAKE) for m in c)]
    assert not found, f"import cycles in the fake: {found}"


def test_the_fakes_codes_fail_and_api_are_its_bottom() -> None:
    """Of the fake, `_calls` imports only its argument parser, which imports none."""
    inside = {m for m in GRAPH[FAKE + "_calls.py"] if m.startswith(FAKE)}
    assert inside <= {FAKE + "_args.py"}, f"{FAKE}_calls.py imports {sorted(inside)}"
    assert not {m for m in GRAPH[FAKE + "_args.py"] if m.startswith(FAKE)}


OUTSIDE_BACKENDS = [m for m in MODULES if not m.startswith(("backends/", "testing/fake_acl/"))]


@pytest.mark.parametrize("rel", OUTSIDE_BACKENDS)
def test_only_the_backends_import_openvino(rel: str) -> None:
    """OpenVINO is an optional extra: `import inferchain` (and every module but the backend
    that needs it) works without it."""
    bad = [(line, name) for line, name in imports(rel) if within(name, "openvino")]
    assert not bad, f"inferchain/{rel} imports {bad}"


def test_inferchain_imports_without_openvino() -> None:
    import subprocess

    code = "import sys; sys.modules['openvino'] = None; import inferchain, inferchain.cli"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
