"""``--tls DIR``, ``--token FILE`` and ``--insecure`` of ``fedhop server | edge | client | clients | launch``: the
options, read once into :class:`SecurityArgs`, and the :class:`~fedhop.transport.credentials.Security` they make
(checked before anything starts)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:
    from fedhop.transport.credentials import Security

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


@dataclass(frozen=True)
class SecurityArgs:
    """What ``--tls``, ``--token`` and ``--insecure`` said (``tls``: a folder, or ``auto`` for launch)."""

    tls: str | None = None
    token: str | None = None
    insecure: bool = False

    @classmethod
    def of(cls, a: argparse.Namespace) -> SecurityArgs:
        return cls(tls=a.tls, token=a.token, insecure=a.insecure)


def security_for(args: SecurityArgs, node_id: str, listen: str | None) -> Security:
    """The node's Security; :class:`Fatal` (USAGE) with the reason when the options contradict each other or
    when the role would listen on ``listen`` beyond loopback in plaintext (material that cannot be used: a
    CredentialsError, USAGE by errors.EXIT_CODES)."""
    from fedhop.transport.credentials import Security, must_refuse_insecure

    if args.insecure and (args.tls or args.token):
        raise Fatal(ExitCode.USAGE, "--insecure contradicts --tls/--token: give one or the other")
    sec = Security.load(node_id, args.tls, args.token)
    if listen is not None:
        why = must_refuse_insecure(listen, sec, args.insecure)
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
    from fedhop.transport.certs import CA_CERT, CertError, init_folder

    d = out / "tls"
    if (d / CA_CERT).is_file():
        return d
    try:
        init_folder(d, node_ids)
    except CertError as e:
        raise Fatal(ExitCode.USAGE, f"--tls auto: {e}") from None
    return d
