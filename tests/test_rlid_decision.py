"""RLiD's decision plane: labels and realisations, the option law, prompts, the one-forward decision
model (batched = per state, gradients) and the token-level generate-and-parse policy."""
from __future__ import annotations

import copy

import pytest
import torch

from rlid.decision_model import DecisionModel
from rlid.menu import labels, menu_realisations, realisations
from rlid.option_law import batched_option_log_probs, margin, option_log_probs, unpad
from rlid.prompt import ANSWER_CUE, action_text, decision_text
from rlid.token_policy import TokenAction, TokenPolicy, parse_action
from rlid.types import DecisionState
from runtime.errors import ConfigError
from test_rlid_helpers import assert_gradients_reach_every_parameter
from runtime.testing import bpe_tokenizer, char_tokenizer, pieces_tokenizer, tiny_member

STATES = [
    DecisionState("Numbers: 3 4 7. Target 14.", ("3 + 4 = 7", "7 * 3 = 21", "7 - 4 = 3"), instruction="Reach the target."),
    DecisionState("Grid:\n#####\n#@ $.#\n#####", ("up", "down", "left", "right", "wait"), memory="moved left"),
    DecisionState("x", ("only",)),
    DecisionState("A much longer observation that spans a good many more tokens than the others do.", ("a", "b")),
]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def member():
    return tiny_member("llama", bpe_tokenizer(), seed=3)


# ---- menu --------------------------------------------------------------------------------------
def test_labels_letters_and_numbers():
    assert labels(3) == ("A", "B", "C")
    assert labels(28)[25:] == ("Z", "AA", "AB")
    assert labels(53)[-1] == "BA"
    assert labels(3, "numbers") == ("1", "2", "3")
    with pytest.raises(ConfigError, match="label_style"):
        labels(3, "roman")


@pytest.mark.parametrize("tok", [char_tokenizer(), bpe_tokenizer()], ids=["char", "bpe"])
@pytest.mark.parametrize("with_action", [False, True])
def test_menu_realisations_are_disjoint_and_contain_the_label(tok, with_action):
    labs = labels(6)
    acts = ["up", "down", "left", "right", "push up", "undo"]
    sets = menu_realisations(tok, labs, acts, with_action)
    flat = [t for s in sets for t in s]
    assert len(flat) == len(set(flat))
    for lab, s in zip(labs, sets):
        assert tok(lab, add_special_tokens=False)["input_ids"][0] in s
        assert all(tok.decode([t]).strip() for t in s)  # no whitespace-only token names an option


def test_realisations_of_one_label_spaces_and_case():
    pieces = ("</s>", " ", "A", "B", "a", "b", "u", "p", " A", " a", " up", "up")
    tok = pieces_tokenizer(pieces, ((" ", "A"), (" ", "a"), ("u", "p"), (" ", "up")))
    ids = {p: i for i, p in enumerate(pieces)}
    assert realisations(tok, "A") == [ids["A"], ids[" A"], ids["a"], ids[" a"]]
    assert realisations(tok, "A", "up", with_action=True)[-1] == ids[" up"]
    # " B" is spelled " " + "B": its first token is a bare space, which names no option
    assert realisations(tok, "B") == [ids["B"], ids["b"]]
    assert realisations(tok, "A", lower_case=False) == [ids["A"], ids[" A"]]


def test_shared_tokens_are_dropped_and_labels_take_precedence():
    pieces = ("</s>", " ", "A", "B", "C", "a", "b", "c", "x", " A", " B", " x")
    tok = pieces_tokenizer(pieces, ((" ", "A"), (" ", "B"), (" ", "x")))
    ids = {p: i for i, p in enumerate(pieces)}
    # option C's action text starts with " A" (option A's label variant): the label keeps it;
    # options A and B both start their action with " x": dropped from both
    sets = menu_realisations(tok, ("A", "B", "C"), ["x1", "x2", "A3"], with_action=True)
    assert sets == [[ids["A"], ids[" A"], ids["a"]], [ids["B"], ids[" B"], ids["b"]], [ids["C"], ids["c"]]]


def test_labels_sharing_a_first_token_are_refused():
    with pytest.raises(ConfigError, match="'1' and '10' start with the same token"):
        menu_realisations(char_tokenizer(), labels(12, "numbers"))
    with pytest.raises(ConfigError, match="'A' and 'AA'"):
        menu_realisations(char_tokenizer(), labels(27))


# ---- option law --------------------------------------------------------------------------------
def _random_menus(gen, V, sizes):
    perm = torch.randperm(V, generator=gen).tolist()
    menus, k = [], 0
    for n in sizes:
        menu = []
        for _ in range(n):
            r = int(torch.randint(1, 4, (1,), generator=gen))
            menu.append(perm[k: k + r])
            k += r
        menus.append(menu)
    return menus


def test_option_law_sums_to_one_and_is_the_marginal_over_realisations():
    gen = torch.Generator().manual_seed(0)
    V = 97
    for trial in range(20):
        logits = torch.randn(V, generator=gen, dtype=torch.float64) * 3
        (menu,) = _random_menus(gen, V, [int(torch.randint(1, 8, (1,), generator=gen))])
        lp = option_log_probs(logits, menu)
        assert abs(float(lp.exp().sum()) - 1) < 1e-6
        p = torch.softmax(logits, -1)
        mass = torch.stack([sum(p[r] for r in toks) for toks in menu])  # hand: the full softmax
        torch.testing.assert_close(lp.double(), (mass / mass.sum()).log(), atol=1e-6, rtol=0)


def test_batched_option_law_pads_with_minus_inf_and_equals_per_menu():
    gen = torch.Generator().manual_seed(1)
    sizes = [3, 1, 5, 2]
    logits = torch.randn(len(sizes), 60, generator=gen)
    menus = _random_menus(gen, 60, sizes)
    padded = batched_option_log_probs(logits, menus)
    assert padded.shape == (4, 5)
    for b, (row, n) in enumerate(zip(unpad(padded, sizes), sizes)):
        torch.testing.assert_close(row, option_log_probs(logits[b], menus[b]), atol=1e-6, rtol=0)
        assert torch.isinf(padded[b, n:]).all() and abs(float(row.exp().sum()) - 1) < 1e-6
    logits.requires_grad_(True)
    batched_option_log_probs(logits, menus)[0, 0].backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[1:].abs().sum() == 0
    torch.testing.assert_close(margin(padded[1]), torch.tensor(1.0))
    p = padded.exp()
    top = p.sort(-1, descending=True).values
    torch.testing.assert_close(margin(padded)[[0, 2, 3]], (top[:, 0] - top[:, 1])[[0, 2, 3]])


# ---- prompts -----------------------------------------------------------------------------------
def test_prompts_are_deterministic_and_carry_every_part():
    s = STATES[1]
    text = decision_text(s, labels(5))
    assert text == decision_text(s, labels(5))
    assert "A. up\nB. down" in text and "E. wait" in text and "Memory:\nmoved left" in text
    assert text.endswith(ANSWER_CUE) and s.observation in text
    plain = action_text(s)
    assert "- up\n- down" in plain and "exactly as written" in plain and "A. up" not in plain


def test_menu_notes_follow_their_actions_in_both_prompts():
    s = DecisionState("board", ("up", "left"), notes=("you step to row 1", "you push the box"))
    assert "A. up (you step to row 1)\nB. left (you push the box)" in decision_text(s, labels(2))
    assert "- up (you step to row 1)\n- left (you push the box)" in action_text(s)
    assert "(" not in decision_text(DecisionState("board", ("up", "left")), labels(2))
    with pytest.raises(ValueError, match="1 notes for a menu of 2 actions"):
        DecisionState("board", ("up", "left"), notes=("x",))


def test_prompt_uses_the_members_chat_template():
    tok = copy.deepcopy(bpe_tokenizer())
    tok.chat_template = "{% for m in messages %}<<{{ m['role'] }}>> {{ m['content'] }}\n{% endfor %}<<assistant>>"
    from runtime.member import Member
    from runtime.testing import tiny_model

    m = Member(tiny_model("llama", vocab_size=len(tok)), tok)
    dm = DecisionModel(m)
    prompt = dm.prompt(STATES[0])
    assert prompt.startswith("<<user>> Reach the target.") and prompt.endswith("Answer:\n<<assistant>>")
    assert dm.prompt_ids(STATES[0]) == m.encode(prompt)


# ---- decision model ----------------------------------------------------------------------------
def _tiny_gpt2(tok):
    """GPT-2 style (absolute position embeddings: wrong position ids under left padding show)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from runtime.member import Member

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=512,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    return Member(GPT2LMHeadModel(cfg).eval(), tok, name="tiny-gpt2")


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_batched_laws_equal_per_state_laws(arch):
    m = _tiny_gpt2(bpe_tokenizer()) if arch == "gpt2" else tiny_member(arch, bpe_tokenizer(), seed=1)
    dm = DecisionModel(m)
    ids = [dm.prompt_ids(s) for s in STATES]
    assert len({len(i) for i in ids}) == len(ids)  # prompts of different lengths: padding is exercised
    with torch.no_grad():
        batched_logits = dm.last_logits(ids)
        for b, one in enumerate(ids):
            alone = m.model(torch.tensor([one])).logits[0, -1]
            torch.testing.assert_close(batched_logits[b], alone, atol=1e-5, rtol=0)
        batched = dm.laws(STATES)
        for s, law in zip(STATES, batched):
            (single,) = dm.laws([s])
            assert law.labels == labels(len(s.actions)) and law.log_probs.shape == (len(s.actions),)
            torch.testing.assert_close(law.log_probs, single.log_probs, atol=1e-5, rtol=0)
            assert abs(float(law.probs.sum()) - 1) < 1e-6


def test_from_pretrained_folder_packed_for_rollouts_plain_for_training(tmp_path, member):
    member.model.save_pretrained(tmp_path)
    member.tokenizer.save_pretrained(tmp_path)
    packed = DecisionModel.from_pretrained(str(tmp_path))
    plain = DecisionModel.from_pretrained(str(tmp_path), trainable=True, label_style="numbers")
    def kinds(dm):
        return {type(x).__name__ for x in dm.member.model.modules() if "Linear" in type(x).__name__}

    assert kinds(packed) == {"PackedLinear"} and kinds(plain) == {"Linear"}
    with torch.no_grad():
        want = DecisionModel(member).laws(STATES)
        for law, ref in zip(packed.laws(STATES), want):
            torch.testing.assert_close(law.log_probs, ref.log_probs, atol=1e-5, rtol=0)
    with torch.enable_grad():
        plain.laws(STATES)[1].log_probs[0].backward()
    assert plain.laws(STATES[:1])[0].labels == ("1", "2", "3")
    assert all(p.grad is not None for p in plain.member.model.parameters())


def test_laws_through_a_peft_lora_wrapper_train_only_the_adapters():
    from peft import LoraConfig, get_peft_model

    m = tiny_member("llama", bpe_tokenizer(), seed=1)
    m.model = get_peft_model(m.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    dm = DecisionModel(m)
    with torch.enable_grad():
        laws = dm.laws(STATES)
        laws[1].log_probs[2].backward()
    with torch.no_grad():
        torch.testing.assert_close(laws[3].log_probs.detach(), dm.laws(STATES[3:])[0].log_probs, atol=1e-5, rtol=0)
    with_grad = {n for n, p in m.model.named_parameters() if p.grad is not None}
    assert with_grad and all("lora_" in n for n in with_grad)


def test_one_forward_per_call_and_counters(member):
    dm = DecisionModel(member)
    with torch.no_grad():
        dm.laws(STATES)
        dm.laws(STATES[:2])
    assert (dm.counters.calls, dm.counters.forwards, dm.counters.decisions) == (2, 2, 6)
    assert dm.counters.tokens == sum(len(dm.prompt_ids(s)) for s in STATES + STATES[:2])
    assert dm.counters.forwards_per_decision == pytest.approx(2 / 6) and dm.counters.decisions_per_second > 0


def test_law_marginalises_the_models_own_softmax(member):
    dm = DecisionModel(member, realise_action_text=True)
    s = STATES[1]
    with torch.no_grad():
        (law,) = dm.laws([s])
        p = torch.softmax(member.model(torch.tensor([dm.prompt_ids(s)])).logits[0, -1], -1)
    mass = torch.stack([p[r].sum() for r in dm.realisations(s)])
    torch.testing.assert_close(law.probs, mass / mass.sum(), atol=1e-6, rtol=0)
    assert any(len(r) > 2 for r in dm.realisations(s))  # action-text tokens joined some options


def test_gradient_flows_to_parameters_only_when_enabled(member):
    dm = DecisionModel(member)
    member.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert dm.laws(STATES)[0].log_probs.grad_fn is None
    with torch.enable_grad():
        laws = dm.laws(STATES)
        (laws[0].log_probs[1] + laws[1].log_probs[4]).backward()
    assert_gradients_reach_every_parameter(member.model)


def test_choose_greedy_is_argmax_and_sampling_follows_the_generator(member):
    dm = DecisionModel(member)
    with torch.no_grad():
        picks, laws = dm.choose(STATES, greedy=True)
        assert picks == [int(law.probs.argmax()) for law in laws]
        a = dm.choose(STATES * 8, generator=torch.Generator().manual_seed(5))[0]
        b = dm.choose(STATES * 8, generator=torch.Generator().manual_seed(5))[0]
    assert a == b and all(0 <= i < len(s.actions) for i, s in zip(a, STATES * 8))
    assert len(set(a[1::4])) > 1  # the 5-option state is sampled, not argmaxed


def test_bad_label_style_and_empty_menu_fail_clearly(member):
    with pytest.raises(ConfigError, match="label_style"):
        DecisionModel(member, label_style="greek")
    with pytest.raises(ValueError, match="empty menu"):
        DecisionModel(member).laws([DecisionState("x", ())])


# ---- token-level policy ------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("up", 0), (" up\n", 0), ("Up", 0), ("UP.", 0), ('"down"', 1), ("- left", 2), ("\n\n right \nmore", 3),
    ("push  up", 4), ("`push up`", 4), ("upward", None), ("", None), ("up or down", None), ("3 + 4 = 7", 5),
    ("3+4=7", None), ("(1, 2).", 6),
])
def test_parse_action(text, expected):
    acts = ["up", "down", "left", "right", "push up", "3 + 4 = 7", "(1, 2)"]
    assert parse_action(text, acts) == expected


def test_parse_action_takes_an_action_copied_with_its_note_only_where_the_menu_had_notes():
    acts = ["up", "down", "push up"]
    assert parse_action("up (you step to row 1", acts, notes=True) == 0
    assert parse_action("Push up (the box moves", acts, notes=True) == 2
    assert parse_action("up (you step to row 1", acts) is None   # no notes shown: as before
    assert parse_action("upward (x", acts, notes=True) is None


def test_parse_action_refuses_ambiguous_normalisations():
    assert parse_action("up", ["Up", "UP"]) is None  # two actions match up to case
    assert parse_action("UP", ["Up", "UP"]) == 1     # an exact match wins
    assert parse_action("x", ["X", "x."]) == 0       # the earlier tier (case) decides first


def _hand_log_prob(model, prompt, output):
    total, seq = 0.0, list(prompt)
    for tok in output:
        logits = model(torch.tensor([seq])).logits[0, -1]
        total += float(torch.log_softmax(logits.double(), -1)[tok])
        seq.append(tok)
    return total


def test_token_policy_sequence_log_probs_equal_a_hand_loop(member):
    tp = TokenPolicy(member, max_new_tokens=6)
    with torch.no_grad():
        acts = tp.act(STATES, greedy=False, generator=torch.Generator().manual_seed(2))
        acts.append(TokenAction("x", None, tp.prompt_ids(STATES[0]), acts[0].output_ids[:1]))
        hand = torch.tensor([_hand_log_prob(member.model, a.prompt_ids, a.output_ids) for a in acts], dtype=torch.float64)
    assert len({len(a.output_ids) for a in acts}) > 1  # outputs of different lengths: padding is exercised
    with torch.enable_grad():
        lp = tp.sequence_log_probs(acts)
        lp.sum().backward()
    torch.testing.assert_close(lp.detach().double(), hand, atol=1e-4, rtol=0)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in member.model.parameters())
    member.model.zero_grad(set_to_none=True)


def _hand_greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_token_policy_batched_greedy_equals_per_state_and_a_hand_loop(arch, member):
    m = _tiny_gpt2(bpe_tokenizer()) if arch == "gpt2" else member
    tp = TokenPolicy(m, max_new_tokens=5)
    with torch.no_grad():
        batched = tp.act(STATES, greedy=True)
        alone = [tp.act([s], greedy=True)[0] for s in STATES]
        hand = [_hand_greedy(m.model, a.prompt_ids, len(a.output_ids)) for a in alone]
    assert [a.output_ids for a in batched] == [a.output_ids for a in alone] == hand
    for s, a in zip(STATES, batched):
        assert a.prompt_ids == tp.prompt_ids(s) and 1 <= len(a.output_ids) <= 5
        assert a.index == parse_action(a.text, s.actions)
    assert tp.counters.decisions == 2 * len(STATES) and tp.counters.forwards >= 2


def _script_head(member, scripts):
    """Force row b's k-th generated token to `scripts[b][k]` (a char, or None for EOS) through a hook
    on the LM head; returns the hook handle."""
    calls = [0]

    def hook(module, args, out):
        for b, script in enumerate(scripts):
            k = min(calls[0], len(script) - 1)
            tok = member.tokenizer.eos_token_id if script[k] is None else \
                member.tokenizer.convert_tokens_to_ids(script[k])
            out[b, -1, tok] += 1000.0
        calls[0] += 1
        return out

    return member.model.get_output_embeddings().register_forward_hook(hook)


def test_token_policy_stops_at_eos_newline_after_text_or_the_cap_and_parses():
    m = tiny_member("llama", char_tokenizer(), seed=0)
    tp = TokenPolicy(m, max_new_tokens=12)
    scripts = [list("3 + 4 = 7\nx"), list("\n up\nmore"), [None], list("b" * 20)]
    handle = _script_head(m, scripts)
    try:
        with torch.no_grad():
            acts = tp.act(STATES, greedy=True)
    finally:
        handle.remove()
    assert [m.decode(a.output_ids) for a in acts] == ["3 + 4 = 7\n", "\n up\n", "</s>", "b" * 12]
    assert [a.text for a in acts] == ["3 + 4 = 7", "\n up", "", "b" * 12]
    assert [a.index for a in acts] == [0, 0, None, None]
    assert tp.counters.forwards == 12  # one prefill + 11 decode steps until the capped row ends
