"""``--tls DIR``, ``--token FILE`` and ``--insecure`` of ``fedhop server | edge | client | launch``: the
options, and the :class:`~fedhop.transport.credentials.Security` they make (checked before anything starts)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from fedhop.common.exit_codes import ExitCode, Fatal

log = logging.getLogger("fedhop.cli")
AUTO = "auto"  # launch --tls auto: a throw-away CA and certificates under the run folder


def add_security_args(s: argparse.ArgumentParser, *, launch: bool = False) -> None:
    tls_help = ("mutual TLS on every link: a folder from `fedhop certs init` holding ca.crt and this node's "
                "<id>.crt + <id>.key (with --token, a client needs only ca.crt)")
    if launch:
        tls_help = ("mutual TLS on every link: `auto` makes a throw-away CA and certificates under the run folder "
                    "(RUN/tls); or a folder from `fedhop certs init`, passed to every process")
    s.add_argument("--tls", metavar="DIR", help=tls_help)
    s.add_argument("--token", metavar="FILE",
                   help="token mode: the file from `fedhop tokens init`; every call carries this node's token "
                        "over server-side TLS (needs --tls DIR for the CA)")
    s.add_argument("--insecure", action="store_true",
                   help="allow plaintext links with no peer authentication on a non-loopback address "
                        "(without --tls/--token a role listening beyond loopback refuses to start)")


def security_from_args(a: argparse.Namespace, node_id: str, listen: str | None) -> Any:
    """The node's Security from ``--tls/--token/--insecure``; :class:`Fatal` (USAGE) with the reason when the
    material cannot be used or when the role would listen on ``listen`` beyond loopback in plaintext."""
    from fedhop.transport.credentials import CredentialsError, Security, must_refuse_insecure

    if a.insecure and (a.tls or a.token):
        raise Fatal(ExitCode.USAGE, "--insecure contradicts --tls/--token: give one or the other")
    try:
        sec = Security.load(node_id, a.tls, a.token)
    except CredentialsError as e:
        raise Fatal(ExitCode.USAGE, str(e)) from None
    if listen is not None:
        why = must_refuse_insecure(listen, sec, a.insecure)
        if why is not None:
            raise Fatal(ExitCode.USAGE, why)
    log.info("%s: links: %s", node_id, sec.describe())
    return sec


def child_args(tls_dir: Path | None, token_file: Path | None) -> list[str]:
    """The options that give a child process the same security (launch)."""
    out: list[str] = []
    if tls_dir is not None:
        out += ["--tls", str(tls_dir)]
    if token_file is not None:
        out += ["--token", str(token_file)]
    return out


def launch_tls_dir(tls: str | None, out: Path, node_ids: list[str]) -> Path | None:
    """``launch --tls``: ``auto`` creates (or, on --resume, reuses) ``out/tls``; a folder is used as it is."""
    if tls is None:
        return None
    if tls != AUTO:
        return Path(tls)
    from fedhop.deploy.certs import CA_CERT, CertError, init_folder

    d = out / "tls"
    if (d / CA_CERT).is_file():
        return d
    try:
        init_folder(d, node_ids)
    except CertError as e:
        raise Fatal(ExitCode.USAGE, f"--tls auto: {e}") from None
    return d
