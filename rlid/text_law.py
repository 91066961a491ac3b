r"""The option law when the decision model answers with the action's own text (`answer: text`).

The prompt lists the menu without labels and asks for the move as written (the token-level policy's
prompt, `rlid.prompt.action_text`); the realisations R(a) of option a are its text written as is
and after a space, each followed by a stop token (EOS, or a newline). With p the model's law,

    log π(a) = log Σ_{w∈R(a)} p(w, stop | prompt) − log Σ_{a'} Σ_{w∈R(a')} p(w, stop | prompt),

every sequence scored in ONE forward over the prompt's cache: all realisations of all options form a
token trie (`text_forest`; shared prefixes fed once) under tree attention. Distinct option texts are
distinct strings, so their stopped sequences are disjoint events and the sum is a marginal of p.

Pure functions here (ids in, tensors out); `rlid.decision_model.DecisionModel` runs the forwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["TextForest", "text_realisations", "stop_token_ids", "text_forest", "text_option_log_probs"]


@dataclass(frozen=True)
class TextForest:
    """The trie of one menu's realisations: node i feeds `tokens[i]` below `parents[i]` (-1: a root,
    right after the prompt). Chain c (one realisation of option `option_of[c]`) is the path from a
    root to node `ends[c]`; `paths[c]` lists its nodes root first."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    option_of: tuple[int, ...]
    ends: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]


def text_realisations(tokenizer, actions: Sequence[str]) -> list[list[list[int]]]:
    """Per option, the distinct token sequences of its text as written and after one space (no
    special tokens). Raises `ValueError` for an empty text or two options with the same text."""
    if len(set(actions)) != len(actions):
        raise ValueError("two options of the menu have the same text; the text answer cannot tell them apart")
    out: list[list[list[int]]] = []
    for act in actions:
        variants: list[list[int]] = []
        for text in (act, " " + act):
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if ids and ids not in variants:
                variants.append(ids)
        if not variants:
            raise ValueError(f"option {act!r} has no tokens")
        out.append(variants)
    return out


def stop_token_ids(tokenizer, eos_token_ids: Sequence[int]) -> list[int]:
    """The tokens that end an answer: the member's EOS ids and the newline token (where "\\n" is one token)."""
    stops = [int(t) for t in eos_token_ids]
    nl = tokenizer("\n", add_special_tokens=False)["input_ids"]
    if len(nl) == 1 and nl[0] not in stops:
        stops.append(int(nl[0]))
    if not stops:
        raise ValueError("the tokenizer has no EOS and no newline token: a text answer cannot stop")
    return stops


def text_forest(realisations: Sequence[Sequence[Sequence[int]]]) -> TextForest:
    """The trie of all realisations (`text_realisations`), nodes in insertion order (parents first)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    option_of, ends, paths = [], [], []
    for a, variants in enumerate(realisations):
        for seq in variants:
            node, path = -1, []
            for tok in seq:
                key = (node, int(tok))
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(node)
                node = children[key]
                path.append(node)
            option_of.append(a)
            ends.append(node)
            paths.append(tuple(path))
    return TextForest(tuple(tokens), tuple(parents), tuple(option_of), tuple(ends), tuple(paths))


def text_option_log_probs(first_logits: torch.Tensor,   # [V] next-token logits after the prompt
                          node_logits: torch.Tensor,    # [N', V] logits at the forest's nodes (N' >= N)
                          forest: TextForest, n_options: int, stops: Sequence[int]) -> torch.Tensor:
    """log π over the menu: [n_options] float32 (see the module docstring). Node i's token is read
    from its parent's logits (the prompt's for a root); a chain's stop from its last node's logits."""
    n = len(forest.tokens)
    logits = torch.cat([first_logits[None], node_logits[:n]], dim=0).float()     # row 0: the prompt
    lse = torch.logsumexp(logits, dim=-1)                                        # [N+1]
    tok = torch.tensor(forest.tokens, dtype=torch.long, device=logits.device)
    prev = torch.tensor(forest.parents, dtype=torch.long, device=logits.device) + 1
    node_logp = logits[prev, tok] - lse[prev]                                    # [N]
    end_rows = torch.tensor(forest.ends, dtype=torch.long, device=logits.device) + 1
    stop_idx = torch.tensor(list(stops), dtype=torch.long, device=logits.device)
    stop_logp = torch.logsumexp(logits[end_rows][:, stop_idx], dim=-1) - lse[end_rows]   # [C]
    chain = torch.stack([node_logp[list(p)].sum() for p in forest.paths]) + stop_logp       # [C]
    option_of = torch.tensor(forest.option_of, dtype=torch.long, device=logits.device)
    scores = torch.stack([torch.logsumexp(chain[option_of == a], dim=0) for a in range(n_options)])
    return torch.log_softmax(scores, dim=-1)
