"""Member views: one loaded model, several ways of prompting it, each an ensemble member of its own.

A view is (model, prompt recipe): which exemplars of the task's pool it sees, chat template or raw
text, a system prompt, and optionally a LoRA adapter. Views of one model share its weights (one load
per model, dtype and device), its tokenizer and its cost counters; each view has its own prompt,
prefix cache and KV cache, and the forwards of views that run together go through the model as rows
of one batch (`runtime.forward_group`).

Spelled as a member spec, a view is the model name with its recipe in brackets:

    qwen2.5-coder-1.5b                               the model's default prompt
    qwen2.5-coder-1.5b[shots=2:4]                    exemplars 2 and 3 of the pool
    qwen2.5-coder-1.5b[shots=8:12,chat=false]        exemplars 8-11, raw text (no chat template)
    qwen2.5-coder-1.5b[shots=seed7x4]                4 exemplars drawn from the pool with seed 7
    qwen2.5-coder-1.5b[shots=0|3|5,system="Be brief."]   exemplars 0, 3, 5 and a system prompt
    qwen2.5-coder-1.5b[chat=false;system=Think.]     `;` separates too (inside lm-eval's --model_args)
    qwen2.5-coder-1.5b[kind=program,system="Write a Python program ..."]   a program view

or, in a YAML config, `{name: qwen2.5-coder-1.5b, view: {shots: "2:4", chat: false}}`; the keys are
`ViewSpec`'s fields. `shots`: "a:b" (a slice of the pool), k (the first k), "i|j|k" or a list (those
exemplars), "seedSxK" or {seed: S, k: K} (K drawn from the pool). `system` replaces the task's
description (the system turn under a chat template, the text above the exemplars in raw text).
`kind: program`: the view's output is a Python program; its answer is what the program prints, run
by `runtime.sandbox.run_program` (answer-level methods and single runs do this; `is_program`).
Exemplar choices need prompts that carry their pool (`runtime.prompts.FewShotPrompt`, what the eval
harness builds); a plain string prompt takes only `chat` and `system`.
"""
from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass, fields
from typing import Any

from runtime.errors import ConfigError

KEYS = ("shots", "chat", "system", "adapter", "kind")
KINDS = ("text", "program")  # what a view's output is: an answer in text, or a program that prints it
_SLICE = re.compile(r"^(\d*):(\d*)$")
_SEED = re.compile(r"^seed(\d+)x(\d+)$")


@dataclass(frozen=True)
class ViewSpec:
    """A prompt recipe (see the module docstring); None: the model's default."""

    shots: str | None = None     # canonical: "a:b", "k", "i|j|k" or "seedSxK"
    chat: bool | None = None
    system: str | None = None
    adapter: str | None = None
    kind: str | None = None      # "program": the output is a Python program whose printed output is the answer

    @property
    def is_program(self) -> bool:
        return self.kind == "program"

    @property
    def is_default(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def label(self) -> str:
        """`k=v,...` in key order (strings with a comma, '=', a bracket or a quote are JSON-quoted)."""
        parts = []
        for key in KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
                if any(ch in text for ch in ',;=[]"') or text != text.strip() or not text:
                    text = json.dumps(text, ensure_ascii=False)
            parts.append(f"{key}={text}")
        return ",".join(parts)

    def exemplars(self, pool_size: int, default: list[int]) -> list[int]:
        """The pool indices this view's prompt shows (`default`: the prompt's own choice); a choice
        beyond the pool is a one-line ConfigError."""
        if self.shots is None:
            return list(default)
        seeded = _SEED.match(self.shots)
        if seeded:
            seed, k = int(seeded.group(1)), int(seeded.group(2))
            if k > pool_size:
                raise ConfigError(f"view shots={self.shots} draws {k} exemplars but the pool holds {pool_size}; "
                                  f"draw fewer or reserve more exemplars (fewshot_reserved)")
            return random.Random(seed).sample(range(pool_size), k)
        chosen = shots_indices(self.shots)
        if chosen and max(chosen) >= pool_size:
            raise ConfigError(f"view shots={self.shots} needs {max(chosen) + 1} exemplars but the pool holds "
                              f"{pool_size}; choose within 0..{pool_size - 1} or reserve more (fewshot_reserved)")
        return chosen

    def pool_needed(self) -> int:
        """How many exemplars the pool must hold for this view (0: any pool)."""
        if self.shots is None:
            return 0
        seeded = _SEED.match(self.shots)
        if seeded:
            return int(seeded.group(2))
        chosen = shots_indices(self.shots)
        return max(chosen) + 1 if chosen else 0


def shots_indices(shots: str) -> list[int]:
    """The indices of a canonical non-seeded `shots` ("a:b", "k", "i|j|k")."""
    m = _SLICE.match(shots)
    if m:
        return list(range(int(m.group(1) or 0), int(m.group(2))))
    if shots.isdigit():
        return list(range(int(shots)))
    return [int(x) for x in shots.split("|")]


def _canonical_shots(value: Any, where: str) -> str:
    bad = ConfigError(f"{where}shots={value!r} is invalid: use \"a:b\" (a slice of the exemplar pool), k (the first "
                      f"k), a list of indices, or {{seed: S, k: K}} / \"seedSxK\" (K drawn with seed S)")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        if value < 0:
            raise bad
        return str(value)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
            raise bad
        return "|".join(str(i) for i in value) if value else "0"
    if isinstance(value, dict):
        if set(value) != {"seed", "k"} or not all(isinstance(value[k], int) and not isinstance(value[k], bool)
                                                  and value[k] >= 0 for k in ("seed", "k")):
            raise bad
        return f"seed{value['seed']}x{value['k']}"
    if not isinstance(value, str):
        raise bad
    text = value.replace(" ", "")
    m = _SLICE.match(text)
    if m:
        if not m.group(2) or int(m.group(1) or 0) >= int(m.group(2)):
            raise bad  # an open or empty slice has no size
        return f"{int(m.group(1) or 0)}:{int(m.group(2))}"
    if text.isdigit():
        return str(int(text))
    if _SEED.match(text):
        return text
    if re.fullmatch(r"\d+(\|\d+)*", text):
        return text
    raise bad


def parse_view(value: Any, where: str = "") -> ViewSpec:
    """A `ViewSpec` from a mapping (or a ViewSpec); unknown keys and bad values are one-line
    ConfigErrors (`where` prefixes the key, e.g. "runs[0].members[1].view.")."""
    if isinstance(value, ViewSpec):
        return value
    if value is None:
        return ViewSpec()
    if not isinstance(value, dict):
        raise ConfigError(f"{where.rstrip('.') or 'view'} must be a mapping of {', '.join(KEYS)}, got {value!r}")
    import difflib

    for key in value:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(KEYS)})"
            raise ConfigError(f"unknown view key '{where}{key}'{hint}")
    chat = value.get("chat")
    if chat is not None and not isinstance(chat, bool):
        raise ConfigError(f"{where}chat={chat!r} is invalid: true (chat template) or false (raw text)")
    for key in ("system", "adapter"):
        if value.get(key) is not None and (not isinstance(value[key], str) or not value[key].strip()):
            raise ConfigError(f"{where}{key}={value[key]!r} is invalid: a non-empty string")
    kind = value.get("kind")
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"{where}kind={kind!r} is invalid: one of {', '.join(KINDS)} (program: the view writes a "
                          f"Python program, run in the sandbox, whose printed output is its answer)")
    shots = value.get("shots")
    return ViewSpec(None if shots is None else _canonical_shots(shots, where), chat, value.get("system"),
                    value.get("adapter"), None if kind == "text" else kind)


def _split_pairs(body: str, spec: str) -> dict[str, Any]:
    """`k=v,k="v, with commas",...` -> {k: v} (values: true/false, JSON strings, or plain text); `;`
    separates pairs too (lm-eval's --model_args split on commas)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq < 0:
            raise ConfigError(f"member '{spec}': view part '{body[i:]}' is not key=value")
        key = body[i:eq].strip()
        j = eq + 1
        if j < len(body) and body[j] == '"':
            try:
                text, end = json.JSONDecoder().raw_decode(body, j)
            except ValueError:
                raise ConfigError(f"member '{spec}': unterminated quoted value of view key '{key}'") from None
            value: Any = text
            j = end
        else:
            ends = [e for e in (body.find(",", j), body.find(";", j)) if e >= 0]
            end = min(ends) if ends else len(body)
            raw = body[j:end].strip()
            value = {"true": True, "false": False}.get(raw, int(raw) if raw.isdigit() else raw)
            j = end
        if key in out:
            raise ConfigError(f"member '{spec}': view key '{key}' given twice")
        out[key] = value
        if j < len(body) and body[j] not in ",;":
            raise ConfigError(f"member '{spec}': expected ',' after view key '{key}'")
        i = j + 1
    return out


def split_member_spec(spec: Any) -> tuple[Any, ViewSpec | None]:
    """(the model spec, its view or None) of a member spec: "name[k=v,...]", a mapping {name, view},
    or anything else (returned as is, no view). Bad views are one-line ConfigErrors."""
    if isinstance(spec, dict):
        unknown = [k for k in spec if k not in ("name", "view")]
        if "name" not in spec or unknown:
            raise ConfigError(f"member {spec!r} is invalid: a mapping with 'name' and optionally 'view'")
        view = parse_view(spec.get("view"), "view.")
        return spec["name"], None if view.is_default else view
    if not isinstance(spec, str) or not spec.endswith("]") or "[" not in spec:
        return spec, None
    name, _, body = spec[:-1].partition("[")
    if not name.strip():
        raise ConfigError(f"member '{spec}' names no model before its view")
    view = parse_view(_split_pairs(body, spec), f"member '{spec}': ")
    return name, None if view.is_default else view


def split_members(text: str) -> list[str]:
    """A comma-separated member list -> its specs; commas inside a view's brackets (or its quoted
    values) do not split: "m,m[shots=2:4,chat=false]" -> ["m", "m[shots=2:4,chat=false]"]."""
    out, part, depth, quoted = [], [], 0, False
    for i, ch in enumerate(text):
        if ch == '"' and depth and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch == "[":
            depth += 1
        elif not quoted and ch == "]":
            depth = max(depth - 1, 0)
        if ch == "," and not depth and not quoted:
            out.append("".join(part).strip())
            part = []
        else:
            part.append(ch)
    out.append("".join(part).strip())
    return [p for p in out if p]


def member_spec(name: str, view: ViewSpec | None) -> str:
    """The canonical member spec string of a model name and a view ("name" for the default)."""
    return name if view is None or view.is_default else f"{name}[{view.label()}]"


def normalise_member(spec: Any) -> Any:
    """A member spec in its canonical string form (mappings and view strings); other specs as given."""
    name, view = split_member_spec(spec)
    return member_spec(name, view) if isinstance(name, str) else spec


def exemplars_needed(members: Any) -> int:
    """How many exemplars the pool must hold for the views among `members` (0: any)."""
    views = [split_member_spec(m)[1] for m in members]
    return max((v.pool_needed() for v in views if v is not None), default=0)


def is_program(member: Any) -> bool:
    """Whether a loaded member is a program view (its outputs are programs to run, `kind=program`)."""
    view = getattr(member, "view", None)
    return view is not None and view.is_program


def model_of(spec: Any) -> Any:
    """The model part of a member spec (the name without its view)."""
    return split_member_spec(spec)[0]


def make_view(member: Any, view: ViewSpec) -> Any:
    """A member that runs `member`'s model (the same weights, tokenizer and cost counters) with its
    own prompt recipe, prefix cache and name. A view with an adapter runs the adapter's LoRA on the
    shared base weights (`runtime.lora_views`)."""
    from runtime.prefix_cache import PrefixCache

    out = copy.copy(member)
    out.view = view
    out.name = member_spec(member.name, view)
    out.model_name = getattr(member, "model_name", member.name)
    out.prefix_cache = PrefixCache()
    if view.chat is not None:
        has_template = bool(getattr(member.tokenizer, "chat_template", None))
        if view.chat and not has_template:
            raise ConfigError(f"view chat=true of '{member.name}': the model has no chat template; use chat=false")
        out.use_chat_template = view.chat
        out.eos_token_ids = out._find_eos_ids()
    if view.system is not None:
        out.system_prompt = view.system  # (plain prompts under a chat template; `view_prompt` does the rest)
    if view.adapter is not None:
        from runtime.lora_views import attach_adapter

        attach_adapter(out, view.adapter)
    return out
