"""What a TextWorldExpress episode remembers, raw or compiled (`rlid.envs.textworld`).

An episode is a list of `Record`s: the reset (action None), then one per executed move, each with
the game's feedback, the current room's description ("look"), the inventory text and the score.

- `raw_memory(records, k)`: the raw observation history, the last k moves with the game's feedback,
  "Move n: <action> -> <feedback>" one a line.
- `compiled_memory(records, k, progress)`: a compact memory compiled from the same records: the rooms
  visited (in order), what was seen in each (its latest description: the things there, how
  containers stand, the exits), what is held, the game's own `progress` lines (what is already
  placed, a recipe read...), then the last k moves without their feedback.

Room descriptions are the game's templated sentences ("You are in the kitchen. In one part of the
room you see a fridge that is closed. ... \\nTo the West you see the living room."); `room_facts`
turns one into short items ("fridge (closed)", "counter (on it: a knife, a cookbook)",
"west: living room"), leaving any sentence it does not recognise as it is."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

_ROOM = re.compile(r"You are in the (?P<room>[^.]+)\.")
_LEAD = re.compile(r"^(?:In (?:one|another) part of the room you see|There is also|You also see)\s+", re.I)
_THING = re.compile(r"^(?:an?|some|the)\s+(?P<open>open\s+)?(?P<name>.+?)(?:,?\s+that\s+(?P<rest>.+))?$", re.I)
_EXIT = re.compile(r"^(?:Through (?P<door>.+? door), t|T)o the (?P<dir>\w+) you see (?P<what>.+?)$")
_INVENTORY_EMPTY = "inventory is currently empty"


@dataclass(frozen=True)
class Record:
    """One point of an episode: `action` (None at the reset), the game's `feedback` to it, the
    room description `look` and `inventory` text after it, the normalised `score` and the step's
    `reward` (score change)."""

    action: str | None
    feedback: str
    look: str
    inventory: str
    score: float
    reward: float = 0.0


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) as single spaces, trimmed."""
    return " ".join(text.split())


def room_of(look: str) -> str | None:
    """The room a description is of ("You are in the kitchen." -> "kitchen"), None if none."""
    found = _ROOM.search(look)
    return found.group("room").strip() if found else None


def _items(text: str) -> str:
    """"a knife, and a cookbook" -> "a knife, a cookbook"."""
    return re.sub(r",?\s+and\s+", ", ", text.strip())


def compact_thing(clause: str) -> str:
    """One object sentence, lead-in removed, in short: "a fridge that is closed" -> "fridge (closed)",
    "An open fridge, that contains some water" -> "fridge (open: some water)"; unknown shapes as is."""
    m = _THING.match(clause.strip().rstrip("."))
    if not m:
        return clause.strip().rstrip(".")
    name, rest = m.group("name").strip(), (m.group("rest") or "").strip()
    if not rest:
        return f"{name} (open)" if m.group("open") else name
    if rest == "is closed":
        return f"{name} (closed)"
    if rest == "is empty":
        return f"{name} (open, empty)"
    if rest == "has nothing on it":
        return f"{name} (nothing on it)"
    if rest.startswith("contains "):
        return f"{name} (open: {_items(rest[len('contains '):])})"
    if rest.startswith("has ") and rest.endswith(" on it"):
        return f"{name} (on it: {_items(rest[len('has '):-len(' on it')])})"
    return f"{name} ({rest})"


def compact_exit(sentence: str) -> str:
    """"To the West you see the living room." -> "west: living room"; "Through an open wood door,
    to the North you see the bathroom." -> "north: bathroom (through an open wood door)"."""
    m = _EXIT.match(sentence.strip().rstrip("."))
    if not m:
        return sentence.strip().rstrip(".")
    what = re.sub(r"^the\s+", "", m.group("what").strip())
    door = f" (through {m.group('door')})" if m.group("door") else ""
    return f"{m.group('dir').lower()}: {what}{door}"


def _sentences(text: str) -> list[str]:
    return [s for s in (part.strip() for part in re.split(r"(?<=\.)\s+", text.strip())) if s]


def room_facts(look: str) -> tuple[list[str], list[str]]:
    """(things seen, exits) of a room description, each in short (`compact_thing`, `compact_exit`)."""
    body, _, exits = look.partition("\n")
    things = []
    for sentence in _sentences(body):
        if _ROOM.fullmatch(sentence):
            continue
        things.append(compact_thing(_LEAD.sub("", sentence)))
    return things, [compact_exit(s) for s in _sentences(exits)]


def held(inventory: str) -> list[str]:
    """The items of an inventory text ("Inventory:\\n  a cushion\\n  a TV remote control\\n")."""
    if _INVENTORY_EMPTY in inventory:
        return []
    lines = [line.strip() for line in inventory.splitlines()[1:]]
    return [re.sub(r"^(?:an?|some|the)\s+", "", line) for line in lines if line]


def _move_lines(records: Sequence[Record], k: int, feedback: bool) -> list[str]:
    moves = list(records[1:])
    start = max(0, len(moves) - k)
    lines = []
    for n in range(start, len(moves)):
        r = moves[n]
        lines.append(f"Move {n + 1}: {r.action} -> {one_line(r.feedback)}" if feedback else f"Move {n + 1}: {r.action}")
    return lines


def raw_memory(records: Sequence[Record], k: int) -> str:
    """The last k moves with the game's feedback to each ("" if k == 0 or no move yet)."""
    if k < 0:
        raise ValueError(f"memory k must be >= 0, got {k}")
    return "\n".join(_move_lines(records, k, feedback=True)) if k else ""


def seen_rooms(records: Sequence[Record]) -> dict[str, str]:
    """Room -> its latest description, in the order the rooms were first visited."""
    rooms: dict[str, str] = {}
    for r in records:
        room = room_of(r.look)
        if room is not None:
            rooms[room] = r.look
    return rooms


def compiled_memory(records: Sequence[Record], k: int,
                    progress: Callable[[Sequence[Record]], list[str]] | None = None) -> str:
    """Visited rooms, what was seen where, what is held, `progress(records)` lines, the last k moves
    (see the module docstring); "" if k == 0 (the `Environment.memory` contract)."""
    if k < 0:
        raise ValueError(f"memory k must be >= 0, got {k}")
    if k == 0 or not records:
        return ""
    rooms = seen_rooms(records)
    lines = [f"Rooms visited: {', '.join(rooms) or 'none'}."]
    for room, look in rooms.items():
        things, exits = room_facts(look)
        text = f"Seen in the {room}: {'; '.join(things) or 'nothing'}."
        lines.append(text + (f" Exits: {'; '.join(exits)}." if exits else ""))
    carried = held(records[-1].inventory)
    lines.append(f"Holding: {', '.join(carried) if carried else 'nothing'}.")
    lines.extend(progress(records) if progress else [])
    moves = _move_lines(records, k, feedback=False)
    return "\n".join(lines + (["Last moves:"] + moves if moves else []))
