"""``fedhop spec`` (a spec validated, every default filled in; or ``--explain``) and ``fedhop algorithms``."""

from __future__ import annotations

import argparse

from fedhop.cli.console import HelpFormatter, load_spec


def cmd_algorithms(a: argparse.Namespace) -> int:
    from fedhop.common.engine.api import ALGORITHMS, get_algorithm

    get_algorithm("fedavg")
    for name in sorted(ALGORITHMS):
        print(f"{name:24s} {ALGORITHMS[name].summary}")
    return 0


def cmd_spec(a: argparse.Namespace) -> int:
    if a.explain is not None:
        from fedhop.cli.spec_fields import explain

        print(explain(a.explain or load_spec(a.spec, a.set).algorithm.name))
        return 0
    spec = load_spec(a.spec, a.set)
    full = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(
        update={"options": spec.options().model_dump(mode="json", exclude_none=True)})})
    print(full.to_toml(), end="")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("algorithms", help="list the algorithms", formatter_class=HelpFormatter)
    s.set_defaults(fn=cmd_algorithms)

    s = sub.add_parser("spec", help="print a spec, validated and with every default filled in; or --explain",
                       formatter_class=HelpFormatter)
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in digits run)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one spec field")
    s.add_argument("--explain", nargs="?", const="", metavar="ALGORITHM",
                   help="print every field with its type, default and description (algorithm options: "
                   "ALGORITHM's, default the spec's algorithm)")
    s.set_defaults(fn=cmd_spec)
