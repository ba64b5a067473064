"""The ``[network]`` profile under compose and swarm (root + Docker; ``make test-testbed``): each container shapes
its own namespace (deploy/container_net.py: htb on what it sends, the nft loss rule and the kernel delay on what it
receives). One client's links are made slow, late, jittery and lossy; the run completes, that link is the slow one
in ``timeline.csv``, its transfer time is what the profile predicts, and the containers' own counters show the
rate held back and the packets dropped, and that the kernel held the delay (not the proxy fallback)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from fedhop.common.network_spec import Shape
from fedhop.common.spec import RunSpec
from fedhop.common.timeline import read_csv as read_timeline
from fedhop.common.virtual_clock import jitter_lag_s
from fedhop.deploy.compose import write_compose
from fedhop.deploy.compose_run import run_compose
from fedhop.deploy.container_net import read_stats
from fedhop.deploy.link_table import read_link_table
from tests.specs import DIGITS, run_spec
from tests.testbed.docker_env import sh, unique_name, wait_for

MBIT, DELAY_MS, JITTER_MS, LOSS = 4.0, 50.0, 10.0, 0.01
# The slow client is the last child: a folding scatter reads the replies in child order, so a child after the slow
# one would show the slow one's time as its own transfer time (its reply waits for its turn; transport/session).
SLOW = "client-2"
ROUNDS = 3


def profile_spec(name: str) -> RunSpec:
    """FedAvg, three clients straight to the PS, a ~0.67 MB model; client-2's links at 4 Mbit/s, 50 +- 10 ms, 1%
    loss."""
    base = run_spec("fedavg", {"lr": 0.05, "local_steps": 1, "batch_size": 16}, clients=3, edges=0,
                    name=name, rounds=ROUNDS, seed=7, data=DIGITS, model={"name": "mlp", "hidden": [512, 256]},
                    transport={"round_deadline_s": 120.0, "join_timeout_s": 900.0})
    return RunSpec.parse({**base.model_dump(mode="json", exclude_none=True),
                          "network": {"nodes": {SLOW: {"mbit": MBIT, "delay_ms": DELAY_MS,
                                                                "jitter_ms": JITTER_MS, "loss": LOSS}}}})


def write_project(folder: Path, name: str, image: str) -> RunSpec:
    spec = profile_spec(name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.toml").write_text(spec.to_toml())
    write_compose(spec, "spec.toml", folder, image=image)
    return spec


def check_run(run_dir: Path, log: str) -> str:
    """The assertions both deployments share; returns the fidelity line printed (and quoted in docs/network.md)."""
    res = json.loads((run_dir / "results.json").read_text())
    assert [r["round"] for r in res["rounds"]] == list(range(1, ROUNDS + 1)) and res["missing"] == []
    rows = [r for r in read_timeline(run_dir / "timeline.csv") if r["phase"] == "transfer" and r["round"] >= 1]
    per_link: dict[tuple[str, str], float] = {}
    for r in rows:
        per_link[(r["node"], r["peer"])] = per_link.get((r["node"], r["peer"]), 0.0) + r["seconds"]
    slowest = max(per_link, key=lambda k: per_link[k])
    assert slowest == ("ps", SLOW), per_link
    others = [v for k, v in per_link.items() if k != slowest]
    assert others and per_link[slowest] >= 3 * max(others), per_link

    links = {(r.src, r.dst): r for r in read_link_table(run_dir / "link_bytes.csv")}
    both = (links[("ps", SLOW)].wire or 0) + (links[(SLOW, "ps")].wire or 0)
    measured = per_link[slowest] / ROUNDS  # the model down and the update up, per round
    lag = jitter_lag_s(Shape(mbit=MBIT, delay_ms=DELAY_MS, jitter_ms=JITTER_MS), both / ROUNDS / 2)  # each way
    predicted = both / ROUNDS * 8 / (MBIT * 1e6) + 2 * (DELAY_MS / 1000 + lag)
    achieved = both / ROUNDS * 8 / max(1e-9, measured - 2 * DELAY_MS / 1000) / 1e6
    stats = read_stats(log)
    assert set(stats) >= {"ps", SLOW} and "client-0" not in stats, sorted(stats)  # only the shaped ones
    assert stats["ps"]["delay"] == stats[SLOW]["delay"] == "kernel", stats  # each holds what it receives
    to_slow = next(r for r in stats["ps"]["rate"] if r["peer"] == SLOW)
    to_ps = next(r for r in stats[SLOW]["rate"] if r["peer"] == "ps")
    assert to_slow["mbit"] == to_ps["mbit"] == MBIT and to_slow["overlimits"] > 0 and to_ps["overlimits"] > 0
    drops = {(d["peer"], node): d["dropped_packets"] for node in ("ps", SLOW) for d in stats[node]["loss"]}
    packets = {(r["src"], r["dst"]): int(r["packets"]) for r in _csv(run_dir / "wire.csv")}  # crossed the wire
    lost = {k: drops[k] / packets[k] for k in ((SLOW, "ps"), ("ps", SLOW))}
    line = (f"{SLOW} <-> ps at {MBIT:g} Mbit/s, {DELAY_MS:g} +- {JITTER_MS:g} ms, {LOSS:.0%} loss: transfer "
            f"{measured:.2f} s per round (predicted {predicted:.2f} s), achieved {achieved:.2f} Mbit/s of wire bytes; "
            f"htb sent "
            f"{to_slow['bytes']} / {to_ps['bytes']} bytes with {to_slow['overlimits']} / {to_ps['overlimits']} "
            f"overlimits; nft dropped {drops[(SLOW, 'ps')]} of {packets[(SLOW, 'ps')]} / {drops[('ps', SLOW)]} of "
            f"{packets[('ps', SLOW)]} packets ({lost[(SLOW, 'ps')]:.2%} / {lost[('ps', SLOW)]:.2%}); other links "
            f"{max(others):.2f} s in all")
    print("\n" + line)
    assert 0.75 * predicted <= measured <= 1.35 * predicted, line
    # each lost packet is one segment (offloads off); ~2,000 packets a direction: 1% +- a binomial spread
    assert all(0.003 <= x <= 0.025 for x in lost.values()), line
    return line


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_compose_applies_the_profile_in_each_container(tmp_path: Path, docker_image: str, compose_v2) -> None:
    folder = tmp_path / "project"
    write_project(folder, "compose-profile", docker_image)
    project = unique_name("-profile-")
    try:
        run = run_compose(compose_v2, project, folder, tmp_path / "runs", "run", timeout_s=1500)
        log = sh(*compose_v2, "-p", project, "logs", "--no-color", cwd=folder).stdout
        assert run.rc == 0, f"compose up exited {run.rc}:\n{run.log[-6000:]}"
    finally:
        subprocess.run([*compose_v2, "-p", project, "down", "-v", "--remove-orphans"], cwd=folder,
                       capture_output=True)
    check_run(run.run_dir, log)


def test_swarm_applies_the_profile_in_each_task(tmp_path: Path, docker_image: str, single_node_swarm: str) -> None:
    project = tmp_path / "project"
    write_project(project, "swarm-profile", docker_image)
    runs, stack = tmp_path / "runs", unique_name("profile")
    try:
        run = subprocess.run([sys.executable, "-m", "fedhop", "stack-run", str(project), "--stack", stack, "--runs",
                              str(runs), "--name", "swarm", "--timeout", "1500"], capture_output=True, text=True)
        log = (runs / "swarm.stack.log").read_text(errors="replace") if (runs / "swarm.stack.log").exists() else ""
        assert run.returncode == 0, f"stack-run exited {run.returncode}:\n{run.stdout}{run.stderr}\n{log[-6000:]}"
    finally:
        subprocess.run(["docker", "stack", "rm", stack], capture_output=True)
        wait_for("the stack's network to go", lambda: subprocess.run(
            ["docker", "network", "inspect", f"{stack}_fl"], capture_output=True).returncode != 0, 120)
    check_run(runs / "swarm", log)
