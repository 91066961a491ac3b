"""CookingWorld in TextWorldExpress: find the cookbook, read the recipe, gather its ingredients,
prepare them as it says (slice, dice, chop; fry, grill, roast), then prepare the meal and eat it.

Difficulty (TextWorldExpress's gameParams, checked here): `num_locations` rooms (numLocations,
1..11), `num_ingredients` in the recipe (numIngredients, 1..5), `num_distractor_items` other foods
(numDistractorItems, 0..10), `include_doors` (includeDoors), `limit_inventory_size`
(limitInventorySize). The game's score counts the recipe's steps done; it is 1.0, and the episode
solved, when the meal is eaten. A wrong move (eating something else, cooking an ingredient the wrong
way) ends the episode as the game's task failure, keeping the score so far. Menu, rewards, folds,
episode end, memory and the JVM: `rlid.envs.textworld`. Compiled memory adds the recipe once read
and the moves that raised the score."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rlid.envs.base import check_int
from rlid.envs.text_memory import Record, one_line
from rlid.envs.textworld import TextWorldEnv, check_textworld_options

INSTRUCTION = ("CookingWorld: you are hungry. Find the cookbook and read the recipe, gather its ingredients, "
               "prepare them as the directions say, then prepare the meal and eat it.")
_RECIPE_MARK = "Ingredients:"
_DIRECTIONS_MARK = "Directions:"


@dataclass(frozen=True)
class CookingOptions:
    """CookingWorld's difficulty (TextWorldExpress gameParams, see the module docstring), the seeds'
    `fold` (None: each seed's own official fold), the episode length `max_steps` and
    `compiled_memory`."""

    num_locations: int = 1
    num_ingredients: int = 2
    num_distractor_items: int = 2
    include_doors: bool = False
    limit_inventory_size: bool = False
    fold: str | None = None
    max_steps: int = 30
    compiled_memory: bool = False

    def validate(self) -> None:
        check_int("num_locations", self.num_locations, 1, 11)
        check_int("num_ingredients", self.num_ingredients, 1, 5)
        check_int("num_distractor_items", self.num_distractor_items, 0, 10)
        check_textworld_options(self)


def recipe(records: Sequence[Record]) -> str | None:
    """The recipe as last read (the feedback of a move that showed it), on one line: "Ingredients:
    salt, yellow potato. Directions: slice the yellow potato; prepare meal."; None if unread."""
    shown = [r.feedback for r in records[1:] if _RECIPE_MARK in r.feedback]
    if not shown:
        return None
    _, _, listed = shown[-1].partition(_RECIPE_MARK)
    ingredients, _, directions = listed.partition(_DIRECTIONS_MARK)
    items = [line.strip() for line in ingredients.splitlines() if line.strip()]
    steps = [line.strip() for line in directions.splitlines() if line.strip()]
    if not items or not steps:
        return one_line(shown[-1])
    return f"Ingredients: {', '.join(items)}. Directions: {'; '.join(steps)}."


class CookingEnv(TextWorldEnv):
    """Seeded CookingWorld games (`rlid.types.Environment`); see the module docstring."""

    name = "cooking"
    game_name = "cookingworld"
    instruction = INSTRUCTION

    def __init__(self, options: CookingOptions | None = None) -> None:
        super().__init__(options or CookingOptions())

    def game_params(self) -> str:
        o = self.options
        return (f"numLocations={o.num_locations},numIngredients={o.num_ingredients},"
                f"numDistractorItems={o.num_distractor_items},includeDoors={int(o.include_doors)},"
                f"limitInventorySize={int(o.limit_inventory_size)}")

    def progress(self, records: Sequence[Record]) -> list[str]:
        read = recipe(records)
        scored = [r.action for r in records[1:] if r.reward > 0]
        return [f"Recipe: {read if read else 'not read yet'}",
                f"Done so far (moves that raised the score): {'; '.join(scored) if scored else 'nothing yet'}."]
