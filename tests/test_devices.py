"""Members on their own devices: `runtime.devices.check_device`, the config's `members: [{name, device}]`,
and the loader receiving each member's device (CPU tests of the placement logic)."""
from __future__ import annotations

import pytest
import torch

from runtime import devices, loader
from runtime.devices import check_device, check_devices
from runtime.errors import ConfigError


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_device_specs_are_checked_against_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check_device("cpu") == "cpu" and check_device(" auto ") == "auto"
    with pytest.raises(ConfigError, match=r"device 'cuda:1' is not here: this machine has no CUDA device; use one of cpu$"):
        check_device("cuda:1")
    with pytest.raises(ConfigError, match="device 'gpu1' is invalid: use cpu, cuda, cuda:N, mps or auto"):
        check_device("gpu1")
    with pytest.raises(ConfigError, match="one device per member: 2 members"):
        check_devices(["cpu"], 2)


def test_cuda_indices_within_the_visible_devices(two_gpus) -> None:
    assert check_device("cuda") == "cuda:0" and check_device("cuda:1") == "cuda:1"
    assert devices.available() == ["cpu", "cuda:0", "cuda:1"]
    with pytest.raises(ConfigError, match=r"'cuda:2' is not here: this machine has 2 CUDA device\(s\)"):
        check_device("cuda:2")


def test_config_members_with_devices(two_gpus) -> None:
    from eval.config import parse_config

    cfg = parse_config({"tasks": ["gsm8k"], "runs": [
        {"name": "e", "method": "adafuse", "members": [{"name": "smollm2-135m", "device": "cuda:1"}, "gemma3-270m"]},
        {"name": "s", "method": "single", "members": [{"name": "qwen2.5-coder-1.5b", "device": "auto"}]}]}, "c.yaml")
    e, s = cfg.runs
    assert e.members == ["smollm2-135m", "gemma3-270m"] and e.options == {"devices": ["cuda:1", "cpu"]}
    assert s.members == ["qwen2.5-coder-1.5b"] and s.options == {"device": "auto"}
    bad = {"tasks": ["gsm8k"], "runs": [{"method": "adafuse", "members": [{"name": "a", "device": "cuda:7"}, "b"]}]}
    with pytest.raises(ConfigError, match=r"^c.yaml: key 'runs\[0\].members': device 'cuda:7' is not here"):
        parse_config(bad, "c.yaml")
    both = {"tasks": ["gsm8k"], "runs": [{"method": "adafuse", "members": [{"name": "a", "device": "cpu"}, "b"],
                                           "options": {"devices": ["cpu", "cpu"]}}]}
    with pytest.raises(ConfigError, match="both place the members; keep one"):
        parse_config(both, "c.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'runs\[0\].members\[0\].gpu'"):
        parse_config({"tasks": ["gsm8k"], "runs": [{"method": "single", "members": [{"name": "a", "gpu": 1}]}]}, "c.yaml")


def test_each_member_is_loaded_on_its_device(two_gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ensemble hands each member's device (and its drafter's: the target's) to the loader."""
    from adafuse.ensemble import Ensemble
    from eval.methods import check_run

    calls = []

    def fake_load(spec, dtype, device, pack_weights=True):
        calls.append((spec, device))
        return object()

    monkeypatch.setattr(loader, "default_loader", lambda: loader.MemberLoader())
    monkeypatch.setattr(loader, "_load", fake_load)
    monkeypatch.setattr(loader, "check_spec", lambda spec: None)
    Ensemble(["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"], method="token-union", lead=2,
             devices=["cpu", "cuda:1", "auto"])
    assert calls == [("smollm2-135m", "cpu"), ("gemma3-270m", "cuda:1"), ("qwen2.5-coder-0.5b", "auto")]
    with pytest.raises(ConfigError, match="'cuda:5' is not here"):
        Ensemble(["smollm2-135m", "gemma3-270m"], method="token-union", devices=["cpu", "cuda:5"])
    with pytest.raises(ConfigError, match="'cuda:3' is not here"):                     # before any model loads
        check_run("adafuse", ["smollm2-135m", "gemma3-270m"], {"devices": ["cuda:3", "cpu"]})
    with pytest.raises(ConfigError, match="'cuda:3' is not here"):
        check_run("single", ["smollm2-135m"], {"device": "cuda:3"})
    assert len(calls) == 3


# ---- members on different devices run at once (runtime.devices.run_by_device) ------------------------
def test_run_by_device_keeps_order_and_runs_groups_in_threads():
    import threading
    import time

    from runtime.devices import run_by_device

    seen = []

    def fn(item):
        seen.append((item, threading.current_thread().name))
        time.sleep(0.05)
        return item * 10

    items = [0, 1, 2, 3]
    assert run_by_device(items, lambda i: "cpu", fn) == [0, 10, 20, 30]
    assert {name for _, name in seen} == {threading.current_thread().name}   # one device: inline
    seen.clear()
    t0 = time.perf_counter()
    assert run_by_device(items, lambda i: f"cuda:{i % 2}", fn) == [0, 10, 20, 30]
    assert time.perf_counter() - t0 < 0.19                                  # two groups of two at once
    names = {item: name for item, name in seen}
    assert names[0] == names[2] != names[1] == names[3]                     # a thread per device
    assert [i for i, _ in seen if i % 2 == 0] == [0, 2]                     # in order within a device


def test_run_by_device_raises_the_first_error():
    from runtime.devices import run_by_device

    def fn(item):
        if item in (1, 2):
            raise ValueError(f"bad {item}")
        return item

    with pytest.raises(ValueError, match="bad 1"):
        run_by_device([0, 1, 2, 3], lambda i: f"cuda:{i % 2}", fn)


def test_ensemble_outputs_are_the_same_with_members_running_at_once(monkeypatch):
    # on this CPU every member is on "cpu" (one group, inline); pretend each is on its own device so
    # the flush, proposal and scoring forwards of an ensembled word run in one thread per member
    # (proposals: one thread per non-lead device, then the lead)
    from adafuse.ensemble import Ensemble
    from adafuse.methods.word_level import ensembled_word
    from runtime import forward_group
    from runtime.testing import bpe_tokenizer, char_tokenizer
    from test_adafuse_helpers import spacey_member

    members = [spacey_member("llama", char_tokenizer(), 0, "char-llama", 3.0),
               spacey_member("qwen2", bpe_tokenizer(), 1, "bpe-qwen", 3.0),
               spacey_member("llama", bpe_tokenizer(), 4, "bpe-llama", 3.0)]
    prompts = ["Question: what is 16*16?\nAnswer:", "The quick brown fox"]
    kw = dict(max_new_tokens=14)
    plain = Ensemble(members, lead=1, threshold=0.3, max_word_tokens=6).generate(prompts, **kw)
    groups = []
    real = ensembled_word.run_by_device

    def spy(items, device_of, fn):
        groups.append(len({device_of(i) for i in items}))
        return real(items, device_of, fn)

    for module in (ensembled_word, forward_group):  # proposals; flush and scoring
        monkeypatch.setattr(module, "device_key", lambda member: member.name)
        monkeypatch.setattr(module, "run_by_device", spy)
    apart = Ensemble(members, lead=1, threshold=0.3, max_word_tokens=6).generate(prompts, **kw)
    assert max(groups) == 3
    assert 2 in groups  # the two non-lead members propose at once
    for x, y in zip(plain, apart):
        assert x.text == y.text
        assert [(r.kind, r.units, r.gate) for r in x.trace] == [(r.kind, r.units, r.gate) for r in y.trace]
        assert ([[(c.text, c.proposed_by) for c in r.candidates] for r in x.trace]
                == [[(c.text, c.proposed_by) for c in r.candidates] for r in y.trace])
        # members proposing at once cannot walk through each other's words: never fewer forwards
        assert all(y.cost.forward_passes[k] >= n for k, n in x.cost.forward_passes.items())
