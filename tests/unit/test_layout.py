"""docs/design.md section 2's dependency rule: common imports no role and no sockets; roles never import each other."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("server", "edge", "client")


def imports_of(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in (ROOT / folder).rglob("*.py"):
        mods = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mods.add(node.module)
            elif isinstance(node, ast.Import):
                mods.update(a.name for a in node.names)
        out[str(path.relative_to(ROOT))] = mods
    return out


def test_common_imports_no_role_no_transport_no_grpc():
    for path, mods in imports_of("common").items():
        bad = {m for m in mods if m.split(".")[0] == "grpc" or m.startswith(("fedhop.server", "fedhop.edge",
                                                                             "fedhop.client", "fedhop.transport"))}
        assert not bad, f"{path} imports {bad}"


def test_roles_never_import_each_other():
    for role in ROLES:
        others = tuple(f"fedhop.{r}" for r in ROLES if r != role)
        for path, mods in imports_of(role).items():
            bad = {m for m in mods if m.startswith(others)}
            assert not bad, f"{path} imports {bad}"


def test_transport_imports_no_role():
    for path, mods in imports_of("transport").items():
        bad = {m for m in mods if m.startswith(tuple(f"fedhop.{r}" for r in ROLES))}
        assert not bad, f"{path} imports {bad}"
