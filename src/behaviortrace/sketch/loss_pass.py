"""Per-rollout gradient factors read off the forward and backward pass TRL runs for its own update.

Train-time capture needs no second pass over the step: `LossPassRecorder` hooks the model while TRL computes
its loss (Capture with nothing frozen), and TRL's backward fills the factors as it fills `.grad`. So the
per-rollout gradients are those of exactly the loss TRL differentiated, at exactly the weights it used.

One use of a weight escapes module hooks. TRL computes the completion log-probs with a fused LM head: the
model is called with `fused_lm_head=True`, runs its backbone, and projects the last hidden states through
`lm_head.weight` in tiles inside one autograd function (trl.trainer.utils.add_fused_lm_head; the call
convention is in train/trl_surface.py). No Linear module runs for the head, and the gradient at its output
never exists as a tensor. The head's factors are rebuilt here: the hidden states come from the backbone's
output, and the gradient at the head's output from differentiating a plain re-evaluation of the same head
(with the logit scale and softcapping the kernel applies, trl_surface.fused_head_transform) against the
gradient that reached the kernel's log-probs. The re-evaluation also gives each rollout's
fluency (mean token log-prob at temperature 1) at no extra cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from behaviortrace.gradients.per_example import Capture, Factor, PerExampleGrads
from behaviortrace.train.trl_surface import (
    FUSED_HEAD_FLAG,
    ROW_KEY,
    fused_head_backbone,
    fused_head_transform,
    fused_head_unsupported,
)


@dataclass
class RecordedStep:
    """What one recorded loss pass yields, in the order TRL trained the rows in: per-rollout gradient factors
    of every hooked module, the fused head's inputs (its factors are built per group of rows, in `select`:
    for a real vocabulary the gradient at the head's output of a whole step is too large to hold), fluency
    [B], each row's place in generation order [B] (TRL shuffles the rows), and the completion ids and mask
    TRL trained on (to check them against the rollout log)."""

    grads: PerExampleGrads
    head: HeadInputs
    fluency: torch.Tensor
    rows: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def select(self, rows: torch.Tensor) -> PerExampleGrads:
        """Per-example gradients of the rows at `rows` (positions in TRL's order), the head's share included."""
        picked = self.grads.select(rows)
        self.head.add_to(picked, rows)
        return picked


@dataclass
class HeadInputs:
    """The fused head's use in TRL's loss pass: hidden states [B, T, H] it projected, target ids [B, T], the
    gradient that reached its log-probs [B, T] (None where the loss did not use them), where its weight
    and bias go among the per-example gradients, and the transform of its logits (`fused_head_transform`)."""

    hidden: torch.Tensor
    targets: torch.Tensor
    upstream: torch.Tensor | None
    weight: torch.Tensor
    bias: torch.Tensor | None
    weight_name: str | None
    bias_name: str | None
    temperature: float
    logit_scale: float = 1.0
    softcap: float | None = None

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """The projection's output y (what the head's factors are the gradient at)."""
        return F.linear(self.hidden[rows], self.weight, self.bias)

    def log_probs(self, logits: torch.Tensor, rows: torch.Tensor, temperature: float) -> torch.Tensor:
        """Log-probs of the target tokens from y, transformed as the fused kernel does."""
        z = logits * self.logit_scale
        if self.softcap is not None:
            z = self.softcap * torch.tanh(z / self.softcap)
        logps = torch.gather(F.log_softmax(z / temperature, dim=-1), 2, self.targets[rows].unsqueeze(-1))
        return logps.squeeze(-1)

    def add_to(self, grads: PerExampleGrads, rows: torch.Tensor) -> None:
        """Add the head's factors for `rows`: the gradient at its output, rebuilt by differentiating a plain
        re-evaluation of log_softmax(logits / temperature) against the gradient at its log-probs."""
        if self.upstream is None or (self.weight_name is None and self.bias_name is None):
            return
        with torch.enable_grad():
            logits = self.logits(rows).requires_grad_(True)
            logps = self.log_probs(logits, rows, self.temperature)
            (at_logits,) = torch.autograd.grad(logps, logits, grad_outputs=self.upstream[rows])
        if self.weight_name is not None:
            grads.matrix[self.weight_name].append((Factor(at_logits), self.hidden[rows]))
        if self.bias_name is not None:
            grads.add_dense(self.bias_name, at_logits.sum(1))

    def fluency(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Mean log-prob of the scored tokens at temperature 1."""
        with torch.no_grad():
            logps = self.log_probs(self.logits(rows), rows, 1.0)
            return (logps * valid).sum(-1) / valid.sum(-1).clamp(min=1.0)


class LossPassRecorder:
    """Records per-rollout gradient factors from TRL's loss pass: `with recorder.recording(inputs):` around
    the loss forward, then `finish()` once the backward has run."""

    def __init__(self, model, temperature: float):
        unsupported = fused_head_unsupported(model)
        if unsupported:
            raise ValueError(
                f"sketch.mode: train cannot rebuild this model's fused LM head: {unsupported}; "
                "use sketch.mode: checkpoint (it sketches from saved checkpoints with the model's own forward)"
            )
        self.model, self.temperature = model, temperature
        self.head = model.get_output_embeddings()
        self._reset()

    def _reset(self) -> None:
        self.capture: Capture | None = None
        self._hidden: torch.Tensor | None = None
        self._heads: list[dict] = []
        self._inputs: dict | None = None

    @contextmanager
    def recording(self, inputs: dict):
        """Context for TRL's loss forward; `inputs` is the batch TRL's `_compute_loss` received. Module hooks
        are removed when it ends; the tensor hooks they left on activations stay for the backward after it."""
        self._reset()
        self._inputs = {k: inputs[k].detach().clone() for k in ("completion_ids", "completion_mask", ROW_KEY)}
        self.capture = Capture(self.model, freeze=False)
        handles = [
            fused_head_backbone(self.model).register_forward_hook(self._on_backbone_output),
            self.model.register_forward_hook(self._on_model_output, with_kwargs=True),
        ]
        try:
            with self.capture:
                yield self
        finally:
            for handle in handles:
                handle.remove()

    def _on_backbone_output(self, module, args, output) -> None:
        self._hidden = output.last_hidden_state.detach()

    def _on_model_output(self, module, args, kwargs, output) -> None:
        if not kwargs.get(FUSED_HEAD_FLAG):
            return
        if kwargs.get("shift_labels") is not None:
            raise ValueError("sketch.mode: train does not support pre-shifted labels (context parallelism)")
        head = {"hidden": self._hidden[:, :-1], "labels": kwargs["labels"][:, 1:].detach(), "grads": {}}
        for name in ("log_probs", "entropy"):
            value = getattr(output, name, None)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                value.register_hook(lambda g, name=name: head["grads"].__setitem__(name, g.detach()))
        self._heads.append(head)

    def finish(self, chunk: int) -> RecordedStep:
        """The step's factors (call after TRL's backward); `chunk` rows at a time where the head's logits are
        needed (fluency here, the head's factors when sketching)."""
        if self.capture is None or len(self._heads) != 1:
            raise RuntimeError(
                f"expected one fused-head forward in TRL's loss pass, saw {len(self._heads)}; "
                "TRL's loss computation changed (see train/trl_surface.py)"
            )
        seen = self._heads[0]
        if "entropy" in seen["grads"]:
            raise RuntimeError("TRL's loss uses the head's entropy output; train-time capture covers log-probs only")
        grads = self.capture.finish()
        labels = seen["labels"]
        valid = labels != -100
        first = int(valid.any(0).float().argmax())  # positions before this score no token in any row
        upstream = seen["grads"].get("log_probs")
        names, weight, bias = self.capture.names, self.head.weight, self.head.bias
        logit_scale, softcap = fused_head_transform(self.model)
        head = HeadInputs(
            hidden=seen["hidden"][:, first:].float(),
            targets=labels[:, first:].clamp(min=0),
            upstream=upstream[:, first:].float() if upstream is not None else None,
            weight=weight.detach().float(),
            bias=bias.detach().float() if bias is not None else None,
            weight_name=names.get(id(weight)),
            bias_name=names.get(id(bias)) if bias is not None else None,
            temperature=self.temperature,
            logit_scale=logit_scale,
            softcap=softcap,
        )
        valid = valid[:, first:].float()
        everyone = torch.arange(grads.batch, device=valid.device)
        fluency = torch.cat([head.fluency(rows, valid[rows]) for rows in everyone.split(max(1, chunk))])
        inputs = self._inputs
        recorded = RecordedStep(
            grads, head, fluency, inputs[ROW_KEY], inputs["completion_ids"], inputs["completion_mask"]
        )
        self._reset()
        return recorded
