"""MemberLoader: every kind of member spec -> a Member, strings cached by (spec, dtype, device);
bad specs are one-line ConfigErrors."""
import pytest
import torch

from runtime import loader as loader_mod
from runtime import member as member_mod
from runtime.errors import ConfigError, ModelNotFetchedError
from runtime.loader import MemberLoader, default_loader, load
from runtime.member import Member
from runtime.testing import char_tokenizer, tiny_member, tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    tiny_model("llama", vocab_size=len(char_tokenizer())).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def fake_loads(monkeypatch):
    """runtime.member.load_member replaced by a tiny model; records its calls."""
    calls = []

    def fake(name, dtype="float32", device="cpu", **kw):
        calls.append((name, dtype, device))
        return tiny_member("llama", name=name)

    monkeypatch.setattr(member_mod, "load_member", fake)
    return calls


def one_line_config_error(fn, *args, match, **kwargs):
    with pytest.raises(ConfigError, match=match) as exc:
        fn(*args, **kwargs)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_a_member_is_returned_as_is():
    m = tiny_member("llama")
    assert MemberLoader().member(m) is m


def test_a_pair_is_wrapped_as_given():
    model, tok = tiny_model("qwen2", vocab_size=len(char_tokenizer())), char_tokenizer()
    m = MemberLoader(dtype="bfloat16").member((model, tok))
    assert isinstance(m, Member) and m.model is model and m.tokenizer is tok
    assert m.dtype == torch.float32  # used as given, not converted
    assert MemberLoader().member([model, tok]).model is model


def test_a_folder_loads_once_per_dtype_and_device(folder, monkeypatch):
    ld = MemberLoader()
    m = ld.member(str(folder))
    assert m.name == "tiny" and m.vocab_size == len(char_tokenizer()) and m.dtype == torch.float32
    assert ld.member(folder) is m                          # a Path
    assert ld.member(str(folder), dtype="fp32", device=torch.device("cpu")) is m
    monkeypatch.chdir(folder.parent)
    assert ld.member("tiny") is m and ld.member("./tiny/") is m
    bf = ld.member(str(folder), dtype=torch.bfloat16)
    assert bf is not m and bf.dtype == torch.bfloat16 and len(ld) == 2
    assert ld.cached() == [m, bf]
    assert MemberLoader().member(str(folder)) is not m     # each loader has its own cache
    ld.clear()
    assert len(ld) == 0 and ld.member(str(folder)) is not m


def test_names_go_through_load_member_with_the_loaders_dtype(fake_loads):
    ld = MemberLoader(dtype="bf16")
    a = ld.member("smollm2-135m")
    assert ld.member("smollm2-135m") is a and ld.member("smollm2-135m", dtype="bfloat16") is a
    b = ld.member("org/some-model", device="cpu")
    assert fake_loads == [("smollm2-135m", torch.bfloat16, "cpu"), ("org/some-model", torch.bfloat16, "cpu")]
    assert ld.members(["smollm2-135m", b, "org/some-model"]) == [a, b, b]


def test_module_level_load_shares_one_cache(fake_loads, monkeypatch):
    monkeypatch.setattr(loader_mod, "_default", None)
    m = load("gemma3-270m")
    assert load("gemma3-270m", dtype="float32", device="cpu") is m and default_loader().cached() == [m]
    assert load("gemma3-270m", dtype="bfloat16") is not m
    assert [c[:2] for c in fake_loads] == [("gemma3-270m", torch.float32), ("gemma3-270m", torch.bfloat16)]


@pytest.mark.parametrize("spec, match", [
    (None, "member None is invalid: give a registry name"),
    (3, "member 3 is invalid"),
    ("", "member '' is empty"),
    ("  ", "is empty"),
    (("smollm2-135m", "gemma3-270m"), "is invalid: give a registry name"),
    ((1, 2), r"member pair \(int, int\) is invalid: give \(a causal LM"),
    ((tiny_model("llama"), tiny_model("llama")), r"pair \(LlamaForCausalLM, LlamaForCausalLM\) is invalid"),
    ((1, 2, 3), "is invalid"),
])
def test_bad_specs(spec, match):
    one_line_config_error(MemberLoader().member, spec, match=match)


def test_swapped_pair_says_so():
    pair = (char_tokenizer(), tiny_model("llama", vocab_size=len(char_tokenizer())))
    one_line_config_error(MemberLoader().member, pair, match=r"is \(tokenizer, model\): give \(model, tokenizer\)")


def test_unknown_names_and_bad_folders(tmp_path):
    msg = one_line_config_error(MemberLoader().member, "smollm-135m", match="unknown model 'smollm-135m'")
    assert "did you mean 'smollm2-135m'" in msg
    (tmp_path / "empty").mkdir()
    one_line_config_error(MemberLoader().member, str(tmp_path / "empty"), match="has no config.json")


def test_bad_dtype_and_device():
    one_line_config_error(MemberLoader, dtype="float64", match="unknown dtype 'float64'")
    one_line_config_error(MemberLoader, device="gpu", match="device 'gpu' is invalid")
    one_line_config_error(MemberLoader().member, "smollm2-135m", dtype="int8", match="unknown dtype 'int8'")


def test_a_registry_model_not_fetched_keeps_its_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFUSE_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFetchedError, match="adafuse models fetch gemma3-270m"):
        MemberLoader().member("gemma3-270m")


def test_a_load_logs_one_line_not_a_progress_bar(folder, capsys):
    """stderr not a terminal (a log): one line per load, no carriage-return frames of a bar."""
    from runtime.member import load_member

    load_member(str(folder), check_memory=False)
    err = capsys.readouterr().err
    assert err.count("loading tiny (float32)") == 1 and "\r" not in err and "Loading weights" not in err
