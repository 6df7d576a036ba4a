"""Per-example gradients of a batched loss, captured as factors in one forward and one backward pass.

For a loss that is a sum of per-example terms, the gradient of example i with respect to a weight
matrix used as `out = x @ W.T` is sum_t delta_it outer x_it, where x is the layer input and delta the
gradient at the layer output. Hooks keep both factors, so per-example weight gradients never have to
be materialized; a sketch map decides what to do with them. Embeddings are the same with one-hot
rows (the token ids). Every other trainable parameter (norm weights, biases) is small: its per-example
gradient is computed exactly, with torch.func's vjp of the owning module vectorized over examples.

Which rule a module gets (`rule_of`) depends on what its forward does, not only on its class: a Linear or
Embedding subclass with a forward of its own (Gemma's scaled embeddings, OPT's positions computed from the
attention mask) may not compute what the factors assume. transformers' Conv1D (GPT-2) is a Linear with its
weight stored [in, out]. An Embedding subclass with its own forward is captured at the `F.embedding` call
inside it, so its own scaling or id arithmetic is differentiated by autograd. Embeddings looked up with ids
shared by the whole batch (GPT-2's positions, [1, T]) are expanded to the batch, so that the gradient
reaching them is still per example. sketch/preflight.py checks the rules on a model before it trains.

Several backward passes over one forward (each with `retain_graph` but the last) yield one set of
per-example gradients each: call `next_backward` between them and `finish_all` after.

A capture-only pass freezes the parameters, so its backward propagates only to activations and skips the
batch weight gradients that nobody reads. Capture can also watch an ordinary training pass without freezing
anything (`freeze=False`): the hooks only read, and the backward fills `.grad` as it would without them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.overrides import TorchFunctionMode

# What `rule_of` answers: how a module's own trainable parameters are captured.
LINEAR, CONV1D, EMBEDDING, EMBEDDING_CALL, GENERIC = "linear", "conv1d", "embedding", "embedding_call", "generic"
# Rules that give a weight matrix's per-example gradient as factors (the sketch treats it as a matrix).
FACTORED_RULES = (LINEAR, CONV1D, EMBEDDING, EMBEDDING_CALL)


@cache
def _conv1d_class():
    """transformers' Conv1D (GPT-2 and its relatives), or None where transformers is not installed."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def rule_of(module: nn.Module) -> str:
    """How the per-example gradients of `module`'s own parameters are captured. The factored rules need the
    module's forward to be exactly the one they model; a subclass with its own forward gets the generic rule (an
    Embedding subclass: its F.embedding call), which differentiates whatever that forward does."""
    own = {name for name, _ in module.named_parameters(recurse=False)}
    kind = type(module)
    if isinstance(module, nn.Linear) and kind.forward is nn.Linear.forward:
        return LINEAR
    conv1d = _conv1d_class()
    if conv1d is not None and isinstance(module, conv1d) and kind.forward is conv1d.forward:
        return CONV1D
    if isinstance(module, nn.Embedding):
        if kind.forward is nn.Embedding.forward:
            return EMBEDDING
        if own == {"weight"}:
            return EMBEDDING_CALL
    return GENERIC


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
    """Each trainable parameter's kind ('matrix': a weight captured as factors, see `rule_of`; 'dense': anything
    else), and its shape; a matrix's gradient is [rows, columns] of its factors."""
    names = trainable_names(model)
    layout: dict[str, tuple[str, torch.Size]] = {}
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in names:
                continue
            matrix = pname == "weight" and rule_of(module) in FACTORED_RULES
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


class CaptureError(RuntimeError):
    """A module's use of its parameters does not fit the capture rule it got; its message names the module."""


class _EmbeddingCalls(TorchFunctionMode):
    """While an Embedding subclass with a forward of its own runs: hands each F.embedding lookup of its weight to
    `on_lookup(ids, output)`, which returns the output the forward goes on with."""

    def __init__(self, weight: torch.Tensor, on_lookup):
        super().__init__()
        self.weight, self.on_lookup = weight, on_lookup

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is F.embedding and len(args) > 1 and args[1] is self.weight:
            out = self.on_lookup(args[0], out)
        return out


class Capture:
    """Context manager: hooks the model so that a backward of a summed loss yields PerExampleGrads."""

    def __init__(self, model, freeze: bool = True):
        self.model, self.freeze = model, freeze
        self.names = trainable_names(model)
        self._handles = []
        self._saved_flags: list[tuple[nn.Parameter, bool]] = []
        self._generic: list[tuple[nn.Module, dict[str, str], tuple, list]] = []
        self._floats: dict[tuple, torch.Tensor] = {}  # layer inputs as float32, one copy per input
        self._batch: int | None = None  # rows of the model call being captured
        self._tokens: int | None = None  # its rows times its sequence length
        self.result: PerExampleGrads | None = None  # what the current backward pass fills
        self._earlier: list[PerExampleGrads] = []  # what earlier backward passes over the same forward filled

    def __enter__(self):
        self.result = PerExampleGrads(batch=0)
        self._earlier = []
        self._generic = []
        self._batch = self._tokens = None
        self._floats = {}
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
        for module in self.model.modules():
            own = {pn: self.names[id(p)] for pn, p in module.named_parameters(recurse=False) if id(p) in self.names}
            if not own:
                continue
            rule = rule_of(module)
            if rule == EMBEDDING_CALL:
                self._hook_embedding_calls(module, own)
                continue
            hook = {
                LINEAR: lambda own: self._matmul_hook(own, input_is_row_factor=False),
                # transformers' Conv1D: out = x @ W + b with W [in, out], so the input is the row factor.
                CONV1D: lambda own: self._matmul_hook(own, input_is_row_factor=True),
                EMBEDDING: self._embedding_hook,
                GENERIC: self._generic_hook,
            }[rule](own)
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

    def _on_model_call(self, module, args, kwargs) -> None:
        """The batch size and sequence length of the model call: every factor has one row per example, or one per
        token of the batch (batch-major, as layers that flatten [B, T, H] to [B * T, H] see it)."""
        for value in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), args[0] if args else None):
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                self._batch, self._tokens = value.shape[0], value.shape[0] * value.shape[1]
                return

    def _rows(self, module, x: torch.Tensor) -> int:
        """The batch size, checked against the rows of a module's input (per example or per token)."""
        batch = self._batch if self._batch is not None else x.shape[0]
        tokens = x.dim() == 2 and self._batch is not None and x.shape[0] == self._tokens
        if x.dim() < 2 or (x.shape[0] != batch and not tokens):
            raise CaptureError(
                f"{type(module).__name__} runs on an input of shape {tuple(x.shape)}: neither one row per example "
                f"nor one per token of the batch of {batch} (tokens regrouped, as mixture-of-experts layers do?), "
                "so its per-example gradients cannot be read off its input and output"
            )
        self.result.batch = batch
        return batch

    def _as_float(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """x as float32 [B, T, features], converted once for all the layers that read it (q, k and v; gate and
        up): in bf16 each conversion is a copy that would otherwise be kept once per layer."""
        key = (x.data_ptr(), x.shape, x.stride(), x.dtype)
        if key not in self._floats:
            self._floats[key] = x.float().reshape(batch, -1, x.shape[-1])
        return self._floats[key]

    def _grad_able(self, output: torch.Tensor) -> torch.Tensor:
        # With parameters frozen, the first layer's output is a fresh leaf; make the graph start there.
        if self.freeze and not output.requires_grad:
            output.requires_grad_(True)
        return output

    def _matmul_hook(self, own: dict[str, str], input_is_row_factor: bool):
        """A layer out = x W^T + b (nn.Linear: the output gradient is the row factor) or x W + b (Conv1D: the
        input is)."""

        def hook(module, args, output):
            x = args[0].detach()
            batch = self._rows(module, x)
            output = self._grad_able(output)

            def on_grad(g):
                g = g.detach().float().reshape(batch, -1, g.shape[-1])
                xs = self._as_float(x, batch)
                if "weight" in own:
                    pair = (Factor(xs), g) if input_is_row_factor else (Factor(g), xs)
                    self.result.matrix[own["weight"]].append(pair)
                if "bias" in own:
                    self.result.add_dense(own["bias"], g.sum(1))

            output.register_hook(on_grad)
            return output

        return hook

    def _lookup(self, module, name: str, ids: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """Hook one embedding lookup; ids shared by the whole batch ([1, T], as positions often are) are expanded
        to it first, so that the gradient reaching the lookup's output is per example."""
        ids = ids.detach()
        output = self._grad_able(output)
        batch = self._batch if self._batch is not None else ids.shape[0]
        if ids.dim() == 2 and ids.shape[0] == 1 and batch > 1:
            ids, output = ids.expand(batch, -1), output.expand(batch, *output.shape[1:])
        self._rows(module, ids)

        def on_grad(g):
            g = g.detach().float()
            if module.padding_idx is not None:  # torch never updates the padding row
                g = g * (ids != module.padding_idx).unsqueeze(-1)
            self.result.matrix[name].append((Factor(ids, is_index=True), g))

        output.register_hook(on_grad)
        return output

    def _embedding_hook(self, own: dict[str, str]):
        def hook(module, args, output):
            return self._lookup(module, own["weight"], args[0], output)

        return hook

    def _hook_embedding_calls(self, module, own: dict[str, str]) -> None:
        """An Embedding subclass with a forward of its own: capture the F.embedding lookup inside that forward."""
        mode = _EmbeddingCalls(module.weight, lambda ids, out: self._lookup(module, own["weight"], ids, out))

        def enter(mod, args):
            mode.__enter__()

        def leave(mod, args, output):
            mode.__exit__(None, None, None)

        self._handles.append(module.register_forward_pre_hook(enter))
        self._handles.append(module.register_forward_hook(leave))

    def _generic_hook(self, own: dict[str, str]):
        def hook(module, args, output):
            if not isinstance(output, torch.Tensor) or not args or not all(isinstance(a, torch.Tensor) for a in args):
                raise CaptureError(
                    f"per-example gradients: module {type(module).__name__} owns trainable parameters "
                    "but does not map tensors to one tensor; it needs its own capture rule"
                )
            for a in args:
                self._rows(module, a)
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
                    # Rows per token (a flattened [B * T, H] input): each example's gradient is its tokens' sum.
                    g = g.float().reshape(result.batch, -1, g[0].numel()).sum(1)
                    result.add_dense(own[pn], g)
        self._generic = []
        self._floats = {}
        return results
