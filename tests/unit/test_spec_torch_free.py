"""The RunSpec and its validation import no torch and no algorithm (issue 15: a bad spec is reported at once).

Read statically from the source, as ``tests/layering.py`` reads it: every import that can run when
``fedhop.common.spec`` is imported and a spec is validated (module level and inside functions, not under
``if TYPE_CHECKING:``), followed transitively from ``fedhop.common.spec`` and from the modules the catalogue
names by reference (``"package.module:attribute"``, imported by name at validation). The fresh-interpreter
check of the same claim is ``tests/integration/test_spec_torch_free.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fedhop.common import catalog
from tests.layering import ROOT, _resolve, source_files

FORBIDDEN = ("torch", "fedhop.common.algorithms", "fedhop.common.engine", "fedhop.common.data",
             "fedhop.common.models")


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``module`` may import when it runs (outside ``if TYPE_CHECKING:``)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            subs = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
            out.update(subs or {target})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def reached(roots: list[str], root: Path = ROOT) -> dict[str, str]:
    """module -> the module that first imported it, for everything importing ``roots`` can import."""
    files = source_files(root)
    known = set(files)
    seen: dict[str, str] = {}
    stack = [(m, "(root)") for r in roots for m in _with_parents(r)]
    while stack:
        module, by = stack.pop()
        if module in seen:
            continue
        seen[module] = by
        if module in files:
            for target in _imports(module, files[module], known):
                stack += [(m, module) for m in _with_parents(target) if m not in seen]
    return seen


def chain(seen: dict[str, str], module: str) -> str:
    out = [module]
    while seen.get(out[-1], "(root)") != "(root)":
        out.append(seen[out[-1]])
    return " <- ".join(out)


def offenders(seen: dict[str, str]) -> list[str]:
    return sorted(chain(seen, m) for m in seen if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def spec_roots() -> list[str]:
    return ["fedhop.common.spec", *sorted({ref.partition(":")[0] for ref in catalog.references()})]


def test_spec_and_validation_reach_no_torch_and_no_algorithm() -> None:
    seen = reached(spec_roots())
    assert "fedhop.common.options.fedavg" in seen  # the catalogue's references are followed
    assert offenders(seen) == []


def test_the_walk_finds_torch_where_it_is() -> None:
    """The check can fail: the engine interface imports torch, and the engine's preflight the data layer."""
    seen = reached(["fedhop.common.engine.api"])
    assert "torch" in seen
    assert any(o.startswith("fedhop.common.data") for o in offenders(reached(["fedhop.common.engine.preflight"])))


def test_a_planted_torch_import_is_found(tmp_path: Path) -> None:
    """A copy of the modules with ``import torch`` planted in a torch-free options module fails the check."""
    common = tmp_path / "common"
    for src in (ROOT / "common").rglob("*.py"):
        dst = common / src.relative_to(ROOT / "common")
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if src.relative_to(ROOT) == Path("common/options/solver.py"):
            text = text.replace("from __future__ import annotations\n", "from __future__ import annotations\n\n"
                                "import torch  # noqa: F401\n", 1)
        dst.write_text(text)
    for folder in ("transport", "server", "edge", "client", "deploy", "proto/fedhop/v1", "fedhop"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    bad = offenders(reached(spec_roots(), tmp_path))
    assert any(b.startswith("torch <- fedhop.common.options.solver") for b in bad), bad


@pytest.mark.parametrize("name", sorted(catalog.ALGORITHMS))
def test_every_algorithms_options_are_torch_free(name: str) -> None:
    info = catalog.ALGORITHMS[name]
    roots = [r.partition(":")[0] for r in (info.options_ref, info.check_ref) if isinstance(r, str)]
    assert roots and offenders(reached(roots)) == []
