"""Speculative engine: greedy equality per drafter/scheme, batching and seeding, `decode` on an existing
state, stop strings, tokenizer mismatch; one slow end-to-end test on the real smollm2-135m."""
import json
from pathlib import Path

import pytest
import torch

from runtime.errors import ConfigError, TokenizerMismatchError
from runtime.sampling import SamplingParams
from runtime.testing import bpe_tokenizer, char_tokenizer, tiny_member
from specdec.config import DEFAULT_SHAPE, DecodeControl, TreeShape
from specdec.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter
from specdec.engine import SpeculativeGenerator
from specdec.tree import node_path

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = ["The quick brown fox jumps", "How many clips did Natalia sell", "1 + 2 ="]


@pytest.fixture(scope="module")
def pair():
    tok = bpe_tokenizer()
    return tiny_member("llama", tokenizer=tok, seed=0), tiny_member("llama", tokenizer=tok, seed=7)


def drafters(target, other):
    # stop_below=0: these tiny random models are never sure, the shape's default cut would stop every tree
    return {
        "perfect": ModelDrafter(target, stop_below=0.0),   # the target itself: everything is accepted
        "random": ModelDrafter(other, stop_below=0.0),     # an unrelated random model: almost nothing is
        "lookup": PromptLookupDrafter(),
        "hybrid": HybridDrafter(ModelDrafter(other, stop_below=0.0), min_match=1),
        "dynamic": ModelDrafter(other, stop_below=0.2),
    }


@pytest.mark.parametrize("which", ["perfect", "random", "lookup", "hybrid", "dynamic"])
@pytest.mark.parametrize("scheme,n,depth,budget", [("greedy", 2, 3, None), ("without", 3, 2, 5)])
def test_greedy_equals_target_greedy(pair, which, scheme, n, depth, budget):
    target, other = pair
    ref = target.generate(PROMPTS, max_new_tokens=24)
    g = SpeculativeGenerator(target, drafters(target, other)[which], scheme=scheme, num_drafts=n, depth=depth,
                             node_budget=budget)
    outs = g.generate(PROMPTS, max_new_tokens=24)
    assert [o.text for o in outs] == [r.text for r in ref]
    assert [o.num_tokens for o in outs] == [r.num_tokens for r in ref]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in ref]
    st = outs[0].stats
    assert st["block_efficiency"] >= 1.0
    if which == "perfect":
        assert all(a == 1.0 for a in st["acceptance_by_depth"])
        assert st["block_efficiency"] > 2


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_greedy_equality_other_archs_and_plain_path(arch):
    tok = char_tokenizer()
    target, other = tiny_member(arch, tokenizer=tok, seed=1), tiny_member(arch, tokenizer=tok, seed=2)
    ref = [o.text for o in target.generate(PROMPTS, max_new_tokens=30)]
    for drafter in (None, ModelDrafter(other, stop_below=0.0), ModelDrafter(target, stop_below=0.0),
                    PromptLookupDrafter()):
        g = SpeculativeGenerator(target, drafter, num_drafts=2, depth=3)
        assert [o.text for o in g.generate(PROMPTS, max_new_tokens=30)] == ref


def test_sampling_batched_equals_per_row_and_is_seeded(pair):
    target, other = pair
    g = SpeculativeGenerator(target, ModelDrafter(other, stop_below=0.0), scheme="without", num_drafts=2, depth=2)
    kw = dict(max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.95)
    both = g.generate(PROMPTS[:2], seed=11, **kw)
    again = g.generate(PROMPTS[:2], seed=11, **kw)
    assert [o.text for o in both] == [o.text for o in again]
    for i, p in enumerate(PROMPTS[:2]):
        assert g.generate([p], seed=11 + i, **kw)[0].text == both[i].text


def test_stop_strings_and_max_tokens(pair):
    target, _ = pair
    free = target.generate(["The quick brown"], max_new_tokens=20)[0].text
    stop = free[3:6]
    want = target.generate(["The quick brown"], max_new_tokens=20, stop=[stop])[0]
    g = SpeculativeGenerator(target, ModelDrafter(target, stop_below=0.0), num_drafts=2, depth=4)
    got = g.generate(["The quick brown"], max_new_tokens=20, stop=[stop])[0]
    assert (got.text, got.finish_reason) == (want.text, "stop")
    assert g.generate(["The quick brown"], max_new_tokens=5)[0].num_tokens == 5


@pytest.mark.parametrize("budget", [None, 7])
def test_model_drafter_q_is_the_drafter_distribution_at_every_node(pair, budget):
    """The drafter's tree grows level by level in one open tree (each level feeds only its new
    nodes); the q at every expanded node equals the drafter model's distribution after that node's
    path, in a batch of rows of different lengths (a chain first, then branching)."""
    _, other = pair
    ctx = [other.encode_prompt(p) for p in PROMPTS]
    drafter = ModelDrafter(other)
    gens = [torch.Generator().manual_seed(i) for i in range(len(ctx))]
    trees = drafter.draft(ctx, TreeShape("with", 2, 4, budget, stop_below=0.0), SamplingParams(1.0), gens)
    checked = 0
    for b, tree in enumerate(trees):
        for node, q in enumerate(tree.draft_probs):
            if q is None:
                continue
            with torch.no_grad():
                logits = other.model(input_ids=torch.tensor([ctx[b] + node_path(tree, node)], device=other.device)).logits[0, -1].float()
            torch.testing.assert_close(q, torch.softmax(logits, -1), atol=1e-5, rtol=1e-4)
            checked += 1
    assert checked >= len(ctx) * 3


def test_decode_continues_an_existing_state(pair):
    """decode() commits exactly the returned tokens, truncates at stop_fn, and re-syncs the drafter
    after someone else rolled the state back or extended it."""
    target, other = pair
    ids = [target.encode_prompt(p) for p in PROMPTS[:2]]
    ref_state = target.start(ids)
    ref = [[], []]
    for _ in range(12):
        toks = ref_state.next_probs(0.0).argmax(-1).tolist()
        for b in range(2):
            ref[b].append(toks[b])
        ref_state.append([[t] for t in toks])
    g = SpeculativeGenerator(target, ModelDrafter(other, stop_below=0.0), num_drafts=2, depth=3)
    state = target.start(ids)
    out = g.decode(state, 5, control=DecodeControl(stop_at_eos=False)).ids
    assert out == [r[:5] for r in ref]
    assert state.ids == [i + r[:5] for i, r in zip(ids, ref)]
    torch.testing.assert_close(state.last_logits, ref_state.member.start([i + r[:5] for i, r in zip(ids, ref)]).last_logits,
                               atol=1e-4, rtol=1e-4)
    # someone else rolls row 0 back by 2 and extends row 1 by its next greedy token
    state.rollback([len(ids[0]) + 3, len(ids[1]) + 5])
    state.append([[], [ref[1][5]]])
    out = g.decode(state, 4, control=DecodeControl(stop=lambda b, row: b == 0 and len(row.ids) == 2,
                                                   stop_at_eos=False)).ids
    assert out[0] == ref[0][3:5] and out[1] == ref[1][6:10]
    assert state.ids[0] == ids[0] + ref[0][:5] and state.ids[1] == ids[1] + ref[1][:10]


@pytest.mark.parametrize("which", ["perfect", "random", "lookup"])
def test_decode_rows_sources_and_uncommitted_last_token(pair, which):
    """decode(rows=...) leaves other rows alone; record_sources gives the distribution each token was
    drawn from (greedy: its argmax is the token); commit_last=False leaves only the last token out."""
    target, other = pair
    ids = [target.encode_prompt(p) for p in PROMPTS]
    plain = SpeculativeGenerator(target, None).decode(target.start(ids), 7, control=DecodeControl(stop_at_eos=False))
    g = SpeculativeGenerator(target, drafters(target, other)[which], num_drafts=2, depth=3)
    state = target.start(ids)
    res = g.decode(state, 7, control=DecodeControl(stop_at_eos=False, rows=[0, 2], record_sources=True,
                                                   commit_last=False))
    out = res.ids
    assert out[1] == [] and state.ids[1] == ids[1] and res.sources[1] == []
    for b in (0, 2):
        assert out[b] == plain.ids[b]
        assert [int(s.argmax()) for s in res.sources[b]] == out[b]
        assert state.ids[b] == ids[b] + out[b][: len(out[b]) - int(res.uncommitted[b])]
    assert any(res.uncommitted)
    assert plain.sources == [None] * 3 and not any(plain.uncommitted)
    assert repr(res).startswith("DecodeResult(rows=3, tokens=[7, 0, 7], sources=recorded, uncommitted=")


def test_tokenizer_mismatch_drafts_through_text():
    """A ModelDrafter drafts in the target's tokens: bound directly to a target with another tokenizer
    it refuses in one clear line; the engine instead drafts with its member through text."""
    from specdec.text_drafter import TextDrafter

    target = tiny_member("llama", tokenizer=char_tokenizer(), name="char-target")
    drafter = tiny_member("llama", tokenizer=bpe_tokenizer(), name="bpe-drafter")
    with pytest.raises(TokenizerMismatchError) as err:
        ModelDrafter(drafter).bind(target)
    msg = str(err.value)
    assert "\n" not in msg and "char-target" in msg and "bpe-drafter" in msg and "TextDrafter" in msg
    g = SpeculativeGenerator(target, ModelDrafter(drafter))
    assert isinstance(g.drafter, TextDrafter) and g.drafter.member is drafter


def test_alpha_star_reported_beside_acceptance(pair):
    target, other = pair
    g = SpeculativeGenerator(target, ModelDrafter(other, stop_below=0.0), scheme="greedy", num_drafts=2, depth=2,
                             track_alpha=True)
    st = g.generate(PROMPTS[:1], max_new_tokens=12, temperature=1.0, seed=0)[0].stats
    assert len(st["alpha_star_by_depth"]) == len(st["acceptance_by_depth"]) >= 1
    assert all(0.0 <= a <= 1.0 + 1e-9 for a in st["alpha_star_by_depth"])


@pytest.mark.slow
def test_real_smollm2_prompt_lookup_greedy_equality():
    """Real smollm2-135m (fp32, chat template): prompt lookup reproduces plain greedy decoding on 20
    real GSM8K / WMT22 prompts x 64 tokens."""
    from runtime.member import load_member

    from conftest import require_model

    require_model("smollm2-135m")
    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not data.exists():
        data = Path("/work/shared/data")
    qs = [json.loads(line)["question"] for line in (data / "gsm8k" / "test.jsonl").open()][:10]
    de = [line.strip() for line in (data / "wmt22" / "de-en.src").open()][:10]
    prompts = qs + [f"Translate German to English: {s}" for s in de]
    m = load_member("smollm2-135m", dtype="float32")
    ref = m.generate(prompts, max_new_tokens=64)
    g = SpeculativeGenerator(m, PromptLookupDrafter(), num_drafts=3, depth=6)
    outs = g.generate(prompts, max_new_tokens=64)
    assert [o.text for o in outs] == [r.text for r in ref]
    eff = sum(o.stats["block_efficiency"] for o in outs) / len(outs)
    assert eff > 1.05


def test_cli_generate_with_and_without_drafter(tmp_path, capsys):
    from eval.cli import main

    target = tiny_member("llama", tokenizer=bpe_tokenizer(), seed=0)
    folder = tmp_path / "tiny"
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    base = ["generate", "--model", str(folder), "--prompt", "The quick brown", "--max_new_tokens", "12"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--drafter", "lookup", "--drafts", "2", "--depth", "4"]) == 0
    spec = capsys.readouterr().out
    assert main(base + ["--drafter", str(folder), "--scheme", "without", "--drafts", "2", "--depth", "2",
                        "--verifier", "rrs-without", "--temperature", "0.8", "--seed", "1"]) == 0
    sampled = capsys.readouterr().out
    assert plain.splitlines()[0] == spec.splitlines()[0]  # greedy: same text
    assert "block efficiency" in spec and "tok/s" in spec and "acceptance by depth" in sampled
    assert "block efficiency" not in plain and "plain decoding" in plain  # no speculation figures without a drafter


def test_make_drafter_specs_and_default_shapes(pair):
    """One factory behind the CLI, eval configs and ensembles: specs map to drafters, run with the
    one measured default shape (model drafters cut by its stop_below)."""
    from specdec.config import DEFAULT_STOP_BELOW
    from specdec.drafters import Drafter, default_shape, make_drafter

    target, other = pair
    assert make_drafter(None) is None and make_drafter("none") is None
    look = make_drafter("lookup")
    assert isinstance(look, PromptLookupDrafter) and look.ngram_min == 2 and look.min_length == 2
    assert default_shape(look) == DEFAULT_SHAPE == TreeShape("greedy", 1, 8, None, DEFAULT_STOP_BELOW)
    model = make_drafter(other)
    assert isinstance(model, ModelDrafter) and model.member is other and model.stop_below is None
    loaded = []
    hybrid = make_drafter("hybrid:tiny", load=lambda name, **kw: loaded.append((name, kw)) or other)
    assert isinstance(hybrid, HybridDrafter) and hybrid.model.member is other and loaded == [("tiny", {})]
    assert make_drafter(look) is look and isinstance(look, Drafter)
    g = SpeculativeGenerator(target, model, default_shape(model))
    assert g.shape == SpeculativeGenerator(target, model).shape == DEFAULT_SHAPE  # one default
    ref = target.generate(PROMPTS, max_new_tokens=16)
    assert [o.text for o in g.generate(PROMPTS, max_new_tokens=16)] == [r.text for r in ref]


@pytest.mark.parametrize("fmt", ["int8", "fp16"])
def test_quantized_specs_load_through_the_given_loader(pair, fmt):
    """'NAME@FMT' and 'hybrid:NAME@FMT' load NAME with the caller's loader, float32 and unpacked, and
    quantize it (decoder layers and LM head); the generator's output is the target's own."""
    from specdec.drafters import make_drafter

    target, other = pair
    loaded = []
    load = lambda name, **kw: loaded.append((name, kw)) or other  # noqa: E731
    d = make_drafter(f"tiny@{fmt}", load=load)
    h = make_drafter(f"hybrid:tiny@{fmt}", load=load)
    assert loaded == [("tiny", {"dtype": "float32", "pack_weights": False})] * 2
    assert isinstance(d, ModelDrafter) and d.member.name == f"{other.name}-{fmt}"
    assert isinstance(h, HybridDrafter) and h.model.member.name == f"{other.name}-{fmt}"
    head = d.member.model.get_output_embeddings()
    assert type(head).__module__.startswith("torch.ao.nn.quantized"), type(head)
    ref = target.generate(PROMPTS[:1], max_new_tokens=8)[0].text
    assert SpeculativeGenerator(target, d).generate(PROMPTS[:1], max_new_tokens=8)[0].text == ref


def test_fp16_drafter_keeps_the_float32_argmax(pair):
    """fp16 weights with float32 activations: the drafter's next-token law stays within float16
    rounding of the float32 one, so its greedy drafts are (almost always) the float32 drafter's."""
    from specdec.drafters import quantize_drafter

    _, other = pair
    q = quantize_drafter(other, "fp16")
    ids = torch.tensor([[5, 17, 3, 9, 22, 40, 7]])
    with torch.no_grad():
        ref = torch.log_softmax(other.model(ids).logits.float(), -1)
        got = torch.log_softmax(q.model(ids).logits.float(), -1)
    assert (ref - got).abs().max() < 2e-2
    assert torch.equal(ref.argmax(-1), got.argmax(-1))


def test_parse_drafter_spec_grammar_and_bad_specs(pair, tmp_path):
    from specdec.drafters import make_drafter, parse_drafter_spec

    _, other = pair
    cases = {None: ("none", None), "": ("none", None), "none": ("none", None), "lookup": ("lookup", None),
             "qwen2.5-coder-0.5b": ("model", "qwen2.5-coder-0.5b"), "Qwen/Qwen2.5-0.5B": ("model", "Qwen/Qwen2.5-0.5B"),
             "m@int8": ("model-int8", "m"), "hybrid:m": ("hybrid", "m"), "hybrid:m@int8": ("hybrid-int8", "m"),
             "m@fp16": ("model-fp16", "m"), "hybrid:m@fp16": ("hybrid-fp16", "m"),
             str(tmp_path): ("model", str(tmp_path)), f"hybrid:{tmp_path}@int8": ("hybrid-int8", str(tmp_path))}
    for spec, want in cases.items():
        assert tuple(parse_drafter_spec(spec)) == want, spec
    assert parse_drafter_spec(other).kind == "member" and parse_drafter_spec(PromptLookupDrafter()).kind == "drafter"
    for bad in ("m@int4", "hybrid:", "hybrid:lookup", "hybrid:none", "lookup:3", "hybird:m", "hybrid:hybrid:m", "m@",
                "@int8", "@fp16", "m@fp32", "m@bf16", 3, ("a", "b")):
        with pytest.raises(ConfigError) as err:
            make_drafter(bad, load=lambda name, **kw: pytest.fail(f"loaded {name}"))
        assert "\n" not in str(err.value) and "drafter" in str(err.value), bad


def test_tree_shape_validation_keywords_and_reprs(pair):
    target, other = pair
    for bad in (dict(scheme="sideways"), dict(num_drafts=0), dict(depth=-1), dict(stop_below=1.0),
                dict(node_budget=-2), dict(num_drafts=1.5)):
        with pytest.raises(ValueError):
            TreeShape(**bad)
    g = SpeculativeGenerator(target, ModelDrafter(other), TreeShape(depth=3), num_drafts=2, scheme="without")
    assert g.shape == TreeShape("without", 2, 3, None, DEFAULT_SHAPE.stop_below) and g.verifier == "rrs-without"
    with pytest.raises(ValueError, match="lossless only"):
        SpeculativeGenerator(target, None, scheme="with", verifier="greedy")
    # a model drafter's own stop_below wins over the shape's; without one it follows the shape
    assert g.stop_below == DEFAULT_SHAPE.stop_below
    assert SpeculativeGenerator(target, ModelDrafter(other, stop_below=0.1), stop_below=0.3).stop_below == 0.1
    assert SpeculativeGenerator(target, HybridDrafter(ModelDrafter(other)), stop_below=0.3).stop_below == 0.3
    assert repr(DecodeControl(rows=[0, 2])) == ("DecodeControl(stop=False, stop_at_eos=True, rows=2, draft_depth=False, "
                                               "commit_last=True, record_sources=False)")
    res = g.decode(target.start([target.encode_prompt(p) for p in PROMPTS[:2]]), 3)
    assert repr(res.rows[0]).startswith("RowResult(ids=3, sources=none") and "RowStats(steps=" in repr(res.stats[0])


@pytest.mark.parametrize("which", ["perfect", "random", "lookup", "hybrid"])
def test_draft_continuations_are_the_drafters_greedy_chains(pair, which):
    """`draft_continuations`: per branch, the drafter's own greedy continuation of context + branch,
    cut where `keep` says no, `depth` at most; rows with a None context get none. Twice in a row (the
    model drafter's state after an open tree must sync again)."""
    target, other = pair
    drafter = drafters(target, other)[which]
    drafter.bind(target)
    model = {"perfect": target, "random": other, "hybrid": other}.get(which)
    ctx = [target.encode_prompt(p) for p in PROMPTS]
    branches = [[[5], [9, 11]], [[7]], [[3], [4]]]
    contexts = [ctx[0], None, ctx[2] + ctx[2]]  # (row 2 repeats itself: lookup finds something there)
    depth = [[4, 2], [3], [3, 0]]
    keep = lambda b, i, d: d[-1] != 13  # noqa: E731  (a stop rule)
    for _ in range(2):
        out = drafter.draft_continuations(contexts, branches, depth, keep)
        assert len(out[1][0]) == 0 and out[2][1] == []
        for b, row in enumerate(out):
            for i, d in enumerate(row):
                assert len(d) <= depth[b][i] and 13 not in d
                if model is not None and contexts[b] is not None and depth[b][i] and (which != "hybrid" or d):
                    st = model.start([contexts[b] + branches[b][i]])
                    ref = []
                    for _ in range(depth[b][i]):
                        tok = int(st.next_probs(0.0)[0].argmax())
                        if tok == 13:
                            break
                        ref.append(tok)
                        st.append([[tok]])
                    if which != "hybrid" or d == ref[: len(d)]:
                        assert d == ref
        if which == "perfect":
            assert all(len(d) for b, i in ((0, 0), (0, 1), (2, 0)) for d in [out[b][i]])
        if which == "lookup":  # row 2: "…ctx + [3]" is found earlier in the same context
            ref = drafter.continuations(contexts[2] + [3], 1, 3)
            assert out[2][0] == (ref[0][: next((k for k, t in enumerate(ref[0]) if t == 13), 3)] if ref else [])
