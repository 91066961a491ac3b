"""Fakes for the RLiD trainer tests (no tests here): a decision model and a token policy that follow
the contract (rlid_common.md), toy environments (PickEnv: one decision, "right" pays; WalkEnv), and a
small TrainConfig maker."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime.prefix_cache import PrefixCache
from runtime.testing import tiny_member
from rlid.lora import LoraSpec
from rlid.train_loop import TrainConfig
from rlid.types import DecisionState, OptionLaw, StepResult

LETTERS = "ABCDEFGH"


# ---- fakes of the other helpers' pieces ---------------------------------------------------------
class FakeDecisionModel:
    """A DecisionModel-like policy: one batched, left-padded forward of a tiny llama; π = softmax of
    the last position's logits at the option letters."""

    def __init__(self, member):
        self.member = member

    def prompt(self, s: DecisionState) -> str:
        menu = "".join(f"{L}. {a}\n" for L, a in zip(LETTERS, s.actions))
        return f"{s.instruction}\n{s.observation}\n{s.memory}\n{menu}Answer:"

    def laws(self, states):
        tok = self.member.tokenizer
        ids = [tok.encode(self.prompt(s), add_special_tokens=False) for s in states]
        width = max(map(len, ids))
        input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.member.model(input_ids=input_ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        out = []
        for row, s in zip(logits, states):
            labels = tuple(LETTERS[: len(s.actions)])
            out.append(OptionLaw(torch.log_softmax(row[tok.convert_tokens_to_ids(list(labels))], -1), labels))
        return out


WORDS = ["left", "right", "jump", "<eos>"]
BOS = len(WORDS)


@dataclass
class TokenAction:  # the contract's rlid.token_policy.TokenAction
    text: str
    index: int | None
    prompt_ids: list[int]
    output_ids: list[int]


class TinyTextLM(nn.Module):
    """A bigram word LM over WORDS (+ BOS); `q_proj` is the layer LoRA adapts."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.q_proj, self.head = nn.Embedding(BOS + 1, 8), nn.Linear(8, 8), nn.Linear(8, len(WORDS))

    def forward(self, ids):
        return self.head(torch.tanh(self.q_proj(self.emb(ids))))


class FakeMember:
    def __init__(self, model):
        self.model, self.prefix_cache = model, PrefixCache()


class FakeTokenPolicy:
    """A TokenPolicy-like policy: writes up to 2 words; the text parses if it is exactly a menu action."""

    def __init__(self, seed: int = 0):
        self.member = FakeMember(TinyTextLM(seed))

    def act(self, states, greedy, generator):
        out = []
        for s in states:
            ids: list[int] = []
            for _ in range(2):
                logits = self.member.model(torch.tensor([[BOS] + ids]))[0, -1]
                ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)))
                if WORDS[ids[-1]] == "<eos>":
                    break
            text = " ".join(WORDS[i] for i in ids if WORDS[i] != "<eos>")
            out.append(TokenAction(text, s.actions.index(text) if text in s.actions else None, [BOS], ids))
        return out

    def sequence_log_probs(self, actions):
        width = max(len(a.output_ids) for a in actions)
        out = torch.tensor([a.output_ids + [0] * (width - len(a.output_ids)) for a in actions])
        inp = torch.cat([torch.full((len(actions), 1), BOS), out[:, :-1]], dim=1)
        mask = torch.tensor([[1.0] * len(a.output_ids) + [0.0] * (width - len(a.output_ids)) for a in actions])
        logp = torch.log_softmax(self.member.model(inp), -1).gather(2, out[..., None]).squeeze(-1)
        return (logp * mask).sum(-1)


class PickEnv:
    """One decision: menu left/right/stay; "right" pays 1 and solves it."""

    name, max_steps, instruction = "pick", 1, "Pick the good option."

    def reset(self, seed):
        self.seed = seed

    def observation(self):
        return f"Round {self.seed}."

    def menu(self):
        return ["left", "right", "stay"]

    def step(self, i):
        return StepResult(1.0 if i == 1 else 0.0, True, success=i == 1)

    def memory(self, k):
        return ""

    def solvable(self):
        return True


class WalkEnv:
    """Walk from 0 to 2 on a line within 4 steps (reward 1 at the goal); counts executed steps."""

    name, max_steps, instruction = "walk", 4, "Reach position 2."

    def __init__(self):
        self.executed = 0

    def reset(self, seed):
        self.pos, self.seed, self.moves = 0, seed, []

    def observation(self):
        return f"At {self.pos}, goal 2 (seed {self.seed})."

    def menu(self):
        return ["left", "right"]

    def step(self, i):
        self.executed += 1
        self.pos += 1 if i == 1 else -1
        self.moves.append(self.menu()[i])
        return StepResult(1.0 if self.pos == 2 else 0.0, self.pos == 2, success=self.pos == 2)

    def memory(self, k):
        return " ".join(self.moves[-k:])

    def solvable(self):
        return True


def decision_policy(seed: int = 0) -> FakeDecisionModel:
    return FakeDecisionModel(tiny_member("llama", seed=seed))


def config(**kw) -> TrainConfig:
    base = dict(train_seeds=tuple(range(8)), seeds_per_step=2, group_size=4, lr=0.02, progress=False,
                lora=LoraSpec(r=4, alpha=8))
    return TrainConfig(**{**base, **kw})



def decision_state_of(seed: int) -> DecisionState:
    env = PickEnv()
    env.reset(seed)
    return DecisionState(env.observation(), tuple(env.menu()), "", env.instruction)



def p_right(pol) -> float:
    """Mean π("right") over eight PickEnv states."""
    states = [decision_state_of(s) for s in range(8)]
    with torch.no_grad():
        return float(torch.stack([law.probs[1] for law in pol.laws(states)]).mean())


def save_tiny_char_model(root) -> str:
    """A tiny random llama with a character tokenizer, saved as a model folder (for the CLI tests);
    returns the folder."""
    from runtime.testing import char_tokenizer, tiny_model

    tok = char_tokenizer()
    model = tiny_model("llama", vocab_size=len(tok), hidden=32, layers=1)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    return str(root / "tiny")


def assert_gradients_reach_every_parameter(model) -> None:
    """Every trainable parameter of `model` has a finite gradient, not all zero; then clears them."""
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    model.zero_grad(set_to_none=True)
