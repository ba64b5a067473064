"""Secure links with real processes (issue 9): mutual TLS and tokens give the same run as the in-process
engine; peers without the right certificate or token, or claiming another node's id, or handing off from
outside the edge graph, are refused while the run goes on with the honest nodes; a client cannot inflate
its FedAvg weight by claiming another data size than the one it joined with."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest
import torch

from fedhop.cli import main
from fedhop.common.engine.base import HandOffError, MissingLog
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.spec import RunSpec
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.certs import CA, CA_CERT, node_files, write_cert, write_key
from fedhop.transport.child import ChildSession, JoinError
from fedhop.transport.credentials import CredentialsError, Security
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.peer import PeerClient
from fedhop.transport.tokens import load_tokens
from tests.integration.netutil import Federation, launch_cli_here, load_result, node_log, rows_by_key, small_spec
from tests.waiting import exited, wait_until

SESSION = "/fedhop.v1.Parent/Session"


def fedhop(*args: str) -> None:
    """``fedhop ARGS`` in this process (`certs`, `tokens`: no role, nothing that outlives the call)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert code == 0, f"fedhop {' '.join(args)} failed ({code}):\n{out.getvalue()}\n{err.getvalue()}"


def certs_for(spec: RunSpec, tmp: Path, name: str = "pki") -> Path:
    """`fedhop certs init` for the spec's nodes."""
    spec_file = tmp / f"{name}-spec.toml"
    spec_file.write_text(spec.to_toml())
    fedhop("certs", "init", str(spec_file), "--out", str(tmp / name))
    return tmp / name


def tokens_for(spec: RunSpec, tmp: Path) -> Path:
    spec_file = tmp / "tokens-spec.toml"
    spec_file.write_text(spec.to_toml())
    fedhop("tokens", "init", str(spec_file), "--out", str(tmp / "tokens.toml"))
    return tmp / "tokens.toml"


def assert_same_as_inprocess(spec: RunSpec, res: dict, final: dict[str, torch.Tensor]) -> None:
    """The networked run's final model and message bytes equal the in-process engine's."""
    oracle = InProcessEngine(spec, device="cpu").run()
    assert res["missing"] == [], res["missing"]
    assert list(final) == list(oracle.final)
    for k, v in oracle.final.items():
        assert torch.equal(final[k], v), f"tensor {k} differs from the in-process engine"
    ora = rows_by_key(oracle.links, "message_bytes")
    net = rows_by_key(res["links"], "message_bytes")
    assert {k: net[k] for k in ora} == ora
    assert [r["accuracy"] for r in res["rounds"]] == [r["accuracy"] for r in oracle.rounds]


# -- the same run, secured ------------------------------------------------------------------------------------

# every link kind: PS-edge, edge-client, edge-edge hand-offs (the flat PS-client link: the --tls auto test)
SECURED = {"fedchs-handoff": dict(algorithm="fedchs", clients=3, edges=3, edge_graph="ring")}


def test_mutual_tls_run_is_bit_identical_to_inprocess(tmp_path: Path) -> None:
    spec = small_spec(**SECURED["fedchs-handoff"])
    pki = certs_for(spec, tmp_path)
    out = launch_cli_here(spec, tmp_path, security=["--tls", str(pki)])
    assert "mutual TLS" in node_log(out, "client-0")
    assert_same_as_inprocess(spec, *load_result(out))


def test_token_run_is_bit_identical_to_inprocess(tmp_path: Path) -> None:
    spec = small_spec(**SECURED["fedchs-handoff"])
    pki, tokens = certs_for(spec, tmp_path), tokens_for(spec, tmp_path)
    out = launch_cli_here(spec, tmp_path, security=["--tls", str(pki), "--token", str(tokens)])
    assert "tokens (" in (out / "logs" / "edge-0.log").read_text()
    assert_same_as_inprocess(spec, *load_result(out))


def test_launch_tls_auto_makes_a_throwaway_ca(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=2, rounds=2)
    out = launch_cli_here(spec, tmp_path, security=["--tls", "auto"])
    assert (out / "tls" / CA_CERT).is_file() and node_files(out / "tls", "client-1").key.is_file()
    assert "mutual TLS" in node_log(out, "client-0")
    assert_same_as_inprocess(spec, *load_result(out))


# -- refusals (mutual TLS) ------------------------------------------------------------------------------------


def _handshake_fails(addr: str, creds: grpc.ChannelCredentials) -> bool:
    with grpc.secure_channel(addr, creds) as ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=5)
        except grpc.FutureTimeoutError:
            return True
        return False  # the server let the peer in at the TLS level


def _with_cert(pki: Path, key_pem: bytes, cert_pem: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=(pki / CA_CERT).read_bytes(), private_key=key_pem,
                                        certificate_chain=cert_pem)


def test_peers_without_a_good_certificate_or_claiming_another_id_are_refused(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=3, rounds=2)
    pki = certs_for(spec, tmp_path)
    other = certs_for(spec, tmp_path, "other-ca")
    fed = Federation(spec, tmp_path, hold=("client-2",), security=["--tls", str(pki)])
    try:
        fed.wait_seen("ready-ps-client-1", 60)
        ps = fed.addr["ps"]
        # no certificate at all
        assert _handshake_fails(ps, grpc.ssl_channel_credentials(root_certificates=(pki / CA_CERT).read_bytes()))
        # an expired certificate of the right CA (the node's own loader refuses it, so craft the channel)
        now = dt.datetime.now(dt.UTC)
        key, cert = CA.load(pki).issue("client-2", not_before=now - dt.timedelta(days=10),
                                       not_after=now - dt.timedelta(days=1))
        stale = tmp_path / "stale"
        stale.mkdir()
        shutil.copy(pki / CA_CERT, stale / CA_CERT)
        write_key(node_files(stale, "client-2").key, key)
        write_cert(node_files(stale, "client-2").cert, cert)
        with pytest.raises(CredentialsError, match="expired"):
            Security.load("client-2", stale)
        files = node_files(stale, "client-2")
        assert _handshake_fails(ps, _with_cert(pki, files.key.read_bytes(), files.cert.read_bytes()))
        # a certificate from another CA: a real client process, refused at the handshake
        fed.start_node("client-2", security=["--tls", str(other)])
        assert fed.procs.procs["client-2"].wait(60) != 0
        assert "no TLS handshake" in fed.log_of("client-2")
        # client-1's certificate saying Hello as client-2
        c1 = node_files(pki, "client-1")
        liar = Security("tls", "client-2", pki, None, (pki / CA_CERT).read_bytes(), c1.cert.read_bytes(),
                        c1.key.read_bytes())
        session = ChildSession(NodeConfig("client-2", ps, connect_timeout_s=20, security=liar), "client")
        rejected = fed.seen("rejected-ps")
        with pytest.raises(JoinError, match="is client-1's, but it said Hello as 'client-2'"):
            session.connect()
        session.close()
        fed.wait_seen("rejected-ps", 10, times=rejected + 1)  # the PS refused it, and logged why:
        assert "is client-1's, but it said Hello as 'client-2'" in fed.ps_log()
        assert "rejected ipv4:127.0.0.1:" in fed.ps_log()
        # the honest client-2 joins and the run is the undisturbed one
        fed.procs.procs.pop("client-2")
        fed.start_node("client-2")
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()
    assert_same_as_inprocess(spec, *load_result(fed.out))


def test_wrong_or_missing_token_is_refused(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=3, rounds=2)
    pki, tokens = certs_for(spec, tmp_path), tokens_for(spec, tmp_path)
    fed = Federation(spec, tmp_path, hold=("client-2",), security=["--tls", str(pki), "--token", str(tokens)])
    try:
        fed.wait_seen("ready-ps-client-1", 60)
        ps = fed.addr["ps"]
        ca = (pki / CA_CERT).read_bytes()
        refused = fed.seen("unauthenticated-call")
        wrong = Security("token", "client-2", pki, tokens, ca, tokens={"client-2": "ab" * 32})
        session = ChildSession(NodeConfig("client-2", ps, connect_timeout_s=20, security=wrong), "client")
        with pytest.raises(JoinError, match="UNAUTHENTICATED: wrong token"):
            session.connect()
        session.close()
        fed.wait_seen("unauthenticated-call", 10, times=refused + 1)  # the PS refused the call, and logged why:
        assert "from ipv4:127.0.0.1:" in fed.ps_log() and "wrong token" in fed.ps_log()
        refused = fed.seen("unauthenticated-call")
        with grpc.secure_channel(ps, grpc.ssl_channel_credentials(root_certificates=ca)) as ch:  # no token
            call = ch.stream_stream(SESSION, request_serializer=bytes, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as e:
                list(call(iter(()), timeout=10))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        fed.wait_seen("unauthenticated-call", 10, times=refused + 1)
        assert "no token" in fed.ps_log()
        assert set(load_tokens(tokens)) >= {"ps", "client-2"}
        fed.start_node("client-2")
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()
    assert_same_as_inprocess(spec, *load_result(fed.out))


def test_hand_offs_and_describes_only_from_neighbours_certificates(tmp_path: Path, monkeypatch) -> None:
    spec = small_spec("fedchs", clients=4, edges=4, edge_graph="ring", rounds=3)
    pki = certs_for(spec, tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "stop-1").touch()
    monkeypatch.setenv("FEDHOP_TEST_GATE", str(gate))
    fed = Federation(spec, tmp_path, security=["--tls", str(pki)])
    try:
        topo = fed.topology
        target = topo.edges[0]
        stranger = next(e for e in topo.edges if e != target and e not in topo.neighbours[target])
        friend = topo.neighbours[target][0]
        # the run is between rounds 1 and 2: every edge is in it
        wait_until((gate / "at-1").exists, "round 1 to end", timeout=120, stop_if=exited(fed.ps, "the PS"),
                   details=fed.all_logs)
        missing = MissingLog()
        # a non-neighbour's own certificate; then the same certificate claiming the neighbour in metadata
        for claimed in (stranger, friend):
            peer = PeerClient(claimed, ByteMeter(), missing, spec.transport, {target: fed.addr[target]},
                              Security.load(stranger, pki))
            with pytest.raises(HandOffError, match=f"{stranger} is not a neighbour of {target}"):
                peer.hand_off(target, "chs.model", {"w": torch.zeros(4)}, {}, 1)
            assert peer.describe(target, 1) is None
            peer.close()
        log = fed.log_of(target)
        assert "hand-off from ipv4:127.0.0.1:" in log and f"refused: {stranger} is not a neighbour of {target}" in log
        assert "describe from ipv4:127.0.0.1:" in log
        assert str(topo.neighbours[target]) not in "".join(m["reason"] for m in missing.entries)
        (gate / "go-1").touch()
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()
    assert_same_as_inprocess(spec, *load_result(fed.out))


# -- weight inflation -----------------------------------------------------------------------------------------

INFLATING_CLIENT = textwrap.dedent("""
    import sys
    from fedhop.common.engine import api
    from fedhop.common.engine.api import Reply
    import fedhop.common.algorithms  # noqa: F401  (registers the tasks)

    honest = api.TASKS["local.train"]

    def inflated(ctx, bundle, args):
        r = honest(ctx, bundle, args)
        return Reply(r.bundle, {**r.scalars, "n": 10**12})

    api.TASKS["local.train"] = inflated
    from fedhop.client.main import run_client
    from fedhop.transport.node_config import NodeConfig
    sys.exit(run_client(NodeConfig(sys.argv[1], sys.argv[2])))
""")


def test_a_client_claiming_another_data_size_is_rejected(tmp_path: Path) -> None:
    """Squatting client-2's id (insecure, loopback) and answering with n = 10**12: every reply is rejected."""
    spec = small_spec("fedavg", clients=3, rounds=3)
    fed = Federation(spec, tmp_path, hold=("client-2",))
    try:
        script = tmp_path / "inflate.py"
        script.write_text(INFLATING_CLIENT)
        fed.procs.start("client-2", [sys.executable, str(script), "client-2", fed.addr["ps"]])
        assert fed.wait(180) == 0, fed.all_logs()
    finally:
        fed.close()
    res, _ = load_result(fed.out)
    rejected = {m["round"] for m in res["missing"] if m["node"] == "client-2"
                and "client-2 claims n = 1000000000000 samples, but reported" in m["reason"]}
    assert rejected == set(range(1, spec.rounds + 1)), res["missing"]
    assert "client-2" in fed.ps_log() and "rejected reply" in str(res["missing"])


# -- listening in the clear -----------------------------------------------------------------------------------


def _role(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedhop", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("role", ["server", "edge"])
def test_listening_beyond_loopback_in_plaintext_needs_insecure(role: str, tmp_path: Path) -> None:
    from fedhop.launch import free_port

    args = (["server", "--out", str(tmp_path / "run")] if role == "server"
            else ["edge", "--id", "edge-0", "--connect", f"127.0.0.1:{free_port()}", "--connect-timeout", "1"])
    p = _role(*args, "--listen", "0.0.0.0:0")
    assert p.returncode == 2, p.stderr
    assert "refusing to listen on 0.0.0.0:0 without TLS or tokens" in p.stderr and "--insecure" in p.stderr
    assert not (tmp_path / "run").exists()
    p = _role(*args, "--listen", "0.0.0.0:0", "--insecure", "--tls", str(tmp_path))
    assert p.returncode == 2 and "--insecure contradicts --tls/--token" in p.stderr, p.stderr


def test_bad_tls_folder_is_a_usage_error(tmp_path: Path) -> None:
    p = _role("client", "--id", "client-0", "--connect", "127.0.0.1:1", "--tls", str(tmp_path / "nope"))
    assert p.returncode == 2 and "no such folder" in p.stderr, p.stderr
    p = _role("client", "--id", "client-0", "--connect", "127.0.0.1:1", "--token", str(tmp_path / "t.toml"))
    assert p.returncode == 2 and "needs --tls DIR too" in p.stderr, p.stderr


def test_launch_checks_every_nodes_certificate_before_starting(tmp_path: Path) -> None:
    spec = small_spec("fedavg", clients=2, rounds=1)
    pki = certs_for(spec, tmp_path)
    node_files(pki, "client-1").key.unlink()
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(spec.to_toml())
    p = _role("launch", str(spec_file), "--out", str(tmp_path / "run"), "--quiet", "--tls", str(pki))
    assert p.returncode == 2, p.stderr
    assert "client-1 has no certificate there" in p.stderr and "client-1.key" in p.stderr
    assert not (tmp_path / "run" / "logs").exists()
