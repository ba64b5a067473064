"""A run whose data cannot be loaded ends `fedhop launch` at once, with the reason, instead of at the join deadline."""

from __future__ import annotations

import contextlib
import io

from fedhop.cli import main
from fedhop.common.spec import RunSpec
from tests.unit.test_data_files import make_mnist


def test_missing_data_stops_the_launch_with_its_reason(tmp_path):
    """``--data-path`` is the run's data path (the PS's too: it evaluates on the test set), so a path that does not
    exist stops the launch with exit 4 (DATA) and one line naming it, not a traceback or a wait."""
    make_mnist(tmp_path / "mnist", n_train=40, n_test=10)
    spec = RunSpec.parse({
        "rounds": 2, "device": "cpu",
        "topology": {"clients": 2},
        "data": {"dataset": "mnist", "path": str(tmp_path / "mnist"), "partition": "iid"},
        "model": {"name": "logreg"},
        # far longer than the failure takes: a launch that waited for it would end with the join timeout's exit
        # code, not 3, and fail the test (bounded: the launch runs in the test process)
        "transport": {"join_timeout_s": 200},
    })
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    err = io.StringIO()
    # the command line's main in this process: no new interpreter and fork server
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["launch", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "run"), "--device", "cpu",
                     "--quiet", "--data-path", str(tmp_path / "nowhere")])
    stderr = err.getvalue()
    assert code == 4, stderr
    assert "cannot load its data" in stderr and "nowhere" in stderr
    assert "Traceback" not in stderr
