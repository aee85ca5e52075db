"""bench/trace_summary.py, which reads the CUDA kernels' block timeline (trace builds; run on the
GPU machine), on a made-up trace: launches told apart where their blocks share timer ticks and one
kernel runs twice in a step, in the order their waits returned, with each launch's share of the step
and the kernels' marks."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def name(kernel: str) -> str:
    return f"const char* edgerunner::cuda::kernel_name() [with K = _GLOBAL__N__1_x_cu_ab::{kernel}]"


GEMV = "GemvStaged<edgerunner::TensorType::Q4_0; false; false; false>"


def step_rows(base: int) -> list[str]:
    """One decode step of 10 µs from `base` (ns): embed, norm, the same GEMV twice, sampler."""
    rows = [(name("Embed<edgerunner::TensorType::Q4_0>"), 0, 1, 100, 150, 1000, 0, 0),
            (name("RmsNorm"), 0, 1, 500, 1600, 2600, 2000, 0)]  # (starts before the embed ends)
    for b, end in enumerate([5000, 5100, 5200]):  # first launch: its first block starts in the norm's mark's tick
        rows.append((name(GEMV), b, 3, 2000 + 32 * (b == 2), 3100, end, 3400, 4400))
    for b in range(3):  # second launch: its blocks start in the tick the first one's first block ends
        rows.append((name(GEMV), b, 3, 5000, 5800, 7000, 6000, 6600))
    rows.append((name("Sample"), 0, 1, 5000, 7500, 8000, 0, 0))  # (starts in the tick the second launch's blocks do)
    return [f"{k.replace(',', ';')},{b % 7},{b},{n},{base + s},{base + w},{base + e},{base + m0 if m0 else 0},{base + m1 if m1 else 0}"
            for k, b, n, s, w, e, m0, m1 in rows]


def summary(tmp_path, *args):
    lines = ["kernel,sm,block,blocks,start,waited,end,mark0,mark1"]
    for k in range(4):
        lines += step_rows(k * 10_000)
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(BENCH / "trace_summary.py"), str(path), *args], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_launches_in_wait_order_with_their_share_of_the_step(tmp_path):
    lines = summary(tmp_path, "--all", "--steps", "2")
    assert lines[0].startswith("2 steps, 10.0 µs a step")
    rows = [l.split() for l in lines[2:]]
    assert [r[1].split("<")[0] for r in rows] == ["Embed", "RmsNorm", "GemvStaged", "GemvStaged", "Sample"]
    assert [r[1] for r in rows][2] == "GemvStaged<Q4_0;"  # (namespaces gone)
    blocks = [int(r[-7]) for r in rows]
    assert blocks == [1, 1, 3, 3, 1]
    adds = [float(r[-2]) for r in rows]  # µs after the previous launch's end
    assert adds == [3.0, 1.6, 2.6, 1.8, 1.0]
    starts = [float(r[-6]) for r in rows]  # first block's start after the previous launch's end
    assert starts == [2.1, -0.5, -0.6, -0.2, -2.0]


def test_marks_split_the_time_after_the_wait(tmp_path):
    lines = summary(tmp_path, "--steps", "2")
    i = next(k for k, l in enumerate(lines) if l.startswith("blocks' time after their wait"))
    marks = {l.split()[0]: [None if x == "-" else float(x) for x in l.split()[-3:]] for l in lines[i + 1:]}
    # the GEMV's two launches: input 0.3 and 0.2, between the marks 1.0 and 0.6, the rest 0.6–0.8
    # and 0.4 µs; medians over their six blocks
    assert marks["GemvStaged<Q4_0;"] == [0.25, 0.8, 0.5]
    assert marks["RmsNorm"] == [0.4, None, 0.6]  # (one mark)
    assert "Embed<Q4_0>" not in marks  # (none)


def test_blocks_of_chosen_launches_from_a_saved_trace(tmp_path):
    """--save's file read back (gzip), and --blocks: a launch's blocks after the previous launch's
    end, as quantiles, and how many of them each SM ran."""
    summary(tmp_path, "--save", str(tmp_path / "last2.csv.gz"))
    out = subprocess.run([sys.executable, str(BENCH / "trace_summary.py"), str(tmp_path / "last2.csv.gz"), "--steps", "1", "--blocks", "2,4"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "  2 GemvStaged<Q4_0; false; false; false>: 3 blocks on 3 SMs (blocks an SM: 1 on 3)"
    rows = {l[:24].strip(): [float(x) for x in l[24:].split()] for l in out[2:7]}
    assert rows["start"] == [-0.6, -0.6, -0.6, -0.6, -0.57, -0.57, -0.57]  # (after the norm's end, 2.6 µs into the step)
    assert rows["end"] == [2.4, 2.4, 2.5, 2.5, 2.6, 2.6, 2.6]
    assert rows["mark 1, after mark 0"] == [1.0] * 7
    assert out[7].startswith("  4 Sample: 1 block on 1 SM (blocks an SM: 1 on 1)")
    bad = subprocess.run([sys.executable, str(BENCH / "trace_summary.py"), str(tmp_path / "last2.csv.gz"), "--steps", "1", "--blocks", "9"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "launches 0 to 4, not 9" in bad.stderr


def test_a_drawn_step_ends_after_its_last_sampler_kernel(tmp_path):
    """A step with a draw ends in three sampler kernels (Sample, SampleMass, SampleWalk): one step,
    not three; --blocks Sample picks all three, and the block that alone reached mark 1 (the last
    block of SampleMass, SampleWalk) is shown with its own times."""
    def drawn_step(base):
        rows = step_rows(base)
        rows += [f"{name('SampleMass')},{b},{b},2,{base + 8000},{base + 8100},{base + 8500 + 500 * b},{base + 8300 + 100 * b},"
                 f"{base + 8700 if b else 0}" for b in range(2)]
        rows += [f"{name('SampleWalk')},{b},{b},2,{base + 8200},{base + 9100},{base + 9400 + 500 * b},{base + 9200},"
                 f"{base + 9600 if b else 0}" for b in range(2)]
        return rows
    lines = ["kernel,sm,block,blocks,start,waited,end,mark0,mark1"] + [r for k in range(4) for r in drawn_step(k * 20_000)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    run = lambda *a: subprocess.run([sys.executable, str(BENCH / "trace_summary.py"), str(path), *a], capture_output=True, text=True,
                                    check=True).stdout.splitlines()
    out = run("--all", "--steps", "2")
    assert out[0].startswith("2 steps, 20.0 µs a step")  # (one SampleWalk's end to the next's; split at each sampler kernel: 3 "steps")
    assert [l.split()[1] for l in out[2:]][-3:] == ["Sample", "SampleMass", "SampleWalk"]
    out = run("--blocks", "Sample")
    assert [l.split()[1].rstrip(":") for l in out if l[:4].strip().isdigit()] == ["Sample", "SampleMass", "SampleWalk"]
    last = [l.strip() for l in out if "the block at mark 1" in l]
    # (after the previous launch's end: SampleMass's after Sample's, at 8.0 µs; SampleWalk's after SampleMass's, at 9.0)
    assert last == ["the block at mark 1: start 0.00, wait returned 0.10, mark 0 0.40, mark 1 0.70, end 1.00",
                    "the block at mark 1: start -0.80, wait returned 0.10, mark 0 0.20, mark 1 0.60, end 0.90"]
