r"""The option law: π over a menu from next-token logits, marginalised over each option's realisations.

Pure functions, tensors in, tensors out (no model, no state). With R(a) the token ids realising
option a (`rlid.menu.menu_realisations`, disjoint across options) and p = softmax(logits),

    log π(a) = log Σ_{r∈R(a)} p[r] − log Σ_{a'} Σ_{r∈R(a')} p[r]
             = logsumexp(logits[R(a)]) − logsumexp_{a'} logsumexp(logits[R(a')]),

since the vocabulary normaliser cancels. Computed in float32 whatever the logits' dtype.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["option_log_probs", "batched_option_log_probs", "unpad", "margin", "realisation_index"]


def realisation_index(realisations: Sequence[Sequence[Sequence[int]]], device=None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded gather indices for B menus: (index [B, N, R] long, token mask [B, N, R] bool,
    option mask [B, N] bool), N the largest menu, R the largest realisation set; padding index 0."""
    B = len(realisations)
    N = max(len(m) for m in realisations)
    R = max(len(r) for m in realisations for r in m)
    index = torch.zeros(B, N, R, dtype=torch.long)
    token_mask = torch.zeros(B, N, R, dtype=torch.bool)
    option_mask = torch.zeros(B, N, dtype=torch.bool)
    for b, menu in enumerate(realisations):
        for a, toks in enumerate(menu):
            if not toks:
                raise ValueError(f"state {b}, option {a}: empty realisation set (menu_realisations forbids it)")
            index[b, a, : len(toks)] = torch.tensor(list(toks), dtype=torch.long)
            token_mask[b, a, : len(toks)] = True
            option_mask[b, a] = True
    return index.to(device), token_mask.to(device), option_mask.to(device)


def batched_option_log_probs(logits: torch.Tensor,  # [B, V] next-token logits, one row per state
                             realisations: Sequence[Sequence[Sequence[int]]],  # [B][n_b][|R(a)|] token ids
                             ) -> torch.Tensor:
    """log π for B states with menus of different sizes: [B, N] float32, N = max n_b, entries past
    a state's menu are -inf. Gradients reach only the realisation logits (none flow through padding)."""
    index, token_mask, option_mask = realisation_index(realisations, logits.device)
    B, N, R = index.shape
    rows = logits.float().gather(1, index.view(B, N * R)).view(B, N, R)
    rows = rows.masked_fill(~token_mask & option_mask[..., None], float("-inf"))
    # padded options gather the (finite) logit at index 0 and are replaced by -inf after the
    # logsumexp, so no -inf - -inf appears in the backward pass
    scores = torch.logsumexp(rows, dim=-1)
    scores = torch.where(option_mask, scores, torch.full_like(scores, float("-inf")))
    return torch.log_softmax(scores, dim=-1)


def option_log_probs(logits: torch.Tensor,  # [V] next-token logits at the answer position
                     realisations: Sequence[Sequence[int]],  # [n][|R(a)|] token ids per option
                     ) -> torch.Tensor:
    """log π over one menu: [n] float32, logsumexp of each option's realisation logits, normalised
    over the menu (the vocabulary normaliser cancels)."""
    return batched_option_log_probs(logits[None], [realisations])[0]


def unpad(log_probs: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """Rows of a padded [B, N] law cut to each state's menu size: a list of [n_b] tensors."""
    return [log_probs[b, :n] for b, n in enumerate(sizes)]


def margin(log_probs: torch.Tensor) -> torch.Tensor:
    """Top-1 − top-2 probability over the last dim ([n] -> scalar, [B, N] padded with -inf -> [B]);
    1 where a menu has a single option. Detached: a gate statistic, not a training signal."""
    p = log_probs.detach().exp()
    if p.shape[-1] < 2:
        return torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
    top = torch.topk(p, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def pick(laws, greedy: bool, generator: torch.Generator | None = None) -> list[int]:
    """One menu index per `OptionLaw`: the argmax of π when `greedy`, else a sample from π drawn with
    `generator` (torch's global generator when None)."""
    if greedy:
        return [int(law.log_probs.detach().argmax()) for law in laws]
    return [int(torch.multinomial(law.probs.detach().float().cpu(), 1, generator=generator)) for law in laws]
