"""TextWorld Commonsense (TWC) in TextWorldExpress: put the objects lying around a house where they
belong — ALFWorld's pick-and-place in spirit.

Difficulty (TextWorldExpress's gameParams, checked here): `num_locations` rooms (numLocations, 1..3),
`num_items_to_put_away` misplaced objects (numItemsToPutAway, 1..4), `include_doors` (includeDoors:
closed doors between rooms), `limit_inventory_size` (limitInventorySize). The game's score counts
picking up a misplaced object and putting it where it belongs (taking a placed one back or putting
one in the wrong place lowers it); it is 1.0, and the episode solved, once every object is in place.
Menu, rewards, folds, episode end, memory and the JVM: `rlid.envs.textworld`. Compiled memory adds
"Placed where they belong: <object> in <container>; ..." (a put that raised the score, until the
object is taken again); with `failed_puts` also "Tried, not where they belong: <object> in <container>;
..." (every put that lowered the score, once each)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from runtime.errors import ConfigError
from rlid.envs.base import check_bool, check_int
from rlid.envs.text_memory import Record
from rlid.envs.textworld import TextWorldEnv, check_textworld_options

INSTRUCTION = ("TextWorld Commonsense: some objects in this house are out of place. Find them, pick them up "
               "and put each one where it usually belongs.")
PUT_MOVE = re.compile(r"^put (?P<item>.+?) (?:in|on) (?P<where>.+)$")
TAKE_MOVE = re.compile(r"^take (?P<item>.+?)(?: from .+)?$")


@dataclass(frozen=True)
class TWCOptions:
    """TWC's difficulty (TextWorldExpress gameParams, see the module docstring), the seeds' `fold`
    (None: each seed's own official fold), the episode length `max_steps` and `compiled_memory`."""

    num_locations: int = 2
    num_items_to_put_away: int = 2
    include_doors: bool = False
    limit_inventory_size: bool = False
    fold: str | None = None
    max_steps: int = 20
    compiled_memory: bool = False
    failed_puts: bool = False

    def validate(self) -> None:
        check_int("num_locations", self.num_locations, 1, 3)
        check_int("num_items_to_put_away", self.num_items_to_put_away, 1, 4)
        check_textworld_options(self)
        check_bool("failed_puts", self.failed_puts)
        if self.failed_puts and not self.compiled_memory:
            raise ConfigError("failed_puts is a line of the compiled memory; set compiled_memory: true with it")


def placed(records: Sequence[Record]) -> dict[str, str]:
    """Object -> where it was put, for the puts that raised the score and were not taken back."""
    where: dict[str, str] = {}
    for r in records[1:]:
        put, take = PUT_MOVE.match(r.action or ""), TAKE_MOVE.match(r.action or "")
        if put and r.reward > 0:
            where[put.group("item")] = put.group("where")
        elif take:
            where.pop(take.group("item"), None)
    return where


def failed_puts(records: Sequence[Record]) -> list[tuple[str, str]]:
    """(object, where) of every put that lowered the score, in order, each once."""
    out: list[tuple[str, str]] = []
    for r in records[1:]:
        put = PUT_MOVE.match(r.action or "")
        if put and r.reward < 0 and (put.group("item"), put.group("where")) not in out:
            out.append((put.group("item"), put.group("where")))
    return out


class TWCEnv(TextWorldEnv):
    """Seeded TextWorld Commonsense games (`rlid.types.Environment`); see the module docstring."""

    name = "twc"
    game_name = "twc"
    instruction = INSTRUCTION

    def __init__(self, options: TWCOptions | None = None) -> None:
        super().__init__(options or TWCOptions())

    def game_params(self) -> str:
        o = self.options
        return (f"numLocations={o.num_locations},numItemsToPutAway={o.num_items_to_put_away},"
                f"includeDoors={int(o.include_doors)},limitInventorySize={int(o.limit_inventory_size)}")

    def progress(self, records: Sequence[Record]) -> list[str]:
        done = placed(records)
        text = "; ".join(f"{item} in the {where}" for item, where in done.items()) or "nothing yet"
        lines = [f"Placed where they belong: {text}."]
        if self.options.failed_puts:
            tried = failed_puts(records)
            lines.append(f"Tried, not where they belong: {'; '.join(f'{i} in the {w}' for i, w in tried) or 'nothing yet'}.")
        return lines
