"""Per-example gradients of a batched loss, captured as factors in one forward and one backward pass.

For a loss that is a sum of per-example terms, the gradient of example i with respect to a weight
matrix used as `out = x @ W.T` is sum_t delta_it outer x_it, where x is the layer input and delta the
gradient at the layer output. Hooks keep both factors, so per-example weight gradients never have to
be materialized; a sketch map decides what to do with them. Embeddings are the same with one-hot
rows (the token ids). Every other trainable parameter (norm weights, biases) is small: its per-example
gradient is computed exactly, with torch.func's vjp of the owning module vectorized over examples.

Several backward passes over one forward (each with `retain_graph` but the last) yield one set of
per-example gradients each: call `next_backward` between them and `finish_all` after.

A capture-only pass freezes the parameters, so its backward propagates only to activations and skips the
batch weight gradients that nobody reads. Capture can also watch an ordinary training pass without freezing
anything (`freeze=False`): the hooks only read, and the backward fills `.grad` as it would without them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, vjp, vmap


def trainable_names(model) -> dict[int, str]:
    """Parameter identity -> canonical name (tied weights appear once, under their first name)."""
    return {id(p): n for n, p in model.named_parameters() if p.requires_grad}


def accumulated_grads(model) -> dict[str, torch.Tensor]:
    """Each trainable parameter's .grad after an ordinary backward (zeros where it got none)."""
    return {
        n: (p.grad.detach() if p.grad is not None else torch.zeros_like(p))
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def param_layout(model) -> dict[str, tuple[str, torch.Size]]:
    """Each trainable parameter's kind ('matrix': a Linear or Embedding weight; 'dense': anything else)."""
    names = trainable_names(model)
    layout: dict[str, tuple[str, torch.Size]] = {}
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in names:
                continue
            matrix = pname == "weight" and isinstance(module, (nn.Linear, nn.Embedding))
            layout[names[id(p)]] = ("matrix" if matrix else "dense", p.shape)
    return {n: layout[n] for n in names.values()}


@dataclass
class Factor:
    """Per-example rows of a weight gradient: dense [B, T, R], or token ids [B, T] standing for one-hot rows."""

    values: torch.Tensor
    is_index: bool = False


@dataclass
class PerExampleGrads:
    """matrix[name]: list of (row factor, column factor [B, T, C]); the gradient is the sum of their products.
    dense[name]: per-example gradients [B, numel]."""

    batch: int
    matrix: dict[str, list[tuple[Factor, torch.Tensor]]] = field(default_factory=lambda: defaultdict(list))
    dense: dict[str, torch.Tensor] = field(default_factory=dict)

    def add_dense(self, name: str, grads: torch.Tensor) -> None:
        """Add per-example gradients [B, ...] of a parameter (summed over its uses)."""
        grads = grads.reshape(grads.shape[0], -1)
        self.dense[name] = self.dense[name] + grads if name in self.dense else grads

    def select(self, rows: torch.Tensor) -> PerExampleGrads:
        """The examples at `rows` only (a 1-d index), so that sketching skips examples known to be zero."""
        picked = PerExampleGrads(batch=len(rows))
        copies: dict[tuple, torch.Tensor] = {}

        def pick(t: torch.Tensor) -> torch.Tensor:
            # Layers that read the same input (q, k, v; gate, up) share one factor: copy it once.
            key = (t.data_ptr(), t.shape, t.stride(), t.dtype)
            if key not in copies:
                copies[key] = t[rows]
            return copies[key]

        for name, contribs in self.matrix.items():
            picked.matrix[name] = [(Factor(pick(r.values), r.is_index), pick(c)) for r, c in contribs]
        picked.dense = {name: g[rows] for name, g in self.dense.items()}
        return picked


class Capture:
    """Context manager: hooks the model so that a backward of a summed loss yields PerExampleGrads."""

    def __init__(self, model, freeze: bool = True):
        self.model, self.freeze = model, freeze
        self.names = trainable_names(model)
        self._handles = []
        self._saved_flags: list[tuple[nn.Parameter, bool]] = []
        self._generic: list[tuple[nn.Module, dict[str, str], tuple, list]] = []
        self.result: PerExampleGrads | None = None  # what the current backward pass fills
        self._earlier: list[PerExampleGrads] = []  # what earlier backward passes over the same forward filled

    def __enter__(self):
        self.result = PerExampleGrads(batch=0)
        self._earlier = []
        self._generic = []
        for module in self.model.modules():
            own = {pn: self.names[id(p)] for pn, p in module.named_parameters(recurse=False) if id(p) in self.names}
            if not own:
                continue
            if isinstance(module, nn.Linear):
                hook = self._linear_hook(own)
            elif isinstance(module, nn.Embedding):
                hook = self._embedding_hook(own)
            else:
                hook = self._generic_hook(own)
            self._handles.append(module.register_forward_hook(hook))
        if self.freeze:
            for p in self.model.parameters():
                self._saved_flags.append((p, p.requires_grad))
                p.requires_grad_(False)
        return self

    def __exit__(self, *exc):
        self._remove_hooks()
        for p, flag in self._saved_flags:
            p.requires_grad_(flag)
        self._saved_flags = []
        return False

    def _grad_able(self, output: torch.Tensor) -> torch.Tensor:
        # With parameters frozen, the first layer's output is a fresh leaf; make the graph start there.
        if self.freeze and not output.requires_grad:
            output.requires_grad_(True)
        return output

    def _linear_hook(self, own: dict[str, str]):
        def hook(module, args, output):
            x = args[0].detach()
            batch = x.shape[0]
            self.result.batch = batch
            output = self._grad_able(output)

            def on_grad(g):
                g = g.detach().float().reshape(batch, -1, g.shape[-1])
                xs = x.float().reshape(batch, -1, x.shape[-1])
                if "weight" in own:
                    self.result.matrix[own["weight"]].append((Factor(g), xs))
                if "bias" in own:
                    self.result.add_dense(own["bias"], g.sum(1))

            output.register_hook(on_grad)
            return output

        return hook

    def _embedding_hook(self, own: dict[str, str]):
        def hook(module, args, output):
            ids = args[0].detach()
            self.result.batch = ids.shape[0]
            output = self._grad_able(output)

            def on_grad(g):
                g = g.detach().float()
                if module.padding_idx is not None:  # torch never updates the padding row
                    g = g * (ids != module.padding_idx).unsqueeze(-1)
                self.result.matrix[own["weight"]].append((Factor(ids, is_index=True), g))

            output.register_hook(on_grad)
            return output

        return hook

    def _generic_hook(self, own: dict[str, str]):
        def hook(module, args, output):
            if not isinstance(output, torch.Tensor) or not all(isinstance(a, torch.Tensor) for a in args):
                raise TypeError(
                    f"per-example gradients: module {type(module).__name__} owns trainable parameters "
                    "but does not map tensors to one tensor; it needs its own capture rule"
                )
            output = self._grad_able(output)
            holder: list = []
            self._generic.append((module, own, tuple(a.detach() for a in args), holder))
            output.register_hook(lambda g: holder.append(g.detach()))
            return output

        return hook

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def next_backward(self) -> None:
        """Keep what the last backward pass gave; the next one fills a new set of per-example gradients."""
        self._earlier.append(self.result)
        self.result = PerExampleGrads(batch=self.result.batch)

    def finish(self) -> PerExampleGrads:
        """The per-example gradients of the one backward pass (call after it)."""
        (result,) = self.finish_all()
        return result

    def finish_all(self) -> list[PerExampleGrads]:
        """The per-example gradients of each backward pass, in order, the generic modules' own parameters
        included (call after the last)."""
        self._remove_hooks()  # the vjp below calls the modules again
        results = [*self._earlier, self.result]
        for module, own, args, holder in self._generic:
            if not holder:
                continue  # the module's output did not reach the loss
            if len(holder) != len(results):
                raise RuntimeError(
                    f"{type(module).__name__}: reached by {len(holder)} of {len(results)} backward passes"
                )
            pnames = list(own)
            params = tuple(getattr(module, pn).detach() for pn in pnames)

            def one(g, *xs, module=module, pnames=pnames, params=params):
                def f(*ps):
                    return functional_call(
                        module, dict(zip(pnames, ps, strict=False)), tuple(x.unsqueeze(0) for x in xs)
                    )

                _, pull = vjp(f, *params)
                return pull(g.unsqueeze(0))

            for result, output_grad in zip(results, holder, strict=True):
                grads = vmap(one)(output_grad, *args)
                for pn, g in zip(pnames, grads, strict=False):
                    result.add_dense(own[pn], g.float())
        self._generic = []
        return results
