"""Where a decode step's GPU time goes, from Nsight Compute's CSV of two one-token steps
(the first warms up; the second half of the kernels is summarised per kernel):

    ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        python3 bench/decode_once.py FILE > k.csv
    python3 bench/ncu_summary.py k.csv

or where a prefill's goes: profile only its kernels and summarise them all,

    ncu --launch-count 300 ... python3 bench/decode_once.py FILE eager 512 > p.csv
    python3 bench/ncu_summary.py p.csv all

With `grid` after them (`... p.csv all grid`) kernels are told apart by grid size too (one line
per GEMM shape). Durations are in ncu's unit (ns); "B/unit" is DRAM bytes read per ns = GB/s.
"""
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
data = []
for r in rows:
    if 'Kernel Name' in r: hdr = r; continue
    if hdr and len(r) == len(hdr): data.append(dict(zip(hdr, r)))
half = data if 'all' in sys.argv[2:] else data[len(data)//2:]  # the decode step (the second of two one-token steps)
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for d in half:
    name = d['Kernel Name']
    if name.endswith(')'): name = name[:name.rindex('(', 0, name.rindex(')'))]  # the parameter list
    name = re.sub(r'^void |edgerunner::cuda::|\(anonymous namespace\)::|<unnamed>::|\(edgerunner::TensorType\)', '', name)[:90]
    if 'grid' in sys.argv[2:]: name = f"{d.get('Grid Size', '?')} {name}"
    try: t = float(d['gpu__time_duration.sum'].replace(',', '')); b = float((d.get('dram__bytes_read.sum') or '0').replace(',', ''))
    except ValueError: continue
    a = agg[name]; a[0] += 1; a[1] += t; a[2] += b
tot = sum(a[1] for a in agg.values())
print(f"{len(half)} kernels, {tot/1e3:.1f} us total (units as ncu reports)")
for n, (c, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:int(next((a for a in sys.argv[2:] if a.isdigit()), 14))]:
    print(f"{t/tot*100:5.1f}% {c:4d}x {t/c:9.1f} avg  {b/max(t,1):7.1f} B/unit  {n}")
