"""Import contracts: the layers DESIGN.md describes, checked on the source (every import
statement, including those inside functions), so that they cannot erode unnoticed."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tensorlights"
GENERATED = PACKAGE / "rpc" / "v1"

POLICY_MAY_NOT_IMPORT = (
    "psutil",
    "pyroute2",
    "grpc",
    "google.protobuf",
    "prometheus_client",
    "time",
    "asyncio",
    "threading",
    "socket",
    "subprocess",
)
"""policy/ is pure: no kernel, process table, network, metrics or clock (time comes in as an
argument)."""

OWNERS = {
    "psutil": ("discovery",),
    "pyroute2": ("datapath",),
    "google.protobuf": ("rpc",),
    "tensorlights.rpc.v1": ("rpc",),
}
"""Third-party or generated modules that one package alone may use."""

COMPOSITION_ROOTS = ("agent.app", "controller_app")
"""Where a daemon is wired together: they may import any layer, and nothing imports them
except the command lines."""


def _modules() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED not in path.parents:
            yield path


def _name(path: Path) -> str:
    """tensorlights/agent/app.py -> agent.app; tensorlights/model.py -> model."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def _imports(path: Path) -> tuple[str, ...]:
    """Absolute names of everything the module imports, wherever the statement is."""
    names: list[str] = []
    package = ["tensorlights", *_name(path).split(".")]
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], base]).rstrip(".")
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return tuple(names)


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _package(module: str) -> str:
    """The top-level unit a module belongs to: agent, policy, model, controller_app..."""
    return module.split(".")[0]


def test_the_contracts_see_every_layer() -> None:
    packages = {_package(_name(path)) for path in _modules()}
    assert {"policy", "agent", "controller", "rpc", "datapath", "discovery", "daemon"} <= packages


@pytest.mark.parametrize(
    "path", [p for p in _modules() if _name(p).startswith("policy")], ids=_name
)
def test_policy_imports_no_io(path: Path) -> None:
    banned = [
        name
        for name in _imports(path)
        for prefix in POLICY_MAY_NOT_IMPORT
        if _matches(name, prefix)
    ]
    assert not banned, f"{_name(path)} imports {banned}"
    inside = [
        name
        for name in _imports(path)
        if _matches(name, "tensorlights")
        and _package(name.removeprefix("tensorlights.")) not in ("policy", "model", "errors")
        and name != "tensorlights"
    ]
    assert not inside, f"{_name(path)} reaches outside policy/model/errors: {inside}"


def test_owned_libraries_are_used_by_their_owner_only() -> None:
    offenders = [
        (_name(path), name)
        for path in _modules()
        for name in _imports(path)
        for prefix, owners in OWNERS.items()
        if _matches(name, prefix) and _package(_name(path)) not in owners
    ]
    assert offenders == []


FORBIDDEN = {
    "controller": ("rpc",),
    "daemon": ("agent", "controller", "rpc"),
}
"""Package -> packages of ours it may not import: the controller's core stays free of the
wire (rpc/ adapts it); the daemons' shared plumbing depends on neither daemon."""


@pytest.mark.parametrize(("package", "forbidden"), FORBIDDEN.items())
def test_packages_keep_off_what_they_may_not_import(
    package: str, forbidden: tuple[str, ...]
) -> None:
    offenders = [
        (_name(path), name)
        for path in _modules()
        if _package(_name(path)) == package
        for name in _imports(path)
        if any(_matches(name, f"tensorlights.{other}") for other in forbidden)
    ]
    assert offenders == []


def test_only_command_lines_import_composition_roots() -> None:
    offenders = [
        (_name(path), name)
        for path in _modules()
        if _package(_name(path)) != "cli" and _name(path) not in COMPOSITION_ROOTS
        for name in _imports(path)
        for root in COMPOSITION_ROOTS
        if _matches(name, f"tensorlights.{root}")
    ]
    assert offenders == []


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _modules():
        source = _package(_name(path))
        if not source:
            continue  # tensorlights/__init__.py: the version string only
        edges = graph.setdefault(source, set())
        for name in _imports(path):
            if not _matches(name, "tensorlights") or name == "tensorlights":
                continue
            target = _package(name.removeprefix("tensorlights."))
            if target != source and target != "__version__":
                edges.add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its nodes in order), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_cycles_between_packages() -> None:
    cycle = _cycle(_package_graph())
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
