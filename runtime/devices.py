"""Where a member runs: `check_device` validates a device spec before any model loads.

Specs: "cpu", "cuda" / "cuda:N", "mps", or "auto" (transformers' `device_map="auto"`: the model is
split over the visible accelerators, then CPU, for a member too big for one device). An unknown
spec, or a device this machine does not have, is a one-line `ConfigError` naming what there is.
`run_by_device` runs per-member work concurrently where members sit on different devices.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence, TypeVar

import torch

from runtime.errors import ConfigError

AUTO = "auto"
T = TypeVar("T")
R = TypeVar("R")


def available() -> list[str]:
    """The devices this process can place a member on (for error messages)."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def check_device(spec: str | torch.device) -> str:
    """The normalised spec ("cpu", "cuda:0", "mps", "auto"); one-line ConfigError if unknown or absent."""
    if isinstance(spec, str) and spec.strip() == AUTO:
        return AUTO
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device {spec!r} is invalid: use cpu, cuda, cuda:N, mps or auto "
                          f"(here: {', '.join(available())})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ConfigError(f"device '{spec}' is not here: this machine has {have}; use one of "
                              f"{', '.join(available())}")
        return f"cuda:{index}"
    if device.type == "mps" and "mps" not in available():
        raise ConfigError(f"device '{spec}' is not here; use one of {', '.join(available())}")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device '{spec}' is not supported: use cpu, cuda, cuda:N, mps or auto")
    return str(device)


def check_devices(devices: list | None, num_members: int) -> list[str] | None:
    """One checked device per member (None: every member on the loader's device)."""
    if devices is None:
        return None
    if not isinstance(devices, (list, tuple)) or len(devices) != num_members:
        raise ConfigError(f"devices must list one device per member: {num_members} members, got {devices!r}")
    return [check_device(d) for d in devices]


def device_key(member: Any) -> str:
    """The device a member's forwards run on ("cpu", "cuda:1", ...), as `run_by_device` groups them."""
    try:
        return str(member.device)
    except (AttributeError, StopIteration):
        return "cpu"


def run_by_device(items: Sequence[T], device_of: Callable[[T], str], fn: Callable[[T], R]) -> list[R]:
    """`[fn(item) for item in items]`, results in item order. Items on one device run one after
    another, in order; groups on different devices run concurrently, one thread per group (torch
    releases the GIL in its kernels, and different GPUs work in parallel), so an ensemble step costs
    about its slowest device's share rather than the sum. A single group (every member on the CPU,
    whose cores intra-op threads already share: `benchmarks/member_concurrency.py`) runs inline.
    The first exception, in item order, is raised once every group has stopped."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(device_of(item), []).append(i)
    if len(groups) <= 1:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)
    errors: dict[int, BaseException] = {}

    def work(indices: list[int]) -> None:
        for i in indices:
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors[i] = exc
                return

    threads = [threading.Thread(target=work, args=(ix,), name=f"member-device-{dev}") for dev, ix in groups.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[min(errors)]
    return results
