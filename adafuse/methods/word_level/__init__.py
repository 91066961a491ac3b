"""Word-level ensembling across tokenizers: `adafuse` (gated, adaptive span) and `word-fixed` (gate
off: every word is ensembled). See docs/algorithms.md §2.

Rows of a batch advance in *steps*; at each step every unfinished row sits at a word start (see
`adafuse.words`) and the lead member's next-token distribution there gives the gate margin
m = p1 - p2. A step advances the confident rows by one or more words each while the other rows
wait; when no row is confident, every row ensembles one word together (one set of member forwards
for the batch):
- confident (m >= threshold and fewer than `span` words committed since the last ensembled word):
  the lead decodes one word on its own (greedy at temperature 0) and the next word start is checked
  again; a row goes on with that word in the same step (same forwards) wherever it would be decoded
  confidently next, so confident rows of a batch do not wait at every word boundary. After `span`
  confident words in a row the next word is ensembled ("forced"), so at most `span` words are ever
  committed without the other members' say; span=0 ensembles every word.
- uncertain: each member proposes its top-`candidates` first tokens, each completed greedily to the
  word boundary (all of a member's branches of all rows in one tree forward per step; a branch walks
  on through draft nodes in that tree, the words members before it proposed and, for a member with
  a `specdec` drafter, the drafter's greedy continuation of the branch, as long as its greedy next
  token is there); the union of the candidate words (dedup by exact text) is scored by every member
  (all candidates of all rows in one tree forward per member; the lead completes last, with every
  other candidate in its tree, and is usually scored from that tree at no further forward; a
  non-lead needs no forward where every candidate it lacks is one token for it, as a token's
  log-prob needs only the logits before it), normalised (`normalise`), fused across members with
  the member weights (`calibration`), and the best is committed.

Text discipline and stopping: see `batch` (lazy catch-up of members with boundary repair; EOS, stop
strings, `max_new_tokens` in lead tokens).

Temperature > 0: the lead's confident words are sampled token by token from its warped distribution
and the ensembled word is drawn from softmax(fused score / temperature); each row uses its own
generator seeded `seed + row`, so a batched run equals per-row runs. Candidate first tokens are the
deterministic top-B, their completions greedy; the gate always uses the untempered distribution.

Modules, by job:
- `options`: `WordConfig`, the knobs. `records`: the typed trace (`Round`, `Candidate`).
- `trees`: candidate words in the making (`Branches`, `complete_words`), grown in a member's
  `runtime.open_tree.OpenTree` (the tree, its nodes and their logits have that one owner).
- `batch`: `Batch`, the rows' shared state (texts, units, pending text per member, finish, streak,
  traces, member views, generators) and the commit / stop / length rules.
- `lead_decoder`: `LeadDecoder`, the lead's confident words (plain and speculative).
- `ensembled_word`: `EnsembledWord`, one ensembled word: propose -> `Proposal` -> score -> `Scored`
  -> fuse -> commit.
- `fusion`: `WordFusion` (gates each row and routes the step), the `AdaFuse` / `WordFixed` methods
  and `generate`.
"""
from __future__ import annotations

from adafuse.methods.word_level.batch import Batch
from adafuse.methods.word_level.ensembled_word import EnsembledWord, Proposal, Scored
from adafuse.methods.word_level.fusion import AdaFuse, WordFixed, WordFusion, generate
from adafuse.methods.word_level.lead_decoder import ConfidentRun, LeadDecoder, count_complete_units
from adafuse.methods.word_level.options import DRAFT_CANDIDATES, WordConfig
from adafuse.methods.word_level.records import EOS_KEY, Candidate, Round, round_stats
from adafuse.methods.word_level.trees import Branches, complete_words, continuation_ids, draft_branches, top_firsts

__all__ = [
    "AdaFuse", "Batch", "Branches", "Candidate", "ConfidentRun", "DRAFT_CANDIDATES", "EOS_KEY", "EnsembledWord",
    "LeadDecoder", "Proposal", "Round", "Scored", "WordConfig", "WordFixed",
    "WordFusion", "complete_words", "continuation_ids", "count_complete_units", "draft_branches",
    "generate", "round_stats", "top_firsts",
]
