"""The participation models of an algorithm's options (``participation = {kind = ...}``): what a spec may
say. The processes that draw S_r from them live in ``fedhop.common.algorithms.participation``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import numpy as np


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProbGroup(_Strict):
    """A fraction of the clients (taken in client-id order) whose probability is drawn from U(low, high)."""

    fraction: float = Field(gt=0, le=1)
    low: float = Field(gt=0, le=1)
    high: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> ProbGroup:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        return self


FIG9_BERN_GROUPS = [ProbGroup(fraction=0.9, low=0.1, high=0.3), ProbGroup(fraction=0.1, low=0.1, high=0.9)]


class FullParticipation(_Strict):
    kind: Literal["full"] = "full"


class UniformParticipation(_Strict):
    kind: Literal["uniform"] = "uniform"
    m: int = Field(4, ge=1, description="clients per round (capped at N)")


class BernoulliParticipation(_Strict):
    kind: Literal["bernoulli"] = "bernoulli"
    p: float | list[float] | None = Field(None, description="p_i (one value for all, or one per client); "
                                          "None: drawn once from `groups`")
    groups: list[ProbGroup] = Field(default_factory=lambda: list(FIG9_BERN_GROUPS),
                                    description="[UNSPECIFIED which clients] groups in client-id order; "
                                    "the first floor(fraction N) clients get the first group, ...")

    @model_validator(mode="after")
    def _valid(self) -> BernoulliParticipation:
        ps = self.p if isinstance(self.p, list) else [self.p] if self.p is not None else []
        if any(not 0 < v <= 1 for v in ps):
            raise ValueError("participation probabilities must lie in (0, 1]")
        return self


class WeightedParticipation(_Strict):
    kind: Literal["weighted"] = "weighted"
    m: int = Field(4, ge=1, description="clients per round (capped at N)")
    q: list[float] | None = Field(None, description="sampling weights q_i > 0 (normalised); None: drawn once "
                                  "as U(0,1) + q_offset, normalised")
    q_offset: float = Field(0.01, ge=0)

    @model_validator(mode="after")
    def _valid(self) -> WeightedParticipation:
        if self.q is not None and any(v <= 0 for v in self.q):
            raise ValueError("weights q must be positive")
        return self


class MarkovParticipation(_Strict):
    kind: Literal["markov"] = "markov"
    p_stay: float = Field(0.7, ge=0, le=1, description="P(participate at r+1 | participated at r)")
    p_join: float | list[float] | None = Field(None, description="P(participate at r+1 | absent at r); "
                                               "None: join_scale * p_i with p_i drawn from `groups`")
    join_scale: float = Field(0.5, gt=0, le=1)
    groups: list[ProbGroup] = Field(default_factory=lambda: [ProbGroup(fraction=1.0, low=0.05, high=0.5)])
    init_low: float = Field(0.1, ge=0, le=1, description="round 0: client i present w.p. U(init_low, init_high)")
    init_high: float = Field(0.9, ge=0, le=1)


class CyclicParticipation(_Strict):
    kind: Literal["cyclic"] = "cyclic"
    m: int = Field(4, ge=1, description="block size: round r takes clients (r*m .. r*m+m-1) mod N")


class TraceParticipation(_Strict):
    """A recorded rounds x clients 0/1 table replayed row by row (``common/options/trace.py`` reads it): round r
    takes the clients marked 1 in row r. Past the last row the run fails at spec time unless ``wrap``, which
    starts again at row 0 (row r mod rows). The table needs one column per client (spec check)."""

    kind: Literal["trace"] = "trace"
    path: Path = Field(description="the table: .npy (2-D bool or 0/1 integers) or CSV (0/1, one row per round)")
    wrap: bool = Field(False, description="replay from row 0 after the last row; false: the trace must have a "
                       "row for every round")

    @model_validator(mode="after")
    def _readable(self) -> TraceParticipation:
        from fedhop.common.options.trace import load_trace  # numpy: only for a spec that names a trace

        load_trace(self.path)  # a TraceError (ValueError) names the file and the problem
        return self

    def table(self) -> np.ndarray:
        from fedhop.common.options.trace import load_trace

        return load_trace(self.path)

    def check_fits(self, field: str, clients: int, rounds: int) -> None:
        rows, cols = self.table().shape
        if cols != clients:
            raise ValueError(f"{field}: trace {self.path} has {cols} columns, topology.clients is {clients}")
        if rows < rounds and not self.wrap:
            raise ValueError(f"{field}: trace {self.path} has {rows} rows for {rounds} rounds; record more rounds, "
                             "lower rounds, or set wrap = true to replay it from the start")


ParticipationModel = Annotated[
    FullParticipation | UniformParticipation | BernoulliParticipation | WeightedParticipation
    | MarkovParticipation | CyclicParticipation | TraceParticipation,
    Field(discriminator="kind"),
]


Participation = Annotated[float, Field(gt=0, le=1)] | ParticipationModel


CLIENT_DECIDABLE = (FullParticipation, BernoulliParticipation, MarkovParticipation, TraceParticipation)
