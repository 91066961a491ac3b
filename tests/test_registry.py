"""Registry: names, errors, local folders, memory check, CLI one-line errors."""
import subprocess
import sys

import pytest

from runtime import registry
from runtime.errors import InsufficientMemoryError, ModelNotFetchedError, UnknownModelError
from runtime.member import load_member
from runtime.testing import char_tokenizer, tiny_model


def test_known_names():
    assert set(registry.REGISTRY) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    qa, qb = registry.REGISTRY["qwen2.5-coder-0.5b"], registry.REGISTRY["qwen2.5-coder-1.5b"]
    assert qa.tokenizer == qb.tokenizer and len(qb.packages) == 22 and len(qa.packages) == 6


def test_unknown_name_lists_known_names():
    with pytest.raises(UnknownModelError) as exc:
        registry.resolve("smollm-135m")
    msg = str(exc.value)
    assert "smollm2-135m" in msg and "did you mean" in msg and "\n" not in msg


def test_not_fetched_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    assert registry.cache_root() == tmp_path
    with pytest.raises(ModelNotFetchedError, match="adafuse models fetch gemma3-270m"):
        load_member("gemma3-270m")
    assert not any(st.ready for st in registry.list_models())


def test_local_folder_loads(tmp_path):
    model, tok = tiny_model("llama", vocab_size=len(char_tokenizer())), char_tokenizer()
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    member = load_member(str(tmp_path / "tiny"))
    assert member.name == "tiny" and member.vocab_size == len(tok)
    assert member.generate(["abc"], max_new_tokens=3)[0].num_tokens >= 1


def test_memory_check_fails_before_loading(tmp_path, monkeypatch):
    model = tiny_model("llama", vocab_size=100)
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    registry.check_memory([str(folder)], "float32", available=10 * 2**30)
    with pytest.raises(InsufficientMemoryError, match="not enough free memory"):
        registry.check_memory([str(folder)], "float32", available=1000)


def test_cli_one_line_errors(tmp_path):
    env = {"ADAFUSE_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for argv, expect in [
        (["models", "fetch", "llama-7b"], "unknown model 'llama-7b'"),
        (["models", "path", "gemma3-270m"], "adafuse models fetch gemma3-270m"),
        (["generate", "--model", "nope", "--prompt", "hi"], "unknown model 'nope'"),
    ]:
        res = subprocess.run([sys.executable, "-m", "eval.cli", *argv], capture_output=True, text=True,
                             env={**env, "PYTHONPATH": ":".join(sys.path)})
        assert res.returncode == 2, res.stderr
        lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and expect in lines[0], res.stderr
    res = subprocess.run([sys.executable, "-m", "eval.cli", "models", "list"], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": ":".join(sys.path)})
    assert res.returncode == 0 and "qwen2.5-coder-1.5b" in res.stdout and " no " in res.stdout


def _fake_cache(root, name="gemma3-270m", marker_name=None):
    """A converted cache for registry model `name` holding a tiny model (its marker names `marker_name`)."""
    import json

    folder = registry.model_dir(name)
    model, tok = tiny_model("llama", vocab_size=len(char_tokenizer())), char_tokenizer()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / registry.MARKER).write_text(json.dumps({"name": marker_name or name}))
    return folder


@pytest.mark.parametrize("damage, needle", [
    ("truncate", "is damaged (truncated:"),
    ("header", "is damaged (header length"),
    ("foreign", "holds 'smollm2-135m', not 'gemma3-270m'"),
    ("no-weights", "has no weights"),
])
def test_a_damaged_or_foreign_model_cache_is_refused_naming_the_fix(tmp_path, monkeypatch, damage, needle):
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    folder = _fake_cache(tmp_path, marker_name="smollm2-135m" if damage == "foreign" else None)
    weights = next(folder.glob("*.safetensors"))
    if damage == "truncate":  # a disk that filled, a copy cut short
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "header":
        weights.write_bytes(b"\xff" * 64)
    elif damage == "no-weights":
        weights.unlink()
    with pytest.raises(registry.AdafuseError) as exc:
        load_member("gemma3-270m")
    msg = str(exc.value)
    assert needle in msg and "adafuse models fetch gemma3-270m --force" in msg and "\n" not in msg


def test_a_whole_cache_and_a_damaged_local_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    folder = _fake_cache(tmp_path)
    assert registry.resolve("gemma3-270m") == ("gemma3-270m", folder)
    assert load_member("gemma3-270m").vocab_size == len(char_tokenizer())
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(registry.AdafuseError, match=r"model folder '.*' is damaged \(.*truncated"):
        registry.resolve(str(folder))
