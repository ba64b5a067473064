"""The house's layering rule, read from the source (every ``import``, at module level or inside a function).

docs/design.md ("Layers") draws it::

    core (fedhop.common's torch-free modules: spec, validation, exit codes, ...)
      <- wire (fedhop.common.wire, fedhop.v1)
      <- ml (fedhop.common.models, fedhop.common.data: torch)
      <- engine (fedhop.common.engine; fedhop.browse, which reads the run folders it writes)
      <- algorithms (fedhop.common.algorithms)
    engine <- transport (fedhop.transport)
    engine <- web (fedhop.server.web)
    transport, algorithms, web <- roles (fedhop.server, fedhop.edge, fedhop.client; no role imports another)
    roles <- testbeds (fedhop.deploy, fedhop.launch, fedhop.forkstart, fedhop.reproduce, and what they share with
                       the CLI: fedhop.client_ids, fedhop.report, fedhop.compare, fedhop.run_folders)
    everything <- cli (the package fedhop.cli, and fedhop's other modules: fedhop.lifecycle, ...); nothing
                       imports the CLI

A module may import its own layer and the layers its layer lists in ``MAY_IMPORT``; anything else is an upward
(or sideways) import. ``cycles`` finds import cycles between the packages (``fedhop.common.engine``,
``fedhop.transport``, ...): a cycle between two packages of one layer is as much a knot as an upward import.

Run ``python -m tests.layering`` for the report; ``tests/unit/test_layering.py`` asserts it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# folder on disk -> its module prefix (fedhop/<name> are links to these folders; see setup.py)
FOLDERS = {
    "common": "fedhop.common",
    "transport": "fedhop.transport",
    "server": "fedhop.server",
    "edge": "fedhop.edge",
    "client": "fedhop.client",
    "deploy": "fedhop.deploy",
    "proto/fedhop/v1": "fedhop.v1",
}

# (module prefix, layer): the longest matching prefix decides
LAYER_OF = [
    ("fedhop.common.wire", "wire"),
    ("fedhop.v1", "wire"),
    ("fedhop.common.models", "ml"),
    ("fedhop.common.data", "ml"),
    ("fedhop.common.engine", "engine"),
    ("fedhop.common.algorithms", "algorithms"),
    ("fedhop.common", "core"),
    ("fedhop.transport", "transport"),
    ("fedhop.server.web", "web"),
    ("fedhop.server", "roles"),
    ("fedhop.edge", "roles"),
    ("fedhop.client", "roles"),
    ("fedhop.deploy", "testbeds"),
    ("fedhop.launch", "testbeds"),
    ("fedhop.forkstart", "testbeds"),
    ("fedhop.reproduce", "testbeds"),
    ("fedhop.client_ids", "testbeds"),
    ("fedhop.report", "testbeds"),
    ("fedhop.compare", "testbeds"),
    ("fedhop.check", "testbeds"),
    ("fedhop.testing", "testbeds"),
    ("fedhop.run_folders", "testbeds"),
    ("fedhop.browse", "engine"),  # the run folders' reader (ls, show, ui): what the engine writes, read back
    ("fedhop.api", "algorithms"),  # the public protocol API: re-exports the engine's and the algorithms' helpers
    ("fedhop", "cli"),
]

MAY_IMPORT = {
    "core": set(),
    "wire": {"core"},
    "ml": {"core", "wire"},
    "engine": {"core", "wire", "ml"},
    "algorithms": {"core", "wire", "ml", "engine"},
    "transport": {"core", "wire", "ml", "engine"},
    "web": {"core", "wire", "ml", "engine"},
    "roles": {"core", "wire", "ml", "engine", "algorithms", "transport", "web"},
    "testbeds": {"core", "wire", "ml", "engine", "algorithms", "transport", "web", "roles"},
    "cli": {"core", "wire", "ml", "engine", "algorithms", "transport", "web", "roles", "testbeds"},
}

ROLES = ("fedhop.server", "fedhop.edge", "fedhop.client")
LINKS = {"common", "transport", "server", "edge", "client", "deploy", "v1"}  # fedhop/<link> -> a top-level folder


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (as written, resolved to absolute)
    path: str  # file, relative to the repository
    line: int


def layer_of(module: str) -> str | None:
    best = None
    for prefix, layer in LAYER_OF:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def package_of(module: str, is_package: bool = False) -> str:
    """The package a module lives in, cut at the depth the layering speaks of (fedhop.common.engine, ...)."""
    parts = module.split(".")
    if parts[:2] == ["fedhop", "common"] and len(parts) >= 3 and parts[2] in (
        "wire", "models", "data", "engine", "algorithms"
    ):
        return ".".join(parts[:3])
    if parts[:2] == ["fedhop", "server"] and len(parts) >= 3 and parts[2] == "web":
        return "fedhop.server.web"
    if len(parts) >= 2 and parts[1] != "cli":  # fedhop.<link>, fedhop.reproduce, fedhop.launch, fedhop.report, ...
        return ".".join(parts[:2])
    return "fedhop.cli"


def source_files(root: Path = ROOT) -> dict[str, Path]:
    """module name -> file, for every module of the installed namespace (the links in fedhop/ not followed)."""
    out: dict[str, Path] = {}
    for folder, prefix in FOLDERS.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    for path in sorted((root / "fedhop").rglob("*.py")):
        rel = path.relative_to(root / "fedhop")
        if rel.parts[0] in LINKS:
            continue
        parts = [p for p in rel.with_suffix("").parts if p != "__init__"]
        out[".".join(["fedhop", *parts])] = path
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(root: Path = ROOT) -> list[Edge]:
    files = source_files(root)
    known = set(files)
    edges = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, path, node)
                # `from fedhop.common import spec` imports the module fedhop.common.spec
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
                targets = subs or [target]
            for target in targets:
                if target == "fedhop" or target.startswith("fedhop."):
                    edges.append(Edge(module, target, str(path.relative_to(root)), node.lineno))
    return edges


def upward_imports(edges: list[Edge]) -> list[str]:
    out = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src is None or dst is None or src == dst and src != "roles":
            continue
        if src == "roles" and dst == "roles":
            own = next(r for r in ROLES if e.source.startswith(r))
            if not e.target.startswith(own):
                out.append(f"{e.path}:{e.line}: role {e.source} imports another role's {e.target}")
            continue
        if dst == "cli" and src != "cli":
            out.append(f"{e.path}:{e.line}: {e.source} ({src}) imports the CLI ({e.target})")
        elif dst not in MAY_IMPORT[src]:
            out.append(f"{e.path}:{e.line}: {e.source} ({src}) imports {e.target} ({dst}), a layer above it")
    return out


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components (more than one package) of the package import graph (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        a, b = package_of(e.source), package_of(e.target)
        if a != b:
            graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycle_witnesses(edges: list[Edge], component: list[str]) -> list[str]:
    """The imports that hold a cycle together: one line per package pair inside the component."""
    members = set(component)
    seen: dict[tuple[str, str], Edge] = {}
    for e in edges:
        a, b = package_of(e.source), package_of(e.target)
        if a != b and a in members and b in members:
            seen.setdefault((a, b), e)
    return [f"{a} -> {b} ({e.path}:{e.line})" for (a, b), e in sorted(seen.items())]


def report(root: Path = ROOT) -> tuple[list[str], list[list[str]]]:
    edges = import_edges(root)
    return upward_imports(edges), cycles(edges)


if __name__ == "__main__":
    edges = import_edges()
    up = upward_imports(edges)
    print(f"{len(up)} upward imports")
    for line in up:
        print("  " + line)
    cyc = cycles(edges)
    print(f"{len(cyc)} package cycles")
    for comp in cyc:
        print("  " + " <-> ".join(comp))
        for w in cycle_witnesses(edges, comp):
            print("      " + w)
    sys.exit(1 if up or cyc else 0)
