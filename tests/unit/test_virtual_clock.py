"""Predicting a run's time from its ``[network]`` profile (common/virtual_clock.py): the transfer model with
hand-computed numbers, and ``simulate``'s virtual clock on the in-process engine."""

from __future__ import annotations

import math

import pytest
import torch

from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.network_spec import NetworkSpec, Shape
from fedhop.common.timeline import derive
from fedhop.common.virtual_clock import (
    bbr_jitter_share,
    jitter_lag_s,
    link_seconds,
    mathis_bps,
    predict_rounds,
    send_s,
    shape_of,
    transfer_s,
    wire_bytes,
)
from tests.specs import DIGITS, run_spec

FEDAVG = {"lr": 0.1, "local_steps": 2, "batch_size": 16}


def test_a_message_costs_delay_plus_its_wire_bytes_at_the_rate() -> None:
    # one full segment: 1448 bytes of payload + a 52-byte header = 1500 bytes = 12,000 bits at 10 Mbit/s = 1.2 ms
    assert transfer_s(Shape(mbit=10, delay_ms=50), 1448) == pytest.approx(0.050 + 0.0012, rel=1e-12)
    # 1 MB at 8 Mbit/s: 1e6 * 1500/1448 bytes * 8 bits / 8e6 = 1.0359 s, plus 20 ms
    assert transfer_s(Shape(mbit=8, delay_ms=20), 1e6) == pytest.approx(0.020 + 1.0359116, rel=1e-6)
    assert transfer_s(Shape(), 10**9) == 0.0  # an unshaped link costs nothing
    assert transfer_s(Shape(delay_ms=30), 10**9) == pytest.approx(0.030)  # delay only: the bytes are free
    # jitter is uniform around the delay: its mean adds nothing
    assert transfer_s(Shape(mbit=10, delay_ms=50, jitter_ms=20), 1448) == transfer_s(Shape(mbit=10, delay_ms=50), 1448)


def test_loss_resends_its_share_and_bounds_tcp_by_mathis() -> None:
    assert wire_bytes(1448, loss=0.5) == pytest.approx(3000.0)
    # Mathis et al.: MSS * 8 / RTT * sqrt(3/2) / sqrt(p); RTT = 2 x 50 ms, p = 1%: 11,584 / 0.1 * 1.2247 / 0.1
    bound = 1448 * 8 / 0.1 * math.sqrt(1.5) / 0.1
    assert mathis_bps(0.01, 0.1) == pytest.approx(bound) and bound == pytest.approx(1_418_744, rel=1e-5)
    assert mathis_bps(0.0, 0.1) == math.inf
    # an unlimited link with 1% loss and 50 ms: the bound is the rate; 144,800 bytes -> 150,000 / 0.99 on the wire
    assert transfer_s(Shape(delay_ms=50, loss=0.01), 144_800) == pytest.approx(0.05 + 150_000 / 0.99 * 8 / bound)
    # a 1 Mbit/s link is slower than the bound: the rate decides, loss only adds the resent volume
    assert transfer_s(Shape(mbit=1, delay_ms=50, loss=0.01), 144_800) == pytest.approx(0.05 + 150_000 / 0.99 * 8 / 1e6)
    # an undelayed lossy link: the bound takes a 1 ms round trip
    assert mathis_bps(0.04, 0.0) == pytest.approx(1448 * 8 / 0.001 * math.sqrt(1.5) / 0.2)


def test_bbr_is_not_bounded_by_mathis_only_its_resent_volume_costs() -> None:
    s = Shape(mbit=10, delay_ms=50, loss=0.01)
    # 4 MB: 4e6 * 1500/1448 / 0.99 bytes on the wire at 10 Mbit/s, plus 50 ms
    assert transfer_s(s, 4e6, "bbr") == pytest.approx(0.05 + 4e6 * 1500 / 1448 / 0.99 * 8 / 1e7)
    assert transfer_s(s, 4e6, "reno") == pytest.approx(0.05 + 4e6 * 1500 / 1448 / 0.99 * 8 / mathis_bps(0.01, 0.1))
    assert transfer_s(s, 4e6, "cubic") == transfer_s(s, 4e6)  # loss-based: the default


def test_a_cold_start_doubles_its_window_each_round_trip_until_it_covers_the_path() -> None:
    # 10 Mbit/s, RTT 100 ms: the path holds 125,000 bytes; flights of 15,000, 30,000, 60,000 bytes (3 round
    # trips), then the window (120,000) still < path: a 4th round trip; then 240,000 >= path: the rest at the rate
    wire = 1_000_000
    assert send_s(wire, 1e7, 0.1, 15_000) == pytest.approx(4 * 0.1 + (wire - 225_000) * 8 / 1e7)
    assert send_s(10_000, 1e7, 0.1, 15_000) == pytest.approx(10_000 * 8 / 1e7)  # fits the first flight
    assert send_s(wire, float("inf"), 0.1, 15_000) == pytest.approx(6 * 0.1)  # no rate: round trips only
    assert send_s(wire, 1e7, 0.1, float("inf")) == pytest.approx(wire * 8 / 1e7)  # warm
    assert transfer_s(Shape(mbit=10, delay_ms=50), 1e6, cold=True) > transfer_s(Shape(mbit=10, delay_ms=50), 1e6)


def test_jitter_lags_a_long_message_by_up_to_the_jitter() -> None:
    s = Shape(mbit=10, delay_ms=50, jitter_ms=20)
    assert jitter_lag_s(s, 1500) == 0.0  # one packet: the uniform hold's mean is the delay
    two = jitter_lag_s(Shape(delay_ms=50, jitter_ms=20), 3000)  # back to back: E[max of 2 uniforms] = j / 3
    assert two == pytest.approx(0.020 / 3, rel=1e-3)
    long = jitter_lag_s(s, 4e6)
    assert 0.5 * 0.020 < long < 0.020
    assert transfer_s(s, 4e6) == pytest.approx(transfer_s(Shape(mbit=10, delay_ms=50), 4e6) + long)


def test_bbr_with_jitter_above_a_third_of_the_delay_is_capped_by_its_window() -> None:
    assert bbr_jitter_share(Shape(mbit=20, delay_ms=50, jitter_ms=10)) == 1.0  # 2 x 40 / 60 > 1
    assert bbr_jitter_share(Shape(mbit=50, delay_ms=40, jitter_ms=30)) == pytest.approx(2 * 10 / 70)
    assert bbr_jitter_share(Shape(delay_ms=40, jitter_ms=40)) == pytest.approx(0.01 * 40 / 80)  # never 0
    s = Shape(mbit=50, delay_ms=40, jitter_ms=30)
    plain = transfer_s(s, 4e6, "bbr") - 0.040 - jitter_lag_s(s, 4e6 * 1500 / 1448)
    assert plain == pytest.approx(4e6 * 1500 / 1448 * 8 / (50e6 * 2 / 7))
    assert transfer_s(s, 4e6, "cubic") < transfer_s(s, 4e6, "bbr")  # (no loss: the cap is BBR's alone)


def test_many_messages_pay_the_delay_each_and_the_rate_once_for_all_bytes() -> None:
    s = Shape(mbit=10, delay_ms=50)
    assert link_seconds(s, 4, 4 * 1448) == pytest.approx(4 * 0.050 + 4 * 0.0012)
    assert link_seconds(s, 0, 1448) == pytest.approx(0.0012)  # a report rides with a result: bytes only


def test_link_shapes_resolve_by_class_direction_and_node() -> None:
    net = NetworkSpec.model_validate({"client_edge": {"mbit": 100, "delay_ms": 20, "up": {"mbit": 10}},
                                      "nodes": {"client-1": {"delay_ms": 5}}})
    assert shape_of(net, "client-0", "edge-0") == Shape(mbit=10, delay_ms=20)
    assert shape_of(net, "edge-0", "client-0") == Shape(mbit=100, delay_ms=20)
    assert shape_of(net, "client-1", "edge-0") == Shape(mbit=10, delay_ms=5)
    assert shape_of(net, "edge-0", "ps") == Shape()


def _fedavg(network: dict | None, rounds: int = 2):
    return run_spec("fedavg", FEDAVG, clients=2, rounds=rounds, data=DIGITS, model={"name": "mlp", "hidden": [32]},
                    **({"network": network} if network is not None else {}))


def test_simulate_predicts_a_2_client_fedavg_round_from_the_slow_link() -> None:
    """client-1's link is 1 Mbit/s and 100 ms each way, client-0's 100 Mbit/s and 1 ms: a round is the PS's
    compute plus the slower of (request + the client's compute + reply), i.e. client-1's 2 x 100 ms plus its
    model down and up at 1 Mbit/s (bytes from the meter, a 52-byte header per 1448)."""
    net = {"client_ps": {"mbit": 100, "delay_ms": 1},
           "nodes": {"client-1": {"mbit": 1, "delay_ms": 100}}}
    res = InProcessEngine(_fedavg(net)).run()
    for rnd in (0, 1):
        down = sum(r["message_bytes"] for r in res.links if (r["src"], r["dst"], r["round"]) == ("ps", "client-1", rnd))
        up = sum(r["message_bytes"] for r in res.links if (r["src"], r["dst"], r["round"]) == ("client-1", "ps", rnd))
        slow = 2 * 0.100 + (down + up) * 1500 / 1448 * 8 / 1e6
        rows = [r for r in res.timeline if r["round"] == rnd]
        link = {r["peer"]: r["predicted_s"] for r in rows if r["phase"] == "transfer"}
        assert link["client-1"] == pytest.approx(slow, rel=1e-9)
        computed = sum(r.get("predicted_s", 0.0) for r in rows if r["phase"] == "compute")
        predicted = res.rounds[rnd]["predicted_round_s"]
        print(f"round {rnd + 1}: predicted {predicted:.4f} s = link {slow:.4f} s + compute (<= {computed:.4f} s)")
        assert slow <= predicted <= slow + computed + 1e-6
        assert slow > 0.3 and computed < 0.25 * slow  # the link decides: the check above is a tight one
        assert [r["predicted_s"] for r in rows if r["phase"] == "round"] == [pytest.approx(predicted, abs=1e-6)]


def test_the_clock_only_observes_the_model_is_bit_identical() -> None:
    plain = InProcessEngine(_fedavg(None, rounds=1)).run()
    net = {"client_ps": {"mbit": 1, "delay_ms": 50}, "nodes": {"client-0": {"compute": 0.5}}}
    shaped = InProcessEngine(_fedavg(net, rounds=1)).run()
    assert plain.final.keys() == shaped.final.keys()
    assert all(torch.equal(plain.final[k], shaped.final[k]) for k in plain.final)
    assert "predicted_round_s" not in plain.rounds[0] and not any("predicted_s" in r for r in plain.timeline)
    assert plain.links == shaped.links


def test_a_slow_node_computes_at_its_factor() -> None:
    res = InProcessEngine(_fedavg({"nodes": {"client-0": {"compute": 0.25}}}, rounds=1)).run()
    comp = {r["node"]: r for r in res.timeline if r["phase"] == "compute"}
    assert comp["client-0"]["predicted_s"] == pytest.approx(4 * comp["client-0"]["seconds"], rel=0.05)
    assert comp["client-1"]["predicted_s"] == pytest.approx(comp["client-1"]["seconds"], rel=0.05)


def test_a_fed_chs_round_the_rows_rebuild_what_the_clock_saw() -> None:
    """Fed-CHS (K scatters at the active edge, then describe and a hand-off): the prediction a networked PS makes
    from the rows (predict_rounds) is the in-process clock's, within 10%."""
    net = {"client_edge": {"mbit": 20, "delay_ms": 30}, "edge_edge": {"mbit": 10, "delay_ms": 20},
           "edge_ps": {"delay_ms": 5}}
    spec = run_spec("fedchs", {"K": 3}, clients=4, edges=2, rounds=3, data=DIGITS,
                    model={"name": "mlp", "hidden": [64]}, network=net)
    eng = InProcessEngine(spec)
    res = eng.run()
    measured = derive(eng.timeline.rows())
    topo = eng.ws.topology
    rows = predict_rounds(measured, res.links, spec.network, {n: list(topo.children(n)) for n in topo.all_nodes()})
    rebuilt = {r["round"]: r["seconds"] for r in rows if r["phase"] == "p_round"}
    for rec in res.rounds:
        live = rec["predicted_round_s"]
        print(f"round {rec['round']}: clock {live:.4f} s, from the rows {rebuilt[rec['round'] - 1]:.4f} s")
        assert rebuilt[rec["round"] - 1] == pytest.approx(live, rel=0.10)
        # 3 interactions x (30 ms down + 30 ms up) at least, plus the hand-off's 20 ms each way
        assert live > 3 * 0.060 + 2 * 0.020


def test_a_link_of_no_class_is_unshaped() -> None:
    net = NetworkSpec.model_validate({"client_edge": {"mbit": 1, "delay_ms": 20}})
    assert shape_of(net, "client-0", "client-1") == Shape()
    assert shape_of(net, "ps", "ps") == Shape()
