"""FedCluster set-up invariants (docs/specs/fedcluster.md sec. 8.1): clusters (T2), per-round budgets (T3), the
rho_device / rho_cluster device data (T5, T6), local solvers (T7), the small AlexNet (T8) and the
heterogeneity measures (T9)."""

import numpy as np
import pytest
import torch

from fedhop.common.algorithms.centralized import CentralizedSGDOptions
from fedhop.common.algorithms.fedcluster import device_gradients, heterogeneity
from fedhop.common.algorithms.local import LocalSolver, full_gradient, local_train
from fedhop.common.data import Dataset, DataSpec, build_federated_data, make_rng
from fedhop.common.data.fedcluster_gauss import device_labels
from fedhop.common.engine.inprocess import InProcessEngine
from fedhop.common.models import ModelSpec, build_model
from fedhop.common.spec import TopologySpec
from fedhop.common.topology import build_topology
from tests.specs import run_spec


def labels_spec(**kw):
    return DataSpec.model_validate({"dataset": "fedcluster-gauss", "partition": "major_class", **kw})


def counts(labels):
    return np.stack([np.bincount(y, minlength=10) for y in labels])


# -- T2: clusters ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [5, 10, 20])
def test_clusters_partition_the_devices_equally(m):
    topo = build_topology(TopologySpec(clients=1000, edges=m, edge_graph="complete"), seed=0)
    clusters = [set(topo.cluster(e)) for e in topo.edges]
    assert all(len(c) == 1000 // m for c in clusters)
    assert set().union(*clusters) == set(topo.clients)
    assert sum(len(c) for c in clusters) == 1000  # disjoint
    assert all(set(topo.neighbours[e]) == set(topo.edges) - {e} for e in topo.edges)


# -- T3: budgets per round at the paper's scale (1000 devices, 10%, E = 20, batch 30) ---------------------

def paper_round(algorithm, edges):
    return run_spec(algorithm, {"local_steps": 1, "batch_size": 30, "participation": 0.1}, clients=1000, edges=edges,
                    edge_graph="complete" if edges else "random",
                    data={"dataset": "fedcluster-gauss", "partition": "major_class", "samples_per_client": 40,
                          "options": {"dim": 2, "test_samples": 100}},
                    model={"name": "logreg"}, rounds=1, seed=0)


def test_budgets_per_round_match_fedavg():
    e_paper, batch = 20, 30
    for algorithm, edges in (("fedavg", 0), ("fedcluster", 5), ("fedcluster", 10), ("fedcluster", 20)):
        res = InProcessEngine(paper_round(algorithm, edges)).run()
        down = sum(r["messages"] for r in res.links if r["kind"] == "local.train" and r["phase"] == "request")
        up = sum(r["messages"] for r in res.links if r["kind"] == "local.train" and r["phase"] == "reply")
        assert down == up == 100
        assert down * e_paper * batch == 60_000  # sample-gradients per round
        if algorithm == "fedcluster":
            assert res.rounds[0]["cycles"] == edges  # M aggregations per round (FedAvg: 1)
            cyc = [r for r in res.links if r["kind"] == "fedcluster.cycle" and r["phase"] == "request"]
            assert sum(r["messages"] for r in cyc) == edges
    central = CentralizedSGDOptions()  # the baseline's defaults: the paper's 1000 iterations of batch 60
    assert central.iters_per_round * central.batch_size == 60_000  # the same sample-gradients per round


# -- T5 / T6: device data ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho,major,others", [(0.9, 450, (5, 6)), (0.4, 200, (33, 34)), (0.1, 50, (50, 50))])
def test_rho_device_counts(rho, major, others):
    labels = device_labels(labels_spec(rho_device=rho), 1000, 10, make_rng(0, "t5"))
    n = counts(labels)
    assert (n.sum(1) == 500).all()
    if rho > 0.1:
        assert (n.max(1) == major).all()
        majors = n.argmax(1)
        assert (np.bincount(majors, minlength=10) == 100).all()  # each class the major class of 100 devices
        rest = n[n != major]
        assert rest.min() == others[0] and rest.max() == others[1]
    else:
        assert (n == 50).all()  # IID
    total = n.sum(0)
    assert np.abs(total - 50_000).max() <= (0 if rho == 0.1 else 300)  # class-balanced union
    # the topology's contiguous clusters are uniformly random: no cluster is dominated by one major class
    if rho > 0.1:
        per_cluster = [np.bincount(n[c * 100:(c + 1) * 100].argmax(1), minlength=10) for c in range(10)]
        assert max(int(p.max()) for p in per_cluster) < 40


@pytest.mark.parametrize("rho_c,diag", [(0.1, 10), (0.5, 50), (0.9, 90)])
def test_rho_cluster_composition(rho_c, diag):
    spec = labels_spec(rho_device=0.5, rho_cluster=rho_c, n_clusters=10)
    n = counts(device_labels(spec, 1000, 10, make_rng(0, "t6")))
    majors = n.argmax(1)
    mat = np.stack([np.bincount(majors[c * 100:(c + 1) * 100], minlength=10) for c in range(10)])
    assert (mat.sum(0) == 100).all() and (mat.sum(1) == 100).all()
    assert (np.diag(mat) == diag).all()
    if rho_c == 0.1:
        assert (mat == 10).all()  # perfectly homogeneous clusters


def test_generated_features_follow_the_class_means():
    spec = labels_spec(rho_device=0.9, samples_per_client=500, options={"dim": 20, "test": "union"})
    fed = build_federated_data(spec, 20, seed=3)
    assert fed.input_shape == (20,) and fed.num_classes == 10
    union = Dataset.concat(fed.clients)
    assert torch.equal(fed.test.x, union.x)  # test = "union": the train-loss metric set
    # fresh per-device draws: no two devices share a sample
    assert len({tuple(r) for r in union.x[:, :3].tolist()}) == len(union)
    # within-class spread is N(0, I) around the mean: per-feature variance close to 1
    x0 = union.x[union.y == int(union.y[0])]
    assert float(x0.var(0).mean()) == pytest.approx(1.0, abs=0.1)


# -- T7: local solvers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ws():
    s = run_spec("fedcluster", clients=2, edges=1,
                 data={"dataset": "fedcluster-gauss", "partition": "major_class", "samples_per_client": 60,
                       "options": {"dim": 4, "test_samples": 50}},
                 model={"name": "logreg"}, seed=0)
    return InProcessEngine(s).ws


def train(ws, **kw):
    cfg = LocalSolver(**{"steps": 3, "lr": 0.1, "batch_size": 0, **kw})
    w0 = {k: v + 0.1 for k, v in ws.initial_params().items()}
    w, _ = local_train(ws, w0, ws.client_data("client-0"), cfg, torch.Generator().manual_seed(0))
    return w0, w


def test_momentum_zero_and_prox_zero_are_sgd(ws):
    _, sgd = train(ws)
    for kw in ({"solver": "momentum", "momentum": 0.0}, {"prox_mu": 0.0}):
        _, other = train(ws, **kw)
        for k in sgd:
            assert torch.equal(sgd[k], other[k])


def manual(ws, w0, steps, update):
    data = ws.client_data("client-0")
    w = {k: v.clone() for k, v in w0.items()}
    state = {}
    for t in range(steps):
        g = full_gradient(ws, w, data)[1]
        w = update(w, g, state, t)
    return w


def test_momentum_and_fedprox_match_the_spec_formulas(ws):
    w0, got = train(ws, solver="momentum", momentum=0.5)

    def sgdm(w, g, st, t):  # v <- m v + g ; w <- w - eta v
        st.update({k: 0.5 * st.get(k, 0) + g[k] for k in g})
        return {k: w[k] - 0.1 * st[k] for k in w}

    want = manual(ws, w0, 3, sgdm)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
    w0, got = train(ws, prox_mu=0.1)
    want = manual(ws, w0, 3, lambda w, g, st, t: {k: w[k] - 0.1 * (g[k] + 0.1 * (w[k] - w0[k])) for k in w})
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_adam_first_step_is_minus_lr_sign_g(ws):
    w0, w1 = train(ws, solver="adam", steps=1, lr=0.01)
    g = full_gradient(ws, w0, ws.client_data("client-0"))[1]
    for k in g:
        step = w1[k] - w0[k]
        nz = g[k].abs() > 1e-4
        torch.testing.assert_close(step[nz], -0.01 * torch.sign(g[k][nz]), rtol=1e-3, atol=1e-7)


# -- T8: the paper's model --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,count", [((3, 32, 32), 1_387_786), ((1, 28, 28), 1_384_586)])
def test_small_alexnet_parameter_count(shape, count):
    m = build_model(ModelSpec(name="alexnet-small"), shape, 10, seed=0)
    assert sum(p.numel() for p in m.parameters()) == count


# -- T9: heterogeneity ------------------------------------------------------------------------------------

def het_setup(rho_cluster):
    extra = {} if rho_cluster is None else {"rho_cluster": rho_cluster, "n_clusters": 10}
    s = run_spec("fedcluster", clients=200, edges=10, edge_graph="complete",
                 data={"dataset": "fedcluster-gauss", "partition": "major_class", "rho_device": 0.5,
                       "samples_per_client": 50, "options": {"dim": 6, "test_samples": 50}, **extra},
                 model={"name": "logreg"}, seed=0)
    ws = InProcessEngine(s).ws
    gen = torch.Generator().manual_seed(7)
    w = {k: 0.5 * torch.randn(v.shape, generator=gen) for k, v in ws.initial_params().items()}
    devices = [ws.client_data(c) for c in ws.topology.clients]
    grads = device_gradients(ws, w, devices)
    sizes = [len(d) for d in devices]
    clusters = [[ws.topology.ordinal(c) for c in ws.topology.cluster(e)] for e in ws.topology.edges]
    return ws, w, devices, grads, sizes, clusters


def test_heterogeneity_matches_a_direct_computation_and_jensen():
    ws, w, devices, grads, sizes, clusters = het_setup(None)
    h_dev = heterogeneity(grads, sizes, [[k] for k in range(len(devices))])
    h_clu = heterogeneity(grads, sizes, clusters)
    assert 0 < h_clu <= h_dev
    # direct: the cluster loss is the mean loss over the cluster's pooled data (equal device sizes)
    g_all = torch.cat([v.reshape(-1) for v in full_gradient(ws, w, Dataset.concat(devices))[1].values()])
    direct = 0.0
    for members in clusters:
        pooled = Dataset.concat([devices[k] for k in members])
        g_c = torch.cat([v.reshape(-1) for v in full_gradient(ws, w, pooled)[1].values()])
        direct += len(pooled) / sum(sizes) * float(((g_c - g_all) ** 2).sum())
    assert h_clu == pytest.approx(direct, rel=1e-4)


def test_cluster_heterogeneity_grows_with_rho_cluster():
    hs = []
    for rho_c in (0.1, 0.5, 0.9):
        _, _, _, grads, sizes, clusters = het_setup(rho_c)
        hs.append(heterogeneity(grads, sizes, clusters))
        assert hs[-1] <= heterogeneity(grads, sizes, [[k] for k in range(len(sizes))])
    assert hs[0] < hs[1] < hs[2]
