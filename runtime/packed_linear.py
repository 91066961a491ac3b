"""Linear layers with weights pre-packed for oneDNN (CPU; float32, and bfloat16 where the CPU computes
bfloat16 natively): the same function, faster GEMMs.

On a CPU, `torch.nn.functional.linear` with a few rows (a tree of draft tokens, a batch of candidate
words) goes through MKL's sgemm, which re-packs the whole weight matrix on every call: on a 2-core
AVX2 machine a 4-token forward of Qwen2.5-1.5B costs ~2.7x a 1-token forward. oneDNN's linear with
a weight reordered once into its blocked layout streams the weight a single time for 1-16 rows, so a
16-token forward costs ~2x a 1-token forward, and the 1-token forward itself gets faster.

`pack_linear_weights(model)` swaps every `nn.Linear` for a `PackedLinear` in place. Results agree
with `nn.Linear` to float32 rounding (a different summation order), exactly as two BLAS libraries do.
bfloat16 layers are packed only where the CPU has native bfloat16 dot products (`native_bf16()`:
AVX512-BF16 or AMX): there oneDNN's packed bfloat16 linear streams half the bytes of float32 and costs
about the same for 1 to 8 rows (2-core Xeon with AMX, 48 Qwen-0.5B MLP matrices: 27-29 ms for 1-8
rows vs 40-56 ms float32 packed); on other CPUs oneDNN emulates it and a packed bfloat16 layer would
be slower than `nn.Linear`.
A weight shared with another module (a tied LM head) stays referenced there; any other original
weight is released, so packing costs no extra memory except for tied heads.

Batch-invariant: a row's result does not depend on how many rows share the call. oneDNN's packed GEMM
computes every row with the same reduction order for 2 rows or 1,024 (checked, bfloat16 and float32,
1 and 2 threads, on a 2-core AMD EPYC with AVX512-BF16), but a single row takes another kernel (a GEMV)
whose sums round differently, so a lone row is computed as two (the same cost: one read of the weight).
`rows_independent` probes this once per dtype on the CPU at hand; where it does not hold, batch-invariant
mode (`runtime.gqa_attention.batch_invariant`) pads every call to a multiple of 16 rows instead.
`tests/test_packed_linear.py` checks a row's result against its row count.

`pack_frozen_linear_weights(model)`: the same for a model being fine-tuned (LoRA): its frozen layers are
packed and keep their plain weight for the input's gradient, so RL rollouts and the forward half of
every update run on packed weights.

`only_tokens(valid)`: inside this context, a packed layer whose input has the mask's leading shape
[B, N] multiplies only the True positions and writes zeros at the others. Batches of rows with
different numbers of new tokens (padded to the longest) then cost their real token count in every
linear layer, which is where a CPU forward over several tokens spends its time. With
`compact_head=True` the packed LM head returns only its wanted positions, [1, n, V] in row-major
order, instead of scattering them into zeros: with a 262k vocabulary the zero-filled [B, K, V]
tensor costs half as much as the head's matmul. The context's `HeadRun.compacted` says whether it did.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

# oneDNN picks its blocking for this many rows; 1..64 rows all run well with it (measured).
DEFAULT_BATCH_HINT = 16


# role -> (leading shape, flat indices of the rows to compute); roles: "body" (every layer but the
# LM head), "head" (the output embedding, marked at packing time)
class _ThreadState(threading.local):
    """`only_tokens`' state, one per thread: members on different devices run their forwards in
    threads of their own (`runtime.devices.run_by_device`), each inside its own `only_tokens`."""

    def __init__(self) -> None:
        self.subsets: dict[str, tuple[torch.Size, torch.Tensor]] = {}
        self.head_run = HeadRun()


def _as_subset(mask: torch.Tensor | None) -> tuple[torch.Size, torch.Tensor] | None:
    if mask is None or bool(mask.all()):
        return None
    return mask.shape, mask.reshape(-1).nonzero().squeeze(-1)


@dataclass
class HeadRun:
    """What the packed LM head did inside one `only_tokens` block."""

    compact: bool = False      # asked: return only the wanted positions
    compacted: bool = False    # done: the logits are [1, n_wanted, V]


_state = _ThreadState()


@contextlib.contextmanager
def only_tokens(valid: torch.Tensor, head: torch.Tensor | None = None, compact_head: bool = False) -> Iterator[HeadRun]:
    """Within the block, packed layers whose input has `valid`'s leading shape [B, N] compute only the
    True positions (zeros elsewhere); the packed LM head does the same with `head` ([B, K] bool over
    the positions the model keeps logits for), or with `compact_head` returns just those positions
    ([1, n, V], row-major; the yielded `HeadRun.compacted` is then True). All-True masks are no-ops.
    The state is per thread."""
    _subsets = _state.subsets
    previous = dict(_subsets)
    previous_run = _state.head_run
    _subsets.clear()
    for role, mask in (("body", valid), ("head", head)):
        subset = _as_subset(mask)
        if subset is not None:
            _subsets[role] = subset
    run = _state.head_run = HeadRun(compact=compact_head)
    try:
        yield run
    finally:
        _subsets.clear()
        _subsets.update(previous)
        _state.head_run = previous_run


def native_bf16() -> bool:
    """True when this CPU computes bfloat16 dot products natively (Linux: AVX512-BF16 or AMX-BF16)."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.lru_cache(maxsize=None)
def rows_independent(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed GEMM on this CPU computes a row alike for any number of rows >= 2 (probed
    once per dtype: a random 512 x 384 layer, rows 2 / 3 / 16 / 64 at a time; 1 and 2 threads)."""
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(384, 512, bias=False).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(512, 384, generator=gen))
    packed = PackedLinear(layer)
    x = torch.randn(64, 384, generator=gen).to(dtype)
    threads = torch.get_num_threads()
    try:
        ref = None
        for n_threads in {1, min(2, threads)}:
            torch.set_num_threads(n_threads)
            for m in (2, 3, 16, 64):
                out = torch.cat([torch.ops.mkldnn._linear_pointwise(x[i: i + m], packed.packed_weight, None, "none", [],
                                                                     "") for i in range(0, 64, m)])
                ref = out if ref is None else ref
                if not torch.equal(out, ref):
                    return False
        return True
    finally:
        torch.set_num_threads(threads)


def row_block(dtype: torch.dtype) -> int:
    """Packed GEMMs run a multiple of this many rows (padded): 1 where the CPU computes a row alike for
    any count >= 2 (`rows_independent`; a lone row still runs as two), else 16 under batch-invariant
    mode (`runtime.gqa_attention.batch_invariant`), every call then the same shape per 16 rows."""
    from runtime import gqa_attention

    if not gqa_attention.ENABLED or rows_independent(dtype):
        return 1
    return 16


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes `pack_linear_weights` packs on this machine."""
    return (torch.float32, torch.bfloat16) if native_bf16() else (torch.float32,)


def packing_available() -> bool:
    """True when this torch build has oneDNN's packed linear (CPU builds with MKLDNN)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class _FrozenPackedMatmul(torch.autograd.Function):
    """rows W^T + b through the packed weight; the gradient flows to the rows only (W and b frozen),
    through the kept plain W: d rows = d y W — what `nn.Linear`'s backward computes for its input."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, layer: "PackedLinear") -> torch.Tensor:
        ctx.layer = layer
        return layer._matmul(rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight = ctx.layer.frozen_weight
        return grad.to(weight.dtype).matmul(weight), None


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W reordered once for oneDNN. No gradient for W; a gradient for x only with
    `keep_weight=True` (then the plain W is kept beside the packed one)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = DEFAULT_BATCH_HINT, role: str = "body",
                 keep_weight: bool = False):
        super().__init__()
        self.role = role  # "head" for the LM head (see `only_tokens`)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.dtype = weight.dtype
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint),
                             persistent=False)
        # keep_weight: the plain weight stays for the input's gradient (a frozen layer inside a model
        # that trains other parameters, e.g. LoRA); None = inference only
        self.frozen_weight = weight if keep_weight else None
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def _matmul(self, rows: torch.Tensor) -> torch.Tensor:
        m = rows.shape[0]
        block = row_block(rows.dtype)
        if m % block or m < 2:  # rows padded to what makes a row's sums independent of the call: see above
            pad = max(2, -(-m // block) * block) - m
            rows = torch.cat([rows, rows[-1:].expand(pad, -1)])
            return torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")[:m]
        return torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        subset = _state.subsets.get(self.role)
        if subset is not None and x.shape[:-1] != subset[0]:
            subset = None
        if subset is not None:
            if subset[1].numel() == 0:
                return x.new_zeros(*x.shape[:-1], self.out_features)
            rows = rows.index_select(0, subset[1])
        if rows.dtype != self.dtype or not rows.is_contiguous():
            rows = rows.to(self.dtype).contiguous()
        if self.frozen_weight is not None and rows.requires_grad and torch.is_grad_enabled():
            y = _FrozenPackedMatmul.apply(rows, self)
        else:
            y = self._matmul(rows)
        if subset is not None and self.role == "head" and _state.head_run.compact:
            _state.head_run.compacted = True
            return y.reshape(1, -1, self.out_features)
        if subset is not None:
            y = y.new_zeros(x.shape[:-1].numel(), self.out_features).index_copy_(0, subset[1], y)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linear_weights(model: nn.Module, batch_hint: int = DEFAULT_BATCH_HINT) -> int:
    """Replace every float32 CPU `nn.Linear` in `model` by a `PackedLinear`, in place, and every
    bfloat16 one where the CPU computes bfloat16 natively (`packable_dtypes`).

    Returns how many layers were packed (0 when oneDNN is missing, or the model is not on the CPU in
    a packable dtype). Idempotent. Layers that are not plain `nn.Linear` (quantized, LoRA wrappers) are left alone.
    """
    return _pack(model, batch_hint, frozen_only=False)


def pack_frozen_linear_weights(model: nn.Module, batch_hint: int = DEFAULT_BATCH_HINT) -> int:
    """For a model that trains some parameters (LoRA): pack every packable plain `nn.Linear` whose
    weight and bias need no gradient (the base layers inside LoRA wrappers included), keeping the plain
    weight so gradients still flow through them to earlier layers. Same outputs and gradients to float
    rounding, faster forwards; the packed copy costs the layers' memory once more. Returns the count."""
    return _pack(model, batch_hint, frozen_only=True)


def _pack(model: nn.Module, batch_hint: int, frozen_only: bool) -> int:
    if not packing_available():
        return 0
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    dtypes = packable_dtypes()
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is nn.Linear and mod.weight.dtype in dtypes and mod.weight.device.type == "cpu"
               and not (frozen_only and any(p.requires_grad for p in mod.parameters()))]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, PackedLinear(mod, batch_hint, role="head" if mod is head else "body",
                                           keep_weight=frozen_only))
    return len(targets)


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
