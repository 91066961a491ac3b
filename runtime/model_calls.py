"""The model calls behind every `runtime.kv_state.KVState` forward: one state's alone, or several
states of one model as one stacked forward (`runtime.stacked_forward`, for views that run together:
`runtime.forward_group`), each with its views' LoRA adapters on its rows (`runtime.lora_views`),
counted once per set of counters."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from runtime.counters import Counters, ModelRunner
from runtime.gqa_attention import valid_queries
from runtime.hf_compat import cache_kwargs
from runtime.logits_plan import LogitsPlan
from runtime.lora_views import adapters_for
from runtime.packed_linear import only_tokens
from runtime.stacked_forward import (
    StackedRequest,
    enable_segmented_attention,
    run_stacked,
)
from runtime.tree_mask import TreeInputs


def _call_model(member: ModelRunner, input_ids: torch.Tensor, attention_mask, position_ids: torch.Tensor, cache,
                logits_to_keep, valid: torch.Tensor, head: torch.Tensor, compact: bool) -> tuple[torch.Tensor, bool]:
    """`member.model(...)` on a cache inside `only_tokens(valid, head, compact)`: (logits, compacted)."""
    with only_tokens(valid, head, compact_head=compact) as run, valid_queries(valid):
        out = member.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=True, logits_to_keep=logits_to_keep, **cache_kwargs(member.model, cache))
    return out.logits, run.compacted


def execute_forwards(payloads: Sequence[tuple[Any, TreeInputs, LogitsPlan]]) -> list[tuple[torch.Tensor, bool]]:
    """Run the forwards of states of one model — alone, or several as one stacked forward
    (`runtime.stacked_forward`) — and count them: one forward, and every valid token, per set of
    counters (views of a model share theirs). Returns per state (logits, compacted) as its own call
    would."""
    member = payloads[0][0].member
    device = member.device
    outs: list[tuple[torch.Tensor, bool]] | None = None
    if len(payloads) > 1 and enable_segmented_attention(member.model):
        requests = [StackedRequest(s.cache, x, p) for s, x, p in payloads]
        rows, r0 = [], 0
        for s, x, _ in payloads:  # views with a LoRA adapter: theirs on their rows (`runtime.lora_views`)
            rows.append((r0, r0 + x.tokens.shape[0], s.member.adapter))
            r0 += x.tokens.shape[0]
        with adapters_for(rows):
            outs = run_stacked(member.model, requests, member.dtype, device,
                               lambda *args: _call_model(member, *args))
        counted: dict[int, tuple[Counters, int]] = {}
        for s, x, _ in payloads:
            c = s.member.counters
            counted[id(c)] = (c, counted.get(id(c), (c, 0))[1] + int(x.valid.sum()))
        for c, tokens in counted.values():
            c.count(tokens)
        return outs
    outs = []
    for s, x, plan in payloads:
        m = s.member
        with adapters_for([(0, x.tokens.shape[0], m.adapter)]):
            outs.append(_call_model(m, x.tokens.to(device), x.attention_mask(m.dtype, device),
                                    x.position_ids.to(device), s.cache, plan.logits_to_keep, x.valid.to(device),
                                    plan.head.to(device), plan.compact))
        m.counters.count(int(x.valid.sum()))
    return outs
