"""``fedhop new protocol NAME [--out DIR]``: a runnable skeleton of a user protocol (docs/protocols.md).

It writes three files into DIR (default: ``./NAME``): ``NAME.py``, the protocol (FedAvg written against
``fedhop.api``: an options model, a state dataclass, a client task, ``init`` and ``round``, the ``ALGORITHM``
record), ``spec.toml``, a small run of it (``algorithm.name = "NAME:ALGORITHM"``), and ``test_NAME.py``, a
pytest file that runs the spec with ``fedhop simulate`` and with ``fedhop launch`` and checks both end with the
same model. Nothing here imports torch: the files are text.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from string import Template

from fedhop.common.exit_codes import ExitCode, Fatal

NAME = re.compile(r"[a-z][a-z0-9_]*")

PROTOCOL = Template('''"""$name: a federated protocol written against fedhop.api (started from `fedhop new protocol`).

One round t (this skeleton is FedAvg; change it into your protocol):

    w_k     = LocalSGD_k(w^t, local_steps)        on every client k (task "$name.train")
    w^{t+1} = sum_k (n_k / sum_j n_j) w_k          on the parameter server, in canonical client order

Run it from this folder: `fedhop simulate spec.toml` (one process) or `fedhop launch spec.toml` (one process
per node, over gRPC). The determinism rules (docs/protocols.md): randomness only from ctx.rng / ctx.np_rng,
aggregate in the order scatter returns replies, never read the clock in the math.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from fedhop.api import Algorithm, Bundle, NodeContext, Reply, Scalar, local_sgd, task, weighted_mean


class Options(BaseModel):
    """[algorithm.options] of the spec, validated before the run starts."""

    model_config = ConfigDict(extra="forbid")

    local_steps: int = Field(5, ge=1, description="local SGD steps per round")
    lr: float = Field(0.05, gt=0, description="client step size")
    batch_size: int = Field(32, ge=0, description="mini-batch size (0 = the whole local set)")


@dataclass
class ServerState:
    """The parameter server's state: checkpointed after every round, restored on resume."""

    model: Bundle


@task("$name.train")
def train(ctx: NodeContext, params: Bundle, args: dict[str, Scalar]) -> Reply:
    """Client: local SGD from the server's model; replies with the new model and its sample count."""
    o: Options = ctx.opts
    w, loss = local_sgd(ctx, params, steps=o.local_steps, lr=o.lr, batch_size=o.batch_size)
    return Reply(w, {"loss": loss, "n": len(ctx.data)})


def init(ctx: NodeContext) -> ServerState:
    return ServerState(model=ctx.initial_params())


def server_round(ctx: NodeContext, s: ServerState) -> ServerState:
    replies = ctx.comm.scatter(ctx.children, "$name.train", s.model, expect=s.model)
    if not replies:
        return s
    model = weighted_mean((float(r.scalars["n"]), r.bundle) for r in replies.values())
    if ctx.should_eval():
        ctx.report(**ctx.evaluate(model))
    return ServerState(model=model)


ALGORITHM = Algorithm(
    name="$name",
    options=Options,
    init=init,
    round=server_round,
    needs_edges=False,
    summary="$name (from fedhop new protocol)",
)
''')

SPEC = Template('''name = "$name"
rounds = 3
seed = 0
device = "cpu"

[algorithm]
name = "$name:ALGORITHM"
[algorithm.options]
local_steps = 5
lr = 0.05
batch_size = 32

[topology]
clients = 4

[data]
dataset = "digits"
partition = "dirichlet"
dirichlet_lambda = 0.5

[model]
name = "mlp"
''')

TEST = Template('''"""Runs spec.toml with `fedhop simulate` (one process) and `fedhop launch` (a process per node):
both finish, and end with the same model, bit for bit (run: pytest test_$name.py)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def fedhop(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "fedhop", *args, "--quiet"], cwd=HERE, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_simulate_and_launch_agree(tmp_path: Path) -> None:
    fedhop("simulate", "spec.toml", "--out", str(tmp_path / "sim"))
    with (tmp_path / "sim" / "rounds.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3  # the spec's rounds
    fedhop("launch", "spec.toml", "--out", str(tmp_path / "net"), "--http", "off")
    sim, net = (torch.load(tmp_path / d / "model.pt") for d in ("sim", "net"))
    assert list(sim) == list(net) and all(torch.equal(sim[k], net[k]) for k in sim)
''')


def skeleton(name: str) -> dict[str, str]:
    """The files of protocol ``name`` (a Python module name): file name -> text."""
    if not NAME.fullmatch(name):
        raise Fatal(ExitCode.USAGE, f"protocol name {name!r} must be a Python module name: lower-case letters, "
                    "digits and '_', starting with a letter (e.g. my_protocol)")
    return {f"{name}.py": PROTOCOL.substitute(name=name), "spec.toml": SPEC.substitute(name=name),
            f"test_{name}.py": TEST.substitute(name=name)}


def write_skeleton(name: str, out: Path, *, force: bool = False) -> list[Path]:
    """Write :func:`skeleton` into ``out``; a Fatal (USAGE) when a file exists and ``force`` is not given."""
    files = skeleton(name)
    paths = [out / f for f in files]
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise Fatal(ExitCode.USAGE, f"{', '.join(existing)} already exist(s); give --force to overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path, text in zip(paths, files.values(), strict=True):
            path.write_text(text)
    except OSError as e:
        raise Fatal(ExitCode.USAGE, f"cannot write the skeleton into {out}: {e.strerror or e}") from None
    return paths


def cmd_new_protocol(a: argparse.Namespace) -> int:
    out = Path(a.out) if a.out else Path(a.name)
    paths = write_skeleton(a.name, out, force=a.force)
    print(f"wrote {', '.join(str(p) for p in paths)}.\nRun it: cd {out} && fedhop simulate spec.toml "
          f"(over real processes: fedhop launch spec.toml; its test: pytest test_{a.name}.py). "
          "docs/protocols.md is the guide.")
    return 0


def add_commands(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    s = sub.add_parser("new", help="write a runnable skeleton (new protocol NAME)", formatter_class=formatter)
    kinds = s.add_subparsers(dest="what", required=True)
    p = kinds.add_parser("protocol", help="a user protocol: NAME.py (fedhop.api), spec.toml and test_NAME.py",
                         formatter_class=formatter)
    p.add_argument("name", metavar="NAME", help="the protocol's module name (e.g. my_protocol)")
    p.add_argument("--out", metavar="DIR", help="the folder to write into (default: ./NAME)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(fn=cmd_new_protocol, title="new protocol")
