"""Which logits one forward computes, and reading them back (the LM head is the costly part of a
forward with a large vocabulary, so a forward asks only for what it needs).

Four modes, for B rows of N (padded) new tokens:

- "all":  every position: [B, N, V];
- "last": each row's last new token: [B, V];
- "at":   per row, given node indices: [B, K, V], row b's k-th = node at[b][k] (rows with fewer
          repeat their last);
- "none": nothing (the model still computes one position; `read` returns None).

A row that wants nothing (no node in "at", no new token in "last") gets filler logits, not to be
read. `LogitsPlan.make` gives the model's `logits_to_keep` (positions shared by all rows) and `head`
[B, K] bool, the (row, kept position) pairs actually wanted: a packed LM head
(`runtime.packed_linear.only_tokens`) computes only those and, for "at" / "last" (`compact`),
returns them compacted as [1, n, V] in row-major order. `read(logits, compacted)` gives the mode's
float32 tensor either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

MODES = ("all", "last", "at", "none")


@dataclass
class LogitsPlan:
    keep: str                              # one of MODES
    logits_to_keep: int | torch.Tensor     # the model's `logits_to_keep`
    head: torch.Tensor                     # [B, K] bool: wanted (row, kept position) pairs
    index: torch.Tensor | None = None      # "at": [B, width] kept column per output; "last": [B]

    @property
    def compact(self) -> bool:
        """Whether a packed LM head may return only the wanted positions."""
        return self.keep in ("at", "last")

    @classmethod
    def make(cls, keep: str, tokens: Sequence[Sequence[int]], valid: torch.Tensor,
             at: Sequence[Sequence[int]] | None = None, device=None) -> "LogitsPlan":
        """The plan of mode `keep` for rows `tokens` (padded to `valid` [B, N]); `at`: for "at",
        per row, the node indices wanted. Position tensors go to `device` (the model's)."""
        B = valid.shape[0]
        if keep == "all":
            return cls(keep, 0, valid)
        if keep == "at":
            want = sorted({int(i) for row in at for i in row}) or [0]
            col = {i: k for k, i in enumerate(want)}
            head = torch.zeros(B, len(want), dtype=torch.bool)
            for b, row in enumerate(at):
                head[b, [col[int(i)] for i in row]] = True
            width = max((len(row) for row in at), default=0) or 1
            index = torch.tensor([[col[int(row[min(k, len(row) - 1)])] if row else 0 for k in range(width)]
                                  for row in at], dtype=torch.long)
            return cls(keep, torch.tensor(want).to(device), head, index)
        if keep == "last":
            last_idx = torch.tensor([max(len(t) - 1, 0) for t in tokens])
            uniq = torch.unique(last_idx)
            where = torch.searchsorted(uniq, last_idx)
            head = torch.zeros(B, len(uniq), dtype=torch.bool)
            head[torch.arange(B), where] = valid.any(dim=1)
            return cls(keep, uniq.to(device), head, where)
        if keep == "none":
            return cls(keep, 1, torch.zeros(B, 1, dtype=torch.bool))
        raise ValueError(f"keep={keep!r} is invalid: one of {', '.join(MODES)}")

    def wanted(self) -> torch.Tensor | None:
        """Which positions of `read`'s output were asked for ([B, N] "all", [B] "last", [B, width]
        "at"; None for "none"): the others hold filler logits (padding, rows that want nothing)."""
        if self.keep == "all":
            return self.head
        if self.keep == "last":
            return self.head.any(dim=1)
        if self.keep == "at":
            return self.head.gather(1, self.index)
        return None

    def read(self, logits: torch.Tensor, compacted: bool) -> torch.Tensor | None:
        """The mode's float32 logits from the model's output (`compacted`: [1, n, V], the wanted
        pairs in row-major order, else [B, K, V])."""
        if self.keep == "none":
            return None
        if self.keep == "all":
            return logits.float()
        if compacted:
            where_in = torch.zeros(self.head.shape, dtype=torch.long)
            where_in[self.head] = torch.arange(int(self.head.sum()))
            logits = logits[0]
            if self.keep == "at":
                return logits[where_in.gather(1, self.index).to(logits.device)].float()
            rows = torch.arange(self.head.shape[0])
            return logits[where_in[rows, self.index].to(logits.device)].float()
        if self.keep == "at":
            idx = self.index.to(logits.device)
            return logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[-1])).float()
        rows = torch.arange(self.head.shape[0])
        return logits[rows, self.index.to(logits.device)].float()
