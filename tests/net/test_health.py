"""grpc.health.v1 on fedhop's servers (transport/health.py) and ``fedhop health``'s exit codes."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from fedhop.cli import main
from fedhop.launch import free_port
from fedhop.transport.health import Probe, add_health, probe, serve_health, wait_until_gone


@pytest.fixture
def served():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health = add_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield server, health, f"127.0.0.1:{port}"
    server.stop(0)


def test_probe_follows_the_status_a_role_sets(served) -> None:
    _, health, addr = served
    assert probe(addr, 5).outcome == Probe.SERVING
    health.not_serving()
    r = probe(addr, 5)
    assert r.outcome == Probe.NOT_SERVING and "NOT_SERVING" in r.detail
    health.serving()
    assert probe(addr, 5, service="fedhop.v1").outcome == Probe.SERVING
    assert probe(addr, 5, service="no.such.Service").outcome == Probe.NOT_SERVING


def test_fedhop_health_exit_codes(served, capsys) -> None:
    _, health, addr = served
    assert main(["health", addr, "--timeout", "5"]) == 0
    assert "SERVING" in capsys.readouterr().out
    health.not_serving()
    assert main(["health", addr, "--timeout", "5"]) == 1
    assert main(["health", f"127.0.0.1:{free_port()}", "--timeout", "0.5"]) == 2
    assert "unreachable within 0.5s" in capsys.readouterr().err
    assert main(["health", addr, "--timeout", "0"]) == 2


def test_server_without_health_service_is_not_serving() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        r = probe(f"127.0.0.1:{port}", 5)
        assert r.outcome == Probe.NOT_SERVING and "no grpc.health.v1" in r.detail
    finally:
        server.stop(0)


def test_health_only_server_for_clients() -> None:
    hs = serve_health("127.0.0.1:0")
    addr = f"127.0.0.1:{hs.port}"
    assert probe(addr, 5).outcome == Probe.SERVING
    hs.stop()
    assert probe(addr, 0.5).outcome == Probe.UNREACHABLE
    with pytest.raises(OSError, match="cannot listen"):
        serve_health("256.0.0.1:1")


def test_wait_until_gone_wakes_when_the_server_stops_or_turns_not_serving(served) -> None:
    server, health, addr = served
    assert wait_until_gone(addr, 0.5) is False  # still serving: times out
    done = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        result.append(wait_until_gone(addr, 30))
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert not done.wait(0.3)
    health.not_serving()
    assert done.wait(30) and result == [True]
    t.join()
    health.serving()
    gone = threading.Event()
    t = threading.Thread(target=lambda: (result.append(wait_until_gone(addr, 20)), gone.set()))
    t.start()
    assert not gone.wait(0.3)  # still serving: the waiter waits
    server.stop(0)
    assert gone.wait(40)
    assert result == [True, True]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from fedhop.transport.certs import init_folder
    from fedhop.transport.tokens import new_tokens, write_tokens

    d = tmp_path_factory.mktemp("health-pki")
    init_folder(d / "certs", ["ps", "client-0"])
    write_tokens(d / "tokens.toml", new_tokens(["ps", "client-0"]))
    return d


@pytest.mark.parametrize("mode", ["tls", "token"])
def test_fedhop_health_with_tls_or_tokens(pki, mode, capsys) -> None:
    """`fedhop health ADDRESS --tls DIR [--token FILE] --id NODE` reaches a node whose links are secured; without
    the credentials it cannot, and says what to give."""
    from fedhop.transport.channels import add_port, make_server
    from fedhop.transport.credentials import Security

    creds = ["--tls", str(pki / "certs"), *(["--token", str(pki / "tokens.toml")] if mode == "token" else [])]
    sec = Security.load("ps", pki / "certs", pki / "tokens.toml" if mode == "token" else None)
    server = make_server(4, sec)
    add_health(server)
    port = add_port(server, "127.0.0.1:0", sec)
    server.start()
    addr = f"127.0.0.1:{port}"
    try:
        assert main(["health", addr, "--timeout", "5", *creds, "--id", "client-0"]) == 0, capsys.readouterr()
        assert "SERVING" in capsys.readouterr().out
        assert main(["health", addr, "--timeout", "1"]) == 2  # plaintext against TLS: no handshake
        assert "give --tls DIR" in capsys.readouterr().err
        assert main(["health", addr, "--timeout", "5", *creds]) == 2
        assert "need --id NODE" in capsys.readouterr().err
        assert main(["health", addr, "--timeout", "5", *creds, "--id", "client-7"]) == 2
        assert "client-7" in capsys.readouterr().err
        if mode == "token":  # a token the node does not know
            from fedhop.transport.tokens import new_tokens, write_tokens

            wrong = write_tokens(pki / "wrong.toml", new_tokens(["client-0"]), force=True)
            assert main(["health", addr, "--timeout", "5", "--tls", str(pki / "certs"), "--token", str(wrong),
                         "--id", "client-0"]) == 2
            assert "refused the probe's credentials" in capsys.readouterr().err
    finally:
        server.stop(0)
