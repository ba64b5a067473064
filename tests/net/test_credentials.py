"""transport/credentials.py against REAL gRPC servers on loopback: a one-method generic service that answers
with the caller's identity as :func:`peer_identity` establishes it."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from concurrent import futures

import grpc
import pytest

from fedhop.transport.certs import CA, init_folder, node_files, write_cert, write_key
from fedhop.transport.credentials import (
    CredentialsError,
    Security,
    Unauthenticated,
    add_port,
    must_refuse_insecure,
    open_channel,
    peer_identity,
    server_interceptors,
)
from fedhop.transport.tokens import TOKEN_HEADER, new_tokens, write_tokens

NODES = ["ps", "edge-0", "client-1", "client-2"]
METHOD = "/fedhop.test.Who/Am"


class WhoServer:
    """A real gRPC server whose one unary method returns the verified peer id (or the refusal reason)."""

    def __init__(self, sec: Security) -> None:
        self.sec = sec
        self.calls = 0
        self.refused: list[str] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                  interceptors=server_interceptors(sec, lambda m, why: self.refused.append(why)))
        handler = grpc.unary_unary_rpc_method_handler(self._am)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.test.Who",
                                                                                   {"Am": handler}),))
        self.port = add_port(self.server, "127.0.0.1:0", sec)
        assert self.port
        self.server.start()

    def _am(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls += 1
        try:
            return (peer_identity(context, self.sec) or "(unverified)").encode()
        except Unauthenticated as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))

    def ask(self, channel: grpc.Channel, metadata=()) -> str:
        with channel:
            return channel.unary_unary(METHOD)(b"", timeout=10, metadata=metadata).decode()

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    init_folder(d, NODES)
    return d


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("other")
    init_folder(d, NODES)
    return d


@pytest.fixture
def mtls_server(pki):
    s = WhoServer(Security.load("ps", pki))
    yield s
    s.stop()


def target(s: WhoServer) -> str:
    return f"127.0.0.1:{s.port}"


def raw_channel(s: WhoServer, ca: bytes, key: bytes | None = None, chain: bytes | None = None) -> grpc.Channel:
    """A channel built by hand, as an attacker would, not through the module under test."""
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=chain)
    return grpc.secure_channel(target(s), creds)


def refused(s: WhoServer, channel: grpc.Channel, metadata=()) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        s.ask(channel, metadata)
    return e.value.code()


# -- mutual TLS --------------------------------------------------------------------------------------------


def test_mtls_identity_is_the_certificate_san(mtls_server, pki):
    assert mtls_server.ask(open_channel(target(mtls_server), Security.load("client-1", pki))) == "client-1"
    assert mtls_server.ask(open_channel(target(mtls_server), Security.load("edge-0", pki))) == "edge-0"


def test_mtls_identity_ignores_what_the_peer_claims_in_metadata(mtls_server, pki):
    ch = open_channel(target(mtls_server), Security.load("client-1", pki))
    claims = (("fedhop-node", "client-2"), (TOKEN_HEADER, "client-2:" + "ab" * 32))
    assert mtls_server.ask(ch, claims) == "client-1"


def test_mtls_refuses_a_client_without_a_certificate(mtls_server, pki):
    ch = raw_channel(mtls_server, (pki / "ca.crt").read_bytes())
    assert refused(mtls_server, ch) == grpc.StatusCode.UNAVAILABLE
    assert mtls_server.calls == 0


def test_mtls_refuses_a_certificate_from_another_ca(mtls_server, pki, other_pki):
    f = node_files(other_pki, "client-1")
    ch = raw_channel(mtls_server, (pki / "ca.crt").read_bytes(), f.key.read_bytes(), f.cert.read_bytes())
    assert refused(mtls_server, ch) == grpc.StatusCode.UNAVAILABLE
    assert mtls_server.calls == 0


def test_mtls_refuses_an_expired_certificate(mtls_server, pki, tmp_path):
    now = dt.datetime.now(dt.UTC)
    key, cert = CA.load(pki).issue("client-1", not_before=now - dt.timedelta(days=3),
                                   not_after=now - dt.timedelta(days=1))
    write_key(tmp_path / "k", key)
    write_cert(tmp_path / "c", cert)
    ch = raw_channel(mtls_server, (pki / "ca.crt").read_bytes(), (tmp_path / "k").read_bytes(),
                     (tmp_path / "c").read_bytes())
    assert refused(mtls_server, ch) == grpc.StatusCode.UNAVAILABLE
    assert mtls_server.calls == 0
    # and Security.load says so before anything dials
    d = tmp_path / "tls"
    d.mkdir()
    shutil.copy(pki / "ca.crt", d)
    shutil.copy(tmp_path / "k", d / "client-1.key")
    shutil.copy(tmp_path / "c", d / "client-1.crt")
    with pytest.raises(CredentialsError, match="expired"):
        Security.load("client-1", d)


def test_client_refuses_a_server_from_another_ca(pki, other_pki):
    s = WhoServer(Security.load("ps", other_pki))
    try:
        assert refused(s, open_channel(target(s), Security.load("client-1", pki))) == grpc.StatusCode.UNAVAILABLE
        assert s.calls == 0
    finally:
        s.stop()


def test_peer_id_pins_the_server_certificate(mtls_server, pki):
    """With peer_id the dialer accepts only that node's certificate (ssl_target_name_override)."""
    sec = Security.load("client-1", pki)
    assert mtls_server.ask(open_channel(target(mtls_server), sec, peer_id="ps")) == "client-1"
    assert refused(mtls_server, open_channel(target(mtls_server), sec, peer_id="edge-0")) == \
        grpc.StatusCode.UNAVAILABLE


def test_peer_id_reaches_a_server_at_an_address_its_certificate_does_not_name(tmp_path):
    """A certificate naming only the node id (no loopback): dialing 127.0.0.1 fails the name check unless the
    dialer names the node it expects."""
    ca = CA.create("t")
    d = tmp_path / "pki"
    d.mkdir()
    write_cert(d / "ca.crt", ca.cert)
    for n in ("client-1", "client-5"):  # client-5 stands for a node with only its id as a name
        key, cert = ca.issue(n)
        write_key(d / f"{n}.key", key)
        write_cert(d / f"{n}.crt", cert)
    s = WhoServer(Security.load("client-5", d))
    try:
        sec = Security.load("client-1", d)
        assert refused(s, open_channel(target(s), sec)) == grpc.StatusCode.UNAVAILABLE
        assert s.ask(open_channel(target(s), sec, peer_id="client-5")) == "client-1"
    finally:
        s.stop()


# -- tokens over TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_setup(pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tokens = new_tokens(NODES)
    write_tokens(d / "all.toml", tokens)
    write_tokens(d / "client-1.toml", {"client-1": tokens["client-1"]})
    write_tokens(d / "forged.toml", {"client-1": "ab" * 32})
    client_dir = d / "client-tls"  # a token-mode client holds the CA certificate only
    client_dir.mkdir()
    shutil.copy(pki / "ca.crt", client_dir)
    return d, client_dir


@pytest.fixture
def token_server(pki, token_setup):
    d, _ = token_setup
    s = WhoServer(Security.load("ps", pki, d / "all.toml"))
    yield s
    s.stop()


def test_token_mode_accepts_the_right_token(token_server, token_setup):
    d, client_dir = token_setup
    sec = Security.load("client-1", client_dir, d / "client-1.toml")
    assert sec.mode == "token" and not sec.cert_pem
    assert token_server.ask(open_channel(target(token_server), sec), (("fedhop-node", "client-2"),)) == "client-1"


def test_token_mode_refuses_a_wrong_token(token_server, token_setup):
    d, client_dir = token_setup
    ch = open_channel(target(token_server), Security.load("client-1", client_dir, d / "forged.toml"))
    assert refused(token_server, ch) == grpc.StatusCode.UNAUTHENTICATED
    assert token_server.calls == 0 and token_server.refused == ["wrong token"]


def test_token_mode_refuses_a_missing_token(token_server, pki):
    ch = raw_channel(token_server, (pki / "ca.crt").read_bytes())
    assert refused(token_server, ch, (("fedhop-node", "client-1"),)) == grpc.StatusCode.UNAUTHENTICATED
    assert token_server.calls == 0 and "no token" in token_server.refused[0]


def test_token_mode_refuses_a_plaintext_client(token_server):
    assert refused(token_server, grpc.insecure_channel(target(token_server))) == grpc.StatusCode.UNAVAILABLE
    assert token_server.calls == 0


# -- loading and refusing ------------------------------------------------------------------------------------


def test_load_modes(pki, token_setup):
    d, _ = token_setup
    assert Security.load("client-1").mode == "insecure"
    assert Security.load("client-1", pki).mode == "tls"
    assert Security.load("client-1", pki, d / "all.toml").mode == "token"
    tok = Security.load("client-1", pki, d / "all.toml")
    assert tok.tokens["client-1"] not in repr(tok) and tok.key_pem.decode() not in repr(tok)


@pytest.mark.parametrize("case, problem", [
    ("token-without-tls", "needs --tls DIR"),
    ("no-folder", "no such folder"),
    ("no-ca", "ca.crt is missing"),
    ("unknown-node", "has no certificate there"),
    ("someone-elses-cert", "certificate of client-2, not of client-1"),
    ("other-ca", "not issued by the CA"),
    ("no-own-token", "no token for edge-0"),
])
def test_load_errors_name_the_problem(pki, other_pki, token_setup, tmp_path, case, problem):
    d, _ = token_setup
    if case == "token-without-tls":
        args = ("client-1", None, d / "all.toml")
    elif case == "no-folder":
        args = ("client-1", tmp_path / "absent", None)
    elif case == "no-ca":
        args = ("client-1", tmp_path, None)
    elif case == "unknown-node":
        args = ("client-7", pki, None)
    elif case == "someone-elses-cert":
        shutil.copy(pki / "ca.crt", tmp_path)
        shutil.copy(pki / "client-2.crt", tmp_path / "client-1.crt")
        shutil.copy(pki / "client-2.key", tmp_path / "client-1.key")
        args = ("client-1", tmp_path, None)
    elif case == "other-ca":
        shutil.copy(other_pki / "ca.crt", tmp_path)
        shutil.copy(pki / "client-1.crt", tmp_path)
        shutil.copy(pki / "client-1.key", tmp_path)
        args = ("client-1", tmp_path, None)
    else:
        args = ("edge-0", pki, d / "client-1.toml")
    with pytest.raises(CredentialsError, match=problem):
        Security.load(*args)


def test_a_token_client_cannot_serve(token_setup):
    d, client_dir = token_setup
    sec = Security.load("client-1", client_dir, d / "client-1.toml")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    with pytest.raises(CredentialsError, match="own certificate"):
        add_port(server, "127.0.0.1:0", sec)


@pytest.mark.parametrize("addr, refuse", [
    ("127.0.0.1:50051", False), ("localhost:50051", False), ("[::1]:50051", False), ("127.0.0.2:1", False),
    ("0.0.0.0:50051", True), ("[::]:50051", True), ("10.0.0.5:50051", True), ("edge-0:50061", True),
    (":50051", True),
])
def test_must_refuse_insecure(pki, addr, refuse):
    insecure = Security.insecure("ps")
    why = must_refuse_insecure(addr, insecure, False)
    assert (why is not None) == refuse
    if refuse:
        assert addr in why and "--insecure" in why and "--tls" in why
    assert must_refuse_insecure(addr, insecure, True) is None
    assert must_refuse_insecure(addr, Security.load("ps", pki), False) is None
