"""Work of several members that meets at the model: views of one model share each forward.

`run_together(items, fn)` runs `fn(item)` for every item as a coroutine of its own (a greenlet, all in
the calling thread). Each model forward an item makes (`KVState._run_model`) suspends it at their
`ForwardGroup`; once every item still running waits for a forward (or has finished), the waiting
forwards run, those of one model as one stacked forward (`runtime.stacked_forward`: each state keeps
its own cache, the weights are read once), and every item resumes with its own result, in item order.
The code each item runs is the code it would run alone, so the results are those of running the items
one after another; only the number of model calls changes. Everything runs in one thread, in a fixed
order: no locks, no second pool of intra-op threads, a deterministic run.

An item that fails stops there (the others go on) and its exception is raised in the caller once
every item has stopped; a failed stacked forward fails each item that asked for it.

`run_members(items, member_of, fn)` is what the methods call for per-member work: members on
different devices run concurrently (`runtime.devices.run_by_device`), members sharing a model run
together, other members on one device one after another. `solo()` lets an item make forwards of
its own (cached prompt prefixes are computed alone, so they do not depend on a batch);
`one_after_another()` turns the grouping off (the reference that stacked forwards must equal).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch
from greenlet import getcurrent, greenlet

from runtime.devices import device_key, run_by_device

T = TypeVar("T")
R = TypeVar("R")

__all__ = ["ForwardGroup", "current_group", "model_groups", "one_after_another", "run_members", "run_together",
           "same_model", "solo"]


@dataclass
class _Ticket:
    """One item's forward, waiting at the group."""

    key: Any                      # forwards with equal keys (one model) run stacked
    payload: Any                  # what `execute` needs
    execute: Callable[[list[Any]], list[Any]]  # runs the payloads of one key, returns their results
    result: Any = None
    error: BaseException | None = None


@dataclass
class ForwardGroup:
    """Where the forwards of `size` items meet; `forwards` counts the model calls it made for them,
    `requests` the forwards they asked for."""

    size: int
    waiting: dict[int, _Ticket] = field(default_factory=dict)
    forwards: int = 0
    requests: int = 0

    def forward(self, index: int, key: Any, payload: Any, execute: Callable[[list[Any]], list[Any]]) -> Any:
        """Item `index` asks for a forward: it is suspended until the group has run it, then gets its
        result. `execute(payloads)` runs the forwards of one key (in item order), results in order."""
        ticket = _Ticket(key, payload, execute)
        self.waiting[index] = ticket
        getcurrent().parent.switch()  # back to `run_together`, which runs the forwards and resumes us
        if ticket.error is not None:
            raise ticket.error
        return ticket.result

    def run_waiting(self) -> None:
        """Run every waiting forward: those of one key together, keys in the order of their first item."""
        tickets = [self.waiting[i] for i in sorted(self.waiting)]
        self.waiting.clear()
        by_key: dict[int, list[_Ticket]] = {}
        for t in tickets:
            by_key.setdefault(id(t.key), []).append(t)
        for group in by_key.values():
            self.forwards += 1
            self.requests += len(group)
            try:
                for t, r in zip(group, group[0].execute([t.payload for t in group])):
                    t.result = r
            except Exception as exc:  # noqa: BLE001 - handed to every item that asked
                for t in group:
                    t.error = exc


class _Item(greenlet):
    """One item of `run_together`: a greenlet that knows its group and index."""

    def __init__(self, run: Callable[[], None], group: ForwardGroup, index: int):
        super().__init__(run, getcurrent())
        self.group, self.index, self.solo = group, index, 0


class _Local(threading.local):
    def __init__(self) -> None:
        self.apart = 0


_local = _Local()


def current_group() -> tuple[ForwardGroup, int] | None:
    """(the group this item's forwards meet at, its index), or None: forward alone."""
    me = getcurrent()
    if not isinstance(me, _Item) or me.solo:
        return None
    return me.group, me.index


@contextlib.contextmanager
def solo() -> Iterator[None]:
    """Forwards made inside this block run alone, not through the item's group."""
    me = getcurrent()
    if isinstance(me, _Item):
        me.solo += 1
    try:
        yield
    finally:
        if isinstance(me, _Item):
            me.solo -= 1


@contextlib.contextmanager
def one_after_another() -> Iterator[None]:
    """Inside this block (this thread), `run_together` runs its items one after another: views make
    their forwards alone (the reference that stacked forwards must equal; `benchmarks/view_cost.py`)."""
    _local.apart += 1
    try:
        yield
    finally:
        _local.apart -= 1


@torch.no_grad()
def run_together(items: Sequence[T], fn: Callable[[T], R]) -> list[R]:
    """`[fn(item) for item in items]`, results in item order, each item a coroutine whose forwards meet
    in one `ForwardGroup` (see the module docstring). One item, a call from inside an item, or
    `one_after_another()` runs inline. The first exception, in item order, is raised once every item
    has stopped."""
    if len(items) <= 1 or isinstance(getcurrent(), _Item) or _local.apart:
        return [fn(item) for item in items]
    group = ForwardGroup(len(items))
    results: list[Any] = [None] * len(items)
    errors: dict[int, BaseException] = {}

    def body(i: int) -> None:
        try:
            results[i] = fn(items[i])
        except Exception as exc:  # noqa: BLE001 - re-raised below, in the caller
            errors[i] = exc

    running = [_Item(lambda i=i: body(i), group, i) for i in range(len(items))]
    while running:
        for item in running:  # each runs until it waits for a forward or finishes
            item.switch()
        running = [item for item in running if not item.dead]
        if group.waiting:
            group.run_waiting()
    if errors:
        raise errors[min(errors)]
    return results


def same_model(a: Any, b: Any) -> bool:
    """Whether two members run on one loaded model (views of it): their forwards can be stacked."""
    return getattr(a, "model", None) is not None and getattr(a, "model", None) is getattr(b, "model", None)


def model_groups(items: Sequence[T], member_of: Callable[[T], Any]) -> list[list[T]]:
    """`items` grouped by the model their member runs (views of one model together), groups in the
    order of their first item, items in order within a group."""
    groups: list[list[T]] = []
    for item in items:
        home = next((g for g in groups if same_model(member_of(g[0]), member_of(item))), None)
        if home is None:
            groups.append([item])
        else:
            home.append(item)
    return groups


def run_members(items: Sequence[T], member_of: Callable[[T], Any], fn: Callable[[T], R]) -> list[R]:
    """`[fn(item) for item in items]`, results in item order: items whose members share a model run
    together (`run_together`), other items on one device one after another, devices concurrently."""
    groups = model_groups(list(range(len(items))), lambda i: member_of(items[i]))
    per_group = run_by_device(groups, lambda g: device_key(member_of(items[g[0]])),
                              lambda g: run_together([items[i] for i in g], fn))
    results: list[Any] = [None] * len(items)
    for g, out in zip(groups, per_group):
        for i, r in zip(g, out):
            results[i] = r
    return results
