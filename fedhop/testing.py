"""The checks of ``fedhop check`` for a user's own pytest suite (:mod:`fedhop.check` does the work).

A few lines per test::

    from fedhop.testing import check_protocol, assert_holds

    def test_my_protocol_is_exact(tmp_path):
        report = check_protocol("my_spec.toml", tmp_path, skip={"crash", "fault"})
        assert_holds(report)            # fails with the verdict table

    def test_my_protocol_survives_a_crash(tmp_path):
        assert_holds(check_protocol(spec, tmp_path, crash_round=2, skip={"fault"}))

``check_protocol`` takes a :class:`~fedhop.common.spec.RunSpec`, a spec file, or a dict of spec fields, and
returns a :class:`~fedhop.check.CheckReport` (frozen): its ``verdicts`` are :class:`~fedhop.check.Verdict`
rows (``check``, ``ok``: True / False / None for skipped, ``detail``). :func:`check_engines` runs only the
equivalence part (model, payload, formula): one in-process and one networked run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhop.check import CheckOptions, CheckReport, KillClient, Verdict, check

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec

__all__ = ["CheckReport", "KillClient", "Verdict", "ProtocolCheckFailed", "as_spec", "assert_holds",
           "check_engines", "check_protocol"]


class ProtocolCheckFailed(AssertionError):
    """A check failed; the message is the verdict table."""


def as_spec(spec: RunSpec | str | Path | Mapping[str, Any]) -> RunSpec:
    """A RunSpec from a RunSpec, a TOML spec file or a mapping of spec fields (validated: SpecError if bad)."""
    from fedhop.common.spec import RunSpec

    if isinstance(spec, RunSpec):
        return spec
    if isinstance(spec, Mapping):
        return RunSpec.parse(dict(spec), "<dict>")
    return RunSpec.load(Path(spec))


def check_protocol(spec: RunSpec | str | Path | Mapping[str, Any], out: str | Path, *,
                   crash_round: int | None = None, kill_client: str | KillClient | None = None,
                   skip: Iterable[str] = (), device: str = "cpu", timeout_s: float = 600.0) -> CheckReport:
    """Every check of ``fedhop check`` on ``spec``, its runs under ``out``. ``kill_client``: ``"client-1@2"``
    or a :class:`KillClient`; ``skip``: any of ``formula``, ``crash``, ``fault``."""
    kill = KillClient.parse(kill_client) if isinstance(kill_client, str) else kill_client
    return check(as_spec(spec), CheckOptions(Path(out), crash_round=crash_round, kill=kill, skip=frozenset(skip),
                                             device=device, timeout_s=timeout_s))


def check_engines(spec: RunSpec | str | Path | Mapping[str, Any], out: str | Path, *,
                  device: str = "cpu") -> CheckReport:
    """The equivalence part only: models bit-identical, payload per link equal and as declared."""
    return check_protocol(spec, out, skip=("crash", "fault"), device=device)


def assert_holds(report: CheckReport) -> None:
    """Raise :class:`ProtocolCheckFailed` (an AssertionError, with the verdict table) unless every check held."""
    if not report.ok:
        raise ProtocolCheckFailed(f"fedhop check failed for {report.spec_name} ({report.algorithm}):\n"
                                  f"{report.table()}")
