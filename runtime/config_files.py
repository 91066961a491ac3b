"""Config files: find one (a path, or a shipped config by name from any folder) and read its YAML, every
mistake a one-line `ConfigError` (a missing file names the closest shipped config; a key given twice in
one mapping is refused). The eval, tune and RLiD configs all read theirs here."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from runtime.errors import ConfigError
from runtime.files import read_text


def shipped_config_dirs() -> list[Path]:
    """Where the configs that ship with adafuse are: `eval/configs/` in an installed wheel, the
    repository's `configs/` in a source checkout (editable install)."""
    top = Path(__file__).resolve().parents[1]  # site-packages (a wheel) or the repository (a checkout)
    return [d for d in (top / "eval" / "configs", top / "configs") if d.is_dir()]


def resolve_config_path(path: str | Path) -> Path:
    """`path` when it exists; else, for `configs/NAME.yaml` or a bare `NAME[.yaml]`, the shipped
    config of that name (so `adafuse eval configs/quickstart.yaml` works from any folder)."""
    path = Path(path)
    if path.is_file() or len(path.parts) > 2 or (len(path.parts) == 2 and path.parts[0] != "configs"):
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    for folder in shipped_config_dirs():
        if (folder / name).is_file():
            return folder / name
    return path


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently,
    so a pasted block could quietly override `output_path` or a setting declared above it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"key {key!r} is given twice (line {key_node.start_mark.line + 1}); keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """The parsed YAML of a config file (`resolve_config_path`); a missing, empty, binary or non-UTF-8
    file, a folder, bad YAML or a key given twice in one mapping is a one-line ConfigError."""
    path = resolve_config_path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder; give the path of a {what} YAML file (see configs/)")
    if not path.is_file():
        import difflib

        shipped = sorted({p.stem for d in shipped_config_dirs() for p in d.glob("*.yaml")})
        close = difflib.get_close_matches(path.stem, shipped, n=1)
        hint = (f" (did you mean '{close[0]}'? " if close else " (") + \
            (f"shipped configs: {', '.join(shipped)}; the experiments' configs are under experiments/)" if shipped
             else "the experiments' configs are under experiments/)")
        raise ConfigError(f"{what} file not found: {path}{hint}")
    text = read_text(path, f"a YAML {what}", "write it as UTF-8 YAML text (examples: configs/)", ConfigError)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({' '.join(str(exc).split())[:200]})") from None
