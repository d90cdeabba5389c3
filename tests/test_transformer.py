"""TransformerConv: layer vs PyG's TransformerConv, every caching scheme and backend,
explicit backward (gradcheck), attention dropout, optimize(), pickling, the plan, errors."""

import inspect
import io
import math
import pickle
import warnings

import pytest
import torch
from torch_geometric.nn import TransformerConv as PygTransformerConv
from torch_geometric.utils import softmax as pyg_softmax

import corgnn
from corgnn.cost.transformer import TRANSFORMER_CACHE_SCHEMES, plan_transformer, transformer_bytes_saved
from corgnn.functional.transformer import transformer_conv
from corgnn.graph import Graph
from corgnn.nn import Transformer, TransformerConv, UnsupportedOption
from corgnn.sparse import use_backend
from corgnn.sparse.rng import DropoutSpec, dropout_keep_mask
from conftest import FAST_GRADCHECK, FORCED_TRITON_INTERPRETER, KERNEL_BACKENDS, eight_head_tier, make_graph

SCHEMES = list(TRANSFORMER_CACHE_SCHEMES)
F64 = torch.float64


def pair(in_channels, out_channels, seed=0, **kw):
    """PyG's layer and ours with the same parameters (float64, PyG's init)."""
    cache = kw.pop("cache", None)
    torch.manual_seed(seed)
    ref = PygTransformerConv(in_channels, out_channels, **kw).to(F64)
    ours = TransformerConv(in_channels, out_channels, **kw).to(F64)
    ours.load_state_dict(ref.state_dict())  # same keys (lin_query, lin_key, lin_value, lin_skip, lin_beta)
    if cache is not None:
        ours.cache = cache
    return ref, ours


def run(layer, call, inputs):
    """Output, then the gradients of every input and every parameter (by name), after
    a loss that weighs each output entry differently."""
    layer.zero_grad()
    for t in inputs:
        t.grad = None
    out = call(layer)
    main = out[0] if isinstance(out, tuple) else out
    loss = (main * torch.linspace(-1, 1, main.numel(), dtype=main.dtype, device=main.device).view_as(main)).sum() + main.square().sum()
    if isinstance(out, tuple):
        alpha = out[1][1]
        loss = loss + (alpha * torch.arange(alpha.numel(), dtype=alpha.dtype, device=alpha.device).view_as(alpha).sin()).sum()
    loss.backward()
    outs = [main.detach()] + ([out[1][0], out[1][1].detach()] if isinstance(out, tuple) else [])
    return outs, [t.grad for t in inputs], {n: p.grad for n, p in layer.named_parameters()}


def assert_same(ref, ours, call, inputs, tol=1e-10):
    want_out, want_in, want_p = run(ref, call, inputs)
    got_out, got_in, got_p = run(ours, call, inputs)
    for a, b in zip(got_out, want_out):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for a, b in zip(got_in, want_in):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert set(got_p) == set(want_p)
    for name, b in want_p.items():
        assert (got_p[name] is None) == (b is None), name
        if b is not None:
            torch.testing.assert_close(got_p[name], b, rtol=tol, atol=tol, msg=name)


def test_signature_is_pygs():
    ours = inspect.signature(TransformerConv.__init__).parameters
    theirs = inspect.signature(PygTransformerConv.__init__).parameters
    positional = [(p.name, p.default, p.kind) for p in ours.values() if p.kind != inspect.Parameter.KEYWORD_ONLY]
    assert positional == [(p.name, p.default, p.kind) for p in theirs.values()]
    assert [n for n, p in ours.items() if p.kind == inspect.Parameter.KEYWORD_ONLY] == ["cache", "format", "memory_budget"]
    forward = [p.name for p in inspect.signature(TransformerConv.forward).parameters.values()]
    assert forward == [p.name for p in inspect.signature(PygTransformerConv.forward).parameters.values()]


OPTIONS = [
    dict(heads=1),
    dict(heads=3),
    dict(heads=3, concat=False),
    dict(heads=2, beta=True),
    dict(heads=2, concat=False, beta=True),
    dict(heads=2, root_weight=False),
    dict(heads=2, bias=False),
]


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_matches_pyg_float64(cache, options):
    ei, n = make_graph()  # duplicates, self-loops, isolated nodes, directed
    ref, ours = pair(6, 4, cache=cache, **options)
    x = torch.randn(n, 6, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei), [x])
    assert ours.last_cache == cache and ours.last_plan.scheme == cache


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("options", [dict(heads=2), dict(heads=3, concat=False, beta=True), dict(heads=1, root_weight=False, bias=False)])
def test_edge_features_match_pyg(cache, options):
    ei, n = make_graph(seed=8)
    ref, ours = pair(6, 4, cache=cache, edge_dim=3, **options)
    x = torch.randn(n, 6, dtype=F64, requires_grad=True)
    ea = torch.randn(ei.size(1), 3, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei, ea), [x, ea])
    assert ours.last_cache == cache
    ours.format = "ell"  # (edge features need the CSR's entry order: the layer uses it)
    assert_same(ref, ours, lambda m: m(x, ei, ea), [x, ea])


def test_edge_features_bipartite_attention_weights_and_no_edges():
    g = torch.Generator().manual_seed(5)
    n_src, n_dst = 8, 5
    ei = torch.stack([torch.randint(0, n_src, (20,), generator=g), torch.randint(0, n_dst, (20,), generator=g)])
    ref, ours = pair((4, 3), 2, heads=2, edge_dim=2, beta=True)
    xs = torch.randn(n_src, 4, dtype=F64, requires_grad=True)
    xd = torch.randn(n_dst, 3, dtype=F64, requires_grad=True)
    ea = torch.randn(20, 2, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m((xs, xd), ei, ea), [xs, xd, ea])
    assert_same(ref, ours, lambda m: m((xs, xd), ei, ea, return_attention_weights=True), [xs, xd, ea])
    ref, ours = pair(4, 2, heads=2, edge_dim=2)
    x = torch.randn(n_src, 4, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, torch.empty(2, 0, dtype=torch.long), torch.empty(0, 2, dtype=F64)), [x])


@pytest.mark.parametrize("fmt", ["coo", "csc", "ell", "hybrid"])
def test_formats_agree(fmt):
    ei, n = make_graph(seed=1)
    ref, ours = pair(5, 3, heads=2, beta=True)
    ours.format = fmt
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei), [x])


def test_zero_edges_and_isolated_nodes():
    ref, ours = pair(4, 3, heads=2)
    n = 7
    x = torch.randn(n, 4, dtype=F64, requires_grad=True)
    empty = torch.empty(2, 0, dtype=torch.long)
    assert_same(ref, ours, lambda m: m(x, empty), [x])
    with torch.no_grad():  # no edges: the root term only
        torch.testing.assert_close(ours(x, empty), ours.lin_skip(x))
    loops = torch.tensor([[0, 0, 2], [0, 0, 2]])  # self-loops only (duplicated), the rest isolated
    assert_same(ref, ours, lambda m: m(x, loops), [x])


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("options", [dict(heads=2), dict(heads=2, concat=False, beta=True)])
def test_bipartite_matches_pyg(cache, options):
    g = torch.Generator().manual_seed(4)
    n_src, n_dst = 9, 6
    ei = torch.stack([torch.randint(0, n_src, (25,), generator=g), torch.randint(0, n_dst - 1, (25,), generator=g)])
    ei = torch.cat([ei, ei[:, :3]], 1)  # duplicates; target n_dst - 1 has no edge
    ref, ours = pair((5, 3), 4, cache=cache, **options)
    xs = torch.randn(n_src, 5, dtype=F64, requires_grad=True)
    xd = torch.randn(n_dst, 3, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m((xs, xd), ei), [xs, xd])
    # same channel counts, a pair of inputs to a one-set layer
    ref, ours = pair(5, 4, cache=cache, **options)
    xd5 = torch.randn(n_dst, 5, dtype=F64, requires_grad=True)
    assert_same(ref, ours, lambda m: m((xs, xd5), ei), [xs, xd5])


@pytest.mark.parametrize("bipartite", [False, True])
def test_attention_weights_match_pyg(bipartite):
    ei, n = make_graph(seed=2)
    ref, ours = pair(5, 3, heads=2)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    inputs = (x, x[: n - 4].detach().requires_grad_()) if bipartite else x
    leaves = list(inputs) if bipartite else [x]
    if bipartite:
        ei = ei[:, ei[1] < n - 4]
    for flag in (True, False):  # PyG: any bool returns them
        assert_same(ref, ours, lambda m: m(inputs, ei, return_attention_weights=flag), leaves)
    assert ours.last_cache is None


def test_sparse_adjacency_matches_edge_index():
    ei, n = make_graph(seed=3)
    ei = torch.unique(ei, dim=1)  # a coalesced adj_t holds each edge once
    ref, ours = pair(5, 3, heads=2)
    x = torch.randn(n, 5, dtype=F64, requires_grad=True)
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(ei.size(1), dtype=F64), (n, n)).coalesce()
    want = ref(x, ei)
    for a in (adj, adj.to_sparse_csr()):
        torch.testing.assert_close(ours(x, a), want, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ explicit backward
def tiny():
    ei = torch.tensor([[0, 1, 2, 3, 3, 4, 1, 1], [1, 2, 0, 0, 0, 2, 1, 4]])
    return Graph(ei, num_nodes=6).gat_adjacency(add_self_loops=False)  # node 5 isolated, duplicate 3->0, loop 1->1


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gradcheck(cache, p):
    A = tiny()
    torch.manual_seed(0)
    H, C, m = 2, 2, 3
    x = torch.randn(6, m, dtype=F64, requires_grad=True)
    params = [torch.randn(s, dtype=F64, requires_grad=True) for s in [(H * C, m), (H * C,)] * 3]
    drop = DropoutSpec(p, seed=7)  # fixed seed: the same mask on every call
    for concat in (True,) if FORCED_TRITON_INTERPRETER else (True, False):  # (the head mean is outside the kernels)
        f = lambda *t: transformer_conv(t[0], None, *t[1:], A, H, concat=concat, dropout=drop, training=True, cache=cache)  # noqa: E731
        assert torch.autograd.gradcheck(f, (x, *params), fast_mode=FAST_GRADCHECK)
    # bipartite: queries from x_dst (4 targets of the 6 sources), no biases
    Ab = corgnn.sparse.CSR.from_coo(torch.tensor([0, 0, 1, 3, 3]), torch.tensor([5, 2, 2, 0, 0]), None, (4, 6))
    xd = torch.randn(4, 2, dtype=F64, requires_grad=True)
    wq = torch.randn(H * C, 2, dtype=F64, requires_grad=True)
    f = lambda xs_, xd_, q, k, v: transformer_conv(xs_, xd_, q, None, k, None, v, None, Ab, H, dropout=drop, training=True, cache=cache)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, xd, wq, params[2], params[4]), fast_mode=FAST_GRADCHECK)
    # edge features: attr (q, 2) in A's entry order, lin_edge's weight (H*C, 2)
    attr = torch.randn(A.nnz, 2, dtype=F64, requires_grad=True)
    we = torch.randn(H * C, 2, dtype=F64, requires_grad=True)
    f = lambda *t: transformer_conv(t[0], None, *t[1:7], A, H, dropout=drop, training=True, cache=cache, edge_attr=t[7], edge_weight=t[8])  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, *params, attr, we), fast_mode=FAST_GRADCHECK)


def reference_attention(x, wq, bq, wk, bk, wv, bv, attr, we, A, heads, concat, keep):
    """Pure-torch autograd attention on ``A``'s entry order with a given dropout scale
    ``keep (q, h)`` and edge features ``attr (q, f)``, ``we (h*c, f)`` (PyG's message)."""
    coo = A.to_coo()
    dst, src = coo.row, coo.col
    n = x.size(0)
    Q, K, V = ((x @ w.t() + b).view(n, heads, -1) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    E = (attr @ we.t()).view(-1, heads, Q.size(2))
    alpha = pyg_softmax((Q[dst] * (K[src] + E)).sum(-1) / math.sqrt(Q.size(2)), dst, num_nodes=n) * keep
    out = torch.zeros_like(V).index_add(0, dst, (V[src] + E) * alpha.unsqueeze(-1))
    return out.reshape(n, -1) if concat else out.mean(1)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("H, edges", [(2, True), (8, True), (8, False)])
def test_backends_and_dropout_match_reference(backend, p, H, edges, monkeypatch):
    """Every backend and caching scheme against the pure-torch reference, float64:
    outputs and every gradient, with and without attention dropout, edge features
    and the head mean (one gradient for every head); 8 heads take the kernels'
    eight-head paths (``numba_kernels.HEADS8``: without edge features, dropout or
    a second slot, the row kernel's softmax backward too)."""
    eight_head_tier(monkeypatch, H)
    ei, n = make_graph(seed=3)
    A = Graph(ei, num_nodes=n).gat_adjacency(add_self_loops=False)
    C, m = 4, 5
    drop = DropoutSpec(p, seed=123)
    keep = dropout_keep_mask(A.nnz, H, drop.p, drop.seed).to(F64) / (1 - p)
    if p:
        assert 0.4 < float((keep > 0).double().mean()) < 0.6
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=F64) for s in [(n, m)] + [(H * C, m), (H * C,)] * 3 + [(A.nnz, 2), (H * C, 2)]]
    if not edges:  # (the reference's edge term zero; corgnn is called without edge features)
        inputs[-2].zero_()
    # (concat=False: the kernels read one (n, 1, c) gradient for every head)
    for concat in (True, False):
        d = H * C if concat else C
        g = torch.randn(n, d, dtype=F64)
        root = [torch.randn(d, m, dtype=F64), torch.randn(d, dtype=F64)]  # (PyG's lin_skip)

        def grads(fn, fused_root=False):
            t = [v.clone().requires_grad_() for v in inputs + (root if fused_root else [])]
            out = fn(*t)
            if fused_root:  # (out, x_r): both outputs' gradients
                (out[0] * g).sum().add((out[1] * g.flip(0)).sum()).backward()
                return [out[0].detach(), out[1].detach()] + [v.grad for v in t]
            out.backward(g)
            return [out.detach()] + [v.grad for v in t]

        want = grads(lambda *t: reference_attention(*t, A, H, concat, keep))
        if not edges:
            want[-2:] = [None, None]  # (no edge features: no gradients for them)
        edge = (lambda w: dict(edge_attr=w[6], edge_weight=w[7])) if edges else (lambda w: {})  # noqa: E731
        with use_backend(backend):
            for cache in SCHEMES:
                got = grads(lambda x, *w: transformer_conv(x, None, *w[:6], A, H, concat=concat, dropout=drop, training=True, cache=cache, **edge(w)))
                for a, b in zip(got, want):
                    assert (a is None) == (b is None)
                    if b is not None:
                        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
            # the root term as a fourth block of the Q, K, V product: x_r and its gradients
            # (x's and the root weights') beside the attention's
            got = grads(lambda x, *w: transformer_conv(
                x, None, *w[:6], A, H, concat=concat, dropout=drop, training=True, root_weight=w[8], root_bias=w[9], **edge(w),
            ), fused_root=True)
        ws, bs = (v.clone().requires_grad_() for v in root)
        x_r = inputs[0] @ ws.t() + bs
        (x_r * g.flip(0)).sum().backward()
        torch.testing.assert_close(got[1], x_r.detach(), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[-2], ws.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[-1], bs.grad, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[2], want[1] + g.flip(0) @ root[0], rtol=1e-10, atol=1e-10)  # (dx: both terms)
        for a, b in zip(got[3:-2], want[2:]):
            assert (a is None) == (b is None)
            if b is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_matches_pyg():
    ei, n = make_graph(seed=7)
    torch.manual_seed(0)
    ref = PygTransformerConv(8, 8, heads=4, beta=True)
    ours = TransformerConv(8, 8, heads=4, beta=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(n, 8, requires_grad=True)
    assert_same(ref, ours, lambda m: m(x, ei), [x], tol=1e-4)





def test_attention_ops_check_shapes():
    """The raw ops raise before any kernel runs when ``Q, K, V, G`` do not fit the
    pattern or one another (values of another width than queries: the kernels would
    read ``V`` at ``Q``'s width, the Triton interpreter crashed on it)."""
    from corgnn.sparse.attention_dot import dot_attention_backward, dot_attention_forward
    from corgnn.sparse.rng import NO_DROPOUT

    ei, n = make_graph(seed=4)
    A = Graph(ei, num_nodes=n).gat_adjacency(add_self_loops=True)
    Q = K = V = torch.randn(n, 3, 4)
    _, lse, _, _ = dot_attention_forward(A, Q, K, V, 0.5, NO_DROPOUT)
    bad = {
        "V": (Q, K, torch.randn(n, 3, 2)), "K": (Q, torch.randn(n, 2, 4), V),
        "Q": (torch.randn(n + 1, 3, 4), K, V), "must be 3-D": (Q, K, torch.randn(n, 12)),
    }
    for what, (q, k, v) in bad.items():
        with pytest.raises(ValueError, match=what):
            dot_attention_forward(A, q, k, v, 0.5, NO_DROPOUT)
        with pytest.raises(ValueError, match=what):
            dot_attention_backward(A, Q, q, k, v, 0.5, NO_DROPOUT, lse=lse)
    with pytest.raises(ValueError, match="G must have shape"):
        dot_attention_backward(A, torch.randn(n, 3, 5), Q, K, V, 0.5, NO_DROPOUT, lse=lse)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("heads, unroll8", [(4, True), (8, False), (8, True)])
def test_exp_shifted_accuracy(dtype, heads, unroll8):
    """The row kernels' exp (a polynomial in float32, ``math.exp`` in float64): within
    one float32 ulp of float64's over softmax's range, the row sums, only ``m`` rows
    written, an argument below float32's normal range giving (near) 0; with 8 heads
    and ``unroll8`` the eight-head path (``numba_kernels.HEADS8``), else the loops."""
    import numpy as np
    from numba import njit

    from corgnn.sparse.backends.numba_transformer_kernels import exp_shifted

    @njit
    def call(P, T, m, shift, tot):
        exp_shifted(P, T, m, shift, tot, unroll8)

    dt = np.dtype(dtype)
    shift = np.array([0.0, 1.0, -2.0, 30.0, 0.5, -1.0, 3.0, -30.0][:heads], dtype=dt)
    x = np.linspace(-86.0, 0.5, 1024 * heads).reshape(1024, heads)  # x = P - shift
    P = np.vstack([(x + shift).astype(dt), np.full((3, heads), 7.0, dtype=dt)])
    P[5, 3] = shift[3] - 200  # exp(-200): below the smallest normal float32
    want = np.exp((P[:1024] - shift).astype(np.float64))  # (the subtraction rounds in dtype, as in the kernels)
    tot = np.ones(heads, dtype=dt)
    call(P, np.empty(P.shape, dtype=np.float32), 1024, shift, tot)
    rel = np.abs(P[:1024] / want - 1)
    rel[5, 3] = 0
    assert rel.max() < (1.2e-7 if dt == np.float32 else 1e-15)
    assert P[5, 3] < 1e-37
    assert (P[1024:] == 7.0).all()  # rows past m untouched
    np.testing.assert_allclose(tot, 1 + want.sum(0), rtol=1e-6)


@pytest.mark.parametrize("cache", SCHEMES)
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("heads, edge_dim", [(3, 2), (8, 2), (8, None)])
def test_float32_kernels_match_float64_every_scheme(cache, p, heads, edge_dim, monkeypatch):
    """The float32 kernels (their exps a vectorized polynomial, ``exp_shifted``; with 8
    heads its eight-head path, ``numba_kernels.HEADS8``) against the float64 ones
    (``math.exp``) with the same parameters and dropout mask, every caching scheme
    (the recomputing ones rerun the exps in backward), with and without edge
    features, and scores spread wide enough that some weights underflow to 0."""
    eight_head_tier(monkeypatch, heads)
    ei, n = make_graph(seed=11)
    attr = torch.randn(ei.size(1), 2) if edge_dim else None
    torch.manual_seed(0)
    layer = TransformerConv(6, 8, heads=heads, edge_dim=edge_dim, dropout=p)
    layer.cache = cache
    layer64 = TransformerConv(6, 8, heads=heads, edge_dim=edge_dim, dropout=p).to(F64)
    layer64.load_state_dict(layer.state_dict())
    layer64.cache = cache
    x = 8 * torch.randn(n, 6)  # scores up to ~+-150: exp(s - max) spans float32's range
    results = []
    for lay, dt in ((layer, torch.float32), (layer64, F64)):
        xi = x.to(dt).detach().requires_grad_()
        lay.train()
        torch.manual_seed(5)  # the attention-dropout seed
        out, (_, alpha) = lay(xi, ei, None if attr is None else attr.to(dt), return_attention_weights=True)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dt).view_as(out)).sum().backward()
        results.append([out.detach(), alpha.detach(), xi.grad] + [q.grad for q in lay.parameters()])
    assert float(results[1][1].min()) < 1e-30  # some weights do underflow
    for a, b in zip(*results):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-4 * max(1.0, float(b.abs().max())))  # (lin_key.bias: 0 exactly)

# ------------------------------------------------------------------ attention dropout
@pytest.mark.skipif(FORCED_TRITON_INTERPRETER, reason="400 forward passes: too slow for the Triton interpreter (its mask is compared with the others in test_backends_and_dropout_match_reference)")
def test_dropout_train_statistics_and_eval_equality():
    ei, n = make_graph(seed=4)
    _, layer = pair(4, 3, heads=2, dropout=0.5)
    ref = PygTransformerConv(4, 3, heads=2).to(F64)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(n, 4, dtype=F64)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x, ei), ref(x, ei))  # eval: no attention dropout
        layer.train()
        torch.manual_seed(1)
        b = layer(x, ei)
        torch.manual_seed(1)
        torch.testing.assert_close(layer(x, ei), b)  # the seed comes from torch's generator
        assert not torch.allclose(layer(x, ei), b)  # a fresh mask per call
        # inverted dropout is unbiased: the mean over many masks approaches the eval output
        mean = sum(layer(x, ei) for _ in range(400)) / 400
    want = ref(x, ei)
    err = (mean - want).abs().max()
    spread = (b - want).abs().max()
    assert err < 0.15 * spread, (float(err), float(spread))


def test_dropout_mask_is_the_gat_kernels():
    """The kernels drop exactly the entries of :func:`dropout_keep_mask` (the GAT
    kernels' generator): with value rows one-hot per entry, each dropped entry's
    contribution is missing from the output."""
    n = 5
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 1], [0, 0, 0, 0, 1, 1, 1]])
    A = Graph(ei, num_nodes=n).gat_adjacency(add_self_loops=False)
    drop = DropoutSpec(0.5, seed=99)
    keep = dropout_keep_mask(A.nnz, 1, drop.p, drop.seed)[:, 0]
    x = torch.eye(n, dtype=F64)
    zeros = torch.zeros(n, n, dtype=F64)
    eye = torch.eye(n, dtype=F64)
    for backend in ("numba", "torch"):
        with use_backend(backend):
            out = transformer_conv(x, None, zeros, None, zeros, None, eye, None, A, 1, dropout=drop, training=True)
        coo = A.to_coo()
        want = torch.zeros(n, n, dtype=F64)
        deg = torch.bincount(coo.row, minlength=n).to(F64)
        for e in range(A.nnz):  # uniform attention 1/deg, kept entries scaled by 2
            want[coo.row[e], coo.col[e]] += keep[e] * 2 / deg[coo.row[e]]
        torch.testing.assert_close(out, want)


# ----------------------------------------------------------------------- model / interop
def test_optimize_converts_pyg_layers():
    ei, n = make_graph(seed=5)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = PygTransformerConv(5, 4, heads=3, beta=True)
            self.conv2 = PygTransformerConv(12, 2, heads=2, concat=False, root_weight=False)

        def forward(self, x, ei):
            return self.conv2(torch.nn.functional.elu(self.conv1(x, ei)), ei)

    torch.manual_seed(0)
    net = Net().to(F64)
    x = torch.randn(n, 5, dtype=F64)
    want = net(x, ei)
    keys = set(net.state_dict())
    params = {name: p for name, p in net.named_parameters()}
    corgnn.optimize(net)
    assert isinstance(net.conv1, TransformerConv) and isinstance(net.conv2, TransformerConv)
    assert set(net.state_dict()) == keys
    assert all(p is params[name] for name, p in net.named_parameters())  # PyG's own Parameter objects
    torch.testing.assert_close(net(x, ei), want, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert isinstance(corgnn.optimize(PygTransformerConv((5, 3), 4, bias=False)), TransformerConv)
        assert isinstance(corgnn.optimize(PygTransformerConv(5, 4, edge_dim=2)), TransformerConv)
        for declined in (PygTransformerConv(5, 4, aggr="mean"), PygTransformerConv(5, 4, flow="target_to_source")):
            assert corgnn.optimize(declined) is declined
    assert len(w) == 2 and all("unsupported" in str(m.message) for m in w)


def test_pickle_and_torch_save_after_forward():
    ei, n = make_graph()
    _, layer = pair(4, 3, heads=2, beta=True)
    x = torch.randn(n, 4, dtype=F64)
    want = layer(x, ei)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for copy_ in (pickle.loads(pickle.dumps(layer)), torch.load(buf, weights_only=False)):
        torch.testing.assert_close(copy_(x, ei), want)
        assert copy_.last_cache is not None


def test_model_sparse_features_and_schemes(cora):
    x = cora.x[:300] / cora.x[:300].sum(1, keepdim=True).clamp_min(1)
    ei = cora.edge_index[:, (cora.edge_index < 300).all(0)]
    torch.manual_seed(0)
    model = Transformer(x.size(1), 4, 7, heads=2).to(F64)
    x = x.to(F64)
    assert model.conv1.sparse_features(x) is not None  # bag-of-words: the sparse path
    out = model(x, ei)
    out.square().sum().backward()
    sparse_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out2 = model(x.clone().requires_grad_(), ei)  # needs dL/dx: the dense path
    out2.square().sum().backward()
    torch.testing.assert_close(out2, out)
    for a, b in zip(model.parameters(), sparse_grads):
        torch.testing.assert_close(a.grad, b)
    assert model.schemes() == ["edge_weights", "edge_weights"]
    torch.manual_seed(0)
    budget = Transformer(x.size(1), 4, 7, heads=2, memory_budget=0).to(F64)
    budget(x, ei).square().sum().backward()  # (recomputes Q, K, V: the stacked SpMM again)
    assert budget.schemes() == ["none", "none"]
    for a, b in zip(budget.parameters(), sparse_grads):
        torch.testing.assert_close(a.grad, b)


def test_train_cli_transformer_smoke(cora):
    from corgnn.train import TrainConfig, train

    res = train(TrainConfig(model="transformer", epochs=2, progress=False))
    assert res.schemes == ["edge_weights", "edge_weights"] and 0.0 <= res.test_acc <= 1.0


# ---------------------------------------------------------------------------- cost model
def test_bytes_saved_and_plan():
    n, q, h, c, m = 2708, 10556, 8, 8, 1433
    got = [transformer_bytes_saved(s, n, q, h, c, m) for s in SCHEMES]
    assert got == [0, 12 * n * h * c, 12 * n * h * c + 4 * n * h, 12 * n * h * c + 4 * q * h]
    plan = plan_transformer(n, q, h, c, m)
    assert plan.scheme == "edge_weights" and "TransformerConv layer" in plan.table() and "row_stats" in plan.table()
    times = [cc.time_s for cc in plan.costs]
    assert times == sorted(times, reverse=True) and len(set(times)) == 4
    assert plan_transformer(n, q, h, c, m, memory_budget=got[2]).scheme == "row_stats"
    assert plan_transformer(n, q, h, c, m, memory_budget=got[1]).scheme == "features"
    assert plan_transformer(n, q, h, c, m, training=False).scheme == "none"
    assert plan_transformer(n, q, h, c, m, cache="lse").forced
    with pytest.raises(ValueError, match="scheme"):
        transformer_bytes_saved("all", n, q, h, c, m)


@pytest.mark.parametrize("edge_dim", [None, 2])
@pytest.mark.parametrize("cache", SCHEMES)
def test_saved_tensors_are_the_plans(cache, edge_dim):
    """What the Function keeps for backward (autograd's saved-tensor hooks) is the
    input plus exactly the scheme's tensors and the 8-byte dropout seed (parameters
    aside; the root term's Linear keeps the input it shares; edge features are an
    input kept in the attention's entry order)."""
    ei, n = make_graph(seed=6)
    _, layer = pair(5, 3, heads=2, dropout=0.5, root_weight=False, edge_dim=edge_dim)
    q = ei.size(1)
    ea = torch.randn(q, 2, dtype=F64) if edge_dim else None
    layer.cache = cache
    params = {id(p) for p in layer.parameters()}
    saved = {}

    def pack(t):
        if id(t) not in params:
            saved[(t.data_ptr(), t.shape)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(torch.randn(n, 5, dtype=F64), ei, ea).sum().backward()
    want = transformer_bytes_saved(cache, n, q, 2, 3, 5, edge_dim=edge_dim or 0, value_bytes=8, include_input=True)
    want += q * 2 * 8 if edge_dim else 0
    assert sum(saved.values()) == want + 8  # + the attention-dropout seed (one int64), not a mask


@pytest.mark.large_graph  # (30k edges: minutes per call in Triton's interpreter; the logic is the layer's, not a backend's)
@pytest.mark.parametrize("cache", ["features", "row_stats", "edge_weights"])
def test_backward_drops_its_cache_once_used_unless_the_graph_is_kept(cache):
    """A backward that frees the graph drops the kept Q, K, V (and alpha/lse) as soon
    as it has used them: K and V before dK and dV exist, so its peak of memory is at
    least their size lower than with the graph kept (retain_graph=True, where they
    stay for a second backward, which then gives the same gradients again). Under
    saved-tensor hooks (save_on_cpu) they are saved tensors and the hooks see them."""
    from corgnn.bench.harness import track_peak

    torch.manual_seed(0)
    n, q, H, C = 3000, 30000, 8, 8
    ei = torch.randint(0, n, (2, q))
    layer = TransformerConv(32, C, heads=H, root_weight=False)
    layer.cache = cache
    x = torch.randn(n, 32)
    g = torch.randn(n, H * C)
    used = [p for name, p in layer.named_parameters() if not name.startswith("lin_skip")]  # (root_weight=False)

    def grads(**kw):
        layer.zero_grad(set_to_none=True)
        with track_peak(torch.device("cpu")) as peak:  # (the whole step: it counts frees of what it allocated)
            out = layer(x, ei)
            out.backward(g, **kw)
        return peak.bytes, out, [p.grad.clone() for p in used]

    grads()  # (plans and graph built)
    freed, out1, g1 = grads()
    kept, out2, g2 = grads(retain_graph=True)
    kv = 2 * n * H * C * 4
    assert freed <= kept - 0.9 * kv, (freed, kept, kv)
    out2.backward(g)  # the kept graph's second backward: the same gradients again
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for p, a in zip(used, g2):
        torch.testing.assert_close(p.grad, 2 * a, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out1.backward(g)  # (a freed graph: torch's own error)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        layer.zero_grad(set_to_none=True)
        layer(x, ei).backward(g)
    assert torch.Size([n, H, C]) in saved  # (Q, K, V went through the hooks)
    for p, a in zip(used, g1):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-6)


def test_backward_walks_split_errors():
    from corgnn.sparse.attention_dot import dot_attention_backward_cols

    A = corgnn.sparse.CSR.from_coo(torch.tensor([0, 1, 1]), torch.tensor([1, 0, 2]), None, (3, 3))
    Q, G = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    with pytest.raises(ValueError, match="ea: expected"):
        dot_attention_backward_cols(A, G, Q, torch.randn(3, 3, 2), None, 0.5)
    with pytest.raises(ValueError, match="alpha: ea holds de alone"):
        dot_attention_backward_cols(A, G, Q, torch.randn(3, 1, 2), None, 0.5)


# ---------------------------------------------------------------------------- errors
def test_bad_input_errors():
    ei, n = make_graph()
    layer = TransformerConv(4, 3, heads=2)
    x = torch.randn(n, 4)
    with pytest.raises(TypeError, match="edge_index"):
        layer(x, ei.float())
    with pytest.raises(ValueError, match="node id"):
        layer(x[:10], ei)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        layer(bad, ei)
    with pytest.raises(ValueError, match="in_channels"):
        layer(torch.randn(n, 5), ei)
    with pytest.raises(TypeError, match="float64"):
        layer(x.double(), ei)
    with pytest.raises(ValueError, match="edge_attr"):
        layer(x, ei, edge_attr=torch.randn(ei.size(1), 3))
    with pytest.raises(ValueError, match="x_dst"):
        layer((x, None), ei)
    with pytest.raises(ValueError, match="source id"):
        layer((x[:5], x), ei)
    with_edges = TransformerConv(4, 3, edge_dim=2)
    with pytest.raises(ValueError, match="edge_attr"):
        with_edges(x, ei)
    with pytest.raises(ValueError, match="edge_attr"):
        with_edges(x, ei, torch.randn(ei.size(1) - 1, 2))
    with pytest.raises(TypeError, match="edge_attr"):
        with_edges(x, ei, torch.randn(ei.size(1), 2, dtype=F64))
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), (n, n)).coalesce()
    with pytest.raises(UnsupportedOption, match="edge_attr"):
        with_edges(x, adj, torch.randn(adj._nnz(), 2))
    with pytest.raises(ValueError, match="edge_dim"):
        TransformerConv(4, 3, edge_dim=0)
    for kw in (dict(cache="everything"), dict(dropout=1.0), dict(heads=0), dict(format="dense"), dict(memory_budget=-1)):
        with pytest.raises(ValueError):
            TransformerConv(4, 3, **kw)
    with pytest.raises(TypeError, match="node_dim"):
        TransformerConv(4, 3, node_dim=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    ei, n = make_graph()
    _, ours = pair(6, 4, heads=3, beta=True)
    x = torch.randn(n, 6, dtype=F64, requires_grad=True)
    want = run(ours, lambda m: m(x, ei), [x])
    ours = ours.cuda()
    xc = x.detach().cuda().requires_grad_()
    got = run(ours, lambda m: m(xc, ei.cuda()), [xc])
    torch.testing.assert_close(got[0][0].cpu(), want[0][0])
    torch.testing.assert_close(got[1][0].cpu(), want[1][0])


def test_explain_shows_the_layers_plans(cora):
    from corgnn.explain import explain_model

    text = explain_model("transformer", "Cora", hidden=4)
    assert text.count("TransformerConv, caching scheme") == 2 and text.count("choice: edge_weights") == 2
    assert "row_stats" in text and "heads=8" in text


@pytest.mark.parametrize("stack", [True, False])
def test_stacked_projections_heads_last_blocks(stack, monkeypatch):
    """Blocks asked heads-last are the same values stored ``(n, c, h)`` (what the CPU
    kernels gather without a transposed copy), from dense and sparse features, by one
    stacked GEMM or one per weight (``STACK_MIN_FEATURES``)."""
    from corgnn.functional import projection
    from corgnn.functional.projection import stacked_projections

    monkeypatch.setattr(projection, "STACK_MIN_FEATURES", 0 if stack else 1 << 30)
    from corgnn.sparse.formats import CSR

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g, dtype=F64) * (torch.rand(7, 5, generator=g) < 0.4)
    nz = x.nonzero().t()
    xs = CSR.from_coo(nz[0], nz[1], x[nz[0], nz[1]], tuple(x.shape))
    ws = tuple(torch.randn(6, 5, generator=g, dtype=F64) for _ in range(3))
    bs = tuple(torch.randn(6, generator=g, dtype=F64) for _ in range(3))
    for feats in ({"x": x}, {"x": None, "xs": xs}):
        plain = stacked_projections(feats["x"], ws, bs, 2, feats.get("xs"))
        last = stacked_projections(feats["x"], ws, bs, 2, feats.get("xs"), heads_last=(1, 2))
        for i, (a, b) in enumerate(zip(plain, last)):
            torch.testing.assert_close(b, a)
            torch.testing.assert_close(a, (x @ ws[i].t() + bs[i]).unflatten(1, (2, 3)))
            assert a.is_contiguous() and b.transpose(1, 2).is_contiguous() == (i > 0)


@pytest.mark.parametrize("stack", [True, False])
def test_stacked_projections_of_several_widths_with_a_root_block(stack, monkeypatch):
    """Q, K, V and the root term (PyG's ``lin_skip``, narrower and without a bias) as
    one product: every block equals its own GEMM, the root block comes out flat, and
    the stacked backward gives every block's gradients."""
    from corgnn.functional import projection
    from corgnn.functional.projection import stacked_projection_grads, stacked_projections

    monkeypatch.setattr(projection, "STACK_GRADS_MIN_BYTES", 0 if stack else 1 << 40)
    monkeypatch.setattr(projection, "STACK_MIN_FEATURES", 0 if stack else 1 << 30)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 7, dtype=F64, generator=g, requires_grad=True)
    ws = tuple(torch.randn(d, 7, dtype=F64, generator=g, requires_grad=True) for d in (6, 6, 6, 3))
    bs = tuple(torch.randn(6, dtype=F64, generator=g, requires_grad=True) for _ in range(3)) + (None,)
    outs = stacked_projections(x, ws, bs, heads=2, heads_last=(1, 2), flat=(3,))
    assert [tuple(o.shape) for o in outs] == [(9, 2, 3)] * 3 + [(9, 3)]
    for out, w, b in zip(outs, ws, bs):
        torch.testing.assert_close(out.reshape(9, -1), x @ w.t() + (0 if b is None else b))
    dPs = [torch.randn(9, w.size(0), dtype=F64, generator=g) for w in ws]
    dws, dbs, dx = stacked_projection_grads(list(dPs), x.detach(), tuple(w.detach() for w in ws), True, True, True)
    auto = torch.autograd.grad([o.reshape(9, -1) for o in outs], (*ws, x, *bs[:3]), dPs)
    for got, want in zip((*dws, dx, *dbs[:3]), auto):
        torch.testing.assert_close(got, want)
    assert tuple(dbs[3].shape) == (3,)
