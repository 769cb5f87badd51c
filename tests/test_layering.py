"""The layering, read from the import statements of every module of the library: the core
never reaches a concrete backend or runtime, the Scheduler stands on records alone, only the
command line imports the command line, and the backend interface loads backends lazily."""

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
            parts = name.split(".")
            while parts and parts[0] == "inferchain":
                path = "/".join(parts[1:])
                hit = next((m for m in (f"{path}.py", f"{path}/__init__.py") if m in MODULES), None)
                if hit is not None:
                    found.append(hit)
                    break
                parts = parts[:-1]  # `from a.b import name`: the module is a.b
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
