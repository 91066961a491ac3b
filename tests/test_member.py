"""Member runtime: incremental KV use equals a full forward; trees, scoring, rollback, batching."""
import pytest
import torch

from runtime.sampling import logits_to_probs
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member

ARCHS = ["llama", "qwen2", "gemma3"]
TOL = dict(atol=2e-5, rtol=1e-4)


def full_logits(member, ids):
    with torch.no_grad():
        return member.model(input_ids=torch.tensor([ids], device=member.device)).logits[0].float()


def rand_ids(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_equals_full_forward(arch):
    m = tiny_member(arch)
    V = m.vocab_size
    a, b = rand_ids(9, V, 1), rand_ids(5, V, 2)
    state = m.start([a[:3], b[:2]])
    state.append([a[3:7], b[2:3]])
    state.append([a[7:], b[3:]])
    ref_a, ref_b = full_logits(m, a), full_logits(m, b)
    torch.testing.assert_close(state.last_logits[0], ref_a[-1], **TOL)
    torch.testing.assert_close(state.last_logits[1], ref_b[-1], **TOL)
    # logits returned by append match every position
    state2 = m.start([a[:2]])
    lg = state2.append([a[2:]])
    torch.testing.assert_close(lg[0], ref_a[2:], **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_matches_each_path(arch):
    m = tiny_member(arch)
    V = m.vocab_size
    prompt = rand_ids(6, V, 3)
    # tree: 0 -> (1 -> 3), 2 ; node tokens
    toks = rand_ids(4, V, 4)
    parents = [-1, 0, -1, 1]
    state = m.start([prompt])
    lg = state.forward_tree([toks], [parents])[0]
    paths = {0: [0], 1: [0, 1], 2: [2], 3: [0, 1, 3]}
    for node, path in paths.items():
        ref = full_logits(m, prompt + [toks[i] for i in path])[-1]
        torch.testing.assert_close(lg[node], ref, **TOL)
    state.accept([[0, 1, 3]])
    assert state.ids[0] == prompt + [toks[0], toks[1], toks[3]]
    nxt = rand_ids(3, V, 5)
    lg2 = state.append([nxt])[0]
    ref = full_logits(m, state.ids[0])
    torch.testing.assert_close(lg2, ref[-3:], **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_extended_tree_equals_the_tree_fed_at_once(arch):
    """A tree grown over three forwards (`OpenTree.grow`, parents anywhere in the tree, deeper than
    gemma3's sliding window of 4, logits everywhere or only at some nodes) gives every node the logits
    of its path; a path across the forwards is accepted, in a batch with a row that grows differently."""
    m = tiny_member(arch)
    V = m.vocab_size
    prompts = [rand_ids(7, V, 30), rand_ids(3, V, 31)]
    toks = [rand_ids(9, V, 32), rand_ids(4, V, 33)]
    # row 0: 0 -> 1 -> (2, 3 -> 5 -> 6 -> 7 -> 8), 4 ; row 1: 0 -> (1, 2 -> 3)
    parents = [[-1, 0, 1, 1, -1, 3, 5, 6, 7], [-1, 0, 0, 2]]
    blocks = [([0, 1, 2], [0, 1]), ([3, 4, 5], [2]), ([6, 7, 8], [3])]  # nodes fed by each forward

    def path(b, node):
        out = []
        while node >= 0:
            out.append(node)
            node = parents[b][node]
        return out[::-1]

    state = m.start(prompts)
    at_end = {0: [2, 5, 8], 1: [1, 3]}  # second run: logits only at these nodes
    for logits_at in (None, at_end):
        state = m.start(prompts)
        tree = state.new_tree()
        for k, nodes in enumerate(blocks):
            at = None if logits_at is None else [[i for i in nodes[b] if i in logits_at[b]] for b in range(2)]
            tree.add_nodes([[toks[b][i] for i in nodes[b]] for b in range(2)],
                           [[parents[b][i] for i in nodes[b]] for b in range(2)])
            lg = tree.grow(at)
            for b in range(2):
                for col, node in enumerate(nodes[b] if at is None else at[b]):
                    ref = full_logits(m, prompts[b] + [toks[b][i] for i in path(b, node)])[-1]
                    torch.testing.assert_close(lg[b, col], ref, **TOL)
        want = [n for n in range(9) if logits_at is None or n in logits_at[0]]
        gathered = tree.gather([want, [3]])
        for k, node in enumerate(want):
            ref = full_logits(m, prompts[0] + [toks[0][i] for i in path(0, node)])[-1]
            torch.testing.assert_close(gathered[0, k], ref, **TOL)
        tree.accept([path(0, 8), path(1, 3)])
        assert not tree.is_open and state.tree is None
        for b, end in ((0, 8), (1, 3)):
            assert state.ids[b] == prompts[b] + [toks[b][i] for i in path(b, end)]
        nxt = [rand_ids(2, V, 34), rand_ids(3, V, 35)]
        lg2 = state.append(nxt)
        for b in range(2):
            torch.testing.assert_close(lg2[b, : len(nxt[b])], full_logits(m, state.ids[b])[-len(nxt[b]):], **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_append_open_equals_append_then_tree(arch):
    """`append_open` commits each row's tokens and opens a tree below them in one forward: the same
    last logits and node logits as `append` + `forward_tree`; the tree then grows (`OpenTree.grow`)
    and a path is accepted as usual, with the committed tokens kept and the other nodes freed. Rows
    commit 3, 0 and 5 tokens (gemma3's sliding window is 4)."""
    m = tiny_member(arch)
    V = m.vocab_size
    prompts = [rand_ids(6, V, 40), rand_ids(4, V, 41), rand_ids(3, V, 42)]
    trunk = [rand_ids(3, V, 43), [], rand_ids(5, V, 44)]
    tree = [rand_ids(3, V, 45), rand_ids(2, V, 46), rand_ids(1, V, 47)]
    parents = [[-1, 0, -1], [-1, -1], [-1]]
    state = m.start(prompts)
    before = state.num_slots
    opened = state.append_open(trunk, tree, parents)
    assert opened.is_open and state.tree is opened
    assert [opened.path(b, tree[b][:1]) for b in range(3)] == [[0], [0], [0]]  # renumbered below the trunk
    for b in range(3):
        ids = prompts[b] + trunk[b]
        assert state.ids[b] == ids
        torch.testing.assert_close(state.last_logits[b], full_logits(m, ids)[-1], **TOL)
    paths = [[[0], [0, 1], [2]], [[0], [1]], [[0]]]
    got = opened.gather([[p[-1] for p in rows] for rows in paths])
    for b in range(3):
        for k, p in enumerate(paths[b]):
            ref = full_logits(m, prompts[b] + trunk[b] + [tree[b][i] for i in p])[-1]
            torch.testing.assert_close(got[b, k], ref, **TOL)
    # grow below node 1 of row 0 and node 0 of rows 1, 2; accept a path across both forwards
    more = [[rand_ids(1, V, 48)[0]], [rand_ids(1, V, 49)[0]], [rand_ids(1, V, 50)[0]]]
    opened.add_nodes(more, [[1], [0], [0]])
    lg = opened.grow()
    ends = [[0, 1, 3], [0, 2], [0, 1]]
    for b in range(3):
        full = [tree[b][i] for i in ends[b][:-1]] + more[b]
        torch.testing.assert_close(lg[b, 0], full_logits(m, prompts[b] + trunk[b] + full)[-1], **TOL)
    state.accept([ends[0], [], ends[2]])
    want = [prompts[0] + trunk[0] + [tree[0][0], tree[0][1], more[0][0]], prompts[1],
            prompts[2] + trunk[2] + [tree[2][0], more[2][0]]]
    assert state.ids == want
    assert state.num_slots <= before + 8 + 3  # the freed tree nodes at the end are trimmed
    nxt = [rand_ids(2, V, 51), rand_ids(1, V, 52), rand_ids(2, V, 53)]
    lg2 = state.append(nxt)
    for b in range(3):
        torch.testing.assert_close(lg2[b, : len(nxt[b])], full_logits(m, want[b] + nxt[b])[-len(nxt[b]):], **TOL)


def test_extending_checks_its_input():
    m = tiny_member("llama")
    state = m.start([rand_ids(4, m.vocab_size, 36)])
    tree = state.new_tree()
    tree.add_nodes([[5, 6]], [[-1, 0]])
    tree.grow()
    with pytest.raises(ValueError, match="parent must come before"):
        tree.add_nodes([[7]], [[2]])  # node 2 is the new node itself
    tree.add_nodes([[7]], [[1]])
    with pytest.raises(ValueError, match="logits_at"):
        tree.grow(logits_at=[[0]])  # node 0 was fed before
    tree = state.new_tree()  # (the failed grow fed nothing: start over)
    tree.add_nodes([[5, 6]], [[-1, 0]])
    tree.grow()
    tree.add_nodes([[7, 8]], [[1, 2]])
    tree.grow(logits_at=[[3]])  # node 2 gets no logits
    assert tree.is_open and tree.path(0, [5, 6, 7, 8]) == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="has no logits"):
        tree.gather([[2]])
    with pytest.raises(RuntimeError, match="must end at a node that has logits"):
        tree.accept([[0, 1, 2]])
    tree.accept([[0, 1, 2, 3]])
    assert state.tree is None and state.ids[0][-4:] == [5, 6, 7, 8]


def test_a_discarded_tree_cannot_grow():
    """Any other operation of the state discards its open tree; growing or accepting it then
    fails with a message instead of hanging nodes below freed slots."""
    m = tiny_member("llama")
    state = m.start([rand_ids(4, m.vocab_size, 37)])
    tree = state.new_tree()
    tree.add(0, [5, 6])
    tree.grow()
    state.append([[9]])
    assert not tree.is_open and state.tree is None
    tree.add(0, [5, 7])
    with pytest.raises(RuntimeError, match="discarded"):
        tree.grow()
    with pytest.raises(RuntimeError, match="not open"):
        tree.accept([[0]])
    fresh = state.new_tree()  # a new tree's first grow opens it (and would discard another)
    assert fresh.add(0, [5, 6]) == 1 and fresh.add(0, [5, 7]) == 2 and fresh.add(0, [5]) == 0
    fresh.grow()
    assert fresh.is_open and fresh.fed == [3]


@pytest.mark.parametrize("arch", ARCHS)
def test_rollback_then_continue(arch):
    m = tiny_member(arch)
    V = m.vocab_size
    a = rand_ids(12, V, 6)
    state = m.start([a[:8], a[:5]])
    state.rollback([4, 5])
    assert state.lengths == [4, 5]
    torch.testing.assert_close(state.next_probs(1.0)[0], full_logits(m, a[:4])[-1].softmax(-1), **TOL)
    tail = rand_ids(3, V, 7)
    state.append([tail, []])
    torch.testing.assert_close(state.last_logits[0], full_logits(m, a[:4] + tail)[-1], **TOL)
    torch.testing.assert_close(state.last_logits[1], full_logits(m, a[:5])[-1], **TOL)
    with pytest.raises(ValueError):
        state.rollback([100, 1])


def test_long_sequence_compaction_and_sliding_window():
    m = tiny_member("gemma3")
    V = m.vocab_size
    a = rand_ids(40, V, 8)
    state = m.start([a[:5]])
    # many rejected trees create holes; compaction must keep results exact
    for i in range(5, 40):
        toks = rand_ids(6, V, 100 + i)
        state.forward_tree([[a[i]] + toks], [[-1, 0, 0, -1, 3, 4, -1]])
        state.accept([[0]])
    assert state.ids[0] == a
    torch.testing.assert_close(state.last_logits[0], full_logits(m, a)[-1], **TOL)
    assert state.num_slots < 40 + 64 + 7


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_batched_scoring_equals_one_by_one(arch):
    m = tiny_member(arch)
    V = m.vocab_size
    p1, p2 = rand_ids(7, V, 9), rand_ids(4, V, 10)
    conts = [[rand_ids(3, V, 11), rand_ids(1, V, 12), rand_ids(5, V, 13)], [rand_ids(2, V, 14)]]
    state = m.start([p1, p2])
    batched = state.score(conts)
    assert state.lengths == [7, 4]  # nothing committed
    for prompt, row, row_scores in zip([p1, p2], conts, batched):
        for c, got in zip(row, row_scores):
            single = m.start([prompt]).score([[c]])[0][0]
            torch.testing.assert_close(got, single, **TOL)
            ref = torch.log_softmax(full_logits(m, prompt + c), -1)
            want = ref[len(prompt) - 1 : -1].gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            torch.testing.assert_close(got, want, **TOL)
    # a logits budget that holds one continuation per row: one forward per group, the same scores
    small = m.start([p1, p2]).score(conts, logits_budget=4 * V * 2 * 5)
    for row, row_small in zip(batched, small):
        for got, want in zip(row_small, row):
            torch.testing.assert_close(got, want, **TOL)


def test_score_groups_keep_each_forward_within_the_budget():
    from runtime.kv_state import score_groups
    conts = [[[1] * 3, [1] * 1, [1] * 5], [[1] * 2]]   # 2 rows, padded to the longest row's tokens
    assert score_groups(conts, 100) == [(0, 3)]          # everything in one forward
    assert score_groups(conts, 2 * 5) == [(0, 2), (2, 3)]  # 2 x max(3+1, 2) = 8 fits, + 5 would not
    assert score_groups(conts, 1) == [(0, 1), (1, 2), (2, 3)]  # at least one continuation per forward
    assert score_groups([], 4) == [(0, 0)] and score_groups([[], []], 4) == [(0, 0)]


def test_generate_batched_equals_per_row_and_seeded():
    m = tiny_member("llama", tokenizer=bpe_tokenizer())
    prompts = ["The quick brown", "How many clips did"]
    both = m.generate(prompts, max_new_tokens=8, temperature=0.0)
    for p, out in zip(prompts, both):
        assert m.generate([p], max_new_tokens=8, temperature=0.0)[0].text == out.text
    s1 = m.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3)
    s2 = m.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3)
    assert [o.text for o in s1] == [o.text for o in s2]
    assert all(o.num_tokens <= 8 for o in both)
    assert both[0].cost.forward_passes[m.name] > 0


def test_generate_greedy_matches_transformers_generate():
    m = tiny_member("qwen2", tokenizer=char_tokenizer(), seed=3)
    prompt = "Question: who"
    ours = m.generate([prompt], max_new_tokens=12, temperature=0.0)[0]
    ids = torch.tensor([m.encode_prompt(prompt)])
    ref = m.model.generate(ids, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids))
    new = ref[0, ids.shape[1]:].tolist()
    if m.eos_token_ids & set(new):
        new = new[: min(new.index(e) for e in m.eos_token_ids if e in new)]
    assert ours.text == m.decode(new)


def test_stop_strings_are_excluded():
    m = tiny_member("llama", tokenizer=char_tokenizer(), seed=1)
    free = m.generate(["abc"], max_new_tokens=10)[0].text
    assert len(free) >= 4
    stop = free[2:4]
    out = m.generate(["abc"], max_new_tokens=10, stop=[stop])[0]
    assert out.finish_reason == "stop" and out.text == free[: free.find(stop)]


def check_finished(member, ids, stop, max_new_tokens):
    """(reason, text) of one row after `ids`, by the one finish rule (`runtime.finish.FinishRule`)."""
    from runtime.finish import FinishRule

    rule = FinishRule(member, 1, stop, max_new_tokens)
    reason = None
    for n in range(1, len(ids) + 1):  # token by token, as the decoding paths call it
        reason = rule.after_tokens(0, ids[:n])
        if reason is not None:
            break
    return reason, rule.texts[0]


def test_check_finished_cuts_at_the_earliest_stop_string():
    from runtime.stopping import StopStrings

    m = tiny_member("llama", tokenizer=char_tokenizer())
    ids = m.encode("ab, cd. ef")
    for stop in ([". ", ","], [",", ". "], StopStrings([". ", "", ","])):
        assert check_finished(m, ids, stop, 100) == ("stop", "ab")
    assert check_finished(m, ids, [], 100) == (None, "ab, cd. ef")
    assert check_finished(m, ids, ["x"], len(ids)) == ("length", "ab, cd. ef")
    assert check_finished(m, ids + [m.tokenizer.eos_token_id], ["x"], 100) == ("eos", "ab, cd. ef")


@pytest.mark.parametrize("which", ["char", "bpe", "pieces"])
def test_the_finish_rule_decodes_incrementally_exactly_as_a_full_decode(which):
    """The rule decodes only new ids (with look-behind) and scans only changed text: at every step its
    text equals a full decode of the ids, byte pieces of multi-byte characters included."""
    from runtime.finish import FinishRule

    tok = {"char": char_tokenizer, "bpe": bpe_tokenizer}.get(which, lambda: bpe_tokenizer(120))()
    m = tiny_member("llama", tokenizer=tok)
    g = torch.Generator().manual_seed(0)
    eos = m.eos_token_ids
    for _ in range(20):
        ids = [int(i) for i in torch.randint(0, len(tok), (30,), generator=g) if int(i) not in eos]
        rule = FinishRule(m, 1, [], 1000)
        for n in range(1, len(ids) + 1):
            assert rule.after_tokens(0, ids[:n]) is None
            assert rule.texts[0] == m.decode(ids[:n]), (ids[:n], rule.texts[0], m.decode(ids[:n]))


def test_warpers_match_transformers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    for t, k, p in [(0.7, 0, 1.0), (1.0, 5, 1.0), (0.5, 10, 0.8), (1.3, 0, 0.9)]:
        ref = logits.clone()
        ref = TemperatureLogitsWarper(t)(None, ref)
        if k:
            ref = TopKLogitsWarper(k)(None, ref)
        if p < 1:
            ref = TopPLogitsWarper(p)(None, ref)
        torch.testing.assert_close(logits_to_probs(logits, t, k, p), ref.softmax(-1))
    greedy = logits_to_probs(logits, 0.0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.all(greedy.sum(-1) == 1)


def test_chat_prompt_formats_exemplars_as_turns():
    from runtime.prompts import ChatPrompt, fewshot_messages

    tok = bpe_tokenizer()
    m = tiny_member("llama", tokenizer=tok)
    prompt = ChatPrompt("Q: a?\nA: b\n\nQ: c?\nA:", fewshot_messages([("Q: a?\nA:", "b")], "Q: c?\nA:"))
    assert m.format_prompt(prompt) == str(prompt)  # no chat template: raw text
    m.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}<assistant>{% endif %}")
    m.use_chat_template = True
    try:
        text = m.format_prompt(prompt)
        assert text == "<user>Q: a?\nA:\n<assistant>b\n<user>Q: c?\nA:\n<assistant>"
        assert m.format_prompt("plain") == "<user>plain\n<assistant>"
        assert m.format_prompt(prompt, chat=False) == str(prompt)
    finally:
        m.tokenizer.chat_template = None


# ---- prompt prefill from cached prefix chunks ---------------------------------------------------
def _prompts_with_shared_prefix(V, seed=0):
    shared = rand_ids(40, V, seed)
    return [shared + rand_ids(13, V, seed + 1), shared + rand_ids(30, V, seed + 2), rand_ids(9, V, seed + 3)]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_chunks_equal_a_plain_prefill(arch):
    m = tiny_member(arch)  # gemma3: sliding window 4, so windows cross chunk boundaries
    prompts = _prompts_with_shared_prefix(m.vocab_size)
    m.prefix_chunk = 0
    ref = m.start(prompts)
    ref_next = ref.append([[5, 6], [7], [8]])
    m.prefix_chunk = 8
    state = m.start(prompts)
    assert len(m.prefix_cache) == 10 and m.prefix_cache.hits == 5  # the 40 shared tokens: computed once
    torch.testing.assert_close(state.append([[5, 6], [7], [8]]), ref_next, **TOL)
    for b, p in enumerate(prompts):
        torch.testing.assert_close(state.last_logits[b], full_logits(m, p + [[5, 6], [7], [8]][b])[-1], **TOL)
    # trees and rollback work on top of loaded chunks
    state.rollback([len(p) + 1 for p in prompts])
    tree = state.forward_tree([[9, 10], [9], [11]], [[-1, 0], [-1], [-1]])
    torch.testing.assert_close(tree[0, 1], full_logits(m, prompts[0] + [5, 9, 10])[-1], **TOL)


def test_prefix_chunks_are_reused_across_calls_and_independent_of_the_batch():
    m = tiny_member("qwen2")
    m.prefix_chunk = 8
    prompts = _prompts_with_shared_prefix(m.vocab_size, seed=5)
    alone = m.start([prompts[1]])
    before = m.counters.snapshot()
    batched = m.start(prompts)
    # prompt 1's chunks all come from the cache: only the other prompts' new chunks and the tails are fed
    fed = m.counters.tokens_processed - before[1]
    assert fed == 8 + 8 + (5 + 6 + 1)  # new chunks: p0 tokens 40-47, p2 tokens 0-7; tails 5, 6, 1
    n = 8 * ((len(prompts[1]) - 1) // 8)
    for a, b in zip(alone.cache.layers, batched.cache.layers):
        assert torch.equal(a.keys[0, :, :n], b.keys[1, :, :n])  # bit-identical chunk KV
    torch.testing.assert_close(alone.last_logits[0], batched.last_logits[1], **TOL)
    m.prefix_cache.max_chunks = 3
    m.start([rand_ids(20, m.vocab_size, 99)])  # two new chunks
    assert len(m.prefix_cache) == 3  # LRU bound
