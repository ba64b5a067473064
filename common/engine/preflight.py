"""Checks of a spec's user code before any process starts (``fedhop simulate | launch | server``).

:meth:`RunSpec.parse` already imports every reference; :func:`check_user_code` runs the code once on the
data, so that the errors a user will hit surface as one message naming the spec field, before a federation is
started: a builder that returns the wrong type, a source whose clients disagree on shapes or dtypes, a model
that does not fit the data, a loss or metric that does not return a number, a user algorithm whose state a
checkpoint cannot hold (its ``init`` and ``node_state`` are run once, with no messages).
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from fedhop.common.data.build import build_client_data
from fedhop.common.data.source import check_client
from fedhop.common.engine.api import NodeContext, get_algorithm
from fedhop.common.engine.state_io import StateError, check_savable
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import RunSpec, SpecError
from fedhop.common.user_code import UserCodeError, is_ref, references


def check_user_code(spec: RunSpec, *, clients: bool = True, data_path: str | None = None,
                    source: str = "<spec>") -> None:
    """Run the spec's user code once (nothing happens for a spec that names none); a SpecError names the field.

    ``clients``: also load every client's partition, one at a time, and check it against the test set and the
    model (where the data lives on this machine: ``simulate``, ``launch``); the PS of a federation on separate
    machines checks its test set and the model only.
    """
    if not references(spec):
        return
    try:
        _check(spec, clients, data_path)
    except (UserCodeError, StateError) as e:
        raise SpecError(f"{source}: {e}") from None


def _check(spec: RunSpec, clients: bool, data_path: str | None) -> None:
    ws = Workspace(spec, "cpu", data_path)
    test = ws.test
    model_field = "model.name" if ":" in spec.model.name else "data"
    try:
        params = ws.initial_params()
    except UserCodeError:
        raise
    except (ValueError, TypeError, RuntimeError) as e:
        raise UserCodeError(f"{model_field}: the model cannot be built for samples of shape "
                            f"{tuple(test.x.shape[1:])}: {e}") from None
    _check_batch(ws, params, test.x[:2], test.y[:2], "the test set", model_field)
    if spec.model.loss is not None:
        _check_loss(ws, params, test.x[:2], test.y[:2])
    if spec.metrics:
        ws.evaluate(params, test)  # a metric that does not return one number raises, naming it
    if is_ref(spec.algorithm.name):
        _check_algorithm_state(ws, clients)
    if clients and spec.data.source is not None:
        n = spec.topology.clients
        for k in range(n):
            data, _ = build_client_data(ws.data_spec, n, spec.seed, k)
            check_client(test, k, data)
            _check_batch(ws, params, data.x[:2], data.y[:2], f"client {k}'s partition", model_field)


def _check_batch(ws: Workspace, params: dict, x: torch.Tensor, y: torch.Tensor, what: str, field: str) -> None:
    try:
        out = ws.forward(params, x)
    except Exception as e:
        raise UserCodeError(f"{field}: the model fails on a batch of {what} (x of shape {tuple(x.shape)}, "
                            f"{x.dtype}): {type(e).__name__}: {e}") from None
    c = ws.meta.num_classes
    want = (len(x), c) if c > 0 else (len(x),)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserCodeError(f"{field}: on a batch of {what} the model outputs {got}, expected {want} "
                            f"({'logits for ' + str(c) + ' classes' if c else 'one value per sample: regression'})")


def _check_loss(ws: Workspace, params: dict, x: torch.Tensor, y: torch.Tensor) -> None:
    out = ws.forward({k: v.detach().requires_grad_(True) for k, v in params.items()}, x)
    try:
        loss = ws.loss(out, y)
    except Exception as e:
        raise UserCodeError(f"model.loss: fails on a batch of the test set: {type(e).__name__}: {e}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = f"a tensor of shape {tuple(loss.shape)} ({loss.dtype})" if isinstance(loss, torch.Tensor) else \
            type(loss).__name__
        raise UserCodeError(f"model.loss: returned {got}; a loss returns a 0-dim floating tensor (the batch mean)")
    if not loss.requires_grad:
        raise UserCodeError("model.loss: the returned loss does not depend on the model outputs (no gradient)")


class _NoMessages:
    """The comm of the preflight's parameter-server context: ``init`` sends no messages."""

    def bind(self, ctx: NodeContext) -> None:
        """The context binds its comm on construction (not a message)."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> NoReturn:
            raise UserCodeError(f"algorithm.name: init called ctx.comm.{name}; init builds the state before "
                                "round 0 and sends no messages (use setup or round)")
        return refuse


def _check_algorithm_state(ws: Workspace, clients: bool) -> None:
    """Run the user algorithm's ``node_state`` and ``init`` once and check a checkpoint can hold what they
    return (a StateError names the field), so that a state fedhop cannot save is refused before round 1.

    ``init`` runs with the data sizes the parameter server will know where the clients' data is here
    (``clients``); an ``init`` that fails here for any other reason is left to the run (whose round loop checks
    the state it returns before round 1 as well)."""
    spec = ws.spec
    ref = spec.algorithm.name
    algo = get_algorithm(ref)
    for role in ["client"] + (["edge"] if spec.topology.edges > 0 else []):
        check_savable(algo.node_state(role), f"algorithm.name: {ref}: node_state({role!r})")
    sizes = ws.topology.subtree_sizes(ws.client_sizes()) if clients else {}
    ctx = NodeContext(node_id=ws.topology.server, role="server", ws=ws, comm=_NoMessages(),  # type: ignore
                      sizes=dict(sizes))
    try:
        state = algo.init(ctx)
    except UserCodeError:
        raise  # init sent a message
    except Exception:
        return
    check_savable(state, f"algorithm.name: {ref}: the state init returns")
