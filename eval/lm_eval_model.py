"""`--model adafuse` for lm-evaluation-harness: an AdaFuse ensemble or a (speculative) single member
as an lm-eval `LM`. Importing this module registers the name (lm-eval is an optional dependency:
`pip install 'adafuse[lm-eval]'`); lm-eval has no plug-in discovery for models, so
`python -m eval.lm_eval_cli` (or `adafuse-lm-eval`) imports it and then runs lm-eval's own CLI.

    --model_args members=smollm2-135m                                   # one member, plain decoding
    --model_args members=qwen2.5-coder-0.5b,drafter=lookup              # one speculative member
    --model_args members=smollm2-135m+gemma3-270m+qwen2.5-coder-0.5b,method=adafuse,lead=2,drafters=lookup+none+lookup
    --model_args members=qwen2.5-coder-1.5b+qwen2.5-coder-1.5b[chat=false]+qwen2.5-coder-1.5b[system=Be brief.],method=view-vote
    # also: weights=1+1+2, dtype=bfloat16, seed=0, max_length=N, and any method option (threshold=0.7, ...)

`+` separates list items (lm-eval's `,` separates arguments); members and drafters are what
`adafuse.Ensemble` takes (registry names, local folders, hub ids, views `name[k=v;k=v]` with `;`
between a view's keys; "none" for no drafter). lm-eval writes the few-shot prompt itself, so views
here differ in chat template, system prompt or LoRA adapter, not in exemplars.

- `generate_until`: requests grouped by their generation kwargs, in request order, `batch_size` at a
  time, through the same generator our harness uses (`eval.methods.build_generator`); `until` stop
  strings cut the text (EOS ends it too), `max_gen_toks` (default 256) bounds it; greedy unless
  `do_sample`/`temperature` ask for sampling (seeded `seed + doc_id` of a batch's first request).
  Contexts are not left-truncated (our harness does not truncate either).
- `loglikelihood` / `loglikelihood_rolling`: one member: exactly lm-eval's `hf` model
  (`eval.lm_eval_scoring.MemberScorer`). An ensemble: each member scores the same continuation text
  with its own tokenizer and the scores are fused as the weighted mixture of the members'
  probabilities, log(sum_i w_i p_i(text) / sum_i w_i) (`mixture_loglikelihood`); the fused greedy
  flag is True when the continuation is every member's greedy choice.
- Chat templates: without `--apply_chat_template` every member reads the plain few-shot text (as
  `hf` does). With it (and `--fewshot_as_multiturn`) the turns are kept and each member formats them
  itself, as our harness does: chat members through their template (the system turn stripped of
  surrounding whitespace, like `eval.task.Task.prompt`), base members the plain text rebuilt with
  the default delimiters (" " between question and answer, "\\n\\n" between shots).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry, register_model
from lm_eval.models.utils import normalize_gen_kwargs
from tqdm import tqdm

from runtime.errors import ConfigError
from runtime.loader import load
from runtime.prompts import ChatPrompt
from runtime.views import split_member_spec
from eval.lm_eval_scoring import MemberScorer, mixture_loglikelihood
from eval.methods import build_generator

log = logging.getLogger(__name__)
NEUTRAL_GEN_KWARGS = {"top_p": (1.0, None), "top_k": (0, None, -1), "num_beams": (1, None),
                      "repetition_penalty": (1.0, None)}


def split_list(value: Any) -> list[Any] | None:
    """'a+b+c' (or a list) -> ['a', 'b', 'c']; 'none'/'None' items -> None; None -> None."""
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else str(value).split("+")
    return [None if item is None or str(item).strip().lower() in ("", "none") else item for item in items]


@dataclass
class LMArgs:
    """`--model_args` of `--model adafuse`, parsed."""

    members: list[str]
    method: str
    lead: int = 0
    weights: list[float] | None = None
    drafters: list[str | None] | None = None
    dtype: str = "float32"
    seed: int = 0
    max_length: int | None = None
    batch_size: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, members: Any = None, method: str | None = None, lead: int = 0, weights: Any = None,
              drafters: Any = None, drafter: str | None = None, dtype: str = "float32", seed: int = 0,
              max_length: int | None = None, batch_size: Any = 1, max_batch_size: Any = None,
              device: Any = None, **options: Any) -> "LMArgs":
        names = [str(m) for m in split_list(members) or [] if m is not None]
        if not names:
            raise ConfigError("--model adafuse needs members=NAME[+NAME...] in --model_args "
                              "(e.g. members=smollm2-135m or members=smollm2-135m+gemma3-270m,method=adafuse)")
        for name in names:  # views: lm-eval builds the few-shot prompt itself, so a view cannot pick exemplars
            view = split_member_spec(name)[1]
            if view is not None and view.shots is not None:
                raise ConfigError(f"member {name}: lm-eval builds the few-shot prompt, so a view cannot choose its "
                                  f"exemplars (shots); use views of chat/system/adapter here, `adafuse eval` for shots")
        method = method or ("single" if len(names) == 1 else "adafuse")
        if device not in (None, "cpu"):
            log.info("--device %s: ignored, adafuse members run where runtime.loader places them (the CPU)", device)
        if drafter is not None and method != "single":
            raise ConfigError("drafter=NAME is for one member (method=single); an ensemble takes drafters=A+B+... "
                              "(one per member, none for no drafter)")
        try:
            weight_list = [float(w) for w in split_list(weights)] if weights is not None else None
        except (TypeError, ValueError):
            raise ConfigError(f"weights={weights!r} is invalid: give one number per member, e.g. weights=1+1+2") from None
        if drafter is not None:
            options["drafter"] = drafter
        return cls(names, method, int(lead), weight_list, split_list(drafters), str(dtype), int(seed),
                   int(max_length) if max_length else None, _batch_size(batch_size), options)

    def generator_options(self, chat: bool | None) -> dict[str, Any]:
        """What `eval.methods.build_generator` takes besides the method and the members."""
        if self.method == "single":
            return {"dtype": self.dtype, **self.options}
        extra = {"weights": self.weights} if self.weights is not None else {}
        if self.drafters is not None:
            extra["drafters"] = self.drafters
        return {"lead": self.lead, "dtype": self.dtype, "chat": chat, **extra, **self.options}


def _batch_size(value: Any) -> int:
    """lm-eval's batch size: an int, or 'auto' (taken as 1: our members batch their own rows)."""
    if value is None or str(value).startswith("auto"):
        return 1
    try:
        return max(int(value), 1)
    except ValueError:
        raise ConfigError(f"--batch_size {value!r} is invalid: a positive integer (or auto)") from None


@dataclass(frozen=True)
class GenSettings:
    """One request group's decoding settings, from lm-eval's generation kwargs."""

    until: tuple[str, ...]
    max_new_tokens: int
    temperature: float

    @classmethod
    def from_kwargs(cls, gen_kwargs: dict[str, Any], default_max: int = 256) -> "GenSettings":
        kw = normalize_gen_kwargs(dict(gen_kwargs), default_max)
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new, temperature = int(kw.pop("max_gen_toks")), float(kw.pop("temperature", 0.0) or 0.0)
        sample = kw.pop("do_sample", False)
        rest = sorted(k for k, v in kw.items() if v not in NEUTRAL_GEN_KWARGS.get(k, ()))
        if rest:
            raise ConfigError(f"generation kwargs {', '.join(rest)} are not supported by --model adafuse "
                              f"(it takes until, max_gen_toks, do_sample, temperature)")
        return cls(tuple(until), max_new, temperature if sample else 0.0)


def plain_text(messages: Sequence[dict[str, str]], target_delimiter: str = " ", fewshot_delimiter: str = "\n\n") -> str:
    """The plain few-shot text of chat turns, as lm-eval lays it out without a chat template:
    system text, then user/assistant pairs joined by `target_delimiter`, pairs by `fewshot_delimiter`."""
    system = "".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    parts, i = [], 0
    while i < len(turns):
        text = turns[i]["content"]
        if i + 1 < len(turns) and turns[i + 1]["role"] == "assistant":
            text, i = text + target_delimiter + turns[i + 1]["content"], i + 1
        parts.append(text)
        i += 1
    if system and not system[-1].isspace():
        system += fewshot_delimiter
    return system + fewshot_delimiter.join(parts)


def harness_turns(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The turns our harness gives chat members: the system turn stripped (dropped when empty)."""
    out = []
    for m in messages:
        content = m["content"].strip() if m["role"] == "system" else m["content"]
        if m["role"] != "system" or content:
            out.append({"role": m["role"], "content": content})
    return out


class _Req:
    """The part of an lm-eval `Instance` that `TemplateLM.loglikelihood` reads."""

    def __init__(self, *args: Any):
        self.args = args


class AdafuseLM(LM):
    """An ensemble or a single member as an lm-eval LM (see the module docstring)."""

    def __init__(self, **model_args: Any):
        super().__init__()
        self.spec = LMArgs.parse(**model_args)
        self.batch_size = self.spec.batch_size
        self._turns: dict[str, list[dict[str, str]]] = {}  # plain text -> its chat turns
        self._generator(None)  # load the members and check the method and its options now
        self.members = [load(name, dtype=self.spec.dtype) for name in self.spec.members]
        self.weights = self.spec.weights or [1.0] * len(self.members)
        self.scorers = [MemberScorer(m, self.batch_size, self.spec.max_length) for m in self.members]

    def _generator(self, chat: bool | None):
        return build_generator(self.spec.method, list(self.spec.members), **self.spec.generator_options(chat))

    # ---- generation --------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        args = [req.args for req in requests]
        out: list[str] = [""] * len(args)
        groups: dict[tuple[str, bool], list[int]] = {}
        for i, (context, gen_kwargs) in enumerate(args):
            key = (json.dumps(gen_kwargs, sort_keys=True, default=str), context in self._turns)
            groups.setdefault(key, []).append(i)
        bar = tqdm(total=len(args), disable=disable_tqdm or self.rank != 0, desc="adafuse generate_until")
        for (_, chat), idxs in groups.items():
            settings = GenSettings.from_kwargs(args[idxs[0]][1])
            for start in range(0, len(idxs), self.batch_size):
                batch = idxs[start: start + self.batch_size]
                texts = self._generate([self._prompt(args[i][0]) for i in batch], settings, chat,
                                       self.spec.seed + int(getattr(requests[batch[0]], "doc_id", None) or 0))
                for i, text in zip(batch, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", args[i], text)
                bar.update(len(batch))
        bar.close()
        return out

    def _generate(self, prompts: list[str], s: GenSettings, chat: bool, seed: int) -> list[str]:
        """Texts of one batch. Plain-text requests: every member reads the text as is (chat=False);
        chat requests: each member's default (its template if it has one)."""
        kwargs = dict(max_new_tokens=s.max_new_tokens, stop=list(s.until), temperature=s.temperature, seed=seed)
        if self.spec.method == "single":
            outs = self._generator(None).generate(prompts, chat=None if chat else False, **kwargs)
        else:
            outs = self._generator(None if chat else False).generate(prompts, **kwargs)
        return [o.text for o in outs]

    def _prompt(self, context: str) -> str:
        turns = self._turns.get(context)
        return ChatPrompt(context, turns) if turns is not None else context

    # ---- chat templates ----------------------------------------------------------------------
    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The plain text of the turns (what base members read); the turns are kept for the chat
        members, which format them with their own templates when the request runs."""
        if not add_generation_prompt:
            raise ConfigError("--model adafuse cannot continue an assistant turn under a chat template "
                              "(the task's gen_prefix); drop --apply_chat_template or the gen_prefix")
        text = plain_text(chat_history)
        self._turns[text] = harness_turns(chat_history)
        return text

    @property
    def tokenizer_name(self) -> str:
        return "+".join(m.tokenizer.name_or_path.replace("/", "__") for m in self.members)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if not chat_template:
            return None
        return "\n".join(str(m.tokenizer.chat_template or "") for m in self.members if m.use_chat_template)

    # ---- likelihoods -------------------------------------------------------------------------
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        per_member = []
        for member, scorer in zip(self.members, self.scorers):
            pairs = [_Req(self._context_for(member, ctx), cont) for ctx, cont in (r.args for r in requests)]
            per_member.append(scorer.loglikelihood(pairs, disable_tqdm=True))
        out = [(mixture_loglikelihood([s[i][0] for s in per_member], self.weights), all(s[i][1] for s in per_member))
               for i in range(len(requests))] if len(per_member) > 1 else per_member[0]
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        per_member = [scorer.loglikelihood_rolling(requests) for scorer in self.scorers]
        out = [mixture_loglikelihood([s[i] for s in per_member], self.weights) for i in range(len(requests))] \
            if len(per_member) > 1 else per_member[0]
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
        return out

    def _context_for(self, member, context: str) -> str:
        """The context as `member` reads it: chat turns through its template, else the text as is."""
        if not context or context not in self._turns:
            return context
        return member.format_prompt(self._prompt(context))

    def get_model_info(self) -> dict[str, Any]:
        return {"adafuse_method": self.spec.method, "adafuse_members": list(self.spec.members),
                "adafuse_lead": self.spec.lead, "adafuse_weights": self.weights}


if model_registry.get("adafuse", None) is None:  # once per process, even if this module is imported again
    register_model("adafuse")(AdafuseLM)
