"""TrackStar as bergson ships its parts: an estimator that needs the model (score/model_run.py), from the `peers`
extra.

At each checkpoint c, bergson's collector takes each rollout's gradient (its share of the step's GRPO loss with its
logged advantage) on every linear layer, divides it entry-wise by AdamW's denominator saved at c (`normalizer:
adam`; the optimizer's sqrt of the bias-corrected second moment), and projects each layer's gradient to
projection_dim x projection_dim with bergson's seeded random matrices. From the same rollouts it fits each layer's
second moment R of the projected gradients. The target's gradient at the analysis checkpoint at or before c goes
through the same normalizer and projection. Both sides are multiplied by (R + damping)^-1/2 (bergson's
DensePreconditioner) and unit-normalized, so a rollout's value is the cosine of the two in that space: TrackStar's
score (Chang et al., 2024), with the rollouts' own second moment where the paper mixes in the query set's
(bergson's `mix_hessians: false`). The score is -lr x the cosine: a positive score means a gradient step on the
rollout raised the target, weighted by the learning rate of its step like the other gradient estimators. A cosine
has no magnitude, so TrackStar ranks rollouts; its sums over a subset (the LDS) weight every rollout alike.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

USES_TARGET = True
NEEDS_MODEL = True
STEP_AGGREGATE = "sum"
REQUIRES = ("bergson",)
NORMALIZERS = ("adam", "none")

log = logging.getLogger(__name__)


def check(
    projection_dim: int = 16,
    projection_seed: int = 0,
    normalizer: str = "adam",
    damping: float = 0.1,
    batch_size: int = 32,
) -> list[str]:
    """Problems with the settings, each naming its key (checked when the workflow starts)."""
    problems = [] if normalizer in NORMALIZERS else [f"normalizer {normalizer!r} is not one of adam, none"]
    for key, value in (("projection_dim", projection_dim), ("batch_size", batch_size)):
        if not (isinstance(value, int) and value >= 1):
            problems.append(f"{key} {value!r} must be a positive integer")
    if not isinstance(projection_seed, int):
        problems.append(f"projection_seed {projection_seed!r} must be an integer")
    if not (isinstance(damping, int | float) and damping > 0):
        problems.append(f"damping {damping!r} must be positive")
    return problems


def prepare(
    run,
    folder,
    projection_dim: int = 16,
    projection_seed: int = 0,
    normalizer: str = "adam",
    damping: float = 0.1,
    batch_size: int = 32,
) -> None:
    """At each checkpoint, the rollouts' normalized, projected gradients and the damped inverse root of their second
    moment, into `folder` (one .pt file per checkpoint): they depend on the seed's checkpoints and rollouts only, so
    every draw and target kind of the seed scores against them."""
    import torch

    problems = check(projection_dim, projection_seed, normalizer, damping, batch_size)
    if problems:
        raise ValueError("; ".join(problems))
    _import_bergson()
    from bergson.config import InversionConfig
    from bergson.hessians.preconditioner import DensePreconditioner

    run = run.without_autocast()  # see `score`
    for c, rows in run.checkpoint_rows():
        model, _ = run.load(c)
        modules = run.linear_modules(model)
        fitted = _processor(model, modules, run, c, normalizer, projection_dim, projection_seed)
        train = _collect(
            model,
            modules,
            fitted,
            run.rows(rows),
            batch_size,
            lambda part, model=model: run.losses(model, run.batch(part)),
            run.scratch,
            fit_moments=True,
        )
        # A layer that no rollout's loss moves (LoRA's A while B is still zero) has R = 0, whose damped inverse root
        # is 1/0; the target cannot move it either, so it adds exactly 0 to both sides: leave it out.
        empty = [m for m in modules if not fitted.hessians[m].abs().sum() > 0]
        for m in empty:
            del fitted.hessians[m]
        if empty:
            log.warning(
                "trackstar: %d layers without gradient at checkpoint %d left out: %s", len(empty), c, ", ".join(empty)
            )
        inverse_root = DensePreconditioner.from_processor(
            fitted, inversion_cfg=InversionConfig(damping_factor=damping), power=-0.5
        )
        kept = [m for m in modules if m not in empty]
        saved = {"modules": kept, "train": {m: train[m] for m in kept}, "inverse_root": inverse_root.h_inv}
        torch.save(saved, Path(folder) / f"checkpoint-{c}.pt")
        log.info("trackstar: checkpoint %d, %d rollouts' gradients and their second moment kept", c, rows.sum())


def score(
    run,
    target,
    projection_dim: int = 16,
    projection_seed: int = 0,
    normalizer: str = "adam",
    damping: float = 0.1,
    batch_size: int = 32,
    prepared=None,
):
    """`projection_dim` P: each layer's gradient becomes P x P numbers (bergson's per-module projection).
    `damping`: bergson's damping factor, added as damping x the mean eigenvalue of each layer's R. `prepared`: the
    folder `prepare` wrote the rollouts' side into."""
    import torch

    problems = check(projection_dim, projection_seed, normalizer, damping, batch_size)
    if problems:
        raise ValueError("; ".join(problems))
    # bergson's hooks multiply a bf16 activation by a float32 normalized gradient and fail: in a bf16 run, trackstar
    # takes its gradients in float32 (from the same float32 weights).
    run, target = run.without_autocast(), target.without_autocast()
    lr = run.rollouts["lr"].to_numpy()

    def values(c, rows, at):
        model, tokenizer = run.load(c)
        modules = run.linear_modules(model)
        query = _processor(model, modules, run, c, normalizer, projection_dim, projection_seed)
        side = torch.load(Path(prepared) / f"checkpoint-{c}.pt")
        pad_id = tokenizer.pad_token_id
        return lr[rows] * cosines(target, model, modules, pad_id, at, query, side, int(rows.sum()), run.scratch)

    return run.score_per_checkpoint(target, "trackstar", values)


def _processor(model, modules, run, c, normalizer, projection_dim, projection_seed):
    """A fresh bergson GradientProcessor with the run's AdamW normalizers at checkpoint `c` (it carries the second
    moments it collects, so each side gets its own)."""
    _import_bergson()
    from bergson import GradientProcessor

    divisors = run.adam_denominator(c) if normalizer == "adam" else None
    normalizers = _adam_normalizers(model, modules, divisors) if divisors is not None else {}
    return GradientProcessor(normalizers=normalizers, projection_dim=projection_dim, projection_seed=projection_seed)


def cosines(target, model, modules, pad_id, at, processor, side, n_rows, scratch):
    """[rows] cos((R + damping)^-1/2 q, (R + damping)^-1/2 g_z) at `model`'s weights, with the rollouts' side
    (their gradients g_z and the inverse root of R) as `prepare` kept it."""
    import torch
    from bergson import Scorer
    from bergson.hessians.preconditioner import DensePreconditioner
    from bergson.score.score_writer import InMemorySequenceScoreWriter

    items = target.items[at]
    per_item = _collect(
        model,
        modules,
        processor,
        items,
        target.chunk,
        lambda part: target.values(model, target.batch(part, pad_id)),
        scratch,
        fit_moments=False,
    )
    inverse_root = DensePreconditioner(side["inverse_root"])
    query = inverse_root.apply({m: g.float().mean(0, keepdim=True) for m, g in per_item.items()})  # f: item mean
    norm = torch.sqrt(sum(q.pow(2).sum() for q in query.values()))
    query = {m: q / norm for m, q in query.items()}
    writer = InMemorySequenceScoreWriter(n_rows, 1, torch.float32)
    scorer = Scorer(
        query,
        side["modules"],
        writer,
        torch.device("cpu"),
        torch.float32,
        unit_normalize=True,
        index_transform=inverse_root.apply,
    )
    scorer(list(range(n_rows)), {m: g.float() for m, g in side["train"].items()})
    return writer.scores[:, 0].double().numpy()


def _import_bergson() -> None:
    """Imports bergson without its logging.basicConfig(force=True), which would close the job's log file handler
    and send every later record, errors included, to the console instead."""
    if "bergson" in sys.modules:
        return
    configure = logging.basicConfig
    logging.basicConfig = lambda **kwargs: None
    try:
        import bergson  # noqa: F401
    finally:
        logging.basicConfig = configure


def _output_hooked():
    """bergson's InMemoryCollector with its backward hook taken on each layer's output tensor. bergson registers it
    with register_full_backward_hook, which hands the model the layer's output as a view that may not be modified in
    place; Falcon's block adds the attention output to the MLP's with `+=` and fails. A tensor hook gets the same
    gradient (that of the output before any in-place change) and leaves the output alone. bergson has no option for
    it, so this swaps the hooks its own __enter__ registered and feeds its own `_process_grad`."""
    from bergson import InMemoryCollector

    class OutputHooked(InMemoryCollector):
        def __enter__(self):
            super().__enter__()
            for handle in self._bwd_hooks:
                handle.remove()
            self._bwd_hooks[:] = [
                self.model.get_submodule(name).register_forward_hook(self._hook_output) for name in self.target_info
            ]
            return self

        def _hook_output(self, module, _, output):
            output.register_hook(lambda grad: self._process_grad(module, None, (grad,)))

    return OutputHooked


def _collect(model, modules, processor, examples, batch_size, losses_of, scratch, fit_moments) -> dict:
    """{module: [examples, P*P]} each example's normalized, projected gradient, from bergson's hooks on a backward
    pass of `losses_of(batch)` (one loss per example). With `fit_moments`, the processor also keeps each module's
    second moment of them."""
    import tempfile

    from bergson import IndexConfig
    from datasets import Dataset

    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        collector = _output_hooked()(
            model=model,
            data=Dataset.from_dict({"input_ids": [[0]] * len(examples)}),  # bergson sizes its buffers by the dataset
            cfg=IndexConfig(run_path=f"{folder}/index"),
            processor=processor,
            target_modules=set(modules),
            skip_hessians=not fit_moments,
        )
        for start in range(0, len(examples), batch_size):
            indices = list(range(start, min(start + batch_size, len(examples))))
            with collector.with_batch(None):  # every position: the prompt's activations carry gradient too
                losses = losses_of(examples[start : start + batch_size])
                losses.sum().backward()
            model.zero_grad(set_to_none=True)
            collector.process_batch(indices, losses=losses.detach())
        collector.teardown()
    return collector.gradients


def _adam_normalizers(model, modules, denominators) -> dict:
    """bergson's Adam normalizers for the run's own AdamW divisor d of each layer's weight: they divide by
    sqrt(s) + 1e-8, so s = (d - 1e-8)^2. Exact for AdamW's eps of 1e-8 (TRL's default) or more; with a smaller eps,
    a coordinate whose divisor is below 1e-8 (no second moment yet) is divided by 1e-8. bergson wants them [out, in]:
    a layer that stores its weight [in, out] (Conv1D) has its divisor transposed, by bergson's own test."""
    from bergson.gradients import AdamNormalizer, LayerAdapter

    params = dict(model.named_parameters())
    missing = [m for m in modules if f"{m}.weight" not in denominators]
    if missing:
        raise KeyError(f"trackstar: the saved AdamW second moment has no entry for {', '.join(missing)}")
    out = {}
    for m in modules:
        s = (denominators[f"{m}.weight"].double() - 1e-8).clamp(min=0).square().float()
        s = s.T if LayerAdapter.weight_transposed(model.get_submodule(m)) else s
        out[m] = AdamNormalizer(s.to(params[f"{m}.weight"].device))
    return out
