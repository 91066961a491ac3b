"""Log-likelihoods of text under our members, as lm-evaluation-harness's `hf` model computes them.

`MemberScorer(member)` is an lm-eval `TemplateLM` over one `runtime.member.Member`: lm-eval's own
`TemplateLM.loglikelihood` tokenises each (context, continuation) pair (trailing spaces of the
context move to the continuation; the pair is encoded whole and split at the context's length; an
empty context is the prefix token), and `tok_encode`, `prefix_token_id`, `max_length`, the
left-truncation to `max_length + 1` tokens, the right-padded batches sorted longest first, the
log-softmax and the greedy flag (every continuation token is the argmax) follow `HFLM`'s code
(lm_eval 0.4.13, `lm_eval/models/huggingface.py`). `loglikelihood_rolling` uses lm-eval's rolling
windows (`get_rolling_token_windows` + `make_disjoint_window`, context length 1, prefixed by the
prefix token), as `HFLM` does. The forwards run on the member's own model (packed weights and all),
counted in its `counters`; `tests/test_lm_eval_model.py` pins the numbers against `HFLM` itself.

`mixture_loglikelihood(lls, weights)` is the ensemble's fusion (pure): the log of the weighted
mean of the members' probabilities of the same text, log(sum_i w_i exp(ll_i) / sum_i w_i).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import DEFAULT_MAX_LENGTH, Collator, has_bos_prefix, resolve_max_length

from runtime.lora_views import adapters_for
from runtime.member import Member

Pair = tuple[tuple[str, str] | None, list[int], list[int]]  # ((context, continuation) or None, ctx ids, cont ids)


def mixture_loglikelihood(lls: Sequence[float], weights: Sequence[float]) -> float:
    """log(sum_i w_i exp(ll_i) / sum_i w_i): the log-probability of one text under the weighted
    mixture of the members' distributions over whole texts (lls: one log-likelihood per member)."""
    if len(lls) != len(weights) or not lls:
        raise ValueError(f"need one weight per log-likelihood, got {len(weights)} for {len(lls)}")
    top = max(lls)
    if top == -math.inf:
        return -math.inf
    total = sum(weights)
    return top + math.log(sum(w * math.exp(ll - top) for ll, w in zip(lls, weights)) / total)


class MemberScorer(TemplateLM):
    """One member's `loglikelihood` / `loglikelihood_rolling`, HFLM's way (see the module docstring)."""

    def __init__(self, member: Member, batch_size: int = 1, max_length: int | None = None,
                 add_bos_token: bool | None = None):
        super().__init__()
        self.member = member
        self.tokenizer = member.tokenizer
        self.batch_size = max(int(batch_size), 1)
        self._max_length = max_length
        self.add_bos_token = add_bos_token

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        if self._max_length:
            return int(self._max_length)
        return resolve_max_length(self.member.model.config, self.tokenizer, default=DEFAULT_MAX_LENGTH)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """HFLM.tok_encode: the tokenizer's own special tokens unless told otherwise, none when the
        string already starts with the prefix (BOS) token."""
        if add_special_tokens is not None:
            special = {"add_special_tokens": add_special_tokens}
        elif self.add_bos_token is not None:
            special = {"add_special_tokens": self.add_bos_token}
        else:
            special = {}
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return list(self.tokenizer.encode(string, **special))

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests: list[Pair], disable_tqdm: bool = True, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probs, all of it greedy) per request, in request order."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        out: list[tuple[float, bool]] = []
        for chunk in order.get_batched(n=self.batch_size):
            out.extend(self._score_batch(chunk))
        return order.get_original(out)

    def _score_batch(self, chunk: Sequence[Pair]) -> list[tuple[float, bool]]:
        L = self.max_length
        if any(len(cont) > L for _, _, cont in chunk):
            raise ValueError(f"a continuation is longer than max_length={L} tokens (lm-eval's hf model refuses it too)")
        inps = [(ctx + cont)[-(L + 1):][:-1] for _, ctx, cont in chunk]
        width = max(len(i) for i in inps)
        batch = torch.zeros((len(inps), width), dtype=torch.long)
        for b, ids in enumerate(inps):  # right padding, as HFLM's pad_and_concat(padding_side="right")
            batch[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        model = self.member.model
        with adapters_for([(0, len(inps), getattr(self.member, "adapter", None))]):  # a view's LoRA adapter
            logprobs = F.log_softmax(model(batch.to(self.member.device)).logits, dim=-1)
        self.member.counters.count(batch.numel())
        res = []
        for (_, _, cont), ids, lp in zip(chunk, inps, logprobs):
            cont_lp = lp[len(ids) - len(cont): len(ids)]  # [len(cont), vocab]
            target = torch.tensor(cont, dtype=torch.long, device=cont_lp.device)
            greedy = bool((cont_lp.argmax(-1) == target).all())
            res.append((float(cont_lp.gather(1, target[:, None]).sum()), greedy))
        return res

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = True) -> list[float]:
        """The whole string's log-likelihood in disjoint rolling windows of `max_length` tokens."""
        windows: list[Pair] = []
        counts: list[int] = []
        for (string,) in [req.args for req in requests]:
            rolling = [lm_utils.make_disjoint_window(w) for w in lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            windows.extend((None, ctx, cont) for ctx, cont in rolling)
            counts.append(len(rolling))
        scores = [ll for ll, _ in self._loglikelihood_tokens(windows)]
        totals, start = [], 0
        for n in counts:
            totals.append(float(sum(scores[start: start + n])))
            start += n
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("MemberScorer only scores; generation is eval.lm_eval_model.AdafuseLM's")
