"""Credentials for every gRPC channel and server a node makes: insecure, mutual TLS, or tokens over TLS.

* ``tls`` (``--tls DIR``, a folder made by ``fedhop certs init``, layout in ``transport/certs.py``): mutual TLS.
  Both ends present a certificate signed by the folder's CA; a server requires one from every client.
  The peer's node id is the ``fedhop://node/<id>`` URI in the certificate the TLS handshake verified
  (:func:`peer_identity`), never what the peer writes in metadata or frames.
* ``token`` (``--token FILE`` from ``fedhop tokens init``, plus ``--tls DIR``): server-side TLS only, and
  every call carries ``<id>:<secret>`` in the ``fedhop-token`` metadata entry, checked in constant time.
  A client's DIR needs only ``ca.crt``; a server's DIR also its own key and certificate.
* ``insecure``: plaintext. :func:`must_refuse_insecure` says when a listening role must not start so.

Server name check. A dialer checks that the server's certificate names the address it dialed: listening
roles' certificates carry ``localhost``, ``127.0.0.1``, ``::1``, their node id and any ``certs init --host``.
Where a peer is dialed at an address its certificate does not carry (e.g. a bare IP on another machine) or
where the dialer knows whom it expects, pass ``peer_id`` to :func:`channel_options` / :func:`open_channel`:
it sets ``grpc.ssl_target_name_override`` to that node id, so the handshake succeeds only if the server's
certificate is that node's (its DNS SAN). Without ``peer_id`` any certificate of the CA that names the
dialed address is accepted, and the parent's identity is then only as strong as the address.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from fedhop.common.testhooks import mark
from fedhop.transport.certs import CA_CERT, node_files, node_id_of
from fedhop.transport.tokens import TOKEN_HEADER, TokenError, check_token, load_tokens, token_value

Mode = Literal["insecure", "tls", "token"]


class CredentialsError(ValueError):
    """``--tls`` / ``--token`` material that cannot be used; the message names the file and the problem."""


class Unauthenticated(Exception):
    """A peer whose identity could not be established; ``str()`` is the reason (safe to log, not to echo)."""


@dataclass(frozen=True)
class Security:
    """How one node authenticates itself and its peers. Build it with :meth:`load`."""

    mode: Mode
    node_id: str
    tls_dir: Path | None = None
    token_file: Path | None = None
    ca_pem: bytes = b""
    cert_pem: bytes = b""  # empty where a token-mode client has no certificate of its own
    key_pem: bytes = field(default=b"", repr=False)
    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def insecure(cls, node_id: str) -> Security:
        return cls("insecure", node_id)

    @property
    def plaintext(self) -> bool:
        """No transport security: plaintext links, peers taken at their word (``insecure`` mode)."""
        return self.mode == "insecure"

    @classmethod
    def load(cls, node_id: str, tls_dir: str | os.PathLike | None = None,
             token_file: str | os.PathLike | None = None) -> Security:
        """``--tls DIR`` alone: mutual TLS; with ``--token FILE``: tokens over server TLS; neither: insecure.

        Checks now what would otherwise fail at the first handshake: files present, the node's certificate
        signed by the CA, naming ``node_id``, and within its validity; the node's own token present."""
        if tls_dir is None and token_file is None:
            return cls.insecure(node_id)
        if tls_dir is None:
            raise CredentialsError("--token sends each node's token over TLS, so it needs --tls DIR too: a folder "
                                   "from `fedhop certs init` (a client needs only its ca.crt, a server its own "
                                   "key and certificate as well)")
        d = Path(tls_dir)
        if not d.is_dir():
            raise CredentialsError(f"--tls {d}: no such folder (create one with `fedhop certs init --out {d}`)")
        ca_path = d / CA_CERT
        if not ca_path.is_file():
            raise CredentialsError(f"--tls {d}: {CA_CERT} is missing (every node needs the CA certificate)")
        ca_pem = ca_path.read_bytes()
        ca = _load_cert(ca_path, ca_pem)
        files = node_files(d, node_id)
        has_own = files.cert.is_file() and files.key.is_file()
        if token_file is None and not has_own:
            missing = [str(p) for p in (files.cert, files.key) if not p.is_file()]
            raise CredentialsError(f"--tls {d}: {node_id} has no certificate there ({', '.join(missing)} missing); "
                                   f"issue one with `fedhop certs add --dir <CA folder> --id {node_id}`")
        cert_pem = key_pem = b""
        if has_own:
            cert_pem, key_pem = files.cert.read_bytes(), files.key.read_bytes()
            _check_own_cert(_load_cert(files.cert, cert_pem), ca, node_id, files.cert, ca_path)
        if token_file is None:
            return cls("tls", node_id, d, None, ca_pem, cert_pem, key_pem)
        try:
            tokens = load_tokens(token_file)
        except TokenError as e:
            raise CredentialsError(str(e)) from e
        if node_id not in tokens:
            raise CredentialsError(f"--token {token_file} holds no token for {node_id}")
        return cls("token", node_id, d, Path(token_file), ca_pem, cert_pem, key_pem, tokens)

    def describe(self) -> str:
        """One line for logs: the mode and where the material came from (never secrets)."""
        if self.plaintext:
            return "insecure (plaintext, no peer authentication)"
        if self.mode == "tls":
            return f"mutual TLS ({self.tls_dir})"
        return f"tokens ({self.token_file}) over TLS ({self.tls_dir})"


PLAINTEXT = Security.insecure("")
"""The Security of a node given no ``--tls`` / ``--token``: plaintext links (the default wherever one is needed)."""


@dataclass(frozen=True)
class SecurityByNode:
    """Each node's :class:`Security` (a client host's ids): :meth:`of` always yields one, :data:`PLAINTEXT` for an
    id it holds none for."""

    by_node: Mapping[str, Security] = field(default_factory=dict)

    def of(self, node_id: str) -> Security:
        return self.by_node.get(node_id, PLAINTEXT)


ALL_PLAINTEXT = SecurityByNode()  # every node plaintext


def _load_cert(path: Path, pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as e:
        raise CredentialsError(f"{path} is not a PEM certificate: {e}") from e


def _check_own_cert(cert: x509.Certificate, ca: x509.Certificate, node_id: str, path: Path, ca_path: Path) -> None:
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as e:
        raise CredentialsError(f"{path} was not issued by the CA in {ca_path} ({type(e).__name__}: {e})") from e
    named = node_id_of(cert)
    if named != node_id:
        raise CredentialsError(f"{path} is the certificate of {named or 'no fedhop node'}, not of {node_id}")
    now = dt.datetime.now(dt.UTC)
    if now > cert.not_valid_after_utc:
        raise CredentialsError(f"{path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; issue a new one "
                               f"with `fedhop certs add --force --id {node_id}`")
    if now < cert.not_valid_before_utc:
        raise CredentialsError(f"{path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
                               f"(check this machine's clock)")


# -- servers -------------------------------------------------------------------------------------------------


def server_credentials(sec: Security) -> grpc.ServerCredentials:
    """TLS server credentials: mutual TLS (client certificate required, root = the CA) in ``tls`` mode,
    server-side TLS in ``token`` mode (tokens are then checked by :func:`server_interceptors`)."""
    if sec.plaintext:
        raise CredentialsError("insecure mode has no server credentials (use add_port, which listens in plaintext)")
    if not sec.cert_pem:
        raise CredentialsError(f"{sec.node_id} serves, so --tls {sec.tls_dir} must hold its own certificate and key "
                               f"({sec.node_id}.crt, {sec.node_id}.key)")
    return grpc.ssl_server_credentials([(sec.key_pem, sec.cert_pem)], root_certificates=sec.ca_pem,
                                       require_client_auth=sec.mode == "tls")


def add_port(server: grpc.Server, listen: str, sec: Security) -> int:
    """``server.add_secure_port`` or ``add_insecure_port`` as ``sec`` says; the bound port (0: failed)."""
    if sec.plaintext:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, server_credentials(sec))


class _TokenGate(grpc.ServerInterceptor):
    """Refuses every call whose token is missing or wrong before any handler runs (UNAUTHENTICATED)."""

    def __init__(self, tokens: Mapping[str, str], on_refuse: Callable[[str, str], None] | None) -> None:
        self._tokens = tokens
        self._on_refuse = on_refuse

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        try:
            _token_identity(self._tokens, details.invocation_metadata)
        except Unauthenticated as e:
            return _refusal(handler, str(e), details.method, self._on_refuse)
        return handler


def _refusal(handler: grpc.RpcMethodHandler, why: str, method: str = "",
             on_refuse: Callable[[str, str], None] | None = None) -> grpc.RpcMethodHandler:
    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        if on_refuse is not None:  # told here, where the peer's address is known
            on_refuse(f"{method} from {context.peer()}", why)
        mark("unauthenticated-call")  # a test hook (common/testhooks.py): the tests await the refusal
        context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    return handler_like(handler, abort)


def handler_like(handler: grpc.RpcMethodHandler, fn: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """A method handler running ``fn`` with the same request / response streaming as ``handler``."""
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(fn)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(fn)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(fn)
    return grpc.unary_unary_rpc_method_handler(fn)


def server_interceptors(sec: Security, on_refuse: Callable[[str, str], None] | None = None,
                        ) -> list[grpc.ServerInterceptor]:
    """Interceptors for ``grpc.server(..., interceptors=...)``: in token mode, one that refuses unauthenticated
    calls before a handler runs (``on_refuse("<method> from <peer>", reason)`` is told, e.g. to log). mTLS
    needs none: the TLS handshake already refused peers without a good certificate."""
    return [_TokenGate(sec.tokens, on_refuse)] if sec.mode == "token" else []


# -- channels ------------------------------------------------------------------------------------------------


class _TokenAuth(grpc.AuthMetadataPlugin):
    def __init__(self, value: str) -> None:
        self._md = ((TOKEN_HEADER, value),)

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback(self._md, None)


def channel_credentials(sec: Security) -> grpc.ChannelCredentials:
    """``tls``: the CA as root plus this node's key and certificate (mutual TLS); ``token``: the CA as root
    and this node's token on every call (composite credentials)."""
    if sec.plaintext:
        raise CredentialsError("insecure mode has no channel credentials (use open_channel)")
    if sec.mode == "tls":
        return grpc.ssl_channel_credentials(root_certificates=sec.ca_pem, private_key=sec.key_pem,
                                            certificate_chain=sec.cert_pem)
    call = grpc.metadata_call_credentials(_TokenAuth(token_value(sec.node_id, sec.tokens[sec.node_id])),
                                          name="fedhop-token")
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(root_certificates=sec.ca_pem), call)


def channel_options(sec: Security, peer_id: str | None = None) -> list[tuple[str, Any]]:
    """Channel options for ``sec``: with ``peer_id``, the server must present that node's certificate
    (``grpc.ssl_target_name_override``; see the module docstring)."""
    if sec.plaintext or peer_id is None:
        return []
    return [("grpc.ssl_target_name_override", peer_id)]


def open_channel(target: str, sec: Security, options: Sequence[tuple[str, Any]] = (),
                 peer_id: str | None = None) -> grpc.Channel:
    """A channel to ``target`` with ``sec``'s credentials (plaintext in insecure mode)."""
    opts = [*options, *channel_options(sec, peer_id)]
    if sec.plaintext:
        return grpc.insecure_channel(target, options=opts)
    return grpc.secure_channel(target, channel_credentials(sec), options=opts)


# -- who is calling ------------------------------------------------------------------------------------------


def _token_identity(tokens: Mapping[str, str], metadata: Sequence[tuple[str, Any]] | None) -> str:
    values = [v for k, v in (metadata or ()) if k == TOKEN_HEADER]
    if not values:
        raise Unauthenticated("no token (token mode: every call must carry the fedhop-token metadata entry)")
    if len(values) > 1:
        raise Unauthenticated("more than one fedhop-token entry")
    node = check_token(tokens, values[0])
    if node is None:
        raise Unauthenticated("wrong token")
    return node


def peer_identity(context: grpc.ServicerContext, sec: Security) -> str | None:
    """The node id of the peer of a call, as verified by ``sec``'s mode; None in insecure mode (nothing is
    verified there: callers may fall back on what the peer claims).

    * ``tls``: the ``fedhop://node/<id>`` URI SAN of the client certificate the handshake verified against
      the CA. Metadata and Hello frames are ignored: client-1's certificate is client-1 whatever it says.
    * ``token``: the id whose token the ``fedhop-token`` entry carries, compared in constant time.

    Raises :class:`Unauthenticated` if the peer cannot be identified.
    """
    if sec.plaintext:
        return None
    if sec.mode == "token":
        return _token_identity(sec.tokens, context.invocation_metadata())
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        raise Unauthenticated("the connection is not TLS")
    pems = auth.get("x509_pem_cert") or []
    if len(pems) != 1:
        raise Unauthenticated("no verified client certificate on the connection")
    node = node_id_of(x509.load_pem_x509_certificate(pems[0]))
    if node is None:
        raise Unauthenticated("the client certificate names no fedhop node (no single fedhop://node/<id> URI)")
    return node


# -- refusing to listen in the clear ---------------------------------------------------------------------------


def is_loopback(listen_addr: str) -> bool:
    """Whether ``host:port`` (``[v6]:port``, ``unix:path``) can only be reached from this machine."""
    if listen_addr.startswith(("unix:", "unix-abstract:")):
        return True
    host = listen_addr.rsplit(":", 1)[0] if ":" in listen_addr else listen_addr
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or nothing: all interfaces) may be reachable from anywhere


def must_refuse_insecure(listen_addr: str, sec: Security, insecure_flag: bool) -> str | None:
    """Why a role must not listen on ``listen_addr`` with ``sec``, or None if it may.

    Listening beyond loopback without TLS or tokens needs ``--insecure``: anyone who can reach the port could
    join as any node, read the model and send poisoned updates."""
    if not sec.plaintext or insecure_flag or is_loopback(listen_addr):
        return None
    return (f"refusing to listen on {listen_addr} without TLS or tokens: anyone who can reach that address could "
            f"join as any node, receive the model and send poisoned updates. Give --tls DIR (from `fedhop certs "
            f"init`) or --token FILE with --tls DIR (from `fedhop tokens init`), listen on 127.0.0.1, or pass "
            f"--insecure on a network you trust.")
