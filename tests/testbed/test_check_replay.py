"""``fedhop check``'s crash check for protocols that take replies in arrival order (issue 16): the PS killed
and resumed over real processes, checked by replay. Two launches each (about 10 s on an idle host, half a
minute on a loaded one): in the testbed tier for its time, not for root."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhop.check import crash_verdict, order_dependent, run_oracle
from tests.integration.netutil import small_spec

ASYNC = {
    "fedasync": {"concurrency": 2, "local_steps": 1},
    "fedbuff": {"concurrency": 3, "buffer": 2, "local_steps": 1},
}


@pytest.mark.parametrize("alg", list(ASYNC))
def test_the_crash_check_of_an_asynchronous_protocol_is_a_replay(alg: str, tmp_path: Path) -> None:
    """Its tasks in flight at the kill are lost, so the resumed run ends with another model than an
    uninterrupted one; the crash row checks it against the in-process engine resumed from the checkpoint at the
    kill, replaying the order the resumed run recorded (its rounds after the kill record their own)."""
    import json

    spec = small_spec(alg, clients=3, rounds=3, options=ASYNC[alg])
    oracle = run_oracle(spec)
    assert order_dependent(oracle)
    v = crash_verdict(spec, tmp_path / "crash", oracle, 1)
    assert v.ok is True and "checked by replay" in v.detail and "bit-identical" in v.detail, v
    run = tmp_path / "crash" / "run"
    rounds = json.loads((run / "results.json").read_text())["rounds"]
    assert len(rounds) == 3 and all(r.get("arrivals") for r in rounds)
    assert (tmp_path / "crash" / "killed-checkpoints").is_dir()
    assert list(torch.load(run / "model.pt")) == list(oracle.final)
