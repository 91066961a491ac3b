"""Sampling losslessness: the law of the first tokens generated speculatively equals the target's own
sampling law, computed exactly by enumeration on a tiny model with a 6-token vocabulary.

Every draft scheme with its verifiers, tree shapes (depth 1-3, n 1-3, budgeted), prompt lookup, and
warped sampling (temperature + top-k + top-p) are covered; a deliberately wrong verifier must fail
the same test (the test has power)."""
import functools
import itertools

import pytest
import torch
from scipy import stats

from runtime.member import Member
from runtime.sampling import SamplingParams, logits_to_probs
from runtime.testing import tiny_model
from specdec import engine as engine_mod
from specdec.config import DecodeControl
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.engine import SpeculativeGenerator
from specdec.verifiers import METHODS

V = 6
K = 3          # law of the first K tokens (V**K cells)
N = 1500       # samples (rows of one batched decode, one seeded generator each)
PROMPT = [0, 1, 2, 0, 1, 3, 0, 1]  # repeated n-grams so prompt lookup finds drafts


@functools.lru_cache(maxsize=None)
def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["a", "b", "c", "d", "e", "</s>"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="a")


@functools.lru_cache(maxsize=None)
def members():
    def make(seed, scale):
        model = tiny_model("llama", vocab_size=V, seed=seed)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(scale)
        return Member(model, word_tokenizer(), name=f"v6-{seed}")
    # target and a different drafter (q != p), both with moderately peaked distributions
    return make(0, 0.6), make(5, 0.8)


def exact_law(target, temperature, top_k, top_p):
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=K):
            ids = torch.tensor([PROMPT + list(seq)], device=target.device)
            logits = target.model(input_ids=ids).logits[0, len(PROMPT) - 1:-1].float()
            p = logits_to_probs(logits, temperature, top_k, top_p)
            law[seq] = float(torch.prod(p[torch.arange(K), torch.tensor(seq)]))
    return law


def sample_law(gen_obj, temperature, top_k, top_p, max_new):
    """(counts of the first K tokens over N seeded rows, each row's `RowStats`)."""
    target = gen_obj.target
    state = target.start([PROMPT] * N)
    gens = [torch.Generator().manual_seed(1000 + i) for i in range(N)]
    res = gen_obj.decode(state, max_new, SamplingParams(temperature, top_k, top_p), gens,
                         DecodeControl(stop_at_eos=False))
    out = res.ids
    assert all(len(o) == max_new for o in out)
    assert all(state.ids[b] == PROMPT + out[b] for b in range(N))
    counts = {}
    for o in out:
        key = tuple(o[:K])
        counts[key] = counts.get(key, 0) + 1
    return counts, res.stats


def chi_square_pvalue(counts, law):
    """Pearson chi-square of the counts against the exact law, pooling cells with expected < 5."""
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for seq, p in law.items():
        e = p * N
        o = counts.get(seq, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    impossible = sum(c for s, c in counts.items() if law.get(s, 0.0) == 0.0)
    assert impossible == 0, f"{impossible} samples have zero probability under the target"
    total = sum(exp)
    exp = [e * sum(obs) / total for e in exp]  # float rounding of the law
    return stats.chisquare(obs, exp).pvalue


def tv(counts, law):
    return 0.5 * sum(abs(counts.get(s, 0) / N - p) for s, p in law.items())


WARPS = {"T1": (1.0, 0, 1.0), "warped": (0.8, 4, 0.9)}


@functools.lru_cache(maxsize=None)
def law_for(warp):
    return exact_law(members()[0], *WARPS[warp])


CASES = [
    # (verifier, scheme, n, depth, node_budget, warp)
    ("rrs", "with", 1, 1, None, "T1"),
    ("rrs", "with", 3, 2, None, "warped"),
    ("rrs", "with", 1, 3, None, "warped"),      # a chain: drafter commits its drafts, re-syncs after
    ("k-seq", "with", 2, 2, None, "T1"),
    ("rrs-without", "without", 2, 1, None, "T1"),
    ("rrs-without", "without", 3, 3, None, "warped"),
    ("greedy", "greedy", 2, 3, None, "T1"),
    ("greedy", "greedy", 3, 2, None, "warped"),
    ("greedy", "greedy", 3, 3, 6, "T1"),       # budgeted tree
    ("spechub", "greedy", 2, 2, None, "T1"),
    ("lp-optimal", "with", 2, 1, None, "T1"),
    ("lp-optimal", "without", 2, 2, None, "T1"),
    ("lp-optimal", "greedy", 3, 1, None, "warped"),
]


def _cases():
    for verifier, scheme, n, depth, budget, warp in CASES:
        if verifier in METHODS:
            yield pytest.param(scheme, n, depth, budget, warp, verifier,
                               id=f"{verifier}-{scheme}-n{n}-d{depth}-b{budget}-{warp}")


@pytest.mark.parametrize("scheme,n,depth,budget,warp,verifier", list(_cases()))
def test_model_drafter_is_lossless(scheme, n, depth, budget, warp, verifier):
    target, draft = members()
    g = SpeculativeGenerator(target, ModelDrafter(draft, stop_below=0.0), scheme=scheme, num_drafts=n, depth=depth,
                             node_budget=budget, verifier=verifier)
    counts, _ = sample_law(g, *WARPS[warp], max_new=max(depth + 1, K))
    law = law_for(warp)
    assert chi_square_pvalue(counts, law) > 1e-3, f"TV={tv(counts, law):.4f}"


@pytest.mark.parametrize("scheme,n", [("with", 1), ("without", 2)])
def test_dynamic_draft_length_is_lossless(scheme, n):
    """`stop_below` cuts branches where the drafter is unsure: a drafter-only choice, still lossless."""
    target, draft = members()
    g = SpeculativeGenerator(target, ModelDrafter(draft, stop_below=0.3), scheme=scheme, num_drafts=n, depth=3)
    counts, cut_stats = sample_law(g, *WARPS["T1"], max_new=K + 1)
    assert chi_square_pvalue(counts, law_for("T1")) > 1e-3
    full = SpeculativeGenerator(target, ModelDrafter(draft, stop_below=0.0), scheme=scheme, num_drafts=n, depth=3)
    _, full_stats = sample_law(full, *WARPS["T1"], max_new=K + 1)
    drafted = lambda stats: sum(sum(s.attempts_by_depth[1:]) for s in stats)  # noqa: E731
    assert drafted(cut_stats) < drafted(full_stats)  # fewer deep drafts


@pytest.mark.parametrize("depth,n", [(1, 1), (2, 2), (3, 3)])
def test_prompt_lookup_is_lossless(depth, n):
    target, _ = members()
    g = SpeculativeGenerator(target, PromptLookupDrafter(ngram_max=2), num_drafts=n, depth=depth)
    counts, stats = sample_law(g, *WARPS["T1"], max_new=max(depth + 1, K))
    st = stats[0]
    assert sum(st.attempts_by_depth) > 0  # lookup drafted something
    assert chi_square_pvalue(counts, law_for("T1")) > 1e-3


def test_perfect_drafter_is_lossless_and_accepts_more():
    target, _ = members()
    g = SpeculativeGenerator(target, ModelDrafter(target, stop_below=0.0), scheme="greedy", num_drafts=2, depth=2)
    counts, stats = sample_law(g, *WARPS["T1"], max_new=K)
    assert chi_square_pvalue(counts, law_for("T1")) > 1e-3
    acc = sum(sum(s.accepts_by_depth) for s in stats) / sum(sum(s.attempts_by_depth) for s in stats)
    assert acc > 0.99  # draft == target: the greedy-optimal verifier accepts always


def test_test_has_power_against_a_wrong_verifier(monkeypatch):
    """Always accepting the first draft is not lossless: the same statistic must reject it."""
    target, draft = members()
    g = SpeculativeGenerator(target, ModelDrafter(draft, stop_below=0.0), scheme="with", num_drafts=1, depth=2)
    g._verify = lambda p, q, drafts, gen: (int(drafts[0]), 0)
    counts, _ = sample_law(g, *WARPS["T1"], max_new=K)
    assert chi_square_pvalue(counts, law_for("T1")) < 1e-6


def test_node_verifier_one_position():
    """The engine's per-node verifier (`specdec.verifiers.verify` as the tree walk calls it, float32
    p and q, drafts as a list) is exact at one position."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(V) * 1.5, -1)
    q = torch.softmax(torch.randn(V) * 1.5, -1)
    from specdec.drafts import sample_drafts
    for scheme, method in [("with", "rrs"), ("without", "rrs_without"), ("greedy", "greedy"), ("with", "k-seq"),
                           ("greedy", "spechub")]:
        run = engine_mod.node_verifier(method, scheme, {})
        gen = torch.Generator().manual_seed(1)
        hits = torch.zeros(V)
        M = 5000
        for _ in range(M):
            drafts = sample_drafts(q, 2, scheme, gen).tolist()
            y, idx = run(p, q, drafts, gen)
            assert idx is None or drafts[idx] == y
            hits[y] += 1
        res = stats.chisquare(hits.numpy(), (p * M).numpy())
        assert res.pvalue > 1e-3, (scheme, hits / M, p)


pytestmark = pytest.mark.usefixtures("one_thread")
