"""What the credentials cost a whole job: the same small FedAvg job launched with plaintext links, mutual TLS and
tokens over TLS (``fedhop launch``: PS, clients as separate processes on loopback), in one run.

    python tests/bench/bench_tls_rounds.py [--clients 4] [--rounds 5] [--hidden 256] [--reps 1]

Prints per mode: the median round time (``round_s`` of ``rounds.csv``, rounds 2.. so that the first round's
warm-up is left out), the whole run's payload and message bytes (the byte meter: equal in every mode, since
TLS sits below the messages), and the round-time ratio to plaintext. Wire bytes with TLS (record headers) are
the testbed's to measure (``fedhop compose-run``, ``deploy/netns.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("plaintext", "mutual TLS", "tokens")


def fedhop(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "fedhop", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fedhop {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def spec_text(clients: int, rounds: int, hidden: int) -> str:
    return f"""name = "bench-tls"
rounds = {rounds}
device = "cpu"
[algorithm]
name = "fedavg"
[algorithm.options]
lr = 0.1
local_steps = 5
batch_size = 32
[topology]
clients = {clients}
edges = 0
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [{hidden}, {hidden}]
[transport]
join_timeout_s = 300.0
"""


def run(mode: str, spec: Path, tmp: Path, tag: str) -> dict:
    out = tmp / f"run-{tag}"
    sec = {"plaintext": [], "mutual TLS": ["--tls", str(tmp / "certs")],
           "tokens": ["--tls", str(tmp / "certs"), "--token", str(tmp / "tokens.toml")]}[mode]
    fedhop("launch", str(spec), "--out", str(out), "--device", "cpu", "--quiet", "--http", "off", *sec)
    res = json.loads((out / "results.json").read_text())
    rounds = res["rounds"]
    times = [r["round_s"] for r in rounds[1:]] or [rounds[0]["round_s"]]
    return {"round_s": statistics.median(times), "payload": sum(r["payload_bytes"] for r in res["links"]),
            "message": sum(r["message_bytes"] for r in res["links"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256, help="width of the MLP's two hidden layers")
    ap.add_argument("--reps", type=int, default=1, help="runs per mode, taking turns; the best median counts")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as d:
        tmp = Path(d)
        spec = tmp / "spec.toml"
        spec.write_text(spec_text(a.clients, a.rounds, a.hidden))
        fedhop("certs", "init", str(spec), "--out", str(tmp / "certs"))
        fedhop("tokens", "init", str(spec), "--out", str(tmp / "tokens.toml"))
        best: dict[str, dict] = {}
        for rep in range(a.reps):
            for mode in MODES:
                got = run(mode, spec, tmp, f"{mode.replace(' ', '-')}-{rep}")
                if mode not in best or got["round_s"] < best[mode]["round_s"]:
                    best[mode] = got
    base = best["plaintext"]["round_s"]
    print(f"FedAvg, {a.clients} clients, MLP 64-{a.hidden}-{a.hidden}-10 on digits, {a.rounds} rounds, loopback")
    print(f"{'mode':<12} {'round s (median)':>17} {'ratio':>6} {'payload B':>12} {'message B':>12}")
    for mode in MODES:
        r = best[mode]
        print(f"{mode:<12} {r['round_s']:>17.3f} {r['round_s'] / base:>6.2f} {r['payload']:>12} {r['message']:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
