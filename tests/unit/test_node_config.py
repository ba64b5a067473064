"""One Security that is never None (``.plaintext``, :data:`PLAINTEXT`, :class:`SecurityByNode`) and the frozen,
checked :class:`NodeConfig` of a child node. No sockets, no processes."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from fedhop.client.host import run_clients
from fedhop.client.main import run_client, run_client_async
from fedhop.edge.node import run_edge
from fedhop.transport import channels, health, peer
from fedhop.transport.credentials import (
    ALL_PLAINTEXT,
    PLAINTEXT,
    Security,
    SecurityByNode,
    channel_options,
    must_refuse_insecure,
)
from fedhop.transport.node_config import NodeConfig, NodeConfigError
from fedhop.transport.session import HubConfig, PendingHub

TLS = Security("tls", "client-1")
TOKEN = Security("token", "client-2")


def test_plaintext_is_the_insecure_mode_and_only_it() -> None:
    assert PLAINTEXT.plaintext and PLAINTEXT.mode == "insecure" and PLAINTEXT.node_id == ""
    assert Security.insecure("edge-0").plaintext
    assert Security.load("edge-0").plaintext  # no --tls, no --token
    assert not TLS.plaintext and not TOKEN.plaintext
    assert PLAINTEXT.describe() == "insecure (plaintext, no peer authentication)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLAINTEXT.mode = "tls"  # type: ignore[misc]


def test_plaintext_asks_for_nothing_of_the_peer() -> None:
    assert channel_options(PLAINTEXT, "ps") == []
    assert channel_options(TLS, "ps") == [("grpc.ssl_target_name_override", "ps")]
    assert must_refuse_insecure("0.0.0.0:50051", PLAINTEXT, insecure_flag=False) is not None
    assert must_refuse_insecure("127.0.0.1:50051", PLAINTEXT, insecure_flag=False) is None
    assert must_refuse_insecure("0.0.0.0:50051", TLS, insecure_flag=False) is None


def test_security_by_node_always_yields_a_security() -> None:
    by_node = SecurityByNode({"client-1": TLS})
    assert by_node.of("client-1") is TLS
    assert by_node.of("client-9") is PLAINTEXT  # an id it holds nothing for: plaintext, never None
    assert ALL_PLAINTEXT.of("client-1") is PLAINTEXT


@pytest.mark.parametrize("fn", [channels.make_server, channels.add_port, channels.make_channel, health.probe,
                                health.wait_until_gone, peer.EdgeService, peer.PeerClient, PendingHub])
def test_every_default_security_is_plaintext_not_none(fn) -> None:
    param = inspect.signature(fn).parameters["security"]
    assert param.default is PLAINTEXT


def test_the_hub_config_and_the_pending_hub_default_to_plaintext() -> None:
    assert HubConfig.__dataclass_fields__["security"].default is PLAINTEXT
    assert PendingHub("edge-0").security is PLAINTEXT


def test_a_node_config_is_frozen_with_plaintext_defaults() -> None:
    cfg = NodeConfig("client-1", "127.0.0.1:50051")
    assert cfg.security is PLAINTEXT and cfg.listen is None and cfg.state_dir is None
    assert (cfg.connect_timeout_s, cfg.linger_timeout_s) == (60.0, 300.0)
    assert NodeConfig("client-1", "127.0.0.1:50051", connect_timeout_s=0.0).connect_timeout_s == 0.0  # one try
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.node_id = "client-2"  # type: ignore[misc]


def test_for_node_changes_only_the_id_and_the_credentials() -> None:
    host = NodeConfig("2 clients", "edge-0:7000", device="cpu", data_path="/data", state_dir=Path("/s"),
                      connect_timeout_s=5.0)
    one = host.for_node("client-1", TLS)
    assert (one.node_id, one.security) == ("client-1", TLS)
    assert dataclasses.replace(one, node_id=host.node_id, security=host.security) == host


@pytest.mark.parametrize("kwargs, problem", [
    ({"node_id": ""}, "node_id: empty"),
    ({"connect": ""}, "connect: empty"),
    ({"listen": ""}, "listen: empty"),
    ({"connect_timeout_s": -0.5}, "connect_timeout_s: -0.5"),
    ({"linger_timeout_s": -1.0}, "linger_timeout_s: -1.0"),
    ({"connect_timeout_s": float("nan")}, "connect_timeout_s: nan"),
    ({"security": None}, "security: None is not a Security"),
])
def test_a_node_config_that_cannot_be_used_says_which_field(kwargs, problem) -> None:
    base = {"node_id": "edge-0", "connect": "127.0.0.1:50051", "listen": "127.0.0.1:0"}
    with pytest.raises(NodeConfigError, match=problem):
        NodeConfig(**{**base, **kwargs})


def test_an_edge_without_a_listen_address_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="edge-0: an edge needs a listen address"):
        run_edge(NodeConfig("edge-0", "127.0.0.1:50051"))


def test_the_entry_points_take_one_node_config() -> None:
    assert list(inspect.signature(run_edge).parameters) == ["config"]
    assert list(inspect.signature(run_client).parameters) == ["config"]
    assert list(inspect.signature(run_client_async).parameters) == ["config", "host", "on_ready"]  # a host's id
    assert list(inspect.signature(run_clients).parameters) == ["ids", "config", "security", "join_slots"]
    assert inspect.signature(run_clients).parameters["security"].default is ALL_PLAINTEXT
