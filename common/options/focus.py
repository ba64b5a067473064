"""Options of ``focus`` (``[algorithm.options]``) and the spec-time checks: torch-free, read at
validation; the algorithm itself lives in ``fedhop.common.algorithms.focus``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedhop.common.options.participation import (
    CLIENT_DECIDABLE,
    BernoulliParticipation,
    FullParticipation,
    MarkovParticipation,
    Participation,
)

if TYPE_CHECKING:
    from fedhop.common.spec import RunSpec


class RoundClose(BaseModel):
    """When the server stops waiting for clients to say they are available (``decided_by = "client"``)."""

    model_config = ConfigDict(extra="forbid")
    deadline_s: float = Field(10.0, gt=0, description="the server (or each edge) waits this long for available "
                              "clients to answer a round's call; every available client must answer within it "
                              "for the networked run to equal the in-process one")
    quorum: int = Field(0, ge=0, description="close the call as soon as this many clients answered; 0: wait for "
                        "the deadline. A quorum smaller than the number of available clients takes the first to "
                        "answer, so the networked run may then differ from the in-process one (flat only)")
    absent: Literal["silent", "say"] = Field(
        "silent", description="what an unavailable client does with the round's call: 'silent' (Assumption 1's "
        "client that is simply away: the call waits for the deadline or the quorum) or 'say' (it answers 'away' "
        "at once, so the call closes as soon as every client has answered, available or not)")

    @model_validator(mode="after")
    def _say_needs_no_quorum(self) -> RoundClose:
        if self.absent == "say" and self.quorum:
            raise ValueError("round_close.absent = 'say' closes the call once every client answered: give no "
                             "quorum (0) with it")
        return self


class FocusOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-3, gt=0, description="eta: the ONE step size of local moves and of the server step")
    local_steps: int = Field(3, ge=1, description="tau: gradient evaluations per round (tau-1 local moves)")
    batch_size: int = Field(0, ge=0, description="0: full local gradient (FOCUS); > 0: SG-FOCUS mini-batch")
    participation: Participation = Field(default_factory=FullParticipation, description="the participation "
                                         "process: S_r drawn by the server, or each client's own availability "
                                         "model (see decided_by)")
    decided_by: Literal["server", "client"] = Field("server", description="who decides S_r: 'server' draws it "
                                                    "from `participation`; 'client': every client draws its own "
                                                    "availability each round from `participation` (full, "
                                                    "bernoulli, markov or trace) and answers the round's call "
                                                    "only if available; the call closes per `round_close`")
    round_close: RoundClose = Field(default_factory=RoundClose, description="decided_by = 'client' only: the "
                                    "call's deadline and quorum")
    flow: Literal["server", "client"] = Field(
        "server", description="who sends the round's messages: 'server' (the PS calls, the push is the reply to "
        "its pull task); 'client' (decided_by = 'client', flat only): each client posts its own `focus.pull` for "
        "the rounds ahead (or says it is away, round_close.absent = 'say'), the PS answers a pull with x, the "
        "client posts `focus.push` when done (docs/focus-wire.md)")
    empty_round: Literal["skip", "step"] = Field("skip", description="S_r empty: 'skip' the round (no messages, "
                                                 "model unchanged); 'step': x -= eta y with the unchanged y")
    init: Literal["zero", "matched"] = Field("zero", description="'zero': Alg. 1 (g_i = 0, y = 0); 'matched': "
                                             "the matrix form's init, a virtual full round with tau = 1 first")

    @model_validator(mode="after")
    def _who_decides(self) -> FocusOptions:
        if self.flow == "client" and self.decided_by != "client":
            raise ValueError("flow = 'client' needs decided_by = 'client' (a client pulls when it is available; "
                             "with decided_by = 'server' the PS draws S_r and calls its members)")
        if self.flow == "client" and self.round_close.quorum:
            raise ValueError("flow = 'client' closes a round at round_close.deadline_s or (absent = 'say') once "
                             "every client pulled or said it is away; a quorum (the first Q pulls to arrive) is "
                             "order-dependent and not supported with it: give quorum = 0")
        if self.decided_by == "client":
            if not isinstance(self.participation, CLIENT_DECIDABLE):
                what = (f"a fraction ({self.participation}: m of N drawn jointly)"
                        if isinstance(self.participation, float) else f"kind {self.participation.kind!r}")
                raise ValueError(f"decided_by = 'client' needs a participation model each client can draw alone "
                                 f"(full, bernoulli, markov or trace); participation is {what}")
        elif self.round_close != RoundClose():  # (the defaults, as `fedhop spec` fills them in, are fine)
            raise ValueError("round_close applies only with decided_by = 'client' (the server draws S_r itself and "
                             "waits transport.round_deadline_s for each participant)")
        return self


class SGFocusOptions(FocusOptions):
    batch_size: int = Field(32, ge=1, description="SG-FOCUS mini-batch size (a fresh batch per gradient)")


def check_spec(spec: RunSpec, o: FocusOptions) -> None:
    """What the options alone cannot check: quorum and per-client lists against the topology, the edges'
    call deadline against the PS's wait for them."""
    n = spec.topology.clients
    p = o.participation
    for name, v in (("p", getattr(p, "p", None)), ("p_join", getattr(p, "p_join", None))):
        if isinstance(p, BernoulliParticipation | MarkovParticipation) and isinstance(v, list) and len(v) != n:
            raise ValueError(f"algorithm.options.participation.{name} has {len(v)} entries for "
                             f"topology.clients = {n}")
    if o.decided_by != "client":
        return
    close = o.round_close
    if close.quorum > n:
        raise ValueError(f"algorithm.options.round_close.quorum ({close.quorum}) exceeds topology.clients ({n})")
    if spec.topology.edges and o.flow == "client":
        raise ValueError("algorithm.options.flow = 'client' applies to flat FOCUS only (topology.edges = 0)")
    if spec.topology.edges and close.quorum:
        raise ValueError("algorithm.options.round_close.quorum applies to flat FOCUS only (topology.edges = 0): "
                         "with edges each edge calls its own clients and waits for round_close.deadline_s")
    if spec.topology.edges:
        budget = spec.transport.nested_deadline(spec.transport.round_deadline_s)
        if close.deadline_s >= budget:
            raise ValueError(f"algorithm.options.round_close.deadline_s ({close.deadline_s:g}s) must be shorter "
                             f"than what an edge may wait within transport.round_deadline_s "
                             f"({spec.transport.round_deadline_s:g}s, less its margin: {budget:g}s)")
