"""Record the CUDA kernels' block timeline of a generation (greedy, or drawn with --sampling's
parameters: name=value pairs as _core.Sampler takes them), as bench's tg runs it (needs a
build with -C cmake.define.EDGERUNNER_CUDA_TRACE=ON; csrc/cuda/trace.cuh):

    python bench/trace_step.py FILE OUT.csv [--dispatch recorded] [--tokens 16] [--sampling temperature=0.8,top_p=0.9]
    python bench/trace_summary.py OUT.csv

Every block of every kernel is one row (its start, when its wait for the input returned, its
end, in ns of the GPU's global timer). Recording adds a barrier, an atomic and a store to each
block's end: the times are the timeline of a slightly slower run.
"""
import argparse
import gc
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--dispatch", default="recorded")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--sampling", help="name=value,... (_core.Sampler's parameters); default greedy")
    args = p.parse_args()
    params = {}  # (checked before the model loads)
    for kv in args.sampling.split(",") if args.sampling else []:
        k, sep, v = kv.partition("=")
        try:
            params[k] = int(v) if k in ("top_k", "seed", "penalty_last_n") else float(v)
        except ValueError:
            sep = ""
        if not sep:
            p.error(f"--sampling: {kv!r} is not name=number (e.g. temperature=0.8,top_k=40)")
    if os.path.exists(args.out):
        os.remove(args.out)  # (the step runners add to it)
    os.environ["EDGERUNNER_CUDA_TRACE"] = args.out  # (read once, at the first launch built)
    import numpy as np

    from edgerunner import _core

    model = _core.Model.load(args.model, backend="cuda", dispatch=args.dispatch, n_ctx=args.tokens + 32, prefill_chunk=16)
    session = _core.Session(model)
    n_vocab = model.config["n_vocab"]
    session.eval(np.random.default_rng(0).integers(0, n_vocab, size=16).astype(np.int32))  # warm-up
    session.rewind(0)
    session.eval(np.array([1], dtype=np.int32))
    session.generate(_core.Sampler(n_vocab, **params), args.tokens + 1, [])
    del session, model
    gc.collect()  # (the step runners add their records to the file as they go)
    if not os.path.exists(args.out):
        sys.exit(f"no trace written to {args.out}: is this a build with -C cmake.define.EDGERUNNER_CUDA_TRACE=ON?")


if __name__ == "__main__":
    main()
