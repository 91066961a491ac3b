"""`Member`: a causal LM + its tokenizer, the unit every generation path drives.

- text <-> ids: `format_prompt` (chat template or raw text; a `ChatPrompt` gives its exemplars as
  turns), `encode`, `encode_prompt` (BOS exactly once), `decode`; `eos_token_ids` (EOS and, under
  a chat template, the end-of-turn tokens `END_OF_TURN_TOKENS`);
- `start(prompt_ids)` prefills a `runtime.kv_state.KVState` for a batch of prompts, full prompt
  chunks from the member's `PrefixCache` (`runtime.prefix_cache`), the rest in one batched forward;
- `generate(prompts, ...)` plain batched decoding (row i seeded `seed + i`), ending rows on EOS, the
  earliest stop string or `max_new_tokens` (`runtime.finish.FinishRule`);
- `counters` count every forward and token fed, for `runtime.outputs.CostMeter`.

`load_member(name_or_path, dtype, device)` loads a registry name, local folder or hub id (packed
CPU weights and grouped-query attention where they apply); `runtime.loader` resolves every other
kind of member spec and caches loaded members.
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.counters import Counters
from runtime.errors import ConfigError
from runtime.forward_group import solo
from runtime.kv_state import KVState
from runtime.finish import FinishRule
from runtime.outputs import Cost, CostMeter, GenerationOutput, batch_outputs
from runtime.prefix_cache import ChunkKV, PrefixCache, chunk_of
from runtime.prompts import view_prompt
from runtime.sampling import SamplingParams, sample
from runtime.stopping import StopStrings

__all__ = ["END_OF_TURN_TOKENS", "Counters", "Member", "load_member", "make_generators",
           "resolve_dtype"]

END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>")
# the end of a document: ends a row in raw-text prompts too (a raw prompt's continuation past it is a
# new, unrelated document; Qwen's generation config names only <|im_end|>)
END_OF_TEXT_TOKENS = ("<|endoftext|>",)


class Member:
    """A causal LM + its tokenizer. Accepts any `AutoModelForCausalLM` and tokenizer.
    `prefix_chunk`: prompt prefixes are prefilled and cached in chunks of this many tokens (0: off)."""

    prefix_chunk: int = 64

    def __init__(self, model, tokenizer, name: str | None = None, use_chat_template: bool | None = None,
                 system_prompt: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.system_prompt = system_prompt
        self.view = None  # a `runtime.views.ViewSpec` on a view of a model (`runtime.views.make_view`)
        self.adapter = None  # a view's LoRA adapter (`runtime.lora_views.LoraWeights`), run on the shared weights
        self.model_name = self.name  # what costs are counted under (views: their model's name)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = has_template if use_chat_template is None else (use_chat_template and has_template)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.layer_types = list(getattr(cfg, "layer_types", None) or [])
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.has_sliding = "sliding_attention" in self.layer_types and bool(self.sliding_window)
        self.max_context = getattr(cfg, "max_position_embeddings", None)  # positions the model was built for
        head = model.get_output_embeddings()
        self.vocab_size = int(getattr(head, "out_features", None) or head.weight.shape[0])
        self.eos_token_ids = self._find_eos_ids()
        self.counters = Counters()
        self.prefix_cache = PrefixCache()

    # ---- properties ------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def num_parameters(self) -> int:
        """Numbers in its weights: parameters and buffers (packed CPU weights are buffers)."""
        return sum(t.numel() for t in (*self.model.parameters(), *self.model.buffers()))

    def __repr__(self) -> str:
        return f"Member({self.name!r}, vocab={self.vocab_size}, dtype={self.dtype}, chat={self.use_chat_template})"

    def _find_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in END_OF_TEXT_TOKENS if t in vocab)
        if self.use_chat_template:
            ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
        return ids

    # ---- text <-> ids ----------------------------------------------------------------------
    def format_prompt(self, text: str, chat: bool | None = None) -> str:
        """The prompt as this member sees it: its chat template around `text` (when it has one and
        `chat` is not False), else `text` unchanged. A `ChatPrompt` gives its exemplars as turns."""
        use_chat = self.use_chat_template if chat is None else (chat and self.use_chat_template)
        text = view_prompt(text, self.view, use_chat)
        if not use_chat:
            return str(text)
        turns = getattr(text, "messages", None)  # runtime.prompts.ChatPrompt: exemplars as turns
        messages = list(turns) if turns else [{"role": "user", "content": str(text)}]
        if self.system_prompt and messages[0]["role"] != "system":  # (a prompt's own system turn wins)
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_prompt(self, text: str, chat: bool | None = None) -> list[int]:
        """Format (chat template or raw) and encode, with BOS exactly once when the tokenizer uses one."""
        formatted = self.format_prompt(text, chat)
        bos = self.tokenizer.bos_token
        return self.encode(formatted, add_special_tokens=not (bos and formatted.startswith(bos)))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ---- state -----------------------------------------------------------------------------
    def start(self, prompts_ids: Sequence[Sequence[int]], room: int = 0) -> "KVState":
        """Prefill a KV state for a batch of prompts: full `prefix_chunk` chunks from the
        `prefix_cache` (computed on a miss), the rest of every prompt in one batched forward. A prompt
        without tokens, one that fills the model's whole context, or one that leaves less than `room`
        positions (the new tokens the caller may add) is a one-line ConfigError, before any forward."""
        for i, p in enumerate(prompts_ids):
            if not len(p):
                raise ConfigError(f"prompt #{i + 1} gives member '{self.name}' no tokens; give a non-empty prompt")
            if self.max_context and len(p) >= self.max_context:
                raise ConfigError(f"prompt #{i + 1} is {len(p)} tokens long, but member '{self.name}' has a context of "
                                  f"{self.max_context} tokens; shorten it (e.g. fewer few-shot exemplars: num_fewshot)")
            if self.max_context and len(p) + room > self.max_context:
                raise ConfigError(f"prompt #{i + 1} is {len(p)} tokens long and asks for up to {room} new tokens, but "
                                  f"member '{self.name}' has a context of {self.max_context} tokens; lower max_new_tokens "
                                  f"to {self.max_context - len(p)} or shorten the prompt")
        state = KVState(self, batch_size=len(prompts_ids))
        C = int(self.prefix_chunk or 0)
        n_chunks = [max(len(p) - 1, 0) // C if C > 0 else 0 for p in prompts_ids]
        if any(n_chunks):
            state.load_prefix([list(p[: n * C]) for p, n in zip(prompts_ids, n_chunks)],
                              [self.prefix_chunks(p, n) for p, n in zip(prompts_ids, n_chunks)])
        state.append([list(p[n * C:]) for p, n in zip(prompts_ids, n_chunks)], return_logits=False)
        return state

    @torch.no_grad()
    def prefix_chunks(self, ids: Sequence[int], n_chunks: int) -> list[ChunkKV]:
        """The KV of the first `n_chunks` chunks of `ids`, from the cache or computed (one batch-1
        forward per missing chunk, after the chunks before it; alone even inside
        `runtime.forward_group.run_together`, so a chunk never depends on a batch)."""
        C = int(self.prefix_chunk)
        out: list[ChunkKV] = []
        work: KVState | None = None  # a batch-1 state holding chunks 0..c-1 once a chunk is missing
        with solo():
            for c in range(n_chunks):
                key = tuple(ids[: (c + 1) * C])
                kv = self.prefix_cache.get(key)
                chunk = list(ids[c * C: (c + 1) * C])
                if kv is None:
                    if work is None:
                        work = KVState(self, batch_size=1)
                        if out:
                            work.load_prefix([list(ids[: c * C])], [out])
                    first = work.extend_without_logits([chunk])
                    kv = chunk_of(work.cache, first, C)
                    self.prefix_cache.put(key, kv)
                elif work is not None:
                    work.load_prefix([chunk], [[kv]])
                out.append(kv)
        return out

    def cost_since(self, snapshot: tuple[int, int], wall_time_s: float = 0.0) -> Cost:
        cost = Cost(wall_time_s=wall_time_s)
        cost.add(self.name, self.counters.forward_passes - snapshot[0], self.counters.tokens_processed - snapshot[1])
        return cost

    # ---- plain decoding --------------------------------------------------------------------
    @torch.no_grad()
    def decode_plain(self, state: "KVState", max_new_tokens: int, stop: Sequence[str] | StopStrings = (),
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     generators: list[torch.Generator] | None = None, logprobs: list[float] | None = None,
                     rule: FinishRule | None = None) -> tuple[list[str], list[str], list[list[int]]]:
        """Plain decoding of every row of an existing `state` until each row finishes (EOS, a stop
        string, `max_new_tokens`): (texts, finish reasons, new token ids). Row r samples from
        `generators[r]` when given. The state holds every new token but each row's last.
        `logprobs` (one float per row) accumulates each row's new tokens' log-probabilities under
        the model's own (untempered) distribution. Rows finish by `rule` (default: a
        `runtime.finish.FinishRule` of `stop` and `max_new_tokens`; pass one to read which stop
        string each row met)."""
        rows = state.batch_size
        rule = rule or FinishRule(self, rows, stop, max_new_tokens)
        new_ids: list[list[int]] = [[] for _ in range(rows)]
        while not rule.done:
            probs = state.next_probs(temperature, top_k, top_p)
            tokens = probs.argmax(-1) if temperature == 0 else sample(probs, generators)
            if logprobs is not None:
                lp = torch.log_softmax(state.last_logits.float(), dim=-1).gather(1, tokens[:, None].to(
                    state.last_logits.device))[:, 0].tolist()
                for b in range(rows):
                    if rule.reasons[b] is None:
                        logprobs[b] += lp[b]
            feed: list[list[int]] = []
            for b, tok in enumerate(tokens.tolist()):
                if rule.reasons[b] is not None:
                    feed.append([])
                    continue
                new_ids[b].append(tok)
                feed.append([] if rule.after_tokens(b, new_ids[b]) is not None else [tok])
            if any(feed):
                state.append(feed, return_logits=False)
        return list(rule.texts), list(rule.reasons), new_ids

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        chat: bool | None = None,
        logprobs: bool = False,
    ) -> list[GenerationOutput]:
        """Plain batched decoding with this member's KV cache. Row i samples from its own generator
        seeded `seed + i`, so a batched call equals per-row calls. Text excludes the stop string.
        `logprobs`: each output's stats get "logprob", the summed log-probability of its new tokens
        under the model's own (untempered) distribution (`decode_plain`)."""
        meter = CostMeter([self])
        prompt_ids = [self.encode_prompt(p, chat) for p in prompts]
        gens = make_generators(len(prompts), seed, self.device)
        state = self.start(prompt_ids, room=max_new_tokens)
        sums = [0.0] * len(prompts) if logprobs else None
        texts, finish, new_ids = self.decode_plain(state, max_new_tokens, stop, temperature, top_k, top_p, gens,
                                                   logprobs=sums)
        stats = None if sums is None else [{"logprob": round(x, 4)} for x in sums]
        return batch_outputs(meter.cost(), texts, [len(ids) for ids in new_ids], finish, stats=stats)


def make_generators(n: int, seed: int | None, device) -> list[torch.Generator] | None:
    """One generator per row, seeded `seed + row` (None without a seed): `SamplingParams.generators`."""
    return SamplingParams(seed=seed).generators(n, device)


def load_member(name_or_path: str, dtype: str | torch.dtype = "float32", device: str = "cpu",
                use_chat_template: bool | None = None, check_memory: bool = True,
                pack_weights: bool | None = None) -> Member:
    """Load a registry name, local folder or hub id as a `Member` (no network for registry names).

    `pack_weights` (default: on on CPU for float32, and for bfloat16 where the CPU has native
    bfloat16, `packed_linear.native_bf16`) swaps the Linear layers for oneDNN-packed ones
    (`runtime.packed_linear`): same outputs to float32 rounding, 1.2-3x faster multi-token forwards;
    packed layers also skip the padding of rows with fewer new tokens. On CPU, `sdpa` attention keeps
    grouped K/V heads grouped under our tree masks (`runtime.gqa_attention`; identical outputs)."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime import registry

    if name_or_path in registry.REGISTRY:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    display, where = registry.resolve(name_or_path)
    spread = device == "auto"                      # device_map="auto": split over accelerators, then CPU
    device = ("cuda" if torch.cuda.is_available() else "cpu") if spread else device
    torch_dtype = resolve_dtype(dtype, device)
    if torch_dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        note_emulated_bf16()
    if check_memory:
        registry.check_memory([name_or_path], str(torch_dtype).replace("torch.", ""))
    tok = AutoTokenizer.from_pretrained(str(where))
    with _load_progress(display, torch_dtype):
        if spread:
            model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch_dtype, device_map="auto")
            device = str(next(model.parameters()).device)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch_dtype).to(device)
    if pack_weights is None and spread:
        pack_weights = False                       # accelerate's dispatch hooks sit on those layers
    if pack_weights is None:
        from runtime.packed_linear import packable_dtypes

        pack_weights = torch.device(device).type == "cpu" and torch_dtype in packable_dtypes()
    if pack_weights:
        from runtime.packed_linear import pack_linear_weights

        pack_linear_weights(model)
    if torch.device(device).type == "cpu":
        from runtime.gqa_attention import use_gqa_sdpa

        use_gqa_sdpa(model)
    return Member(model, tok, name=display, use_chat_template=use_chat_template)


_NOTED_BF16 = False


def _load_progress(name: str, dtype: torch.dtype):
    """transformers' weight-loading bar on a terminal; in a log (stderr not a terminal) one line per
    load instead of hundreds of carriage-return frames."""
    import contextlib
    import sys

    if sys.stderr.isatty():
        return contextlib.nullcontext()
    from transformers.utils import logging as hf_logging

    @contextlib.contextmanager
    def quiet():
        was_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        print(f"loading {name} ({str(dtype).replace('torch.', '')})", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            if was_on:
                hf_logging.enable_progress_bar()
    return quiet()


def note_emulated_bf16() -> bool:
    """Say once per process, on stderr, when bfloat16 runs on a CPU that emulates it (no AVX512-BF16 / AMX):
    there prompts, menu scores and training steps run several times slower than in float32
    (`benchmarks/dtype_rows.py`: 9x at 256 rows on an AVX2 EPYC). True when it said so."""
    import sys

    from runtime.packed_linear import native_bf16

    global _NOTED_BF16
    if _NOTED_BF16 or native_bf16():
        return False
    _NOTED_BF16 = True
    print("note: bfloat16 is emulated on this CPU (no AVX512-BF16 / AMX): prompts and training steps run "
          "several times slower than in float32 here; dtype auto picks the fast one (adafuse models dtype)",
          file=sys.stderr, flush=True)
    return True


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """A torch dtype from its name; "auto": the fast one on `device`, measured on this CPU
    (`runtime.dtype_choice.fastest_dtype`, cached per CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        from runtime.dtype_choice import fastest_dtype

        return resolve_dtype(fastest_dtype(device).dtype)
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"unknown dtype '{dtype}'; use one of: auto, float32, bfloat16, float16")
    return table[dtype]
