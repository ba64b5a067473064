"""``fedhop certs init|add`` and ``fedhop tokens init``: the identity material for secure links (docs/design.md
section 7). The files' layout and formats are described in ``transport/certs.py`` and ``transport/tokens.py``.

A CertError or TokenError ends the command with USAGE (errors.EXIT_CODES).
"""

from __future__ import annotations

import argparse

from fedhop.cli.console import load_spec


def _node_ids(spec_path: str | None) -> list[str]:
    from fedhop.common.topology import build_topology

    spec = load_spec(spec_path)
    return build_topology(spec.topology, spec.seed).all_nodes()


def cmd_certs_init(a: argparse.Namespace) -> int:
    from fedhop.transport.certs import CA_KEY, init_folder, parse_host_options

    ids = _node_ids(a.spec)
    files = init_folder(a.out, ids, hosts=parse_host_options(a.host), days=a.days, ca_days=a.ca_days,
                        ca_name=a.name or "fedhop", force=a.force)
    print(f"wrote a CA and {len(files)} node certificates to {a.out} ({', '.join(ids)}).\n"
          f"Each node needs ca.crt and its own <id>.crt + <id>.key (pass --tls with a folder holding them); "
          f"{CA_KEY} signs new nodes and stays here.")
    return 0


def cmd_certs_add(a: argparse.Namespace) -> int:
    from fedhop.transport.certs import add_node

    files = add_node(a.dir, a.id, hosts=a.host, days=a.days, force=a.force)
    print(f"wrote {files.cert} and {files.key}")
    return 0


def cmd_tokens_init(a: argparse.Namespace) -> int:
    from fedhop.transport.tokens import new_tokens, write_tokens

    tokens = new_tokens(_node_ids(a.spec))
    path = write_tokens(a.out, tokens, force=a.force)
    print(f"wrote {len(tokens)} node tokens to {path} (mode 0600). A server needs the tokens of the nodes it "
          f"accepts; give every other node a copy holding only its own line.")
    return 0


def _days(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"validity must be at least 1 day, got {v}")
    return v


def add_commands(sub: argparse._SubParsersAction) -> None:
    from fedhop.transport.certs import DEFAULT_CA_DAYS, DEFAULT_DAYS

    host_help = ("an extra name or address peers dial a listening node at (repeatable). NAME: every listening "
                 "role (PS, edges); NODE=NAME: that node only. Always included: the node id as a DNS name, and "
                 "for listening roles localhost, 127.0.0.1 and ::1")

    certs = sub.add_parser("certs", help="certificates for mutual TLS (--tls DIR)")
    csub = certs.add_subparsers(dest="certs_cmd", required=True)
    s = csub.add_parser("init", help="create a CA and one key + certificate per node of a spec's topology")
    s.add_argument("spec", nargs="?", help="RunSpec TOML file whose nodes get certificates (default: the built-in run)")
    s.add_argument("--out", required=True, help="folder to create (must be new or empty unless --force)")
    s.add_argument("--host", action="append", default=[], metavar="[NODE=]NAME", help=host_help)
    s.add_argument("--days", type=_days, default=DEFAULT_DAYS,
                   help=f"node certificate validity (default {DEFAULT_DAYS})")
    s.add_argument("--ca-days", type=_days, default=DEFAULT_CA_DAYS, help=f"CA validity (default {DEFAULT_CA_DAYS})")
    s.add_argument("--name", help="a name for the CA's subject (default: fedhop)")
    s.add_argument("--force", action="store_true", help="write into a non-empty folder, replacing its CA and nodes")
    s.set_defaults(fn=cmd_certs_init, title="certs init")

    s = csub.add_parser("add", help="issue one more node certificate from an existing CA")
    s.add_argument("--dir", required=True, help="the folder `certs init` created (it holds the CA key)")
    s.add_argument("--id", required=True, help="node id, e.g. client-12")
    s.add_argument("--host", action="append", default=[], metavar="NAME",
                   help="an extra name or address peers dial this node at (repeatable)")
    s.add_argument("--days", type=_days, default=DEFAULT_DAYS, help=f"validity (default {DEFAULT_DAYS})")
    s.add_argument("--force", action="store_true", help="replace the node's existing certificate and key")
    s.set_defaults(fn=cmd_certs_add, title="certs add")

    tokens = sub.add_parser("tokens", help="per-node secrets for token mode (--token FILE)")
    tsub = tokens.add_subparsers(dest="tokens_cmd", required=True)
    s = tsub.add_parser("init", help="write one random secret per node of a spec's topology (mode 0600)")
    s.add_argument("spec", nargs="?", help="RunSpec TOML file (default: the built-in run)")
    s.add_argument("--out", required=True, help="file to write: TOML, or JSON if the name ends in .json")
    s.add_argument("--force", action="store_true", help="replace an existing file")
    s.set_defaults(fn=cmd_tokens_init, title="tokens init")
