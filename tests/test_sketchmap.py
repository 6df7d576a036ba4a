"""Sketch maps: the exact linear map they claim, unbiased inner products with the error expected for k,
exact norms, and full coverage."""

import pytest
import torch

from behaviortrace.gradients.per_example import Factor, PerExampleGrads, param_layout
from behaviortrace.model import models
from behaviortrace.sketch.maps import SketchMap, materialize

LAYOUT = {
    "emb": ("matrix", torch.Size([7, 5])),
    "w": ("matrix", torch.Size([4, 5])),
    "bias": ("dense", torch.Size([4])),
    "norm": ("dense", torch.Size([5])),
}


def random_grads(batch=3, positions=6, seed=0) -> PerExampleGrads:
    """Factors like a tied embedding (two uses of 'emb': token ids and a dense head), a linear layer, and
    dense blocks."""
    g = torch.Generator().manual_seed(seed)
    grads = PerExampleGrads(batch=batch)
    ids = torch.randint(0, 7, (batch, positions), generator=g)
    grads.matrix["emb"].append((Factor(ids, is_index=True), torch.randn(batch, positions, 5, generator=g)))
    grads.matrix["emb"].append(
        (Factor(torch.randn(batch, positions, 7, generator=g)), torch.randn(batch, positions, 5, generator=g))
    )
    grads.matrix["w"].append(
        (Factor(torch.randn(batch, positions, 4, generator=g)), torch.randn(batch, positions, 5, generator=g))
    )
    grads.dense["bias"] = torch.randn(batch, 4, generator=g)
    grads.dense["norm"] = torch.randn(batch, 5, generator=g)
    return grads


def flat(dense: dict, i=None) -> torch.Tensor:
    return torch.cat([(v if i is None else v[i]).flatten() for v in dense.values()])


def dense_matrix(smap: SketchMap) -> torch.Tensor:
    """S as a [k, n_params] matrix, column by column from unit vectors."""
    cols = []
    for name, (_, shape) in smap.layout.items():
        for j in range(shape.numel()):
            unit = {n: torch.zeros(s) for n, (_, s) in smap.layout.items()}
            unit[name].view(-1)[j] = 1.0
            cols.append(smap.sketch_dense(unit)[0])
    return torch.stack(cols, dim=1)


def explicit_by_hand(smap: SketchMap) -> torch.Tensor:
    """S built directly from its definition: bucket/sign columns, and kron(P_R, P_C) for factored blocks."""
    parts = []
    for name, (kind, shape) in smap.layout.items():
        n = shape.numel()
        if smap.method == "factored" and kind == "matrix":
            block = torch.zeros(smap.k, n)
            p_rows, p_cols = smap.proj[name]
            off = smap.offsets[name]
            block[off : off + smap.dim**2] = torch.kron(p_rows, p_cols)
        else:
            bucket, sign = smap.rest.hashes(name, 0, n)
            block = torch.zeros(smap.rest.k, n)
            block[bucket, torch.arange(n)] = sign
            if smap.method == "factored":
                block = torch.cat([torch.zeros(smap.k_rest_offset, n), block])
        parts.append(block)
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("method", ["countsketch", "factored"])
def test_is_the_linear_map_it_claims(method):
    smap = SketchMap(LAYOUT, method, 64, seed=3)
    S = dense_matrix(smap)
    assert torch.allclose(S, explicit_by_hand(smap), atol=1e-6)
    grads = random_grads()
    dense = materialize(grads, LAYOUT)
    sketch, sq = smap.sketch_examples(grads)
    exact = torch.stack([flat(dense, i) for i in range(grads.batch)])
    assert torch.allclose(sketch, exact @ S.T, rtol=1e-4, atol=1e-5)
    assert torch.allclose(sq, exact.pow(2).sum(1), rtol=1e-5)


def test_materialized_factors_match_a_direct_outer_product_sum():
    grads = random_grads(batch=2)
    dense = materialize(grads, LAYOUT)
    (ids, c1), (r2, c2) = grads.matrix["emb"]
    for i in range(2):
        expected = sum(
            torch.outer(torch.nn.functional.one_hot(ids.values[i, t], 7).float(), c1[i, t])
            + torch.outer(r2.values[i, t], c2[i, t])
            for t in range(ids.values.shape[1])
        )
        assert torch.allclose(dense["emb"][i], expected, atol=1e-5)


def countsketch_variance(a: dict, b: dict, k: int) -> float:
    fa, fb = flat(a), flat(b)
    return float((fa.pow(2).sum() * fb.pow(2).sum() + (fa @ fb) ** 2 - 2 * (fa.pow(2) * fb.pow(2)).sum()) / k)


def kron_gaussian_variance(A: torch.Tensor, B: torch.Tensor, d1: int, d2: int) -> float:
    """Var of <P A Q^T, P B Q^T> for Gaussian P [d1, R], Q [d2, C] with entries of variance 1/d1, 1/d2."""
    D = A.T @ B
    tr_d, tr_d2, fro_d = torch.trace(D), torch.trace(D @ D), D.pow(2).sum()
    e_c_fro = (1 + 1 / d2) * torch.trace(A.T @ A @ B.T @ B) + A.pow(2).sum() * B.pow(2).sum() / d2
    e_c_sq = tr_d2 + (fro_d + tr_d**2) / d2
    return float((e_c_fro + e_c_sq) / d1 + (fro_d + tr_d2) / d2)


def expected_variance(smap: SketchMap, a: dict, b: dict) -> float:
    if smap.method == "countsketch":
        return countsketch_variance(a, b, smap.k)
    var = 0.0
    rest_a, rest_b = {}, {}
    for name, (kind, _) in smap.layout.items():
        if kind == "matrix":
            var += kron_gaussian_variance(a[name].double(), b[name].double(), smap.dim, smap.dim)
        else:
            rest_a[name], rest_b[name] = a[name].double(), b[name].double()
    return var + countsketch_variance(rest_a, rest_b, smap.rest.k)


@pytest.mark.parametrize("method", ["countsketch", "factored"])
def test_inner_products_of_real_rollout_gradients_are_unbiased_with_the_expected_error(method, rollout_gradients):
    """Standardized errors over 15 pairs x 40 independent maps: mean ~0 and mean square ~1."""
    layout, dense = rollout_gradients
    n = next(iter(dense.values())).shape[0]
    vecs = [{name: v[i] for name, v in dense.items()} for i in range(n)]
    pairs = [(i, j) for i in range(6) for j in range(i + 1, 6)]
    exact = {p: float(flat(vecs[p[0]]).double() @ flat(vecs[p[1]]).double()) for p in pairs}
    scale = {}
    z = []
    for seed in range(40):
        smap = SketchMap(layout, method, 512, seed)
        sk = [smap.sketch_dense(v)[0].double() for v in vecs[:6]]
        for p in pairs:
            if p not in scale:
                scale[p] = expected_variance(smap, vecs[p[0]], vecs[p[1]]) ** 0.5
            z.append((float(sk[p[0]] @ sk[p[1]]) - exact[p]) / scale[p])
    z = torch.tensor(z)
    assert abs(float(z.mean())) < 0.15, float(z.mean())
    assert 0.75 < float(z.pow(2).mean()) < 1.3, float(z.pow(2).mean())


def test_coverage_check_fails_when_a_parameter_is_left_out(base_model_dir, cpu):
    model, _ = models.load(base_model_dir, cpu)
    layout = param_layout(model)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(layout)
    SketchMap(layout, "countsketch", 64, 0).check_covers(model)
    partial = {n: v for n, v in layout.items() if n != "lm_head.weight"}
    with pytest.raises(ValueError, match="does not cover 1 trainable"):
        SketchMap(partial, "countsketch", 64, 0).check_covers(model)
    with pytest.raises(ValueError, match="gradients missing"):
        SketchMap(layout, "factored", 256, 0).sketch_dense({n: torch.zeros(s) for n, (_, s) in partial.items()})


def test_same_seed_same_map_regardless_of_block_order():
    reordered = dict(reversed(list(LAYOUT.items())))
    for method in ("countsketch", "factored"):
        one, two = SketchMap(LAYOUT, method, 64, 5), SketchMap(reordered, method, 64, 5)
        grads = {n: torch.randn(s) for n, (_, s) in LAYOUT.items()}
        if method == "countsketch":
            # the same map; only the order of floating-point additions differs
            assert torch.allclose(one.sketch_dense(grads)[0], two.sketch_dense(grads)[0], atol=1e-6)
        else:  # blocks keep their own projections; only their slot in the output follows the order
            assert all(torch.equal(one.proj[n][0], two.proj[n][0]) for n in one.proj)
        assert not torch.equal(one.sketch_dense(grads)[0], SketchMap(LAYOUT, method, 64, 6).sketch_dense(grads)[0])
