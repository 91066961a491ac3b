"""The member runtime both subsystems drive: a causal LM + tokenizer + a KV cache for a batch of rows.

`Member` holds the model and tokenizer. `member.start(prompt_ids)` prefills a `KVState`, which then
supports:

- `append(tokens)`            commit tokens to each row (one forward), returns their logits;
- `next_probs(...)`           next-token distribution after warping (temperature / top-k / top-p);
- `forward_tree(tokens, parents)` + `accept(paths)`  score a token tree in one forward (tree mask,
                               per-node positions) and keep only the accepted path; with
                               `extend=True` a later forward grows the open tree by new nodes only;
- `score(continuations)`      log-probs of several continuations per row in one forward, no commit;
- `rollback(lengths)`         shorten rows.

Prompt prefill reuses work across rows and calls (`PrefixCache`): every full chunk of
`Member.prefix_chunk` tokens of a prompt (all but a last partial chunk) is looked up by the prompt's
ids up to its end, and computed on a miss by one batch-1 forward of exactly that chunk after the
earlier ones; only the rest of each prompt goes through the batched forward. k-shot prompts share
their exemplars, so an evaluation prefills them once. A chunk is always computed the same way, so a
prompt's chunk KV does not depend on the batch it is in or on the prompts before it.

Rows may have different lengths. The cache is a slot array shared by all rows; `slot_pos[b, j]` is
the position id of slot j in row b, or -1 when the slot is free (padding, rejected tree nodes,
rolled-back tokens). Every forward builds its own 4-D mask from `slot_pos`, so holes cost a little
attention but never change results. Sliding-window layers (Gemma 3) get their own mask.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from runtime.outputs import Cost, GenerationOutput, split_batch_cost
from runtime.sampling import logits_to_probs, sample
from runtime.packed_linear import only_tokens

_END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>")


@dataclass
class Counters:
    """Running totals of model work for one member."""

    forward_passes: int = 0
    tokens_processed: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.forward_passes, self.tokens_processed


# per layer (keys, values) of one chunk of one prompt prefix, [1, heads, chunk, head_dim] (None for a
# layer that keeps no cache of its own)
ChunkKV = list[tuple[torch.Tensor, torch.Tensor] | None]


@dataclass
class _TreeBlock:
    """The logits of one forward of an open tree: row b's node n (tree-wide index) is column
    `cols[b][n]` of `logits` [B, K, V]."""

    logits: torch.Tensor
    cols: list[dict[int, int]]


@dataclass
class _OpenTree:
    """A token tree fed by `forward_tree` (and grown by `forward_tree(..., extend=True)`), not yet
    accepted. Nodes are numbered per row in the order they were fed."""

    first: int                      # the tree's first slot
    tokens: list[list[int]]         # per row, each node's token
    parents: list[list[int]]        # per row, each node's parent node (-1: the last committed token)
    slots: list[list[int]]          # per row, each node's slot - first
    blocks: list[_TreeBlock]
    serial: int                     # tells trees apart (`KVState.open_tree_serial`)

    def lineage(self, b: int, node: int) -> list[int]:
        """`node` and its ancestors in row b."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[b][node]
        return out

    def logits_of(self, b: int, node: int) -> torch.Tensor | None:
        for block in self.blocks:
            col = block.cols[b].get(node)
            if col is not None:
                return block.logits[b, col]
        return None


class PrefixCache:
    """LRU map: prompt ids up to a chunk's end -> that chunk's `ChunkKV`. Memory: `max_chunks`
    chunks of K/V, e.g. ~200 MB for qwen2.5-coder-0.5b and ~470 MB for the 1.5B at 128 x 64 tokens."""

    def __init__(self, max_chunks: int = 128):
        self.max_chunks = max_chunks
        self._chunks: OrderedDict[tuple[int, ...], ChunkKV] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def get(self, key: tuple[int, ...]) -> ChunkKV | None:
        kv = self._chunks.get(key)
        if kv is None:
            self.misses += 1
            return None
        self.hits += 1
        self._chunks.move_to_end(key)
        return kv

    def put(self, key: tuple[int, ...], kv: ChunkKV) -> None:
        self._chunks[key] = kv
        self._chunks.move_to_end(key)
        while len(self._chunks) > self.max_chunks:
            self._chunks.popitem(last=False)

    def clear(self) -> None:
        self._chunks.clear()


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
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = has_template if use_chat_template is None else (use_chat_template and has_template)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.layer_types = list(getattr(cfg, "layer_types", None) or [])
        self.sliding_window = getattr(cfg, "sliding_window", None)
        self.has_sliding = "sliding_attention" in self.layer_types and bool(self.sliding_window)
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
        if self.use_chat_template:
            vocab = self.tokenizer.get_vocab()
            ids.update(vocab[t] for t in _END_OF_TURN_TOKENS if t in vocab)
        return ids

    # ---- text <-> ids ----------------------------------------------------------------------
    def format_prompt(self, text: str, chat: bool | None = None) -> str:
        """The prompt as this member sees it: its chat template around `text` (when it has one and
        `chat` is not False), else `text` unchanged. A `ChatPrompt` gives its exemplars as turns."""
        use_chat = self.use_chat_template if chat is None else (chat and self.use_chat_template)
        if not use_chat:
            return str(text)
        turns = getattr(text, "messages", None)  # runtime.prompts.ChatPrompt: exemplars as turns
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages += turns if turns else [{"role": "user", "content": str(text)}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_prompt(self, text: str, chat: bool | None = None) -> list[int]:
        """Format (chat template or raw) and encode, with BOS exactly once when the tokenizer uses one."""
        formatted = self.format_prompt(text, chat)
        bos = self.tokenizer.bos_token
        ids = self.encode(formatted, add_special_tokens=not (bos and formatted.startswith(bos)))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ---- state -----------------------------------------------------------------------------
    def start(self, prompts_ids: Sequence[Sequence[int]]) -> "KVState":
        """Prefill a KV state for a batch of prompts: full `prefix_chunk` chunks from the
        `prefix_cache` (computed on a miss), the rest of every prompt in one batched forward."""
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
        forward per missing chunk, after the chunks before it)."""
        C = int(self.prefix_chunk)
        out: list[ChunkKV] = []
        work: KVState | None = None  # a batch-1 state holding chunks 0..c-1 once a chunk is missing
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
                kv = [None if layer.keys is None or layer.keys.numel() == 0 else
                      (layer.keys[:, :, first: first + C].clone(), layer.values[:, :, first: first + C].clone())
                      for layer in work.cache.layers]
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
    ) -> list[GenerationOutput]:
        """Plain batched decoding with this member's KV cache. Row i samples from its own generator
        seeded `seed + i`, so a batched call equals per-row calls. Text excludes the stop string."""
        t0 = time.perf_counter()
        snap = self.counters.snapshot()
        stop = [s for s in (stop or []) if s]
        prompt_ids = [self.encode_prompt(p, chat) for p in prompts]
        gens = make_generators(len(prompts), seed, self.device)
        state = self.start(prompt_ids)
        new_ids: list[list[int]] = [[] for _ in prompts]
        texts = ["" for _ in prompts]
        finish = [None] * len(prompts)
        while any(f is None for f in finish):
            probs = state.next_probs(temperature, top_k, top_p)
            tokens = probs.argmax(-1) if temperature == 0 else sample(probs, gens)
            feed: list[list[int]] = []
            for b, tok in enumerate(tokens.tolist()):
                if finish[b] is not None:
                    feed.append([])
                    continue
                new_ids[b].append(tok)
                finish[b], texts[b] = check_finished(self, new_ids[b], stop, max_new_tokens)
                feed.append([] if finish[b] is not None else [tok])
            if any(feed):
                state.append(feed, return_logits=False)
        wall = time.perf_counter() - t0
        outs = []
        for b in range(len(prompts)):
            cost = self.cost_since(snap, wall) if b == 0 else Cost(wall_time_s=0.0)
            outs.append(GenerationOutput(texts[b], len(new_ids[b]), finish[b], cost))
        # the batch shares one cost; split it evenly so per-example figures add up
        return split_batch_cost(outs)


def make_generators(n: int, seed: int | None, device) -> list[torch.Generator] | None:
    if seed is None:
        return None
    gens = []
    for i in range(n):
        g = torch.Generator(device=device)
        g.manual_seed(int(seed) + i)
        gens.append(g)
    return gens


def check_finished(member: Member, new_ids: list[int], stop: Sequence[str], max_new_tokens: int) -> tuple[str | None, str]:
    """(finish reason or None, text so far). EOS and stop strings are excluded from the text."""
    if new_ids and new_ids[-1] in member.eos_token_ids:
        return "eos", member.decode(new_ids[:-1])
    text = member.decode(new_ids)
    for s in stop:
        cut = text.find(s)
        if cut >= 0:
            return "stop", text[:cut]
    if len(new_ids) >= max_new_tokens:
        return "length", text
    return None, text


class KVState:
    """Token ids + KV cache of a batch of rows of one member. See the module docstring."""

    def __init__(self, member: Member, batch_size: int):
        from runtime.kv_cache import GrowableCache

        self.member = member
        self.batch_size = batch_size
        self.cache = GrowableCache()
        self.ids: list[list[int]] = [[] for _ in range(batch_size)]
        self.slots: list[list[int]] = [[] for _ in range(batch_size)]  # slot of each committed token
        self.slot_pos = torch.empty(batch_size, 0, dtype=torch.long, device=member.device)
        self.last_logits: torch.Tensor | None = None  # [B, V] float32, after each row's last token
        self._tree: _OpenTree | None = None
        self._tree_serial = 0
        self._stale: set[int] = set()  # rows whose last_logits predate a rollback

    def __repr__(self) -> str:
        return f"KVState(member={self.member.name!r}, rows={self.batch_size}, lengths={self.lengths}, slots={self.num_slots})"

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.ids]

    @property
    def num_slots(self) -> int:
        return int(self.slot_pos.shape[1])

    # ---- the one forward -------------------------------------------------------------------
    def _forward(
        self,
        tokens: list[list[int]],   # per row, N_b new tokens
        parents: list[list[int]],  # per row, parent index within the row's new tokens; -1 = last committed
        keep: str,                 # "all" | "last" | "none" | "at": which logits to compute
        at: Sequence[Sequence[int]] | None = None,  # keep="at": per row, node indices wanted
        roots: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Feed new tokens as a forest hanging off each row's committed sequence. Returns
        (logits [B, N, V] float32 or [B, V] for keep="last", and the first new slot index).
        `roots` = (seen [B, N, S] bool, depth [B, N] long) puts the roots of the new block (parent
        -1) elsewhere: root i of row b sees exactly the past slots seen[b, i] and sits at depth
        depth[b, i] past the row's committed tokens (an open tree's nodes below which it hangs)."""
        device = self.member.device
        B = self.batch_size
        n_new = max((len(t) for t in tokens), default=0)
        if n_new == 0:
            return None, self.num_slots
        tok = torch.zeros(B, n_new, dtype=torch.long)
        valid = torch.zeros(B, n_new, dtype=torch.bool)
        par = torch.full((B, n_new), -1, dtype=torch.long)
        for b, (t, p) in enumerate(zip(tokens, parents)):
            if len(t) != len(p):
                raise ValueError("tokens and parents must have the same length per row")
            if t:
                tok[b, : len(t)] = torch.tensor(t, dtype=torch.long)
                par[b, : len(p)] = torch.tensor(p, dtype=torch.long)
                valid[b, : len(t)] = True
        # ancestor-or-self relation and depth inside the new block
        S = self.num_slots
        past_pos = self.slot_pos.cpu()
        anc = torch.zeros(B, n_new, n_new, dtype=torch.bool)
        root_depth = roots[1] if roots is not None else torch.zeros(B, n_new, dtype=torch.long)
        depth = torch.zeros(B, n_new, dtype=torch.long)
        seen = roots[0].clone() if roots is not None else None  # past slots each node sees
        eye = torch.eye(n_new, dtype=torch.bool)
        rows = torch.arange(B)
        for i in range(n_new):
            p = par[:, i]
            if bool((p >= i).any()):
                raise ValueError("a node's parent must come before it (parents[i] < i)")
            has_parent = p >= 0
            pc = p.clamp(min=0)
            anc[:, i] = eye[i] | (anc[rows, pc] & has_parent[:, None])
            depth[:, i] = torch.where(has_parent, depth[rows, pc] + 1, root_depth[:, i])
            if seen is not None:
                seen[:, i] = torch.where(has_parent[:, None], seen[rows, pc], seen[:, i])
        anc &= valid[:, None, :]
        anc |= eye[None]  # padding nodes see themselves (avoids empty rows)
        base = torch.tensor(self.lengths, dtype=torch.long)
        pos = torch.where(valid, base[:, None] + depth, torch.zeros_like(depth))

        past_valid = (past_pos >= 0)[:, None, :].expand(B, n_new, S)
        if seen is not None:
            past_valid = past_valid & seen
        full = torch.cat([past_valid, anc], dim=-1)  # [B, N, S+N]
        masks = {"full_attention": full}
        if self.member.has_sliding:
            all_pos = torch.cat([past_pos, pos], dim=1)  # [B, S+N]
            window = (pos[:, :, None] - all_pos[:, None, :]) < int(self.member.sliding_window)
            masks["sliding_attention"] = full & (window | eye_pad(n_new, S))
        dtype = self.member.dtype
        neg = torch.finfo(dtype).min
        float_masks = {
            k: torch.zeros(B, 1, n_new, S + n_new, dtype=dtype).masked_fill(~m[:, None], neg).to(device)
            for k, m in masks.items()
        }
        attention_mask = float_masks if self.member.has_sliding else float_masks["full_attention"]

        # logits_to_keep: the positions (shared by all rows) the model computes logits at; `head`:
        # which (row, kept position) pairs are actually wanted (packed LM heads compute only those)
        if keep == "all":
            logits_to_keep, head = 0, valid
        elif keep == "at":
            want = sorted({int(i) for row in at for i in row}) or [0]
            col = {i: k for k, i in enumerate(want)}
            logits_to_keep = torch.tensor(want).to(device)
            head = torch.zeros(B, len(want), dtype=torch.bool)
            for b, row in enumerate(at):
                head[b, [col[int(i)] for i in row]] = True
        elif keep == "last":
            last_idx = torch.tensor([max(len(t) - 1, 0) for t in tokens])
            uniq = torch.unique(last_idx)
            logits_to_keep = uniq.to(device)
            where = torch.searchsorted(uniq, last_idx)
            head = torch.zeros(B, len(uniq), dtype=torch.bool)
            head[rows, where] = valid.any(dim=1)
        else:
            logits_to_keep, head = 1, torch.zeros(B, 1, dtype=torch.bool)
        # "at" / "last" read a few positions: a packed head then returns only the wanted ones
        with only_tokens(valid.to(device), head.to(device), compact_head=keep in ("at", "last")) as run:
            out = self.member.model(
                input_ids=tok.to(device), attention_mask=attention_mask, position_ids=pos.to(device),
                cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep,
            )
        self.member.counters.forward_passes += 1
        self.member.counters.tokens_processed += int(valid.sum())
        new_pos = torch.where(valid, pos, torch.full_like(pos, -1)).to(device)
        self.slot_pos = torch.cat([self.slot_pos, new_pos], dim=1)
        logits = out.logits
        if run.compacted:  # [1, n, V]: the wanted (row, kept position) pairs in row-major order
            where_in = torch.zeros(head.shape, dtype=torch.long)
            where_in[head] = torch.arange(int(head.sum()))
            logits = logits[0]
        if keep == "all":
            return logits.float(), S
        if keep == "at":
            width = max((len(row) for row in at), default=0) or 1
            idx = torch.tensor([[col[int(row[min(k, len(row) - 1)])] if row else 0 for k in range(width)] for row in at],
                               dtype=torch.long)
            if run.compacted:
                return logits[where_in.gather(1, idx).to(logits.device)].float(), S
            idx = idx.to(logits.device)
            return logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[-1])).float(), S
        if keep == "last":
            if run.compacted:
                return logits[where_in[rows, where].to(logits.device)].float(), S
            return logits[rows, where.to(logits.device)].float(), S
        return None, S

    # ---- public operations -----------------------------------------------------------------
    def load_prefix(self, ids: Sequence[Sequence[int]], chunks: Sequence[Sequence[ChunkKV]]) -> None:
        """Append precomputed KV (`Member.prefix_chunks`) of `ids[b]` to each row of a state whose
        rows have no free slots (a fresh state, or one only ever extended this way)."""
        if any(len(self.slots[b]) != self.num_slots for b in range(self.batch_size)) or self._tree is not None:
            raise RuntimeError("load_prefix() needs a state without free slots")
        S, B = self.num_slots, self.batch_size
        n = max(len(r) for r in ids)
        if n == 0:
            return
        device = self.member.device
        n_layers = max(len(kv) for row in chunks for kv in row)
        for i in range(n_layers):
            ref = next((kv[i] for row in chunks for kv in row if kv[i] is not None), None)
            if ref is None:
                continue
            k0, v0 = ref
            keys = k0.new_zeros(B, k0.shape[1], n, k0.shape[3])
            values = v0.new_zeros(B, v0.shape[1], n, v0.shape[3])
            for b, row in enumerate(chunks):
                if row:
                    keys[b, :, : len(ids[b])] = torch.cat([kv[i][0][0] for kv in row], dim=1)
                    values[b, :, : len(ids[b])] = torch.cat([kv[i][1][0] for kv in row], dim=1)
            self.cache.update(keys, values, i)
        pos = torch.full((B, n), -1, dtype=torch.long)
        for b, r in enumerate(ids):
            pos[b, : len(r)] = torch.arange(len(r)) + len(self.ids[b])
            self.ids[b].extend(r)
            self.slots[b].extend(range(S, S + len(r)))
            if r:
                self._stale.add(b)  # until the next append brings this row's last_logits
        self.slot_pos = torch.cat([self.slot_pos, pos.to(device)], dim=1)

    def extend_without_logits(self, tokens: Sequence[Sequence[int]]) -> int:
        """Commit the same number of tokens to every row without computing any logits (prefill
        chunks); returns the first new slot."""
        if len({len(t) for t in tokens}) != 1:
            raise ValueError("extend_without_logits() needs the same number of tokens per row")
        self._discard_tree()
        tokens = [list(t) for t in tokens]
        _, first = self._forward(tokens, [list(range(-1, len(t) - 1)) for t in tokens], "none")
        self._commit_rows(tokens, [list(range(first, first + len(t))) for t in tokens], None)
        return first

    @torch.no_grad()
    def append(self, tokens: Sequence[Sequence[int]], return_logits: bool = True) -> torch.Tensor | None:
        """Commit `tokens[b]` to row b (rows may get different counts, including none). Returns
        logits [B, N, V] for every appended position when `return_logits` (row b's valid ones are
        the first len(tokens[b])); updates `last_logits` for rows that got tokens."""
        self._discard_tree()
        tokens = [list(t) for t in tokens]
        self._stale.difference_update(b for b, t in enumerate(tokens) if t)
        parents = [list(range(-1, len(t) - 1)) for t in tokens]
        logits, first = self._forward(tokens, parents, "all" if return_logits else "last")
        if logits is None:
            return None
        last = logits[torch.arange(self.batch_size), [max(len(t) - 1, 0) for t in tokens]] if return_logits else logits
        self._commit_rows(tokens, [list(range(first, first + len(t))) for t in tokens], last)
        return logits if return_logits else None

    def _commit_rows(self, ids: Sequence[Sequence[int]], slots: Sequence[Sequence[int]],
                     last_logits: torch.Tensor | None) -> None:
        """Record committed tokens `ids[b]` at cache slots `slots[b]`; without `last_logits` the rows'
        next-token logits are stale until their next append."""
        if self.last_logits is None and last_logits is not None:
            self.last_logits = torch.zeros(self.batch_size, last_logits.shape[-1], dtype=torch.float32,
                                           device=last_logits.device)
        for b, (row_ids, row_slots) in enumerate(zip(ids, slots)):
            if not row_ids:
                continue
            self.ids[b].extend(row_ids)
            self.slots[b].extend(row_slots)
            if last_logits is None:
                self._stale.add(b)
            else:
                self.last_logits[b] = last_logits[b]

    def next_probs(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """[B, V] next-token distribution of each row after its last committed token."""
        if self.last_logits is None:
            raise RuntimeError("empty state: append a prompt first")
        self._refresh()
        return logits_to_probs(self.last_logits, temperature, top_k, top_p)

    @torch.no_grad()
    def forward_tree(self, tokens: Sequence[Sequence[int]], parents: Sequence[Sequence[int]],
                     logits_at: Sequence[Sequence[int]] | None = None, extend: bool = False) -> torch.Tensor:
        """Score a token tree per row in one forward, without committing. `parents[b][i]` is the
        index of node i's parent among row b's nodes (-1: child of the last committed token).
        Returns logits [B, N, V] (the distribution after each node). Call `accept` next.
        With `logits_at` (per row, node indices) only those nodes get logits (the LM head is the
        costly part with large vocabularies): returns [B, K, V], row b's k-th = node logits_at[b][k]
        (rows with fewer repeat a valid column); `accept` can then keep, per row, a path ending at
        one of those nodes (or none).
        `extend=True` grows the open tree instead (a fresh one if none is open): the new nodes of
        row b are numbered on from its n_b nodes (n_b + i for tokens[b][i]); `parents` and
        `logits_at` use those tree-wide numbers, a parent may be any node of the tree, and the
        returned logits are of the new nodes only ([B, N, V], row b's i-th = node n_b + i; or in
        `logits_at` order). The nodes already fed are not fed again. `tree_logits` gathers the logits
        of any nodes of the open tree; `accept` takes tree-wide node numbers."""
        if not (extend and self._tree is not None):
            self._discard_tree()
            self._refresh()  # (a tree is only ever opened on fresh rows)
        tokens = [list(t) for t in tokens]
        parents = [list(p) for p in parents]
        tree = self._tree
        if tree is None:
            n_old = [0] * self.batch_size
            local_parents, roots = parents, None
        else:
            n_old = [len(t) for t in tree.tokens]
            local_parents, roots = self._roots_below(tree, tokens, parents)
        at = None if logits_at is None else [[int(i) - n for i in row] for row, n in zip(logits_at, n_old)]
        if at is not None and any(i < 0 or i >= len(t) for row, t in zip(at, tokens) for i in row):
            raise ValueError("logits_at may only name nodes fed by this forward")
        before = self.num_slots
        logits, first = self._forward(tokens, local_parents, "all" if at is None else "at", at=at, roots=roots)
        if tree is None:
            self._tree_serial += 1
            tree = self._tree = _OpenTree(first, [[] for _ in tokens], [[] for _ in tokens],
                                          [[] for _ in tokens], [], self._tree_serial)
        offset = before - tree.first
        for b, (t, p) in enumerate(zip(tokens, parents)):
            tree.tokens[b].extend(t)
            tree.parents[b].extend(p)
            tree.slots[b].extend(offset + i for i in range(len(t)))
        if logits is not None:
            cols = ([{n_old[b] + i: i for i in range(len(t))} for b, t in enumerate(tokens)] if at is None else
                    [{n_old[b] + i: k for k, i in enumerate(row)} for b, row in enumerate(at)])
            tree.blocks.append(_TreeBlock(logits, cols))
        return logits

    @torch.no_grad()
    def append_open(self, tokens: Sequence[Sequence[int]], tree_tokens: Sequence[Sequence[int]],
                    tree_parents: Sequence[Sequence[int]]) -> None:
        """`append(tokens, return_logits=False)` and `forward_tree(tree_tokens, tree_parents)` in one
        forward: row b commits tokens[b] and opens a tree that hangs below its new last token
        (parent -1), every node with logits, numbered 0.. as if fed by `forward_tree` after the
        append. The same state and logits as the two calls, for the cost of one forward (a
        lazy flush of committed text can so carry guesses of what comes next)."""
        self._discard_tree()
        self._stale.difference_update(b for b, t in enumerate(tokens) if t)
        trunk = [len(t) for t in tokens]
        combined, parents, at = [], [], []
        for t, tt, tp, n in zip(tokens, tree_tokens, tree_parents, trunk):
            if len(tt) != len(tp):
                raise ValueError("tree_tokens and tree_parents must have the same length per row")
            combined.append(list(t) + list(tt))
            parents.append(list(range(-1, n - 1)) + [p + n if p >= 0 else n - 1 for p in tp])
            at.append(([n - 1] if n else []) + [n + i for i in range(len(tt))])
        self.forward_tree(combined, parents, logits_at=at)
        self._commit_trunk(trunk)

    def _commit_trunk(self, trunk: Sequence[int]) -> None:
        """Commit the first trunk[b] nodes of row b's open tree (a chain from the root, the last one
        with logits); the rest stays open, renumbered from 0, its children of the trunk's end now
        children of the last committed token (-1)."""
        tree = self._tree
        ids, slots, last = [], [], []
        for b, n in enumerate(trunk):
            ids.append(tree.tokens[b][:n])
            slots.append([tree.first + s for s in tree.slots[b][:n]])
            last.append(tree.logits_of(b, n - 1) if n else None)
            if not n:
                continue
            tree.tokens[b] = tree.tokens[b][n:]
            tree.parents[b] = [p - n if p >= n else -1 for p in tree.parents[b][n:]]
            tree.slots[b] = tree.slots[b][n:]
            for block in tree.blocks:
                block.cols[b] = {node - n: col for node, col in block.cols[b].items() if node >= n}
        if any(trunk):
            fill = next(x for x in last if x is not None)
            self._commit_rows(ids, slots, torch.stack([x if x is not None else fill for x in last]))

    def _committed_mask(self, tree: "_OpenTree") -> torch.Tensor:
        """[B, S] bool on the CPU: the slots holding committed tokens (not the open tree's)."""
        committed = (self.slot_pos >= 0).cpu()
        for b in range(self.batch_size):
            committed[b, [tree.first + s for s in tree.slots[b]]] = False
        return committed

    def _roots_below(self, tree: "_OpenTree", tokens: list[list[int]], parents: list[list[int]]
                     ) -> tuple[list[list[int]], tuple[torch.Tensor, torch.Tensor]]:
        """For nodes added to the open `tree`: parents within the new block (-1 for a node whose
        parent is committed or in the tree) and, for those roots, the past slots they see (the
        committed slots and their ancestors in the tree) and their depth."""
        B, S = self.batch_size, self.num_slots
        n_new = max((len(t) for t in tokens), default=0)
        committed = self._committed_mask(tree)
        seen = torch.zeros(B, n_new, S, dtype=torch.bool)
        seen[:, :, :] = committed[:, None, :]
        depth = torch.zeros(B, n_new, dtype=torch.long)
        local = []
        for b, (t, par) in enumerate(zip(tokens, parents)):
            n = len(tree.tokens[b])
            row = []
            for i, p in enumerate(par):
                if p >= n + i or p < -1:
                    raise ValueError("a node's parent must come before it (parents[i] < i)")
                row.append(p - n if p >= n else -1)
                if 0 <= p < n:
                    line = tree.lineage(b, p)
                    seen[b, i, [tree.first + tree.slots[b][a] for a in line]] = True
                    depth[b, i] = len(line)
            local.append(row)
        return local, (seen, depth)

    def tree_logits(self, nodes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits [B, K, V] after the given nodes (per row, tree-wide numbers) of the open tree; row b's
        k-th = nodes[b][k] (rows with fewer repeat their last; a row with none gets zeros)."""
        tree = self._tree
        if tree is None:
            raise RuntimeError("tree_logits() needs an open tree (forward_tree)")
        width = max((len(r) for r in nodes), default=0)
        vocab = tree.blocks[0].logits.shape[-1] if tree.blocks else self.member.vocab_size
        out = torch.zeros(self.batch_size, width, vocab, dtype=torch.float32, device=self.member.device)
        for b, row in enumerate(nodes):
            for k, node in enumerate(list(row) + list(row[-1:]) * (width - len(row))):
                found = tree.logits_of(b, node)
                if found is None:
                    raise RuntimeError(f"row {b}: node {node} of the open tree has no logits")
                out[b, k] = found
        return out

    def node_logits(self, row: int, node: int) -> torch.Tensor | None:
        """The logits [V] after one node of the open tree (None: no open tree, or no logits there)."""
        return self._tree.logits_of(row, node) if self._tree is not None else None

    @property
    def open_tree_serial(self) -> int | None:
        """A number that identifies the open tree (None if none is open); it changes with every
        new tree, not when the tree is extended."""
        return self._tree.serial if self._tree is not None else None

    def _discard_tree(self) -> None:
        if self._tree is not None:
            self.accept([[] for _ in range(self.batch_size)])

    def accept(self, paths: Sequence[Sequence[int]]) -> None:
        """Commit, per row, the node numbers of a root-to-node chain of the open tree (may be empty);
        all other tree nodes are freed. A path must end at a node that has logits."""
        tree = self._tree
        if tree is None:
            raise RuntimeError("accept() needs a preceding forward_tree()")
        last = None
        if any(paths):
            ends = []
            for b, path in enumerate(paths):
                found = tree.logits_of(b, path[-1]) if path else None
                if path and found is None:
                    raise RuntimeError("with logits_at, an accepted path must end at a node that has logits")
                ends.append(found)
            fill = next(e for e in ends if e is not None)
            last = torch.stack([e if e is not None else fill for e in ends])
        self._tree = None
        first = tree.first
        free = torch.zeros_like(self.slot_pos[:, first:], dtype=torch.bool)  # the tree's slots not kept
        for b, path in enumerate(paths):
            free[b, tree.slots[b]] = True
            if path:
                free[b, [tree.slots[b][i] for i in path]] = False
        self.slot_pos[:, first:] = self.slot_pos[:, first:].masked_fill(free.to(self.slot_pos.device), -1)
        if last is not None:
            self._stale.difference_update(b for b, path in enumerate(paths) if path)
            self._commit_rows([[tree.tokens[b][i] for i in path] for b, path in enumerate(paths)],
                              [[first + tree.slots[b][i] for i in path] for b, path in enumerate(paths)], last)
        # accepted nodes sit at depth 0..k-1 of the tree, so their positions already equal their
        # final positions; only the freed slots need compaction
        self._trim()

    @torch.no_grad()
    def score(self, continuations: Sequence[Sequence[Sequence[int]]]) -> list[list[torch.Tensor]]:
        """Log-probs of each continuation's tokens given each row's committed prefix, in one forward
        (continuations become branches of a tree; nothing is committed). Returns, per row and per
        continuation, a float32 tensor [len(continuation)]."""
        if self.last_logits is None:
            raise RuntimeError("empty state: append a prompt first")
        self._discard_tree()
        self._refresh()
        tokens, parents, spans = [], [], []
        for conts in continuations:
            t, p, s = [], [], []
            for c in conts:
                start = len(t)
                t.extend(c)
                p.extend([-1] + list(range(start, start + len(c) - 1)) if c else [])
                s.append((start, len(c)))
            tokens.append(t)
            parents.append(p)
            spans.append(s)
        logits, first = self._forward(tokens, parents, "all")
        self.slot_pos[:, first:] = -1
        self._trim()
        last_lp = torch.log_softmax(self.last_logits.float(), dim=-1)
        out: list[list[torch.Tensor]] = []
        for b, conts in enumerate(continuations):
            row = []
            lp = torch.log_softmax(logits[b], dim=-1) if logits is not None and tokens[b] else None
            for c, (start, n) in zip(conts, spans[b]):
                if n == 0:
                    row.append(torch.zeros(0))
                    continue
                ids = torch.tensor(c, device=last_lp.device)
                prev = torch.cat([last_lp[b : b + 1], lp[start : start + n - 1]], dim=0)
                row.append(prev.gather(-1, ids[:, None]).squeeze(-1).cpu())
            out.append(row)
        return out

    def rollback(self, lengths: Sequence[int]) -> None:
        """Shorten row b to `lengths[b]` tokens (>= 1; no-op where equal). A shortened row's
        `last_logits` is refreshed lazily (one re-fed token) unless new tokens are appended first."""
        self._discard_tree()
        for b, n in enumerate(lengths):
            if n > len(self.ids[b]):
                raise ValueError(f"row {b}: cannot roll back to {n} > current length {len(self.ids[b])}")
            if n == len(self.ids[b]):
                continue
            if n < 1:
                raise ValueError("rollback keeps at least one token per row")
            self.slot_pos[b, self.slots[b][n:]] = -1
            del self.ids[b][n:]
            del self.slots[b][n:]
            self._stale.add(b)
        self._trim()

    def _refresh(self) -> None:
        """Recompute `last_logits` of rolled-back rows by re-feeding their last token."""
        if not self._stale:
            return
        rows = sorted(self._stale)
        refeed: list[list[int]] = [[] for _ in range(self.batch_size)]
        for b in rows:
            self.slot_pos[b, self.slots[b][-1]] = -1
            self.slots[b].pop()
            refeed[b] = [self.ids[b].pop()]
        self._stale.clear()
        self.append(refeed, return_logits=False)

    def truncate_to(self, lengths: Sequence[int]) -> None:
        """Alias of `rollback`."""
        self.rollback(lengths)

    def _trim(self) -> None:
        """Drop trailing free slots; compact when free slots dominate the cache."""
        valid = self.slot_pos >= 0
        if valid.numel() == 0:
            return
        any_valid = valid.any(dim=0)
        nz = torch.nonzero(any_valid)
        keep_to = int(nz[-1]) + 1 if len(nz) else 0
        S = self.num_slots
        if keep_to < S:
            self.cache.crop(keep_to - S)
            self.slot_pos = self.slot_pos[:, :keep_to]
        longest = max(self.lengths) if self.batch_size else 0
        if self.num_slots - longest > max(64, longest // 2):
            self.compact()

    def compact(self) -> None:
        """Gather each row's committed slots to the left of the cache (order kept)."""
        longest = max(self.lengths)
        device = self.slot_pos.device
        index = torch.zeros(self.batch_size, longest, dtype=torch.long)
        new_pos = torch.full((self.batch_size, longest), -1, dtype=torch.long)
        for b, slots in enumerate(self.slots):
            n = len(slots)
            if n:
                index[b, :n] = torch.tensor(slots)
                new_pos[b, :n] = self.slot_pos[b, slots].cpu()
        index = index.to(device)
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            idx = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            keys = layer.keys.gather(2, idx)  # (both read before either is replaced)
            values = layer.values.gather(2, idx.expand(-1, -1, -1, layer.values.shape[-1]))
            layer.keys, layer.values = keys, values
        self.slot_pos = new_pos.to(device)
        self.slots = [list(range(len(s))) for s in self.slots]


def eye_pad(n_new: int, n_past: int) -> torch.Tensor:
    """[N, S+N] bool: True at each new node's own slot (it always sees itself)."""
    return torch.cat([torch.zeros(n_new, n_past, dtype=torch.bool), torch.eye(n_new, dtype=torch.bool)], dim=1)


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

    os.environ.setdefault("HF_HUB_OFFLINE", "1") if name_or_path in registry.REGISTRY else None
    display, where = registry.resolve(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    if check_memory:
        registry.check_memory([name_or_path], str(torch_dtype).replace("torch.", ""))
    tok = AutoTokenizer.from_pretrained(str(where))
    model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch_dtype).to(device)
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


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        from runtime.errors import AdafuseError

        raise AdafuseError(f"unknown dtype '{dtype}'; use one of: float32, bfloat16, float16")
    return table[dtype]
