"""``fedhop spec`` (a spec validated, every default filled in; ``--template``; or ``--explain``) and ``fedhop
algorithms``; :func:`load_run_spec`, the spec a run command runs (a file, the default run, or an algorithm's
template with ``--algorithm``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from fedhop.cli.console import DEFAULT_SPEC, HelpFormatter, load_spec
from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec


def cmd_algorithms(a: argparse.Namespace) -> int:
    from fedhop.common.engine.api import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")
    for name in sorted(ALGORITHMS):
        print(f"{name:24s} {ALGORITHMS[name].summary}")
    return 0


def load_run_spec(path: str | None, sets: list[str], algorithm: str | None = None,
                  data_path: str | None = None) -> RunSpec:
    """The spec a run command runs: the file ``path``, the default run (no path), or with ``algorithm`` that
    algorithm's template (``fedhop spec --template``); then ``--set`` in order, then ``--data-path`` as
    ``data.path`` (so that a file-backed dataset's required path is satisfied by it)."""
    if algorithm and path:
        raise Fatal(ExitCode.USAGE, f"give a spec file or --algorithm {algorithm}, not both (--algorithm runs the "
                                    "algorithm's template; change it with --set)")
    if not algorithm and not data_path:
        return load_spec(path, sets)
    from fedhop.cli.spec_fields import apply_sets, read_raw
    from fedhop.common.spec import RunSpec
    from fedhop.common.templates import template_raw

    if algorithm:
        raw, source = template_raw(algorithm), f"the template of {algorithm}"
    else:
        source = str(path or DEFAULT_SPEC)
        raw = read_raw(Path(source))
    if sets:
        raw = apply_sets(raw, sets)
        source += " with " + " ".join(f"--set {s}" for s in sets)
    if data_path:
        data = raw.get("data")
        absolute = str(Path(data_path).expanduser().resolve())  # the working directory's, as every --set path
        raw = {**raw, "data": {**(data if isinstance(data, dict) else {}), "path": absolute}}
        source += f" with --data-path {data_path}"
    return RunSpec.parse(raw, source)


def cmd_spec(a: argparse.Namespace) -> int:
    if a.template is not None:
        from fedhop.common.templates import template_spec, template_toml

        if a.spec or a.set or a.explain is not None or a.algorithm:
            raise Fatal(ExitCode.USAGE, "--template ALGORITHM prints that algorithm's template as is; give no "
                                        "spec file, --set, --algorithm or --explain with it")
        template_spec(a.template)  # a template that does not validate is a bug: say so before printing it
        print(template_toml(a.template), end="")
        return 0
    if a.explain is not None:
        from fedhop.cli.spec_fields import explain

        if a.explain:  # an algorithm: its template, what `fedhop launch --algorithm ALGORITHM` runs
            if a.spec or a.algorithm:
                raise Fatal(ExitCode.USAGE, "--explain ALGORITHM explains that algorithm's template; to explain a "
                                            "spec file give it with --explain alone")
            spec, what = _explained_algorithm(a.explain, a.set)
        else:
            spec = load_run_spec(a.spec, a.set, a.algorithm)
            what = (a.spec if a.spec else f"the template of {a.algorithm!r}" if a.algorithm
                    else "the default run (`fedhop launch` with no spec: fedhop/default_spec.toml)")
        print(explain(spec, what))
        return 0
    spec = load_run_spec(a.spec, a.set, a.algorithm)
    full = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(
        update={"options": spec.options().model_dump(mode="json", exclude_none=True)})})
    print(full.to_toml(), end="")
    return 0


def _explained_algorithm(name: str, sets: list[str]) -> tuple[RunSpec, str]:
    """The run ``--explain NAME`` explains: NAME's template; a user algorithm (``package.module:NAME``, which
    has none): the default run with that algorithm, its options' defaults, and a topology it accepts."""
    from fedhop.common import catalog
    from fedhop.common.templates import TEMPLATES

    if name in TEMPLATES or ":" not in name:
        return load_run_spec(None, sets, name), f"the template of {name!r} (`fedhop launch --algorithm {name}`)"
    needs = catalog.algorithm(name).needs_edges  # a UserCodeError (exit 2) names what fails to import
    topology = ["topology.edges=0"] if needs is False else ["topology.edges=2"] if needs else []
    return (load_spec(None, [f"algorithm.name={json.dumps(name)}", *topology, *sets]),
            f"the default run with algorithm {name!r}")


def add_algorithm_arg(s: argparse.ArgumentParser) -> None:
    """``--algorithm NAME``: run NAME's template instead of a spec file (``fedhop spec --template NAME``)."""
    s.add_argument("--algorithm", metavar="NAME",
                   help="the spec is NAME's template (what `fedhop spec --template NAME` prints: a topology it accepts "
                        "and its paper's settings) instead of a spec file; --set changes it")


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("algorithms", help="list the algorithms", formatter_class=HelpFormatter)
    s.set_defaults(fn=cmd_algorithms)

    s = sub.add_parser("spec", help="print a spec, validated and with every default filled in; an algorithm's "
                       "runnable template (--template); or every field (--explain)", formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one spec field")
    add_algorithm_arg(s)
    s.add_argument("--template", metavar="ALGORITHM",
                   help="print a runnable spec for ALGORITHM: a topology it accepts (edge servers for the "
                   "hierarchical ones), its paper's settings, every option written out; save it and edit it, or "
                   "run it as is with `fedhop simulate --algorithm ALGORITHM`")
    s.add_argument("--explain", nargs="?", const="", metavar="ALGORITHM",
                   help="print every field with its type, the value the run uses, its default and description, "
                   "then every participation model; the run: ALGORITHM's template, else the spec given, else the "
                   "default run")
    s.set_defaults(fn=cmd_spec)
