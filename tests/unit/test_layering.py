"""The layering rule of docs/design.md section 3, over every folder of the tree (tests/layering.py reads it)."""

from pathlib import Path

from tests.layering import import_edges, report, upward_imports


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in ("common", "transport", "server", "edge", "client", "deploy", "proto/fedhop/v1", "fedhop"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return root


def test_the_tree_has_no_upward_import_and_no_package_cycle():
    up, cycles = report()
    assert not up, "upward imports:\n" + "\n".join(up)
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_a_planted_upward_import_is_found_also_inside_a_function(tmp_path):
    root = _tree(tmp_path, {
        "common/__init__.py": "",
        "common/spec.py": "def f():\n    from fedhop.common.engine import api\n",
        "common/engine/__init__.py": "",
        "common/engine/api.py": "import fedhop.common.spec\n",
    })
    up, _ = report(root)
    assert up == ["common/spec.py:2: fedhop.common.spec (core) imports fedhop.common.engine.api (engine), "
                  "a layer above it"]


def test_a_planted_cycle_between_packages_of_one_layer_is_found(tmp_path):
    root = _tree(tmp_path, {
        "server/__init__.py": "",
        "server/main.py": "from fedhop.server.web import app\n",
        "server/web/__init__.py": "",
        "server/web/app.py": "from fedhop.server import main\n",  # web (below roles) imports a role: upward
        "deploy/__init__.py": "",
        "deploy/a.py": "from fedhop.reproduce import b\n",
        "fedhop/__init__.py": "",
        "fedhop/reproduce/__init__.py": "",
        "fedhop/reproduce/b.py": "from fedhop.deploy import a\n",  # testbeds <-> testbeds: a cycle
    })
    up, cycles = report(root)
    assert cycles == [["fedhop.deploy", "fedhop.reproduce"], ["fedhop.server", "fedhop.server.web"]]
    assert any("fedhop.server.web.app (web) imports fedhop.server.main (roles)" in line for line in up)


def test_nothing_below_the_cli_may_import_it_and_roles_never_import_each_other(tmp_path):
    root = _tree(tmp_path, {
        "deploy/__init__.py": "",
        "deploy/x.py": "import fedhop.cli\n",
        "edge/__init__.py": "",
        "edge/node.py": "from fedhop.client.main import run\n",
        "client/__init__.py": "",
        "client/main.py": "",
        "fedhop/__init__.py": "",
        "fedhop/cli/__init__.py": "",
    })
    lines = upward_imports(import_edges(root))
    assert "deploy/x.py:1: fedhop.deploy.x (testbeds) imports the CLI (fedhop.cli)" in lines
    assert "edge/node.py:1: role fedhop.edge.node imports another role's fedhop.client.main" in lines
