"""The plan's decisions reproduce the usage conditions of the paper's Tables 1-2."""

import pytest

from corgnn.cost import GCN_SCHEMES, plan_gcn
from corgnn.cost.gcn import GCNScheme, parse_scheme, scheme_cost

ARXIV = dict(n=169343, q=1166243 + 169343)
CORA = dict(n=2708, q=13264)
UNCACHED = tuple(s for s in GCN_SCHEMES if not s.cache)
SIZES = [8, 16, 32, 64, 128, 256, 512, 1024]


def cases(ratio_lo, ratio_hi):
    """(m, k) pairs with k/m clearly below ratio_lo or clearly above ratio_hi."""
    for m in (16, 128, 500, 1433):
        for k in SIZES:
            if k <= 0.7 * ratio_lo * m:
                yield m, k, "low"
            elif k >= 1.4 * ratio_hi * m:
                yield m, k, "high"


@pytest.mark.parametrize("graph", [ARXIV, CORA])
@pytest.mark.parametrize("input_grad,threshold", [(True, 1.0), (False, 0.5)])
def test_table2_cached_schemes(graph, input_grad, threshold):
    """Table 2: transform-first+fused when k < m (with input grad) or k < m/2 (without);
    propagate-first + split-propagate with caching otherwise."""
    pairs = list(cases(threshold, threshold))
    assert pairs
    for m, k, side in pairs:
        plan = plan_gcn(graph["n"], graph["q"], m, k, input_grad)
        if side == "low":
            assert plan.scheme == GCN_SCHEMES[0], (m, k, plan.scheme)
        else:
            assert plan.scheme.cache, (m, k, plan.scheme)


@pytest.mark.parametrize("input_grad,bwd_threshold", [(True, 2.0), (False, 1.0)])
def test_table1_uncached_schemes(input_grad, bwd_threshold):
    """Table 1: forward transform-first iff k < m; backward fused-propagate iff
    k < 2m (with input grad) or k < m (without)."""
    g = ARXIV
    for m, k, side in cases(1.0, 1.0):
        plan = plan_gcn(g["n"], g["q"], m, k, input_grad, candidates=UNCACHED)
        assert plan.scheme.forward == ("transform-first" if side == "low" else "propagate-first"), (m, k)
    for m, k, side in cases(bwd_threshold, bwd_threshold):
        plan = plan_gcn(g["n"], g["q"], m, k, input_grad, candidates=UNCACHED)
        assert plan.scheme.backward == ("fused-propagate" if side == "low" else "split-propagate"), (m, k)


def test_caching_costs_no_memory_and_saves_a_spmm():
    n, q, m, k = 1000, 8000, 64, 256
    plain = scheme_cost(parse_scheme("propagate-first+split"), n, q, m, k, input_grad=False)
    cached = scheme_cost(parse_scheme("propagate-first+split+cache"), n, q, m, k, input_grad=False)
    assert plain.saved == cached.saved == n * m
    assert len(cached.spmm_columns) == len(plain.spmm_columns) - 1
    assert cached.flops < plain.flops and cached.bytes < plain.bytes
    assert cached.transient_backward == 0  # Table 2: "nm; 0" without feature gradient


def test_transients_match_table_2():
    n, q, m, k = 1000, 8000, 64, 32
    tf = scheme_cost(GCN_SCHEMES[0], n, q, m, k, input_grad=True)
    pf = scheme_cost(parse_scheme("propagate-first+split+cache"), n, q, m, k, input_grad=True)
    assert (tf.transient_forward, tf.transient_backward) == (n * k, n * k)
    assert (pf.transient_forward, pf.transient_backward) == (n * m, n * m)
    assert tf.spmm_columns == (k, k) and pf.spmm_columns == (m, m)


def test_rows_with_entries_shrink_the_products_on_rows():
    """With ``rows`` (the rows of A' holding entries) propagate-first's GEMMs, A'X and
    G Θ^T run on those rows; transform-first's XΘ and the fused backward on all n."""
    n, q, m, k, r = 10000, 14000, 128, 64, 2000
    for name in ("propagate-first+split+cache", "propagate-first+split"):
        full = scheme_cost(parse_scheme(name), n, q, m, k, input_grad=True)
        part = scheme_cost(parse_scheme(name), n, q, m, k, input_grad=True, rows=r)
        gemms = 3 * 2 * m * k  # forward, dΘ, G Θ^T: FLOPs per row
        assert full.flops - part.flops >= gemms * (n - r)
        assert part.transient_forward == r * m and part.time_s < full.time_s
    tf = parse_scheme("transform-first+fused")
    assert scheme_cost(tf, n, q, m, k, True, rows=r).flops == scheme_cost(tf, n, q, m, k, True).flops
    # the plan picks propagate-first where few rows hold entries, transform-first else (k < m/2 fails: k = m/2)
    assert plan_gcn(n, q, m, k, False, rows=r).scheme.forward == "propagate-first"
    assert plan_gcn(n, q, m, 32, False).scheme.forward == "transform-first"
    assert plan_gcn(n, q, m, 32, False, rows=r).scheme.forward == "propagate-first"
    assert "rows with entries=2000" in plan_gcn(n, q, m, k, False, rows=r).table()
    with pytest.raises(ValueError, match="rows must be"):
        plan_gcn(n, q, m, k, False, rows=n + 1)


def test_forced_and_inference_and_errors():
    plan = plan_gcn(100, 500, 8, 64, True, scheme="transform-first+split")
    assert plan.forced and plan.scheme.name == "transform-first+split"
    inf = plan_gcn(100, 500, 8, 64, False, training=False)
    assert inf.scheme.forward == "propagate-first" and "inference" in inf.reason
    assert "<==" in plan.table() and "choice:" in plan.table()
    with pytest.raises(ValueError, match="unknown GCN scheme"):
        parse_scheme("nope")
    with pytest.raises(ValueError, match="caching"):
        GCNScheme("transform-first", "fused-propagate", cache=True)
    with pytest.raises(ValueError, match="n must be"):
        plan_gcn(-1, 0, 1, 1, True)


def test_static_plan_matches_sized_plans():
    """The compile-time plan (no n, q) picks what plan_gcn picks at realistic degrees
    in all but a few near-tie cells of a grid."""
    import itertools

    from corgnn.cost.gcn import static_scheme_name

    cells = agree = 0
    for m, k, ig in itertools.product([16, 64, 128, 512, 1433], [8, 16, 64, 128, 256, 512, 1024], [False, True]):
        want = static_scheme_name(m, k, ig)
        for n, d in itertools.product((1000, 100000), (2, 5, 10, 30, 100)):
            cells += 1
            agree += plan_gcn(n, n * d, m, k, ig).scheme.name == want
    assert agree / cells >= 0.98, (agree, cells)
