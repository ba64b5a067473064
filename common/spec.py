"""RunSpec: the one description of a run (docs/design.md section 2).

A RunSpec is read from TOML, validated completely before anything starts (a bad field fails with a message
naming it), and handed by the parameter server to every process that joins.

Importing and validating a RunSpec imports no torch and no algorithm: the names a spec uses (algorithm,
dataset, model) are looked up in :mod:`fedhop.common.catalog`, whose torch-free option models
(:mod:`fedhop.common.options`) are imported by name when a spec names them.
"""

from __future__ import annotations

import logging
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedhop.common import catalog
from fedhop.common.data_spec import DataSpec
from fedhop.common.exit_codes import ExitCode
from fedhop.common.model_spec import ModelSpec
from fedhop.common.network_spec import NetworkSpec, from_testbed, to_toml_hint
from fedhop.common.testbed_spec import LinkDelays, LinkRates, TestbedSpec
from fedhop.common.user_code import RESERVED_METRICS, UserCodeError, check_imports, check_ref, is_ref, metric_name
from fedhop.common.validation import closest_field, flat_errors

log = logging.getLogger("fedhop.spec")
_DEPRECATIONS_LOGGED: set[str] = set()


def _deprecated(message: str) -> None:
    """Log ``message`` once per process (a spec is parsed again by every node that joins)."""
    if message not in _DEPRECATIONS_LOGGED:
        _DEPRECATIONS_LOGGED.add(message)
        log.warning(message)


def _algorithm(name: str) -> catalog.AlgorithmInfo | None:
    """The catalogue entry of ``name``; None for a user algorithm (``package.module:NAME``) this process cannot
    import. Such a spec is not refused here but by the checks that name the failure the way they do for every
    user reference: :meth:`RunSpec.parse` (spec files, ``--set``: a SpecError, exit code 2) and a joining
    node's code-digest check (``check_parent_code``: exit code USER_CODE), so a node that lacks the module
    says so in one line instead of failing to read the spec its parent sent."""
    if not is_ref(name):
        return catalog.algorithm(name)
    ref = check_ref(name, "algorithm.name", "NAME")  # a malformed reference is refused everywhere
    try:
        return catalog.user_algorithm(ref)
    except UserCodeError:
        return None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AlgorithmSpec(Strict):
    name: str = "fedavg"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> AlgorithmSpec:
        algo = _algorithm(self.name)  # raises with the list of known names
        if algo is None:
            return self
        try:
            algo.options.model_validate(self.options)
        except ValidationError as e:
            raise ValueError(f"algorithm.options for {self.name!r}: {option_errors(e, algo.options, self.options)}"
                             ) from None
        return self


def tagged_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """The models of a tagged union (``kind`` = tag) an annotation holds, also through ``Annotated`` and ``X |
    float``: ``{tag: model}``, empty when it holds none (e.g. the participation models)."""
    out: dict[str, type[BaseModel]] = {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        kind = annotation.model_fields.get("kind")
        if kind is not None and typing.get_origin(kind.annotation) is Literal:
            out.update({str(tag): annotation for tag in typing.get_args(kind.annotation)})
        return out
    for arg in typing.get_args(annotation):
        out.update(tagged_members(arg))
    return out


def option_errors(e: ValidationError, model: type[BaseModel], given: dict[str, Any]) -> str:
    """:func:`flat_errors` of an options model, with a tagged union's errors (participation = {kind = ...}) said
    in the spec's words: a kind that does not exist names the kinds there are, a field the kind does not have
    names the fields it has, and the alternative a field was not given as (a fraction, when a table was given;
    a table, when a number was) is left out, instead of pydantic's union branch names."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        field = model.model_fields.get(loc[0]) if loc else None
        members = tagged_members(field.annotation) if field is not None else {}
        if not members:
            hint = closest_field(model, err["loc"]) if err["type"] == "extra_forbidden" else None
            parts.append(f"{'.'.join(loc) or '(root)'}: {err['msg'].removeprefix('Value error, ')}"
                         + (f" (did you mean {hint!r}?)" if hint else ""))
            continue
        value = given.get(loc[0])
        kinds = ", ".join(repr(k) for k in members)
        branch = next((i for i, x in enumerate(loc) if x.startswith("tagged-union[")), None)
        via_table = branch is not None or err["type"] in ("union_tag_invalid", "union_tag_not_found")
        if isinstance(value, dict) != via_table:
            continue  # the alternative the value was not written as
        if err["type"] == "union_tag_invalid":
            parts.append(f"{loc[0]}.kind: {err['input'].get('kind')!r} is no {loc[0]} model; allowed: {kinds}")
        elif err["type"] == "union_tag_not_found":
            parts.append(f"{loc[0]}: a table needs kind = one of {kinds}")
        elif via_table and branch is not None and len(loc) > branch + 1:
            tag, rest = loc[branch + 1], loc[branch + 2:]
            where = ".".join([loc[0], *rest])
            if err["type"] == "extra_forbidden" and tag in members:
                known = ", ".join(f for f in members[tag].model_fields if f != "kind")
                parts.append(f"{where}: kind {tag!r} has no field {rest[-1]!r}; its fields: {known or '(none)'}")
            else:
                parts.append(f"{where} (kind {tag!r}): {err['msg'].removeprefix('Value error, ')}")
        else:
            alt = "" if isinstance(value, int | float) else f", or a table {{kind = one of {kinds}}}"
            parts.append(f"{'.'.join(loc[:1])}: {err['msg'].removeprefix('Value error, ')}{alt}")
    return "; ".join(dict.fromkeys(parts)) or flat_errors(e)


class TopologySpec(Strict):
    clients: int = Field(10, ge=1, le=100_000, description="number of clients")
    edges: int = Field(0, ge=0, description="edge servers; 0 = clients attach straight to the parameter server")
    clients_per_edge: list[int] | None = Field(
        None, description="explicit cluster sizes (sum = clients); default: as even as possible, in id order")
    edge_graph: Literal["random", "ring", "complete"] = "random"
    edge_max_degree: int = Field(3, ge=1, description="max neighbours per edge in the random edge graph")
    peer_graph: Literal["none", "ring", "random", "complete"] | None = Field(
        None, description="direct client <-> client links (clients then listen for their peers): none, ring, random "
        "(connected, at most peer_max_degree links per client) or complete; unset = what the algorithm needs "
        "(wrwgd: random, dpsgd: ring, every other built-in: none)")
    peer_max_degree: int = Field(3, ge=2, description="max peers per client in the random peer graph")

    @model_validator(mode="after")
    def _consistent(self) -> TopologySpec:
        if self.edges > self.clients:
            raise ValueError(f"topology.edges ({self.edges}) exceeds topology.clients ({self.clients})")
        if self.clients_per_edge is not None:
            if len(self.clients_per_edge) != self.edges:
                raise ValueError(f"topology.clients_per_edge has {len(self.clients_per_edge)} entries, "
                                 f"topology.edges is {self.edges}")
            if sum(self.clients_per_edge) != self.clients or min(self.clients_per_edge) < 1:
                raise ValueError("topology.clients_per_edge must be positive and sum to topology.clients")
        return self


class TransportSpec(Strict):
    chunk_bytes: int = Field(1 << 20, ge=1024, le=64 << 20, description="bundle chunk size on the wire")
    round_deadline_s: float = Field(120.0, gt=0, description="a scatter waits this long for replies")
    join_timeout_s: float = Field(60.0, gt=0, description="the PS waits this long for every node to join")
    rpc_timeout_s: float = Field(30.0, gt=0, description="deadline of unary RPCs (describe, hand-off ack)")
    handoff_retries: int = Field(3, ge=0)
    max_bundle_bytes: int = Field(16 << 30, ge=1, description="largest bundle a node accepts")
    max_data_size: int = Field(1 << 31, ge=1, description="largest data size (samples) a client may declare when "
                               "it joins; a parent refuses a Ready over it, naming another node, or changing a "
                               "size declared before")
    min_participants: int = Field(1, ge=0, description="a round in which the PS sent tasks and got fewer usable "
                                  "replies than this (or than the tasks sent, if fewer) is redone; 0 = never")
    round_retries: int = Field(2, ge=0, description="how often a round with too few participants is redone "
                               "before the run ends with an error")
    late_join: Literal["admit", "refuse"] = Field(
        "admit", description="a node that joins after the run started: admitted at the next round boundary, "
                             f"or refused (it exits with code {ExitCode.LATE_JOIN_REFUSED:d})")
    keepalive_s: float = Field(5.0, gt=0, description="a parent sends a keep-alive frame to a session it sent "
                                                      "nothing for keepalive_timeout_s / 3, or this long if longer "
                                                      "(it looks every keepalive_s / 2)")
    keepalive_timeout_s: float = Field(30.0, gt=0, description="a child that hears nothing from its parent this "
                                                               "long dials it again and re-joins")
    reconnect_s: float = Field(120.0, ge=0, description="a child whose parent is lost tries to re-join this long "
                                                        f"before it gives up (exit code {ExitCode.PARENT_LOST:d})")
    deadline_margin_s: float = Field(1.0, ge=0, description="an edge closes its clients' round this long (plus "
                                                            "deadline_margin_fraction of the budget) before the "
                                                            "deadline its parent gave it")
    deadline_margin_fraction: float = Field(0.1, ge=0, lt=1)
    rejoin_grace_s: float = Field(0.0, ge=0, description="a task for a child that was admitted and is away "
                                  "(restarting, re-joining) waits this long for it to come back before it fails")
    reply_window: int = Field(0, ge=0, description="a scatter that aggregates while replies arrive (FedAvg) "
                              "receives the next reply to fold and at most this many more at once; the others "
                              "wait in their senders (memory: the aggregate + 1 + this many models)")
    spill_model_bytes: int = Field(64 << 20, ge=0, description="the PS of a networked run whose algorithm never "
                                   "changes its state's tensors in place (FedAvg, HierFAVG) writes them into an "
                                   "unlinked temporary file ($TMPDIR) at each round's start when they hold at least "
                                   "this many bytes, and lets their pages leave its memory once the round's requests "
                                   "are out (one model less at its peak, for one write of the model per round into "
                                   "the page cache); its edges do the same with the model of each scatter; 0 = never")
    handshake_timeout_s: float = Field(10.0, gt=0, le=600, description="a peer that connects and has not said "
                                       "Hello (or not finished its TLS handshake) this long after is disconnected")
    max_open_bundles: int = Field(4, ge=1, description="bundles one peer may have arriving at once (a child's "
                                  "replies, a neighbour's hand-offs); more are refused before allocating")
    max_inflight_bytes: int = Field(0, ge=0, description="payload bytes one peer may have arriving at once, summed "
                                    "over its open bundles (0 = max_bundle_bytes)")
    drop_after_missed: int = Field(3, ge=0, description="a child that sends no reply at all (not even a late one or "
                                   "an error) to the tasks of this many consecutive rounds it was given tasks in is "
                                   "disconnected and its session freed; it stays in the run and may re-join "
                                   "(0 = never)")

    @model_validator(mode="after")
    def _keepalive_fits(self) -> TransportSpec:
        if self.keepalive_timeout_s <= self.keepalive_s:
            raise ValueError(f"transport.keepalive_timeout_s ({self.keepalive_timeout_s:g}) must exceed "
                             f"transport.keepalive_s ({self.keepalive_s:g})")
        return self

    @model_validator(mode="after")
    def _inflight_fits(self) -> TransportSpec:
        if self.max_inflight_bytes and self.max_inflight_bytes < self.max_bundle_bytes:
            raise ValueError(f"transport.max_inflight_bytes ({self.max_inflight_bytes}) must be at least "
                             f"transport.max_bundle_bytes ({self.max_bundle_bytes}), or a largest bundle could never "
                             f"arrive")
        return self

    def inflight_bytes(self) -> int:
        """The per-peer cap on payload bytes in flight (``max_inflight_bytes``; 0: ``max_bundle_bytes``)."""
        return self.max_inflight_bytes or self.max_bundle_bytes

    def nested_deadline(self, budget_s: float) -> float:
        """What a node given ``budget_s`` by its parent leaves for its own children: the budget less the
        margin it needs to aggregate and answer in time."""
        return budget_s * (1.0 - self.deadline_margin_fraction) - self.deadline_margin_s


class RunSpec(Strict):
    name: str = "run"
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    topology: TopologySpec = Field(default_factory=TopologySpec)
    data: DataSpec = Field(default_factory=DataSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    rounds: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    eval_every: int = Field(1, ge=1)
    checkpoint_every: int = Field(1, ge=0, description="every node saves its state after every this many rounds "
                                  "(0 = never); a run resumes from the PS's last checkpoint")
    metrics: list[str] = Field(default_factory=list, description="user metrics 'package.module:function', "
                               "metric(outputs, y) -> float on the test set, reported under the function's name "
                               "every eval_every rounds")
    transport: TransportSpec = Field(default_factory=TransportSpec)
    testbed: TestbedSpec | None = Field(None, description="the namespace testbed's own settings (subnet, MTU, ...)")
    network: NetworkSpec | None = Field(None, description="the network profile (rate, delay, jitter, loss per link; "
                                        "compute speed per node), applied by the testbeds (docs/network.md)")

    @model_validator(mode="after")
    def _network_from_old_testbed_keys(self) -> RunSpec:
        """The deprecated ``[testbed.mbit]`` / ``[testbed.delay_ms]`` / ``[testbed.nodes]`` become ``[network]``."""
        tb = self.testbed
        if tb is None:
            return self
        mbit, delay = tb.mbit.model_dump(exclude_none=True), tb.delay_ms.model_dump(exclude_none=True)
        nodes = {n: o.model_dump(exclude_none=True) for n, o in tb.nodes.items()}
        if not (mbit or delay or nodes):
            return self
        if self.network is not None:
            raise ValueError("both [network] and the deprecated [testbed.mbit] / [testbed.delay_ms] / "
                             "[testbed.nodes] are given: move the testbed keys into [network]")
        self.network = from_testbed(mbit, delay, nodes)
        self.testbed = tb.model_copy(update={"mbit": LinkRates(), "delay_ms": LinkDelays(), "nodes": {}})
        _deprecated(f"[testbed.mbit] / [testbed.delay_ms] / [testbed.nodes] are deprecated; write instead: "
                    f"{to_toml_hint(self.network)}")
        return self

    @model_validator(mode="after")
    def _network_nodes_exist(self) -> RunSpec:
        """A ``[network.nodes.<id>]`` override names a node of this topology (every deployment ignores others)."""
        if self.network is not None:
            t = self.topology
            nodes = ["ps", *(f"edge-{m}" for m in range(t.edges)), *(f"client-{i}" for i in range(t.clients))]
            self.network.check_nodes(nodes)
        return self

    def network_profile(self) -> NetworkSpec:
        """The ``[network]`` table, or the empty profile (nothing shaped, every node at full speed)."""
        return self.network if self.network is not None else NetworkSpec()

    @model_validator(mode="after")
    def _algorithm_fits_topology(self) -> RunSpec:
        algo = _algorithm(self.algorithm.name)
        if algo is None:
            return self
        self._resolve_peer_graph(algo.peers)
        needs = algo.needs_edges
        name = self.algorithm.name
        template = f", or start from its template (--algorithm {name})" if name in catalog.ALGORITHMS else ""
        if needs is True and self.topology.edges == 0:
            raise ValueError(f"algorithm {name!r} needs edge servers (it is hierarchical): set topology.edges "
                             f"to 1 or more (--set topology.edges=2){template}")
        if needs is False and self.topology.edges > 0:
            raise ValueError(f"algorithm {name!r} runs on server + clients only (it is flat, no edge servers): "
                             f"set topology.edges = 0 (--set topology.edges=0){template}")
        check = algo.check
        if check is not None:
            check(self, self.options())
        return self

    def _resolve_peer_graph(self, needs: str) -> None:
        """``topology.peer_graph`` unset becomes what the algorithm needs; an algorithm that walks or gossips
        between clients cannot run without peer links, and peer links need a flat topology."""
        t = self.topology
        if t.peer_graph is None:
            t.peer_graph = needs  # type: ignore[assignment]
        if needs != "none" and t.peer_graph == "none":
            raise ValueError(f"algorithm {self.algorithm.name!r} sends models from client to client: "
                             f"topology.peer_graph must not be 'none' (its default is {needs!r})")
        if t.peer_graph != "none" and t.edges > 0:
            raise ValueError("topology.peer_graph links clients directly, which fedhop supports on a flat topology "
                             "only: set topology.edges = 0 or topology.peer_graph = 'none'")

    @model_validator(mode="after")
    def _data_clusters_match_topology(self) -> RunSpec:
        """Cluster-aware partitions (rho_cluster, cluster_iid) must see the topology's clusters."""
        n = self.data.clusters_given()
        if n == 0:
            return self
        if n != self.topology.edges:
            raise ValueError(f"data clusters ({n}) must equal topology.edges ({self.topology.edges})")
        topo_sizes = self.topology.clients_per_edge or [
            self.topology.clients // n + (1 if m < self.topology.clients % n else 0) for m in range(n)]
        if self.data.cluster_sizes is not None and list(self.data.cluster_sizes) != list(topo_sizes):
            raise ValueError(f"data.cluster_sizes {self.data.cluster_sizes} differ from the topology's "
                             f"clusters {topo_sizes}")
        return self

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        seen: dict[str, str] = {}
        for i, ref in enumerate(v):
            check_ref(ref, f"entry {i}")
            name = metric_name(ref)
            if name in RESERVED_METRICS:
                raise ValueError(f"entry {i}: {ref} would be reported as {name!r}, a column fedhop already writes; "
                                 "rename the function")
            if name in seen:
                raise ValueError(f"entry {i}: {ref} and {seen[name]} would both be reported as {name!r}")
            seen[name] = ref
        return v

    @model_validator(mode="after")
    def _traces_fit(self) -> RunSpec:
        """A recorded participation trace has one column per client and (unless it wraps) a row per round."""
        from fedhop.common.options.participation import TraceParticipation

        if _algorithm(self.algorithm.name) is None:
            return self
        for key, value in self.options():
            if isinstance(value, TraceParticipation):
                value.check_fits(f"algorithm.options.{key}", self.topology.clients, self.rounds)
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {v!r}")
        return v

    def options(self) -> BaseModel:
        """The algorithm's options, validated into its typed model."""
        return catalog.algorithm(self.algorithm.name).options.model_validate(self.algorithm.options)

    def to_toml(self) -> str:
        return _to_toml(self.model_dump(mode="json", exclude_none=True))

    @classmethod
    def from_toml(cls, text: str, source: str = "<spec>") -> RunSpec:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{source}: not valid TOML: {e}") from None
        return cls.parse(raw, source)

    @classmethod
    def parse(cls, raw: dict[str, Any], source: str = "<spec>") -> RunSpec:
        """Validate ``raw`` and import the user code it names (a process that runs it must be able to)."""
        algorithm = raw.get("algorithm")
        name = algorithm.get("name") if isinstance(algorithm, dict) else None
        if isinstance(name, str) and is_ref(name):  # its options model is needed to validate the spec
            try:
                catalog.user_algorithm(check_ref(name, "algorithm.name", "NAME"))
            except UserCodeError as e:
                raise SpecError(f"{source}: invalid run spec: {e}") from None
        try:
            spec = cls.model_validate(raw)
        except ValidationError as e:
            errors = "; ".join(part.removeprefix("(root): ") for part in flat_errors(e, cls).split("; "))
            raise SpecError(f"{source}: invalid run spec: {errors}") from None
        try:
            check_imports(spec)
        except UserCodeError as e:
            raise SpecError(f"{source}: invalid run spec: {e}") from None
        return spec

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        """The spec of a TOML file; relative paths in it are the file's folder's (:func:`resolve_paths`)."""
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"spec file not found: {p}")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{p}: not valid TOML: {e}") from None
        return cls.parse(resolve_paths(raw, p.parent), str(p))


def resolve_paths(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``raw`` (a spec file's table) with the relative file paths it holds made absolute against ``folder``,
    the spec file's folder, so that a spec means the same files whatever the working directory: ``data.path``
    and the ``path`` of every participation trace (a table with ``kind = "trace"``) under
    ``algorithm.options``. Paths given on the command line (``--set``, ``--data-path``) stay the working
    directory's. The user code a spec names (``package.module:function``) is imported from the spec's folder
    too (see ``fedhop.cli.spec_fields.read_raw``)."""

    def absolute(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        p = Path(value).expanduser()
        return value if p.is_absolute() else str((folder / p).resolve())

    def traces(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: traces(v) for k, v in node.items()}
            if out.get("kind") == "trace" and "path" in out:
                out["path"] = absolute(out["path"])
            return out
        if isinstance(node, list):
            return [traces(v) for v in node]
        return node

    out = dict(raw)
    data = out.get("data")
    if isinstance(data, dict) and "path" in data:
        out["data"] = {**data, "path": absolute(data["path"])}
    algorithm = out.get("algorithm")
    if isinstance(algorithm, dict) and isinstance(algorithm.get("options"), dict):
        out["algorithm"] = {**algorithm, "options": traces(algorithm["options"])}
    return out


class SpecError(ValueError):
    """A run spec that cannot run; the message names the field."""


def toml_text(table: dict[str, Any]) -> str:
    """A spec table (plain values: what ``model_dump(mode="json")`` gives) written as TOML."""
    return _to_toml(table)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _to_toml(d: dict[str, Any], prefix: str = "") -> str:
    scalars = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    tables = [
        _to_toml(v, f"{prefix}{_toml_key(k)}.") for k, v in d.items() if isinstance(v, dict)
    ]
    head = f"[{prefix[:-1]}]\n" if prefix else ""
    return head + "".join(s + "\n" for s in scalars) + "".join("\n" + t for t in tables)
