"""Answer-level selection among whole answers: pure functions, answers in, the chosen index out.

- `majority_vote`: the most frequent extracted answer (self-consistency, Wang et al. 2022; Dipper's
  view vote). Answers are compared after `normalise_answer` (case, white space, a final period);
  answers that could not be extracted (None or empty) do not vote. Ties go to the answer with the
  highest summed log-probability over its samples (when given), then to the one whose first sample
  comes earliest; the chosen index is that answer's earliest sample. With no answer at all: 0.
- `consensus_pick`: for free text, where answers are not discrete (MBR with chrF): the candidate
  with the highest mean chrF against the others; ties go to the earliest.
- `weighted_vote` (confidence-weighted majority, as in CISC, arXiv 2502.06233): each sample votes with
  its confidence, the mean probability of its tokens exp(logprob / num_tokens); the answer with the
  largest summed confidence wins; ties go to the one whose first sample comes earliest.
- `most_confident`: the single sample with the highest mean token log-probability among those with an
  answer (ties: the earliest).
- `rerank_pick` (sample-rerank read off its records): the candidate with the highest mean of the scorers'
  normalised log-probabilities of it (ties: the earliest).
- `prove_vote` (programs as verifiers, after Toh et al. 2024, "Not All Votes Count!"): the majority
  among the text answers that some program answer confirms (the same answer); with none confirmed, the
  majority over every answer.
- `longest_pick`: the longest answer (ties: the earliest): not a method to use but the length control
  of an MT claim (a "gain" that picking the longest candidate also gets is brevity, not quality).
Confidences need each sample's summed log-probability and token count (`confidences`).

Early stop (`vote_decided`, `agreeing`): answers drawn one batch at a time can stop once the vote is
decided, the rest unable to change the winner (majority: its lead over every other answer, ties
included, exceeds the answers still to come; weighted: each answer to come adds at most 1), or once
k answers agree (not lossless: a cheaper rule that the vote with every answer may disagree with).
"""
from __future__ import annotations

import math
import re
from typing import Callable, Mapping, Sequence

CONFIDENCE_VOTES = ("weighted", "confident")   # the votes that read log-probabilities
VOTES = ("majority", "consensus", *CONFIDENCE_VOTES, "prove", "longest")
DECIDABLE_VOTES = ("majority", "weighted")      # the votes `vote_decided` can call early


def normalise_answer(answer: str | None) -> str | None:
    """The form answers are compared in: case-folded, white space folded, a final period dropped;
    None for an answer that is missing or empty."""
    if answer is None:
        return None
    text = re.sub(r"\s+", " ", answer).strip().casefold().rstrip(".").strip()
    return text or None


def _tally(answers: Sequence[str | None], values: Sequence[float]) -> tuple[dict[str, int], dict[str, float]]:
    """(answer -> index of its earliest sample, answer -> sum of its samples' `values`) over the
    normalised answers; samples without an answer are left out."""
    first: dict[str, int] = {}
    total: dict[str, float] = {}
    for i, a in enumerate(answers):
        k = normalise_answer(a)
        if k is not None:
            first.setdefault(k, i)
            total[k] = total.get(k, 0.0) + float(values[i])
    return first, total


def majority_vote(answers: Sequence[str | None], logprobs: Sequence[float] | None = None) -> int:
    """Index of the chosen sample (see the module docstring). `answers[i]`: sample i's extracted
    answer (None: none); `logprobs[i]`: its summed log-probability (None: ties go to the earliest)."""
    first, count = _tally(answers, [1.0] * len(answers))
    if not count:
        return 0
    _, mass = _tally(answers, logprobs if logprobs is not None else [0.0] * len(answers))
    return first[max(count, key=lambda k: (count[k], mass[k], -first[k]))]


def chrf(hypothesis: str, reference: str) -> float:
    """Sentence chrF (sacreBLEU's defaults), 0..100."""
    from sacrebleu.metrics import CHRF

    return float(_CHRF(CHRF).sentence_score(hypothesis, [reference]).score)


def _CHRF(cls, _cache: dict = {}):  # noqa: B006 - one metric object per process
    if "m" not in _cache:
        _cache["m"] = cls()
    return _cache["m"]


def consensus_pick(candidates: Sequence[str], similarity: Callable[[str, str], float] = chrf) -> int:
    """Index of the candidate with the highest mean `similarity(c_i, c_j)` over the others (MBR);
    ties go to the earliest; 0 for fewer than two candidates."""
    n = len(candidates)
    if n < 2:
        return 0
    means = [sum(similarity(candidates[i], candidates[j]) for j in range(n) if j != i) / (n - 1) for i in range(n)]
    return max(range(n), key=lambda i: (means[i], -i))


def confidences(logprobs: Sequence[float | None], num_tokens: Sequence[int]) -> list[float]:
    """Each sample's mean token log-probability (logprob / num_tokens; 0 tokens: 0.0). A missing
    log-probability is a ValueError naming the fix: the samples' writer must record them."""
    if any(lp is None for lp in logprobs):
        raise ValueError("a confidence vote needs every sample's log-probability; the samples were written "
                         "without them (view-vote and self-consistency runs record them: re-run with one)")
    return [float(lp) / n if n > 0 else 0.0 for lp, n in zip(logprobs, num_tokens)]


def weighted_vote(answers: Sequence[str | None], mean_logprobs: Sequence[float]) -> int:
    """Index of the chosen sample: the answer with the largest summed exp(mean token log-prob) over its
    samples wins (see the module docstring); with no answer at all: 0."""
    first, weight = _tally(answers, [math.exp(float(c)) for c in mean_logprobs])
    if not weight:
        return 0
    return first[max(weight, key=lambda k: (weight[k], -first[k]))]


def most_confident(answers: Sequence[str | None], mean_logprobs: Sequence[float]) -> int:
    """Index of the sample with an answer and the highest mean token log-probability (the earliest on
    ties); with no answer at all: 0."""
    keys = [i for i, a in enumerate(answers) if normalise_answer(a) is not None]
    if not keys:
        return 0
    return max(keys, key=lambda i: (float(mean_logprobs[i]), -i))


def rerank_pick(cross: Sequence[Mapping[str, float]], scorers: Sequence[str]) -> int:
    """Index of the candidate whose mean score over `scorers` is highest (the earliest on ties);
    `cross[i][name]`: scorer `name`'s normalised log-probability of candidate i (sample-rerank's
    `cross`). A candidate without a scorer's score is a ValueError."""
    if not cross:
        return 0
    missing = [name for c in cross for name in scorers if name not in c]
    if missing:
        raise ValueError(f"no score of a candidate by {missing[0]!r}: a rerank reads sample-rerank runs whose members "
                         f"include every scorer")
    means = [sum(float(c[name]) for name in scorers) / len(scorers) for c in cross]
    return max(range(len(cross)), key=lambda i: (means[i], -i))


def longest_pick(answers: Sequence[str | None]) -> int:
    """Index of the longest answer in characters (a missing answer as ""; ties: the earliest)."""
    return max(range(len(answers)), key=lambda i: (len(answers[i] or ""), -i)) if answers else 0


def prove_vote(answers: Sequence[str | None], programs: Sequence[bool],
               logprobs: Sequence[float] | None = None) -> int:
    """Index of the chosen sample: `majority_vote` among the text answers (`programs[i]` False) whose
    answer some program answer (`programs[i]` True) equals, after `normalise_answer`; with none
    confirmed, `majority_vote` over every answer (ties as there)."""
    confirmed = {normalise_answer(a) for a, p in zip(answers, programs) if p} - {None}
    kept = [a if not p and normalise_answer(a) in confirmed else None for a, p in zip(answers, programs)]
    return majority_vote(kept if any(k is not None for k in kept) else answers, logprobs)


def vote_decided(vote: str, answers: Sequence[str | None], to_come: int,
                 mean_logprobs: Sequence[float] | None = None) -> bool:
    """Whether `vote` over `answers` plus any `to_come` more answers must pick the answer it picks now
    (majority ties as `view_pick` breaks them: to the earliest answer; weighted: each answer to come
    weighs at most 1). With no answer yet, only when none is to come."""
    if vote not in DECIDABLE_VOTES:
        raise ValueError(f"early stop on a decided vote needs one of {', '.join(DECIDABLE_VOTES)}, got {vote!r}")
    weights = [1.0] * len(answers) if vote == "majority" else [math.exp(float(c)) for c in mean_logprobs or []]
    first, mass = _tally(answers, weights)
    if not mass:
        return to_come == 0
    leader = min(mass, key=lambda k: (-mass[k], first[k])) if vote == "majority" else \
        max(mass, key=lambda k: (mass[k], -first[k]))
    if mass[leader] <= to_come:  # (a new answer comes later, so it loses a tie: strictly below is safe)
        if not (vote == "majority" and mass[leader] == to_come):
            return False
    for other, m in mass.items():
        if other != leader:
            margin = mass[leader] - (m + to_come)
            if margin < 0 or (margin == 0 and (vote != "majority" or first[other] < first[leader])):
                return False
    return True


def agreeing(answers: Sequence[str | None]) -> int:
    """How many answers the most frequent (normalised) answer has (0 with none)."""
    _, count = _tally(answers, [1.0] * len(answers))
    return int(max(count.values(), default=0))


def pick(vote: str, answers: Sequence[str | None], logprobs: Sequence[float | None] | None = None,
         num_tokens: Sequence[int] | None = None, programs: Sequence[bool] | None = None) -> int:
    """The chosen sample under `vote` (see the module docstring): `majority_vote` (ties by summed
    `logprobs` when given), `consensus_pick` (a missing answer as ""), or the confidence rules
    `weighted_vote` / `most_confident` (they need `logprobs` and `num_tokens`), or `prove_vote`
    (`programs[i]`: whether sample i is a program's answer; none: no program, a plain majority)."""
    if vote == "majority":
        return majority_vote(answers, logprobs)
    if vote == "prove":
        return prove_vote(answers, programs or [False] * len(answers), logprobs)
    if vote == "consensus":
        return consensus_pick([a or "" for a in answers])
    if vote == "longest":
        return longest_pick(answers)
    if vote in CONFIDENCE_VOTES:
        if logprobs is None or num_tokens is None:
            raise ValueError(f"vote {vote!r} needs the samples' log-probabilities and token counts")
        conf = confidences(logprobs, num_tokens)
        return weighted_vote(answers, conf) if vote == "weighted" else most_confident(answers, conf)
    raise ValueError(f"unknown vote {vote!r}; use one of {', '.join(VOTES)}")


def view_pick(vote: str, answers: Sequence[str | None], logprobs: Sequence[float | None],
              num_tokens: Sequence[int], programs: Sequence[bool] | None = None) -> int:
    """`view-vote`'s choice among the views' answers, the lead's first: `pick`, except that a majority's
    (and prove's) ties go to the earliest answer (the lead), not to log-probabilities."""
    return pick(vote, answers, logprobs if vote in CONFIDENCE_VOTES else None, num_tokens, programs)
