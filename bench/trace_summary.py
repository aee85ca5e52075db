"""Read a kernel timeline (bench/trace_step.py) and show where a decode step's time goes: per
kernel launch of the last steps (a step ends with the sampler), averaged over those steps,

  start   its first block's start, after the previous launch's last block ended (negative: it
          started while that one still ran: programmatic dependent launch)
  spread  from its first block's start to its last's
  release its blocks' waits returned this long after the previous launch ended (the dependency)
  after   from the last wait's return to its last block's end (the work that had to wait)
  adds    what it adds to the step: its last end after the previous launch's last end

and, for kernels that mark points of their body (trace_mark: the input staged, the arithmetic
done), the median block's time after its wait split at those marks. With --blocks, chosen launches
of the last step block by block: when their blocks started, their waits returned, they ended
(quantiles, after the previous launch's end) and how many of its blocks each SM ran (a launch
of more blocks than the SMs hold runs in waves).

    python bench/trace_summary.py OUT.csv [--steps 8] [--all [--first N]] [--blocks I,J|NAME] [--save LAST2.csv.gz]

(OUT.csv: trace_step.py's file, or a --save'd one.)
"""
import argparse
import csv
import gzip
import re
import statistics
from collections import Counter, defaultdict


def short(name: str) -> str:
    """The kernel's struct and template arguments, without namespaces."""
    m = re.search(r"\[with K = (.*)\]", name)
    s = m.group(1) if m else name
    s = re.sub(r"edgerunner::|cuda::|\{anonymous\}::|\(anonymous namespace\)::|_GLOBAL__N__\w+::", "", s)
    return s.replace("TensorType::", "").replace("KvType::", "")


def launches(rows):
    """The launches: each kernel's blocks in order of start, a launch ending where a block number
    comes again (the timer ticks every 32 ns: blocks of a launch and the next often start in one
    tick, so start times alone do not separate launches; two launches of one kernel never overlap)."""
    out = []
    by_kernel = defaultdict(list)
    for r in rows:
        by_kernel[r["name"]].append(r)
    for name, blocks in by_kernel.items():
        cur, seen = None, set()
        for r in sorted(blocks, key=lambda r: r["start"]):
            if cur is None or r["block"] in seen or len(seen) == cur["n"]:
                cur, seen = {"name": name, "n": r["blocks_total"], "blocks": []}, set()
                out.append(cur)
            seen.add(r["block"])
            cur["blocks"].append(r)
    for l in out:  # its first and last block's start, its first and last wait's return, its end
        b = l["blocks"]
        l["first"], l["last_start"] = min(x["start"] for x in b), max(x["start"] for x in b)
        w = [x["waited"] for x in b if x["waited"]]
        l["wait_min"], l["wait_max"] = (min(w), max(w)) if w else (None, None)
        l["end"] = max(x["end"] for x in b)
    # in the order their waits returned (each waits for the launch before it to end); a launch
    # whose blocks never waited, by its first block's start
    out.sort(key=lambda l: l["first"] if l["wait_min"] is None else l["wait_min"])
    return out


def show_blocks(i: int, launch: dict, prev_end: int) -> None:
    """Launch i's blocks: quantiles of their start, wait and end after the previous launch's end,
    of the time to each mark, and how many of its blocks each SM ran."""
    b = launch["blocks"]
    q = (0, 10, 25, 50, 75, 90, 100)
    us = 1e-3

    def line(label, values):
        v = sorted(values)
        if v:
            print(f"  {label:<22}" + "".join(f"{v[int(p / 100 * (len(v) - 1) + 0.5)]:8.2f}" for p in q))  # (nearest rank)

    per_sm = Counter(Counter(x["sm"] for x in b).values())  # blocks an SM ran → how many SMs ran that many
    waves = ", ".join(f"{n} on {per_sm[n]}" for n in sorted(per_sm))
    n_sm = sum(per_sm.values())
    print(f"{i:3d} {launch['name']}: {len(b)} block{'s' * (len(b) != 1)} on {n_sm} SM{'s' * (n_sm != 1)} (blocks an SM: {waves})")
    print(f"  {'µs, quantiles':<22}" + "".join(f"{p:7d}%" for p in q))
    line("start", [(x["start"] - prev_end) * us for x in b])
    line("wait returned", [(x["waited"] - prev_end) * us for x in b if x["waited"]])
    line("end", [(x["end"] - prev_end) * us for x in b])
    line("mark 0, after the wait", [(x["mark0"] - x["waited"]) * us for x in b if x["mark0"] and x["waited"]])
    line("mark 1, after mark 0", [(x["mark1"] - x["mark0"]) * us for x in b if x["mark1"] and x["mark0"]])
    at_mark1 = [x for x in b if x["mark1"]]
    if len(at_mark1) == 1:  # a block that alone reaches mark 1 (the sampler's last block): its own times
        x = at_mark1[0]
        t = lambda v: f"{(v - prev_end) * us:.2f}" if v else "-"
        print(f"  the block at mark 1: start {t(x['start'])}, wait returned {t(x['waited'])}, mark 0 {t(x['mark0'])}, "
              f"mark 1 {t(x['mark1'])}, end {t(x['end'])}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=8, help="the last this many decode steps")
    p.add_argument("--all", action="store_true", help="every launch of one step, in order, not per kernel")
    p.add_argument("--first", type=int, help="with --all: only the step's first this many launches")
    p.add_argument("--blocks", help="the last step's launches I,J,... (numbered as --all prints them, or every launch of "
                                     "a kernel whose name starts with NAME, e.g. Sample) block by block")
    p.add_argument("--save", help="write the blocks of the last two steps here (gzip CSV, names shortened)")
    args = p.parse_args()
    rows = []
    with (gzip.open(args.trace, "rt") if args.trace.endswith(".gz") else open(args.trace)) as f:
        for r in csv.DictReader(f):
            rows.append({"name": short(r["kernel"]), "sm": int(r["sm"]), "block": int(r["block"]), "blocks_total": int(r["blocks"]),
                         "start": int(r["start"]), "waited": int(r["waited"]), "end": int(r["end"]),
                         "mark0": int(r.get("mark0") or 0), "mark1": int(r.get("mark1") or 0)})
    ls = launches(rows)
    sampler = [l["name"].startswith("Sample") for l in ls]
    ends = [i for i, is_s in enumerate(sampler) if is_s and (i + 1 == len(ls) or not sampler[i + 1])]
    # a step: the launches after one step's sampler kernels (Sample, and SampleMass and SampleWalk
    # where the step draws) up to the next's last, timed from the first's end
    steps = [(ls[a]["end"], ls[a + 1:b + 1]) for a, b in zip(ends, ends[1:])][-args.steps:]
    if not steps:
        names = sorted({l["name"] for l in ls})
        raise SystemExit(f"no two decode steps in the trace (a step ends with the sampler): {len(rows)} blocks, "
                         f"{len(ls)} launches of {len(names)} kernels: {names[:8]}")
    if args.save:
        with gzip.open(args.save, "wt") as f:
            f.write("kernel,sm,block,blocks,start,waited,end,mark0,mark1\n")
            for _, step in steps[-2:]:
                for l in step:
                    for b in l["blocks"]:
                        f.write(f"{l['name'].replace(',', ';')},{b['sm']},{b['block']},{b['blocks_total']},{b['start']},{b['waited']},"
                                f"{b['end']},{b['mark0']},{b['mark1']}\n")
    us = 1e-3
    if args.blocks:
        prev_end, step = steps[-1]
        chosen = []
        for x in args.blocks.split(","):  # a launch's number, or a kernel name's start: its launches
            chosen += [int(x)] if x.isdigit() else [i for i, l in enumerate(step) if l["name"].startswith(x)]
        if not chosen:
            raise SystemExit(f"--blocks {args.blocks}: no launch of the last step is named so; its kernels: "
                             f"{sorted({l['name'].split('<')[0] for l in step})}")
        for i in chosen:
            if not 0 <= i < len(step):
                raise SystemExit(f"--blocks: the last step has launches 0 to {len(step) - 1}, not {i}")
            show_blocks(i, step[i], step[i - 1]["end"] if i else prev_end)
        return
    table = defaultdict(lambda: defaultdict(list))
    step_times = []
    for prev_end, step in steps:
        step_times.append((step[-1]["end"] - prev_end) * us)
        for i, l in enumerate(step):
            key = (i, l["name"]) if args.all else l["name"]
            t = table[key]
            t["start"].append((l["first"] - prev_end) * us)
            t["spread"].append((l["last_start"] - l["first"]) * us)
            if l["wait_max"] is not None:
                t["release"].append((l["wait_min"] - prev_end) * us)
                t["after"].append((l["end"] - l["wait_max"]) * us)
            t["adds"].append((l["end"] - prev_end) * us)
            t["blocks"].append(len(l["blocks"]))
            prev_end = l["end"]
    n = len(steps)
    print(f"{n} steps, {statistics.fmean(step_times):.1f} µs a step (min {min(step_times):.1f}); µs, mean per launch")
    print(f"{'kernel':<70} {'launches':>8} {'blocks':>6} {'start':>7} {'spread':>7} {'release':>7} {'after':>7} {'adds':>7} {'adds/step':>9}")
    items = list(table.items())
    if not args.all:
        items.sort(key=lambda kv: -sum(kv[1]["adds"]))
    elif args.first:
        items = items[:args.first]
    for key, t in items:
        name = f"{key[0]:3d} {key[1]}" if args.all else key
        m = lambda v: f"{statistics.fmean(v):7.2f}" if v else "      -"
        print(f"{name[:70]:<70} {len(t['adds']) / n:8.1f} {statistics.fmean(t['blocks']):6.0f} {m(t['start'])} {m(t['spread'])} "
              f"{m(t['release'])} {m(t['after'])} {m(t['adds'])} {sum(t['adds']) / n:9.1f}")
    if args.all:
        return
    # where a kernel marks points of its body (trace_mark): a block's time after its wait in parts
    parts = defaultdict(lambda: defaultdict(list))
    for _, step in steps:
        for l in step:
            for b in l["blocks"]:
                if not (b["waited"] and b["mark0"]):
                    continue
                p = parts[l["name"]]
                p["input"].append((b["mark0"] - b["waited"]) * us)
                if b["mark1"]:
                    p["middle"].append((b["mark1"] - b["mark0"]) * us)
                p["rest"].append((b["end"] - (b["mark1"] or b["mark0"])) * us)
    if parts:
        print("\nblocks' time after their wait, by the kernels' marks (µs, median over blocks): to mark 0 "
              "(input staged), mark 0 to 1, to the end")
        for name, p in sorted(parts.items(), key=lambda kv: -len(kv[1]["input"])):
            med = lambda v: f"{statistics.median(v):7.2f}" if v else "      -"
            print(f"{name[:70]:<70} {len(p['input']):8d} {med(p['input'])} {med(p['middle'])} {med(p['rest'])}")


if __name__ == "__main__":
    main()
