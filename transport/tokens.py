"""Per-node secrets for token mode (``fedhop tokens init``): one random token per node, checked in constant time.

A node proves who it is by sending ``<node id>:<secret>`` in the gRPC metadata entry :data:`TOKEN_HEADER`
of every call, over server-side TLS (``transport/credentials.py``). The file holds a table ``tokens`` of
node id -> secret (TOML, or JSON when the file name ends in ``.json``), written 0600. A server needs the
tokens of the nodes it accepts; a node that only dials out needs only its own entry.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedhop.transport.certs import check_node_id, write_file

TOKEN_HEADER = "fedhop-token"
TOKEN_BYTES = 32  # secrets are 64 hex digits
_MIN_HEX = 32  # a hand-written file may hold shorter secrets, but not guessable ones
_DUMMY = "0" * (2 * TOKEN_BYTES)


class TokenError(ValueError):
    """A token file or option that cannot be used; the message names the problem."""


def new_tokens(node_ids: Sequence[str]) -> dict[str, str]:
    ids = [check_node_id(n) for n in node_ids]
    if len(set(ids)) != len(ids):
        raise TokenError(f"duplicate node ids in {ids}")
    return {n: secrets.token_hex(TOKEN_BYTES) for n in ids}


def write_tokens(path: str | os.PathLike, tokens: Mapping[str, str], *, force: bool = False) -> Path:
    """Write ``tokens`` to ``path`` (0600 whatever the umask); an existing file is kept unless ``force``."""
    p = Path(path)
    if p.exists() and not force:
        raise TokenError(f"{p} exists: pass --force to replace it (every node then needs its new token)")
    if not p.parent.is_dir():
        raise TokenError(f"folder {p.parent} does not exist")
    for n, s in tokens.items():
        check_node_id(n)
        _check_secret(n, s, p)
    if p.suffix == ".json":
        text = json.dumps({"tokens": dict(tokens)}, indent=2) + "\n"
    else:
        lines = ["# fedhop node tokens (fedhop tokens init). Keep secret: a node needs only its own line, a",
                 "# server the lines of the nodes it accepts.", "[tokens]"]
        lines += [f"{json.dumps(n)} = {json.dumps(s)}" for n, s in tokens.items()]
        text = "\n".join(lines) + "\n"
    write_file(p, text.encode(), 0o600)
    return p


def _check_secret(node: str, secret: object, path: Path) -> None:
    if not isinstance(secret, str) or len(secret) < _MIN_HEX or any(c not in "0123456789abcdef" for c in secret):
        raise TokenError(f"{path}: the token of {node} must be a string of at least {_MIN_HEX} lower-case hex "
                         f"digits (fedhop tokens init writes {2 * TOKEN_BYTES})")


def load_tokens(path: str | os.PathLike) -> dict[str, str]:
    """The ``tokens`` table of a token file, validated (node ids, hex secrets)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TokenError(f"cannot read the token file {p}: {e.strerror}") from e
    try:
        data = json.loads(raw) if p.suffix == ".json" else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise TokenError(f"{p} is not a valid {'JSON' if p.suffix == '.json' else 'TOML'} token file: {e}") from e
    table = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise TokenError(f"{p} has no non-empty 'tokens' table (node id -> secret); make one with fedhop tokens init")
    for n, s in table.items():
        try:
            check_node_id(n)
        except ValueError as e:
            raise TokenError(f"{p}: {e}") from None
        _check_secret(n, s, p)
    return dict(table)


def token_value(node_id: str, secret: str) -> str:
    """What a node sends in :data:`TOKEN_HEADER`."""
    return f"{node_id}:{secret}"


def check_token(tokens: Mapping[str, str], presented: str | bytes | None) -> str | None:
    """The node id that ``presented`` (``<id>:<secret>``) proves, or None.

    The secret is compared with :func:`hmac.compare_digest`, and an unknown id is compared against a dummy,
    so the time taken says nothing about how much of a secret was right or which ids exist."""
    if isinstance(presented, bytes):
        presented = presented.decode("utf-8", "replace")
    if not isinstance(presented, str):
        return None
    node, _, secret = presented.partition(":")
    expected = tokens.get(node)
    ok = hmac.compare_digest((expected or _DUMMY).encode(), secret.encode())
    return node if ok and expected is not None else None
