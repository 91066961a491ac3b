"""`adafuse models list|fetch|path|dtype`: the registry (`runtime.registry`) from the command line."""
from __future__ import annotations

import argparse

from runtime import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    sub.required = True
    sub.add_parser("list", help="name, family, tokenizer, size, and whether each model is ready locally")
    fetch = sub.add_parser("fetch", help="install, verify and convert models into the local cache (idempotent)")
    fetch.add_argument("names", nargs="+", metavar="NAME")
    fetch.add_argument("--force", action="store_true", help="convert again even if the model is ready")
    path = sub.add_parser("path", help="print the cached folder of a model")
    path.add_argument("name", metavar="NAME")
    dtype = sub.add_parser("dtype", help="the fast dtype on this CPU (what dtype=auto picks), measured once and cached")
    dtype.add_argument("--remeasure", action="store_true", help="measure again instead of reading the cache")


def run(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        print(f"{'name':<20} {'family':<8} {'tokenizer':<22} {'params':>6}  {'ready':<5}  path")
        for st in registry.list_models():
            ready = "yes" if st.ready else "no"
            print(f"{st.name:<20} {st.family:<8} {st.tokenizer:<22} {st.params:>6}  {ready:<5}  {st.path}")
        print(f"cache root: {registry.cache_root()} (set ADAFUSE_CACHE to move it)")
        return 0
    if args.models_command == "fetch":
        for name in args.names:
            registry.get_spec(name)  # fail fast on a typo before any download
        for name in args.names:
            registry.fetch(name, force=args.force)
        return 0
    if args.models_command == "path":
        registry.get_spec(args.name)
        if not registry.is_ready(args.name):
            registry.resolve(args.name)  # raises the "run: adafuse models fetch" error
        print(registry.model_dir(args.name))
        return 0
    if args.models_command == "dtype":
        from runtime.dtype_choice import fastest_dtype

        print(fastest_dtype("cpu", remeasure=args.remeasure).describe())
        return 0
    return 2
