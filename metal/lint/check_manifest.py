"""The Metal kernel manifest check: metal/kernels.def against the code it describes.

    python3 metal/lint/check_manifest.py [ROOT]      exit status 1 and one line per problem

Checks, from source text alone (no Metal compiler needed):
  - every OpKind of csrc/core/plan.h is run by some kernel of the manifest, and the manifest
    names no op kind plan.h does not have;
  - every weight type the CPU reads (csrc/core/tensor_type.cpp, dequantize = true) has an
    embed_, a gemv_ and a gemm_ kernel;
  - every argument struct the manifest names is defined in edgerunner/kernel_args.h, with
    ER_ASSERT_SIZE (and every struct there has one);
  - the `kernel void` functions of metal/*.metal are exactly the manifest's, no duplicates, each
    taking `constant <its struct>& ... [[buffer(ER_BUFFER_ARGS)]]`, then
    `constant er_step_block& ... [[buffer(ER_BUFFER_STEP)]]`, then ER_THREAD_POSITION, nothing
    else; ER_BUFFER_ARGS and ER_BUFFER_STEP are distinct;
  - the function constants of metal/common.h use every ER_FC_* index of kernel_args.h once.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

KERNEL_ENTRY = re.compile(r"^\s*ER_KERNEL\(\s*(\w+)\s*,\s*(\w+)\s*,([^)]*)\)", re.M)
KERNEL_DEF = re.compile(r"\bkernel\s+void\s+(\w+)\s*\(([^{]*)\)\s*\{", re.S)
PARAM = re.compile(r"^constant\s+(\w+)\s*&\s*(\w+)\s*\[\[\s*buffer\(\s*(\w+)\s*\)\s*\]\]$")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _defines(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\s*#define\s+(\w+)\s+([^\n/]+)", text, re.M)}


def _split_params(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return [" ".join(p.split()) for p in out]


def check(root: Path) -> list[str]:
    root = Path(root)
    problems: list[str] = []
    manifest_path = root / "metal" / "kernels.def"
    manifest_text = _strip_comments(manifest_path.read_text())
    manifest: dict[str, tuple[str, list[str]]] = {}
    for m in KERNEL_ENTRY.finditer(manifest_text):
        name, struct, ops = m.group(1), m.group(2), m.group(3).split()
        if name in manifest:
            problems.append(f"kernels.def: {name} listed twice")
        manifest[name] = (struct, ops)
    if not manifest:
        return ["kernels.def: no ER_KERNEL entries"]

    # plan.h's op kinds
    plan = _strip_comments((root / "csrc" / "core" / "plan.h").read_text())
    m = re.search(r"enum\s+class\s+OpKind\s*:\s*\w+\s*\{([^}]*)\}", plan)
    if not m:
        return problems + ["plan.h: enum class OpKind not found"]
    op_kinds = [k.strip().split("=")[0].strip() for k in m.group(1).split(",") if k.strip()]
    covered = {op for _, ops in manifest.values() for op in ops}
    for op in op_kinds:
        if op not in covered:
            problems.append(f"OpKind::{op} (plan.h) has no Metal kernel in kernels.def")
    for op in sorted(covered - set(op_kinds)):
        problems.append(f"kernels.def names op kind {op}, which plan.h's OpKind does not have")

    # weight types the CPU reads
    types = re.findall(r'\{TensorType::(\w+),\s*"\w+",\s*\d+,\s*\d+,\s*true\}', (root / "csrc" / "core" / "tensor_type.cpp").read_text())
    if not types:
        problems.append("tensor_type.cpp: no dequantizable types found")
    for t in types:
        for family in ("embed", "gemv", "gemm"):
            if f"{family}_{t.lower()}" not in manifest:
                problems.append(f"weight type {t} has no {family}_{t.lower()} kernel in kernels.def")

    # argument structs
    args_text = _strip_comments((root / "csrc" / "include" / "edgerunner" / "kernel_args.h").read_text())
    structs = set(re.findall(r"typedef\s+struct\s*\{[^}]*\}\s*(\w+)\s*;", args_text, re.S))
    sized = set(re.findall(r"ER_ASSERT_SIZE\(\s*(\w+)\s*,", args_text))
    for s in sorted(structs - sized):
        problems.append(f"kernel_args.h: struct {s} has no ER_ASSERT_SIZE")
    for name, (struct, _) in manifest.items():
        if struct not in structs:
            problems.append(f"kernels.def: {name} takes {struct}, which kernel_args.h does not define")
    defines = _defines(args_text)
    if defines.get("ER_BUFFER_ARGS") is None or defines.get("ER_BUFFER_ARGS") == defines.get("ER_BUFFER_STEP"):
        problems.append("kernel_args.h: ER_BUFFER_ARGS and ER_BUFFER_STEP must be defined and distinct")

    # the kernels themselves
    seen: dict[str, str] = {}
    for path in sorted((root / "metal").glob("*.metal")):
        text = _strip_comments(path.read_text())
        for km in KERNEL_DEF.finditer(text):
            name, params = km.group(1), _split_params(km.group(2))
            where = f"{path.name}: kernel {name}"
            if name in seen:
                problems.append(f"{where}: also defined in {seen[name]}")
            seen[name] = path.name
            if name not in manifest:
                problems.append(f"{where} is not in kernels.def")
                continue
            struct = manifest[name][0]
            if len(params) != 3 or params[2] != "ER_THREAD_POSITION":
                problems.append(f"{where}: parameters must be (args, step, ER_THREAD_POSITION), got {params}")
                continue
            a, s = PARAM.match(params[0]), PARAM.match(params[1])
            if not a or a.group(1) != struct or a.group(3) != "ER_BUFFER_ARGS":
                problems.append(f"{where}: first parameter must be 'constant {struct}& a [[buffer(ER_BUFFER_ARGS)]]', got '{params[0]}'")
            if not s or s.group(1) != "er_step_block" or s.group(3) != "ER_BUFFER_STEP":
                problems.append(f"{where}: second parameter must be 'constant er_step_block& step [[buffer(ER_BUFFER_STEP)]]', got '{params[1]}'")
    for name in manifest:
        if name not in seen:
            problems.append(f"kernels.def lists {name}, but no metal/*.metal file defines it")

    # function constants
    common = _strip_comments((root / "metal" / "common.h").read_text())
    fc_indices = {k: v for k, v in defines.items() if k.startswith("ER_FC_") and k != "ER_FC_COUNT"}
    used: dict[str, str] = {}
    for fm in re.finditer(r"^\s*ER_FUNCTION_CONSTANT\(\s*\w+\s*,\s*(\w+)\s*,\s*(\w+)\s*\)", common, re.M):
        name, index = fm.group(1), fm.group(2)
        if index not in fc_indices:
            problems.append(f"common.h: function constant {name} uses {index}, not an ER_FC_* index of kernel_args.h")
        elif index in used:
            problems.append(f"common.h: function constants {used[index]} and {name} share {index}")
        used[index] = name
    for index in sorted(set(fc_indices) - set(used)):
        problems.append(f"kernel_args.h: {index} has no function constant in common.h")
    values = sorted(int(v) for v in fc_indices.values() if v.isdigit())
    if values != list(range(len(fc_indices))) or defines.get("ER_FC_COUNT") != str(len(fc_indices)):
        problems.append("kernel_args.h: ER_FC_* must number 0 .. ER_FC_COUNT - 1 without gaps")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    problems = check(root)
    for p in problems:
        print(p)
    if not problems:
        print(f"metal manifest: {len(KERNEL_ENTRY.findall(_strip_comments((root / 'metal' / 'kernels.def').read_text())))} kernels, all consistent")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
