"""End-to-end benchmark, like llama-bench: prefill of N tokens (pp) and decode of M tokens (tg).

    python -m bench MODEL [MODEL ...] [--threads 2] [--pp 512] [--tg 128] [--depth 0] [--reps 5]
                    [--backend cpu|cuda|cuda:N|metal] [--dispatch eager,argument_buffers,recorded]
                    [--peer PATH/llama-bench] [--json out.json]

MODEL is a .gguf path or a built-in name. Each figure is the mean ± standard deviation over
--reps repetitions after one warm-up. With --peer, llama.cpp's llama-bench runs on the same
file in the same run and the table shows ours / peer (the peer's median over its repetitions). Decode is also shown as a share of the
read-bandwidth roofline: weight bytes read per token / this machine's measured bandwidth
(on CUDA: the device's copy bandwidth; on Metal: the CPU's read bandwidth of the memory the GPU
shares, a lower bound of what the GPU reaches). --dispatch takes several GPU dispatch modes
(eager, argument_buffers, recorded), each a row. --depth N starts both with N tokens already in
the context (llama-bench's -d), where attention over the cache starts to count.
Memory is the process's resident set after load and a 16-token warm-up (weights, KV cache,
scratch for --chunk tokens) against the file size plus the KV cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Any

from edgerunner import _core, gguf, sources
from edgerunner.benchmark import measure, weight_bytes_per_token
from edgerunner.model import is_backend


def bench_ours(path: str, args: argparse.Namespace, dispatch: str = "auto") -> dict[str, Any]:
    return measure(path, pp=args.pp, tg=args.tg, depth=args.depth, reps=args.reps, threads=args.threads, kv_type=args.kv_type,
                   chunk=args.chunk, backend=args.backend, dispatch=dispatch)


def bench_peer(peer: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [peer, "-m", path, "-p", str(args.pp), "-n", str(args.tg), "-t", str(args.threads),
           "-r", str(args.reps), "-o", "json"]
    if args.depth:
        cmd += ["-d", str(args.depth)]
    if args.backend.startswith("cuda"):
        # all layers on our GPU alone (not split over the machine's GPUs), flash attention on
        cmd += ["-ngl", "99", "-sm", "none", "-mg", "0" if args.backend == "cuda" else args.backend[5:], "-fa", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = {"command": " ".join(cmd)}
    for row in json.loads(out):
        key = "pp" if row["n_prompt"] and not row["n_gen"] else "tg"
        samples = row.get("samples_ts") or [row["avg_ts"]]
        result[key] = {"mean": row["avg_ts"], "std": row["stddev_ts"], "values": samples,
                       "median": statistics.median(samples)}
        result["build"] = row.get("build_commit")
    return result


def fmt(s: dict[str, float] | None) -> str:
    return "–" if not s else f"{s['mean']:.1f} ± {s['std']:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help=".gguf paths or built-in names")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pp", type=int, default=512)
    p.add_argument("--tg", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (tokens per step)")
    p.add_argument("--depth", type=int, default=0,
                   help="tokens already in the context when pp and tg start (llama-bench's -d); the roofline counts weights only")
    p.add_argument("--kv-type", default="f16")
    p.add_argument("--backend", default="cpu", help="cpu, cuda, cuda:N (CUDA device N) or metal")
    p.add_argument("--dispatch", default="recorded", help="GPU dispatch modes, comma-separated: eager, argument_buffers, recorded")
    p.add_argument("--peer", help="llama.cpp's llama-bench binary, run on the same files")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    if not is_backend(args.backend) or args.backend == "auto":
        p.error(f"unknown backend {args.backend!r}: choose cpu, cuda, cuda:N or metal")
    cuda_gpu = int(args.backend.partition(":")[2] or 0) if args.backend.startswith("cuda") else None
    if cuda_gpu is not None:
        if not _core.cuda_available() or cuda_gpu >= _core.cuda_device_count():
            p.error(f"--backend {args.backend}: {_core.cuda_device(cuda_gpu)}")
        bandwidth = _core.cuda_copy_bandwidth(1 << 31, 5, cuda_gpu)
        machine = _core.cuda_device(cuda_gpu)
        print(f"{machine}: copy bandwidth {bandwidth:.0f} GB/s\n")
    elif args.backend == "metal":
        if not _core.metal_available():
            p.error(f"--backend metal: {_core.metal_device()}")
        bandwidth = _core.read_bandwidth(1 << 30, os.cpu_count() or args.threads, 5)
        machine = _core.metal_device()
        print(f"{machine}: CPU read bandwidth of the shared memory {bandwidth:.0f} GB/s (a lower bound of the GPU's)\n")
    else:
        bandwidth = _core.read_bandwidth(1 << 30, args.threads, 5)
        machine = platform.processor() or platform.machine()
        print(f"read bandwidth ({args.threads} threads): {bandwidth:.1f} GB/s; kernels: {_core.cpu_isa()}\n")
    gpu = args.backend != "cpu"
    dispatches = args.dispatch.split(",") if gpu else ["auto"]
    report: dict[str, Any] = {"machine": machine, "backend": args.backend, "threads": args.threads,
                              "read_bandwidth_gbs": bandwidth, "pp": args.pp, "tg": args.tg, "depth": args.depth, "models": []}
    at = f" @ d{args.depth}" if args.depth else ""
    print(f"| model | ours pp{args.pp}{at} tok/s | ours tg{args.tg}{at} tok/s | roofline % | RSS / (file + KV) |"
          + (f" peer pp{args.pp}{at} (median) | peer tg{args.tg}{at} (median) | pp ratio | tg ratio |" if args.peer else ""))
    print("| --- | --- | --- | --- | --- |" + (" --- | --- | --- | --- |" if args.peer else ""))
    for source in args.models:
        path = str(sources.resolve(source))
        f = gguf.open(path)
        per_token = weight_bytes_per_token(f)
        roofline = bandwidth * 1e9 / per_token
        peer = bench_peer(args.peer, path, args) if args.peer else None
        for dispatch in dispatches:
            ours = bench_ours(path, args, dispatch)
            label = os.path.basename(path) + (f" ({dispatch})" if gpu else "")
            row: dict[str, Any] = {"model": label, "file_size": f.file_size, "dispatch": dispatch,
                                   "weight_bytes_per_token": per_token, "roofline_tok_s": roofline, "ours": ours}
            memory = ours["rss_after_load"] / (f.file_size + ours["kv_bytes"])
            line = (f"| {label} | {fmt(ours['pp'])} | {fmt(ours['tg'])} | "
                    f"{100 * ours['tg']['mean'] / roofline:.0f} % of {roofline:.0f} | "
                    f"{ours['rss_after_load'] / 2**20:.0f} MiB ({memory:.2f} ×) |")
            if peer:
                row["peer"] = peer
                # the peer's median: llama-bench's first repetition can run at half speed
                row["ratio"] = {k: ours[k]["mean"] / peer[k]["median"] for k in ("pp", "tg")}
                line += (f" {peer['pp']['median']:.1f} | {peer['tg']['median']:.1f} | {row['ratio']['pp']:.2f} × |"
                         f" {row['ratio']['tg']:.2f} × |")
            print(line, flush=True)
            report["models"].append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
