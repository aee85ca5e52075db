"""The ``edgerunner`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from edgerunner.errors import GGUFError


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def resolve_model(source: str) -> str:
    """A path to an existing file, or a built-in alias fetched into the cache."""
    if os.path.exists(source) or os.sep in source or source.endswith(".gguf"):
        return source
    from edgerunner import builtin_models

    if source in builtin_models.ALIASES:
        return str(builtin_models.fetch(source, progress=lambda msg: print(msg, file=sys.stderr)))
    known = ", ".join(sorted(builtin_models.ALIASES))
    raise FileNotFoundError(f"{source!r} is neither a file nor a built-in model (built-in: {known})")


def _print_summary(s: dict[str, Any], tensors: list | None) -> None:
    print(f"file          {s['path']} ({_human_bytes(s['file_size'])}, GGUF v{s['gguf_version']})")
    print(f"architecture  {s['architecture'] or '(not set)'}" + (f"  [{s['name']}]" if s["name"] else ""))
    print(f"parameters    {_human_count(s['parameters'])} in {s['tensor_count']} tensors "
          f"({_human_bytes(s['tensor_bytes'])})")
    for key, value in s["hyperparameters"].items():
        print(f"  {key:<24}{value}")
    print("tensor types")
    for name, t in s["tensor_types"].items():
        print(f"  {name:<8}{t['count']:>6} tensors  {_human_bytes(t['bytes']):>10}")
    tok = s["tokenizer"]
    if tok["model"]:
        pre = f", pre-tokenizer {tok['pre']}" if tok["pre"] else ""
        print(f"tokenizer     {tok['model']}, {tok['vocab_size']} tokens{pre}")
    else:
        print("tokenizer     (none in the file)")
    print(f"chat template {'present' if s['chat_template'] else 'absent'}")
    if tensors is not None:
        print("tensors")
        for t in tensors:
            shape = "x".join(str(d) for d in t.shape)
            print(f"  {t.name:<40}{t.type_name:<8}{shape:>20}  {_human_bytes(t.n_bytes):>10}")


def cmd_info(args: argparse.Namespace) -> int:
    from edgerunner import gguf

    f = gguf.open(resolve_model(args.model))
    summary = f.summary()
    if args.json:
        if args.tensors:
            summary["tensors"] = [
                {"name": t.name, "type": t.type_name, "shape": list(t.shape), "offset": t.offset, "bytes": t.n_bytes}
                for t in f.tensors
            ]
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, f.tensors if args.tensors else None)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgerunner", description="Fast local LLM inference over GGUF models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="describe a GGUF model: architecture, sizes, tensor types, tokenizer")
    info.add_argument("model", help="path to a .gguf file, or a built-in model name")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument("--tensors", action="store_true", help="also list every tensor")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (GGUFError, OSError) as e:
        print(f"edgerunner: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
