"""CountSketch: exact linear map, unbiased inner products with the expected spread, full coverage."""

import pytest
import torch

from behaviortrace import models
from behaviortrace.countsketch import CountSketch


def test_matches_a_dense_sketch_matrix():
    shapes = {"a": torch.Size([3, 4]), "b": torch.Size([5])}
    sketch = CountSketch(shapes, k=6, seed=1)
    dense = torch.zeros(6, 17)
    offset = 0
    for name in sketch.names:
        n = shapes[name].numel()
        dense[sketch.buckets[name], torch.arange(offset, offset + n)] = sketch.signs[name]
        offset += n
    grads = {"a": torch.randn(2, 3, 4), "b": torch.randn(2, 5)}
    flat = torch.cat([grads["a"].reshape(2, -1), grads["b"]], dim=1)
    assert torch.allclose(sketch.apply(grads), flat @ dense.T, atol=1e-6)


def test_inner_products_are_unbiased_with_the_expected_variance():
    """Over 400 independent maps, the standardized error of <Sa, Sb> has mean ~0 and sd ~1."""
    torch.manual_seed(0)
    shapes = {"w": torch.Size([40, 50]), "v": torch.Size([300])}
    k, trials = 256, 400
    a = {n: torch.randn(1, *s) for n, s in shapes.items()}
    b = {n: 0.5 * a[n] + torch.randn(1, *s) for n, s in shapes.items()}
    fa = torch.cat([x.flatten() for x in a.values()])
    fb = torch.cat([x.flatten() for x in b.values()])
    exact = float(fa @ fb)
    scale = ((float(fa @ fa) * float(fb @ fb) + exact**2) / k) ** 0.5
    z = []
    for seed in range(trials):
        sketch = CountSketch(shapes, k, seed)
        z.append((float(sketch.apply(a)[0] @ sketch.apply(b)[0]) - exact) / scale)
    z = torch.tensor(z)
    assert abs(z.mean()) < 4 / trials**0.5
    assert 0.8 < z.std() < 1.2


def test_coverage_check_fails_when_a_parameter_is_left_out(base_model_dir, cpu):
    model, _ = models.load(base_model_dir, cpu)
    full = CountSketch.for_model(model, 64, 0)
    full.check_covers(model)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(full.names)
    shapes = {n: p.shape for n, p in model.named_parameters() if n != "lm_head.weight"}
    with pytest.raises(ValueError, match="does not cover 1 trainable"):
        CountSketch(shapes, 64, 0).check_covers(model)


def test_same_seed_same_map_regardless_of_block_order():
    shapes = {"a": torch.Size([7]), "b": torch.Size([9])}
    one = CountSketch(shapes, 16, 3)
    two = CountSketch(dict(reversed(list(shapes.items()))), 16, 3)
    assert all(torch.equal(one.buckets[n], two.buckets[n]) and torch.equal(one.signs[n], two.signs[n]) for n in shapes)
