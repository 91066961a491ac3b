"""Word-level ensembling (`adafuse`, `word-fixed`) on tiny in-process members with deliberately
different tokenizers (character-level vs byte-level BPE): gate, span, candidate union, scoring,
boundary repair, batching, text invariants, knobs and config errors."""
import pytest
import torch

from adafuse.ensemble import Ensemble
from runtime.errors import ConfigError
from adafuse.methods.word_level import EnsembledWord, LeadDecoder, WordConfig
from runtime.testing import bpe_tokenizer, char_tokenizer
from test_adafuse_helpers import fresh_next_probs, scripted_member

P = "Question: what is 16*16?\nAnswer:"
SCRIPT = " 16*16 = 256\n-3 + 4 = 1\n\nShe has 18 apples."
PROMPTS = [P, "The quick brown fox"]


@pytest.fixture(scope="module")
def scripted():
    return (scripted_member(bpe_tokenizer(), SCRIPT, P, "bpe-script"),
            scripted_member(char_tokenizer(), SCRIPT, P, "char-script"))


def units(out):
    return "".join("".join(r.units) for r in out.trace)


def decisions(out):
    return [g["decision"] for r in out.trace for g in r.gate]


# ---- text invariants ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["word-fixed", "adafuse"])
def test_output_is_exactly_the_committed_units(scripted, method):
    out = Ensemble(list(scripted), method=method).generate([P], max_new_tokens=200)[0]
    assert out.text == SCRIPT                 # " =", "-", "+" at span starts kept, newlines kept
    assert units(out) == out.text             # byte for byte the concatenation of committed units
    assert out.text.count("She") == 1 and out.finish_reason == "eos"
    ensembled = [r.units[0] for r in out.trace if r.kind == "ensemble" and r.units]
    if method == "word-fixed":
        assert " =" in ensembled and "-3" in ensembled and " +" in ensembled and "\n\n" in ensembled


def test_stop_string_cuts_text_and_trace(scripted):
    out = Ensemble(list(scripted), method="word-fixed").generate([P], max_new_tokens=200, stop=["\n\nShe"])[0]
    assert out.text == SCRIPT[: SCRIPT.index("\n\nShe")]
    assert units(out) == out.text and out.finish_reason == "stop"


def test_length_limit_counts_lead_tokens(spacey):
    out = Ensemble(list(spacey), threshold=0.05).generate([P], max_new_tokens=8)[0]
    lead = spacey[0]
    assert out.finish_reason == "length" and out.num_tokens == len(lead.encode(out.text)) >= 8
    assert units(out) == out.text


# ---- gate and span ------------------------------------------------------------------------------
def test_gate_and_span_on_confident_script(scripted):
    # the scripted lead is sure of every token: margin ~1 >= 0.7
    out = Ensemble(list(scripted), span=3).generate([P], max_new_tokens=200)[0]
    d = decisions(out)
    assert d[:4] == ["confident"] * 3 + ["forced"]
    assert max(len(r.units) for r in out.trace if r.kind == "confident") == 3
    out1 = Ensemble(list(scripted), span=1).generate([P], max_new_tokens=200)[0]
    assert decisions(out1)[:4] == ["confident", "forced"] * 2
    assert out1.text == out.text == SCRIPT
    out0 = Ensemble(list(scripted), span=0).generate([P], max_new_tokens=200)[0]
    assert set(decisions(out0)) == {"forced"}


def test_threshold_switches_between_confident_and_ensemble(spacey):
    lo = Ensemble(list(spacey), threshold=0.0, span=100).generate([P], max_new_tokens=8)[0]
    hi = Ensemble(list(spacey), threshold=1.0).generate([P], max_new_tokens=6)[0]
    assert set(decisions(lo)) == {"confident"} and all(r.kind == "confident" for r in lo.trace)
    assert set(decisions(hi)) == {"uncertain"} and all(r.kind == "ensemble" for r in hi.trace)
    margins = [g["margin"] for r in hi.trace for g in r.gate]
    assert all(0.0 <= m < 1.0 for m in margins)
    # the confident path is the lead alone: its text equals the lead's own greedy word by word
    alone = spacey[0].generate([P], max_new_tokens=len(spacey[0].encode(lo.text)))[0]
    assert alone.text.startswith(lo.text) or lo.text.startswith(alone.text)
    # the non-lead member did no work while the lead was confident (lazy catch-up)
    assert lo.cost.forward_passes[spacey[1].name] <= 1


# ---- candidates and scoring ---------------------------------------------------------------------
def test_candidate_union_and_scores(spacey):
    out = Ensemble(list(spacey), method="word-fixed", candidates=3, calibration="none").generate(
        [P], max_new_tokens=6)[0]
    names = {m.name for m in spacey}
    for r in out.trace:
        if r.kind != "ensemble" or r.chosen == "<eos>":
            continue
        texts = [c.text for c in r.candidates]
        assert len(texts) == len(set(texts))                               # dedup by exact text
        assert 1 <= len(texts) <= 6
        assert {n for c in r.candidates for n in c.proposed_by} == names     # both members proposed
        for c in r.candidates:
            assert set(c.scores) == names                                  # every member scored every one
            assert c.fused == pytest.approx(sum(c.scores.values()) / 2, abs=1e-3)
        best = max(r.candidates, key=lambda c: c.fused)
        assert r.chosen == best.text and r.units == [best.text]


def test_scoring_is_at_most_one_forward_per_member_per_round(spacey, monkeypatch):
    calls = []
    score, commit = EnsembledWord.score, EnsembledWord.commit

    def counting(fn, label):
        def wrapped(self, handed, *rest):  # score(proposal) / commit(scored, picks)
            proposal = handed if label == "score" else handed.proposal
            before = [m.counters.forward_passes for m in self.members]
            result = fn(self, handed, *rest)
            calls.append((label, [m.counters.forward_passes - x for m, x in zip(self.members, before)],
                          sum(len(c) for c in proposal.cands.values()), len(proposal.rows)))
            return result
        return wrapped

    monkeypatch.setattr(EnsembledWord, "score", counting(score, "score"))
    monkeypatch.setattr(EnsembledWord, "commit", counting(commit, "commit"))
    out = Ensemble(list(spacey), method="word-fixed", max_word_tokens=6).generate(PROMPTS, max_new_tokens=10)
    scores = [c for c in calls if c[0] == "score"]
    commits = [c for c in calls if c[0] == "commit"]
    assert len(scores) == max(sum(1 for r in o.trace if r.kind == "ensemble") for o in out)
    # one forward per member for all rows and candidates; the non-lead always (the lead adds
    # candidates after it completed its own), the lead only if its completion tree lacks one
    assert all(fw[1] == 1 and fw[0] <= 1 for _, fw, _, _ in scores)
    assert max(n for _, _, n, _ in scores) > 4 and max(r for *_, r in scores) == 2
    # keeping the chosen branch costs no forward (a boundary repair, when needed, at most one)
    assert all(max(fw) <= 1 for _, fw, _, _ in commits) and sum(sum(fw) for _, fw, _, _ in commits) < len(commits)


def test_scoring_feeds_only_candidates_missing_from_the_completion_tree(spacey, monkeypatch):
    """A non-lead's completion tree stays open: scoring extends it by the candidates it lacks
    (the other members' words), so it feeds fewer tokens than a tree of all candidates."""
    from adafuse.methods.word_level import continuation_ids
    from runtime.open_tree import TokenTrie
    fed, full = [], []
    score = EnsembledWord.score

    def counting(self, proposal):
        m = 1 - self.lead
        built = TokenTrie(len(self.batch.texts))
        for b in proposal.rows:
            for c in proposal.cands[b]:
                if not c.eos:
                    built.add(b, continuation_ids(self.batch.views[m], b, c.text))
        before = self.members[m].counters.tokens_processed
        result = score(self, proposal)
        fed.append(self.members[m].counters.tokens_processed - before)
        full.append(sum(len(t) for t in built.tokens))
        return result

    monkeypatch.setattr(EnsembledWord, "score", counting)
    Ensemble(list(spacey), method="word-fixed", max_word_tokens=4).generate(PROMPTS, max_new_tokens=10)
    assert all(f <= n for f, n in zip(fed, full)) and sum(fed) < sum(full)


@pytest.mark.parametrize("lead", [0, 1])
def test_lead_scores_from_its_completion_tree(scripted, monkeypatch, lead):
    """The lead completes its words last, through a tree holding the other members' candidates: when
    that tree holds every candidate, scoring costs the lead no forward, and the output is unchanged."""
    fws = []
    score = EnsembledWord.score

    def counting(self, proposal):
        before = self.members[self.lead].counters.forward_passes
        result = score(self, proposal)
        fws.append(self.members[self.lead].counters.forward_passes - before)
        return result

    monkeypatch.setattr(EnsembledWord, "score", counting)
    out = Ensemble(list(scripted), method="word-fixed", lead=lead).generate([P, P], max_new_tokens=200)
    assert [o.text for o in out] == [SCRIPT, SCRIPT]
    # (not every round: a byte-level first token like a lone UTF-8 lead byte re-encodes differently)
    assert fws.count(0) >= len(fws) // 3 and max(fws) <= 1


def naive_word(member, ids, first, max_word_tokens):
    """Greedy completion of `first` to the word boundary by full re-encoding (the reference)."""
    from adafuse.words import word_end
    br, text = [first], member.decode([first])
    end = word_end(text)
    if end is not None or max_word_tokens <= 1:
        return text[:end] if end is not None else text
    while True:
        nxt = int(fresh_next_probs(member, ids + br).argmax())
        if nxt in member.eos_token_ids:
            return text
        new = member.decode(br + [nxt])
        end = word_end(new)
        if end is not None:
            return new[:end] if end > len(text) else text
        br.append(nxt)
        text = new
        if len(br) >= max_word_tokens:
            return new


def naive_logprobs(member, ids, cont):
    with torch.no_grad():
        lp = member.model(input_ids=torch.tensor([ids + cont])).logits[0].float().log_softmax(-1)
    return lp[len(ids) - 1: len(ids) - 1 + len(cont)].gather(-1, torch.tensor(cont)[:, None]).squeeze(-1)


@pytest.mark.parametrize("lead,method", [(0, "word-fixed"), (1, "word-fixed"), (0, "adafuse"), (1, "adafuse")])
def test_candidates_and_scores_equal_a_fresh_reference(spacey, lead, method, monkeypatch):
    """Every ensembled round's candidates are exactly the union of each member's top-B first tokens
    completed greedily to the word end, and every score is the member's log-prob of the candidate's
    tokens: both recomputed from scratch (full re-encoding, no cache, no trees). With the gate on
    (a mixed batch), the lead's candidates of waiting rows are advanced in its confident forwards."""
    rides = []
    ride = LeadDecoder._ride
    monkeypatch.setattr(LeadDecoder, "_ride", lambda self, *a: rides.append(1) or ride(self, *a))
    cfg = WordConfig(gate=False, max_word_tokens=4, calibration="none")
    gate = dict(threshold=[0.06, 0.02][lead]) if method == "adafuse" else {}  # mixed batches
    outs = Ensemble(list(spacey), method=method, lead=lead, max_word_tokens=4,
                    calibration="none", **gate).generate(PROMPTS, max_new_tokens=12)
    assert (len(rides) > 0) == (method == "adafuse")
    assert rounds_checked_against_fresh_reference(spacey, outs, cfg) > 20


def rounds_checked_against_fresh_reference(members, outs, cfg) -> int:
    """Check every ensembled round of `outs` (generated from PROMPTS) against a reference recomputed
    from scratch: candidates = each member's top-B first tokens completed greedily to the word end,
    scores = the members' log-probs of each candidate. Returns how many scores were checked."""
    from adafuse.scoring import normalised_score
    from runtime.text_state import MemberText
    prompt_ids = [MemberText(m, PROMPTS, chat=None).prompt_ids for m in members]
    checked = 0
    for b, out in enumerate(outs):
        prefix = ""
        for r in out.trace:
            if r.kind == "ensemble" and r.chosen != "<eos>":
                want = set()
                for m, member in enumerate(members):
                    ids = prompt_ids[m][b] + member.encode(prefix)
                    top = fresh_next_probs(member, ids).topk(cfg.candidates).indices.tolist()
                    want |= {naive_word(member, ids, t, cfg.max_word_tokens) for t in top
                             if t not in member.eos_token_ids} - {""}
                assert {c.text for c in r.candidates if not c.eos} == want
                for c in r.candidates:
                    if c.eos:
                        continue
                    for m, member in enumerate(members):
                        have = member.encode(prefix)
                        full = member.encode(prefix + c.text)
                        cont = full[len(have):] if full[: len(have)] == have else member.encode(c.text)
                        ref = normalised_score(naive_logprobs(member, prompt_ids[m][b] + have, cont), c.text,
                                               cfg.normalise)
                        assert c.scores[member.name] == pytest.approx(ref, abs=2e-3)
                        checked += 1
            prefix += "".join(r.units)
    return checked


@pytest.mark.parametrize("lead", [0, 1])
def test_one_token_candidates_are_scored_without_a_forward(bpe_pair, lead, monkeypatch):
    """A token's log-prob needs only the logits after its parent, so a non-lead scores the candidates
    it lacks from its last logits and open completion tree when each is one token for it (or lacks
    only its last token there): no scoring forward; the chosen word reaches it with the next text it
    receives. Candidates and scores still equal a fresh reference, and so does every member's cache."""
    fws = []
    score = EnsembledWord.score

    def counting(self, proposal):
        m = 1 - self.lead
        before = self.members[m].counters.forward_passes
        result = score(self, proposal)
        fws.append(self.members[m].counters.forward_passes - before)
        return result

    monkeypatch.setattr(EnsembledWord, "score", counting)
    cfg = WordConfig(gate=False, max_word_tokens=4, calibration="none")
    outs = Ensemble(list(bpe_pair), method="word-fixed", lead=lead, max_word_tokens=4,
                    calibration="none").generate(PROMPTS, max_new_tokens=12)
    assert fws.count(0) >= len(fws) // 3 and max(fws) <= 1
    assert rounds_checked_against_fresh_reference(bpe_pair, outs, cfg) > 20


def test_ensembled_words_of_all_rows_share_the_member_forwards(spacey, monkeypatch):
    """Confident rows advance while the others wait, so every ensembled round covers every active
    row (one set of member forwards per round for the whole batch), and outputs equal per-row runs."""
    seen = []
    score = EnsembledWord.score

    def recording(self, proposal):
        seen.append((list(proposal.rows), self.batch.active()))
        return score(self, proposal)

    monkeypatch.setattr(EnsembledWord, "score", recording)
    ens = Ensemble(list(spacey), threshold=0.06, max_word_tokens=6)  # margins here are ~0.01-0.13
    outs = ens.generate(PROMPTS, max_new_tokens=16)
    kinds = {r.kind for o in outs for r in o.trace}
    assert kinds == {"confident", "ensemble"}  # a mixed batch
    assert seen and all(rows == active for rows, active in seen)
    rounds = [sum(1 for r in o.trace if r.kind == "ensemble") for o in outs]
    assert len(seen) == max(rounds) < sum(rounds)


def test_choice_is_not_whoever_proposed_it():
    prompt = "Q: how old is she?\nA:"
    lead = scripted_member(char_tokenizer(), " She is 18.", prompt, "lead-18", scale=3.0)
    b = scripted_member(bpe_tokenizer(), " She is 17.", prompt, "bpe-17", scale=12.0)
    c = scripted_member(char_tokenizer(), " She is 17.", prompt, "char-17", scale=12.0, noise_seed=5)
    out = Ensemble([lead, b, c], method="word-fixed").generate([prompt], max_new_tokens=40)[0]
    assert out.text == " She is 17."
    r = next(r for r in out.trace if r.chosen == " 17.")
    cand = {c.text: c for c in r.candidates}
    assert "lead-18" in cand[" 18."].proposed_by and "lead-18" not in cand[" 17."].proposed_by


def test_softmax_calibration_against_a_self_confident_lead():
    prompt = "Q: how old is she?\nA:"
    lead = scripted_member(char_tokenizer(), " She is 18.", prompt, "lead-18", scale=20.0)
    b = scripted_member(bpe_tokenizer(), " She is 17.", prompt, "bpe-17", scale=8.0)
    c = scripted_member(char_tokenizer(), " She is 17.", prompt, "char-17", scale=8.0, noise_seed=5)
    plain = Ensemble([lead, b, c], method="word-fixed", calibration="none").generate([prompt], max_new_tokens=40)[0]
    calib = Ensemble([lead, b, c], method="word-fixed", calibration="softmax").generate([prompt], max_new_tokens=40)[0]
    assert plain.text == " She is 18."   # the extreme member vetoes the others' word
    assert calib.text == " She is 17."   # each member's say is bounded: the majority wins



# ---- batching and sampling ----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_run_equals_per_row_runs(spacey, temperature):
    ens = Ensemble(list(spacey), threshold=0.05, max_word_tokens=6)
    batched = ens.generate(PROMPTS, max_new_tokens=10, temperature=temperature, seed=7)
    for b, prompt in enumerate(PROMPTS):
        single = ens.generate([prompt], max_new_tokens=10, temperature=temperature, seed=7 + b)[0]
        assert single.text == batched[b].text
        assert [r.chosen for r in single.trace] == [r.chosen for r in batched[b].trace]


@pytest.mark.parametrize("threshold, stop", [(0.02, []), (0.05, [" a"]), (0.0, [])])
def test_confident_rows_run_on_through_word_boundaries(spacey, monkeypatch, threshold, stop):
    """A confident row goes on into its next word in the same lead forwards wherever one word per
    step would decode that word confidently (gate, span, length, stop string, canonical boundary,
    also after a max_word_tokens cut), instead of waiting at each word boundary for the batch's
    longest word: same texts, token counts and traces as one word per step, fewer lead forwards."""
    lead = spacey[0]
    prompts = PROMPTS + ["Once upon", "Q: 2+2?\nA:"]

    def run():
        snap = lead.counters.snapshot()
        outs = Ensemble(list(spacey), threshold=threshold, span=3, max_word_tokens=4).generate(
            prompts, max_new_tokens=14, stop=stop)
        view = [(o.text, o.num_tokens, o.finish_reason, [(r.kind, r.units, r.gate, r.chosen) for r in o.trace])
                for o in outs]
        return view, lead.cost_since(snap).forward_passes[lead.name]

    run_on, forwards = run()
    monkeypatch.setattr(LeadDecoder, "_next_word", lambda self, *a: "stop")  # one word per step
    per_step, forwards_per_step = run()
    assert run_on == per_step
    assert any(len(r[1]) > 1 for o in run_on for r in o[3] if r[0] == "confident")
    assert forwards <= forwards_per_step
    if threshold == 0.02:
        assert forwards < forwards_per_step


def test_sampling_is_reproducible(spacey):
    ens = Ensemble(list(spacey), threshold=0.05, max_word_tokens=6)
    a = ens.generate([P], max_new_tokens=12, temperature=1.0, seed=1)[0].text
    assert a == ens.generate([P], max_new_tokens=12, temperature=1.0, seed=1)[0].text
    others = {ens.generate([P], max_new_tokens=12, temperature=1.0, seed=s)[0].text for s in (2, 3, 4)}
    greedy = ens.generate([P], max_new_tokens=12)[0].text
    assert len(others | {a, greedy}) > 1


# ---- every knob changes behaviour (and the trace shows it) ---------------------------------------
def run(members, **kw):
    kw.setdefault("max_word_tokens", 6)
    return Ensemble(list(members), **kw).generate([P], max_new_tokens=8)[0]


def test_every_knob_changes_behaviour(spacey):
    base = run(spacey, method="word-fixed")
    # candidates: the union grows with B
    b1 = run(spacey, method="word-fixed", candidates=1)
    assert max(len(r.candidates) for r in b1.trace) <= 2 < max(len(r.candidates) for r in base.trace)
    # normalise: the recorded scores change
    tok = run(spacey, method="word-fixed", normalise="token")
    assert [c.scores for c in tok.trace[0].candidates] != [c.scores for c in base.trace[0].candidates]
    # calibration: the fused scores change
    cal = run(spacey, method="word-fixed", calibration="none")
    assert [c.fused for c in cal.trace[0].candidates] != [c.fused for c in base.trace[0].candidates]
    # max_word_tokens: words are cut
    short = run(spacey, method="word-fixed", max_word_tokens=1)
    assert max(len(spacey[0].encode(c.text)) for r in base.trace for c in r.candidates) > 1
    assert any(len(c.text) > 2 for r in base.trace for c in r.candidates)
    assert all(len(spacey[0].encode(c.text)) <= 1 or len(spacey[1].encode(c.text)) <= 1
               for r in short.trace for c in r.candidates)
    # weights: a zero-weight member has no say
    only0 = run(spacey, method="word-fixed", weights=[1, 0], calibration="none")
    for r in only0.trace:
        for c in r.candidates:
            assert c.fused == pytest.approx(c.scores[spacey[0].name], abs=1e-3)
    # lead: the gate follows the other member
    lead1 = run(spacey, threshold=0.05, lead=1)
    assert {r.proposer for r in lead1.trace} == {spacey[1].name}
    assert lead1.num_tokens >= 8 and len(spacey[1].encode(lead1.text)) == lead1.num_tokens
    # gate: adafuse vs word-fixed
    ada = run(spacey, threshold=0.05)
    assert "confident" in decisions(ada) and set(decisions(base)) == {"off"}
    # texts differ for at least some of the knobs
    assert len({o.text for o in (base, b1, tok, cal, short, only0, ada)}) > 1


def test_single_method_is_the_lead_alone(spacey):
    out = Ensemble(list(spacey), method="single", lead=1).generate([P], max_new_tokens=6)[0]
    assert out.text == spacey[1].generate([P], max_new_tokens=6)[0].text


def test_cost_counters_per_member(spacey):
    out = Ensemble(list(spacey), method="word-fixed").generate(PROMPTS, max_new_tokens=6)
    for o in out:
        assert set(o.cost.forward_passes) == {m.name for m in spacey}
        assert all(v > 0 for v in o.cost.tokens_processed.values()) and o.cost.wall_time_s > 0
        assert o.stats["ensemble_rounds"] == o.stats["rounds"]


# ---- configuration errors -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    (dict(method="nope"), "unknown method"),
    (dict(bogus=1), "unknown option 'bogus'"),
    (dict(threshold=1.5), "threshold"),
    (dict(span=-1), "span"),
    (dict(candidates=0), "candidates"),
    (dict(normalise="bits"), "normalise"),
    (dict(calibration="rank"), "calibration"),
    (dict(max_word_tokens=0), "max_word_tokens"),
    (dict(weights=[1.0]), "weights"),
    (dict(weights=[-1.0, 1.0]), "weights"),
    (dict(lead=2), "lead"),
    (dict(method="single", threshold=0.5), "single"),
    (dict(drafters=["lookup"]), "drafters"),
])
def test_config_errors_are_one_line(spacey, kwargs, needle):
    with pytest.raises(ConfigError) as exc:
        Ensemble(list(spacey), **kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("method", ["word-fixed", "adafuse"])
def test_stop_strings_cut_at_the_earliest_match(scripted, method):
    # " 256" completes both stop strings at once: the text is cut at the one that starts first,
    # whatever their order in `stop` (runtime.stopping.StopStrings)
    out = Ensemble(list(scripted), method=method).generate([P], max_new_tokens=200, stop=["= 2", "16 = 25"])[0]
    assert out.text == SCRIPT[: SCRIPT.index("16 = 25")] and out.finish_reason == "stop"
    assert units(out) == out.text
