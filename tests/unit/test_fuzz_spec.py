"""Property-based fuzzing of the spec loader (hypothesis): random ``--set KEY=VALUE`` strings on the default spec
(real field paths and made-up ones, TOML values and junk), random changes to the default spec's table (values
replaced, keys dropped or added, tables where values go and back) and random TOML text. Every case must give a
RunSpec or an error the CLI turns into USAGE (exit 2, :func:`fedhop.cli.errors.as_fatal`): never another
exception. No value holds ``:`` (a user-code reference would import whatever it names).

CI runs ``FEDHOP_FUZZ_EXAMPLES`` (default 50) examples per property; ``make fuzz`` runs many more.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import tomllib
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedhop.cli.console import DEFAULT_SPEC, load_spec
from fedhop.cli.errors import as_fatal
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec, SpecError

EXAMPLES = int(os.environ.get("FEDHOP_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=EXAMPLES, deadline=dt.timedelta(seconds=10), database=None,
                suppress_health_check=[HealthCheck.too_slow])
DEFAULT = tomllib.loads(DEFAULT_SPEC.read_text())
KEYS = ("rounds", "seed", "name", "algorithm.name", "algorithm.options.lr", "algorithm.options.local_steps",
        "topology.clients", "topology.edges", "topology.graph", "data.dataset", "data.partition", "data.alpha",
        "model.name", "network.default.bandwidth", "network.default.latency", "eval_every", "algorithm",
        "topology", "x.y", "rounds.x", "algorithm.options", "data.path", "algorithm.options.participation.kind")
SAFE = st.characters(blacklist_characters=":\x00", blacklist_categories=("Cs",))
VALUES = st.one_of(st.sampled_from(["5", "0", "-1", "1e400", "nan", "inf", "true", '"x"', "[1, 2]", "{k = 1}", "",
                                    '"fedavg"', '"fedchs"', "fedavg", "[", "{", '"', "2.5", "1_000", "0x10"]),
                   st.integers(-10**20, 10**20).map(str), st.floats().map(repr), st.text(SAFE, max_size=20))
SETS = st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS) | st.text(SAFE, max_size=15),
                                    VALUES), st.text(SAFE, max_size=30)), min_size=1, max_size=4)
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(SAFE, max_size=20),
                   st.lists(st.integers(-5, 5), max_size=3), st.builds(dict))


def usage_or_spec(fn, *args: Any) -> str:
    """Call ``fn``: a RunSpec, or an exception the CLI reports as USAGE; returns which (for hypothesis' events)."""
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the property: every exception must be a USAGE error
        fatal = as_fatal(e)
        assert fatal is not None and fatal.code == ExitCode.USAGE, f"{type(e).__name__}: {e}"
        assert str(e), "an error without a message"
        return type(e).__name__
    assert isinstance(out, RunSpec)
    return "spec"


@FUZZ
@given(sets=SETS)
def test_any_set_strings_give_a_spec_or_usage(sets: list[str]) -> None:
    event(usage_or_spec(load_spec, None, sets))


def _paths(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for k, v in table.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


@st.composite
def mutated_tables(draw) -> dict[str, Any]:
    raw = copy.deepcopy(DEFAULT)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(raw)
        path = draw(st.sampled_from(paths)) if paths else ("rounds",)
        parent = raw
        for part in path[:-1]:
            parent = parent[part]
        how = draw(st.sampled_from(["replace", "drop", "add"]))
        if how == "replace":
            parent[path[-1]] = draw(LEAVES)
        elif how == "drop":
            parent.pop(path[-1], None)
        else:
            target = parent[path[-1]] if isinstance(parent.get(path[-1]), dict) else parent
            target[draw(st.text(SAFE, min_size=1, max_size=12))] = draw(LEAVES)
    return raw


@FUZZ
@given(raw=mutated_tables())
def test_any_table_gives_a_spec_or_usage(raw: dict[str, Any]) -> None:
    event(usage_or_spec(RunSpec.parse, raw, "<fuzz>"))


@FUZZ
@given(text=st.text(SAFE, max_size=200) | st.builds(lambda a, b: a + b, st.just(DEFAULT_SPEC.read_text()),
                                                     st.text(SAFE, max_size=40)))
def test_any_toml_text_gives_a_spec_or_usage(text: str) -> None:
    event(usage_or_spec(RunSpec.from_toml, text, "<fuzz>"))


def test_spec_errors_are_usage() -> None:
    assert as_fatal(SpecError("x")).code == ExitCode.USAGE  # the property above leans on this mapping
