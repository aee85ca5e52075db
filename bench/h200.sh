#!/usr/bin/env bash
# The CUDA figures of bench/NOTES.md, on the lent H200 (device tool), from the repository root:
#   bench/h200.sh prebuild                (here, not on the device) build the package with the CUDA backend
#                                         (sm_90a only) for the device's Python 3.12 into .dev-site (~1 min on
#                                         two cores, 19 MB; $PY312: a Python 3.12 with scikit-build-core,
#                                         nanobind, cmake and ninja); carry .dev-site and `setup` installs it
#                                         instead of building there (~150 s of device time saved a machine)
#   bench/h200.sh prebuild-base REV       (here) revision REV's CUDA extension (`git archive`, built as prebuild) into
#                                         .ab/base_core.so.xz (~5 MB: carry .ab); `setup` then makes /tmp/site-base,
#                                         /tmp/site with that extension in it: the base of `sampling`'s A/B, no device
#                                         time spent building it
#   bench/h200.sh prebuild-trace          (here) the same with the kernels' timeline compiled in
#                                         (EDGERUNNER_CUDA_TRACE=ON, csrc/cuda/trace.cuh) into .dev-site-trace;
#                                         carry it too and `setup` installs it into /tmp/site-trace
#   bench/h200.sh setup                   build the package with the CUDA backend (sm_90a only) into /tmp/site
#   bench/h200.sh test                    the CUDA tests (backend ops, whole models, dispatch modes)
#   bench/h200.sh models NAME...          random-weight GGUFs of real shapes into /tmp/m (NAME = PRESET-TYPE,
#                                         e.g. llama-3.1-8b-Q4_0; presets and types of edgerunner.model_builder)
#   bench/h200.sh bench [bench args]      python -m bench over every file in /tmp/m, CUDA, all dispatch modes
#   bench/h200.sh sampling [args]         decode speed by sampling setting (bench/sampling_speed.py) over every file in
#                                         /tmp/m, this build then /tmp/site-base's where there is one, twice over
#   bench/h200.sh profile NAME...         where a decode step's time goes (ncu, kernels serialised: per kernel,
#                                         bench/ncu_summary.py), then the decode GEMV's limits (ncu sections:
#                                         DRAM vs SM throughput, occupancy) for the first 8 of a step
#   bench/h200.sh sample-profile NAME SAMPLING  the sampler's kernels (Sample, SampleMass, SampleWalk) of
#                                         bench/decode_once.py's draws under SAMPLING (e.g. temperature=0.8,min_p=0.05)
#                                         under ncu, eager: time, instructions, L2 atomics, stall reasons; this build,
#                                         then /tmp/site-base's where there is one
#   bench/h200.sh gemv-profile NAME T N   the first N one-token staged GEMVs of type T (TensorType's number: 2 Q4_0,
#                                         12 Q4_K, 14 Q6_K; no RoPE, no int8 output) of a decode step under ncu,
#                                         serialised: DRAM and issue throughput, occupancy, stall reasons
#   bench/h200.sh decode-stalls NAME [SKIP COUNT]  the decode step's per-layer kernels (GEMVs, attention, norms,
#                                         quantize) of /tmp/m/NAME.gguf under ncu after a 16-token prompt, COUNT
#                                         launches from the SKIP-th (default 80 and 14: on a 32-layer Llama, the
#                                         prompt's 65 norms come first, then the step; from the second layer's down
#                                         projection through the third layer): time and why warps stalled, among them
#                                         no_instruction (instruction fetch; over every block's warps: the attention's
#                                         blocks with no work make most of its share, bench/NOTES.md, twenty-ninth
#                                         CUDA session). Application replay and caches left as
#                                         they are, so each kernel meets the caches its predecessor left (serialised)
#   bench/h200.sh prefill-profile NAME... the first layer's four prefill GEMMs of a 512-token prompt under ncu:
#                                         occupancy, pipes, L2 / DRAM, stall reasons
#   bench/h200.sh base                    build the tree in .ab/base (never committed: `git archive REV | tar -x -C
#                                         .ab/base`) into /tmp/site-base, for A/B runs in one call:
#                                         PYTHONPATH=/tmp/site-base:/tmp/site python3 -m bench ... (the base),
#                                         the same without /tmp/site-base (this tree)
#   bench/h200.sh variants                build every tree in .ab/v/NAME (never committed: `git archive REV | tar -x
#                                         -C .ab/v/NAME`) into /tmp/site-NAME, side by side (after `setup`)
#   bench/h200.sh ab [bench args]         this tree and then each variant, recorded, one after the other on every
#                                         file in /tmp/m (ROUNDS=2: twice over): the A/B runs of bench/NOTES.md
#   bench/h200.sh knob VAR V1,V2 [args]   recorded runs of every file in /tmp/m with the environment knob VAR at each
#                                         value in turn (ROUNDS=2: twice over): A/B runs within one build
#   bench/h200.sh trace NAME...           the block timeline of 16 recorded decode steps of /tmp/m/NAME.gguf
#                                         (bench/trace_step.py, with /tmp/site-trace), per kernel and, for the
#                                         first 40 launches of a step, launch by launch (bench/trace_summary.py;
#                                         its --blocks I,J on the file saved under $OUT: launches block by block)
#   bench/h200.sh parts NAME...           recorded tg128 of /tmp/m/NAME.gguf with each part of the step left out in
#                                         turn (EDGERUNNER_CUDA_SKIP=norm, attention, ...): what a part costs a token
#                                         in the running graph, where ncu's serialised kernels cannot tell
#   bench/h200.sh peer                    llama.cpp's CUDA llama-bench into /tmp/peer: the build made here and carried
#                                         as .peer-bin/llama-bench.xz (never committed; bench/NOTES.md, thirteenth
#                                         CUDA session: how), where it runs there; else built from the sdist source
#                                         carried in .peer.tgz (or .peer/; never committed) (~5 min); then
#                                         `bench/h200.sh bench --peer /tmp/peer/bin/llama-bench` runs it on
#                                         the same files in the same run. .peer/llama.cpp: the sdist's
#                                         vendor/llama.cpp trimmed to CMakeLists.txt cmake ggml include src
#                                         common vendor gguf-py tools/llama-bench tools/quantize, with a
#                                         tools/CMakeLists.txt that adds only those two (ggml/src's other
#                                         backends may go: ~24 MB). Carry it as `tar czf .peer.tgz -C .peer
#                                         llama.cpp` (3.5 MB): carried as a folder, some files once did not
#                                         arrive. A failed build prints its first errors.
# .whl/ carries the gguf wheel the device lacks (and, for `test`, the truncated real model).
set -euo pipefail
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
case "${1:-}" in
  prebuild)
    rm -rf .dev-site
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "${PY312:-python3.12}" -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.EDGERUNNER_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=/tmp/b312 --target .dev-site . ;;
  prebuild-base)
    rev=${2:?a revision}
    rm -rf .ab/base-src /tmp/site-base-build && mkdir -p .ab/base-src && git archive "$rev" | tar -x -C .ab/base-src
    (cd .ab/base-src && CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "${PY312:-python3.12}" -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.EDGERUNNER_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=/tmp/b312base --target /tmp/site-base-build .)
    xz -T0 -c /tmp/site-base-build/edgerunner/_core*.so > .ab/base_core.so.xz && rm -rf .ab/base-src
    echo "$rev" > .ab/base_core.rev ;;
  prebuild-trace)
    rm -rf .dev-site-trace
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "${PY312:-python3.12}" -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.EDGERUNNER_CUDA=ON -C cmake.define.EDGERUNNER_CUDA_TRACE=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real \
      -C build-dir=/tmp/b312t --target .dev-site-trace . ;;
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    if [ -d .dev-site-trace/edgerunner ]; then mkdir -p /tmp/site-trace && cp -r .dev-site-trace/. /tmp/site-trace/; fi
    if [ -d .dev-site/edgerunner ]; then
      cp -r .dev-site/. /tmp/site/
      if [ -f .ab/base_core.so.xz ]; then  # (prebuild-base)
        mkdir -p /tmp/site-base && cp -r /tmp/site/. /tmp/site-base/
        python3 -c "import lzma, shutil, sys, glob; shutil.copyfileobj(lzma.open(sys.argv[1]), open(glob.glob('/tmp/site-base/edgerunner/_core*.so')[0], 'wb'))" \
          .ab/base_core.so.xz
        echo "/tmp/site-base: $(cat .ab/base_core.rev 2>/dev/null)'s extension"
      fi
      exit
    fi
    CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.EDGERUNNER_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=/tmp/b . ;;
  test)
    shift
    EDGERUNNER_TRUNCATED_SMOLLM2=$PWD/.whl/smollm2-2l.gguf timeout 400 python3 -m pytest -q -p no:cacheprovider \
      tests/test_cuda_ops.py tests/test_cuda_engine.py "$@" ;;
  models)
    shift
    mkdir -p /tmp/m
    for name in "$@"; do
      preset=${name%-*}; type=${name##*-}
      [ -f /tmp/m/$name.gguf ] || python3 -m edgerunner.model_builder /tmp/m/$name.gguf --preset $preset --type $type --quiet
    done ;;
  bench)
    shift
    timeout 500 python3 -m bench /tmp/m/*.gguf --backend cuda --dispatch eager,argument_buffers,recorded "$@" ;;
  sampling)
    shift
    for round in 1 2; do
      echo "== this build (round $round)"; python3 bench/sampling_speed.py /tmp/m/*.gguf "$@"
      if [ -d /tmp/site-base ]; then
        echo "== /tmp/site-base (round $round)"; PYTHONPATH=/tmp/site-base python3 bench/sampling_speed.py /tmp/m/*.gguf "$@"
      fi
    done ;;
  profile)
    shift
    for name in "$@"; do
      echo "== $name: one decode step"
      ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        python3 bench/decode_once.py /tmp/m/$name.gguf > /tmp/ncu-$name.csv 2>/dev/null
      python3 bench/ncu_summary.py /tmp/ncu-$name.csv
      echo "== $name: the decode GEMV (after a 16-token prompt; kernels by mangled name)"
      ncu --clock-control none --kernel-name-base mangled -k regex:GemvStaged --launch-count 8 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        python3 bench/decode_once.py /tmp/m/$name.gguf eager 16 2>/dev/null |
        grep -E "GemvStaged|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued" |
        sed -E 's/^ +//; s/ {2,}/ /g'
    done ;;
  sample-profile)
    # the sampler's kernels (Sample, SampleMass, SampleWalk), eager, on the draws of decode_once's
    # 4 steps under SAMPLING, for this build and /tmp/site-base: time, instructions, stalls
    name=$2; sampling=$3
    stalls=$(printf 'smsp__warp_issue_stalled_%s_per_warp_active.pct,' long_scoreboard lg_throttle barrier membar \
      short_scoreboard wait math_pipe_throttle)
    for site in /tmp/site /tmp/site-base; do
      [ -d $site ] || continue
      echo "== $site: $name, $sampling"
      PYTHONPATH=$site ncu --clock-control none --kernel-name-base mangled -k "regex:Sample" --launch-skip 3 --launch-count 6 \
        --metrics "gpu__time_duration.sum,smsp__inst_executed.sum,lts__t_requests_op_red.sum,lts__t_requests_op_atom.sum,${stalls%,}" \
        python3 bench/decode_once.py /tmp/m/$name.gguf eager 16 "$sampling" 2>/dev/null |
        grep -E "^  [a-zA-Z_].*\(|gpu__time|stalled|inst_executed|lts__" |
        sed -E 's/^ +//; s/ {2,}/ /g; s/smsp__warp_issue_stalled_//; s/^void (by_[a-z]+)_bounded<unnamed>::([A-Za-z]+)>\(.*\) (\([0-9, ]+\)x\([0-9, ]+\)).*/\1 \2 \3/'
    done ;;
  gemv-profile)
    name=$2; type=$3; count=${4:-1}
    stalls=$(printf 'smsp__warp_issue_stalled_%s_per_warp_active.pct,' long_scoreboard short_scoreboard wait selected \
      not_selected barrier math_pipe_throttle mio_throttle lg_throttle no_instruction)
    ncu --clock-control none --kernel-name-base mangled -k "regex:GemvStaged.*TensorTypeE${type}ELb0ELb0E" --launch-count "$count" \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      --metrics "${stalls}sm__inst_executed.sum" python3 bench/decode_once.py /tmp/m/$name.gguf eager 1 2>/dev/null |
      grep -E "GemvStaged|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Warp Cycles Per Issued|Grid Size|stalled|inst_executed.sum" |
      sed -E 's/^ +//; s/ {2,}/ /g' | cut -c1-150 ;;
  decode-stalls)
    name=$2; skip=${3:-80}; count=${4:-14}
    stalls=$(printf 'smsp__warp_issue_stalled_%s_per_warp_active.pct,' no_instruction long_scoreboard short_scoreboard wait \
      barrier mio_throttle lg_throttle branch_resolving)
    ncu --kernel-name-base mangled --clock-control none --cache-control none --replay-mode application \
      -k "regex:DecodeAttention|GemvStaged|RmsNorm|Quantize" --launch-skip "$skip" --launch-count "$count" \
      --metrics "gpu__time_duration.sum,${stalls}smsp__inst_executed.sum" \
      python3 bench/decode_once.py /tmp/m/$name.gguf eager 16 2>/dev/null |
      grep -E "^  [a-zA-Z_].*\(|gpu__time|stalled|inst_executed" |
      sed -E 's/^ +//; s/ {2,}/ /g; s/^void by_value[_a-z]*<unnamed>::/</' | cut -c1-150 ;;
  prefill-profile)
    shift
    stalls=$(printf 'smsp__warp_issue_stalled_%s_per_warp_active.pct,' wait long_scoreboard short_scoreboard selected \
      not_selected barrier math_pipe_throttle mio_throttle lg_throttle dispatch_stall no_instruction)
    pipes=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
    for name in "$@"; do
      echo "== $name"
      ncu --clock-control none --kernel-name-base mangled -k regex:Gemm --launch-count 4 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
        --metrics "$stalls$pipes" python3 bench/decode_once.py /tmp/m/$name.gguf eager 512 2>/dev/null |
        grep -E "Gemm|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Occupancy|Warp Cycles Per Issued|Block Limit|Registers Per|Grid Size|Block Size|stalled|pipe_" |
        sed -E 's/^ +//; s/ {2,}/ /g'
    done ;;
  base)
    cd .ab/base && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.EDGERUNNER_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=/tmp/bb --target /tmp/site-base . ;;
  variants)
    pids=()
    for d in .ab/v/*/; do
      [ -d "$d" ] || { echo "no trees in .ab/v"; exit 1; }
      n=$(basename "$d")
      (cd "$d" && CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q -C cmake.define.EDGERUNNER_CUDA=ON \
        -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a-real -C build-dir=/tmp/bb-$n --target /tmp/site-$n .) > /tmp/build-$n.log 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "a variant build failed (/tmp/build-*.log)"; exit 1; }; done ;;
  ab)
    shift
    for round in $(seq "${ROUNDS:-1}"); do
      for d in this .ab/v/*/; do
        [ "$d" = this ] || [ -d "$d" ] || continue
        n=$(basename "$d")
        echo "== $n"
        site=/tmp/site; [ "$n" = this ] || site=/tmp/site-$n:/tmp/site
        PYTHONPATH=$site timeout 250 python3 -m bench /tmp/m/*.gguf --backend cuda --dispatch recorded --reps 3 "$@" | grep -E "gguf"
      done
    done ;;
  knob)
    # an environment knob's values in turn, recorded, on every file in /tmp/m (ROUNDS: times over)
    shift; var=$1; values=$2; shift 2
    for round in $(seq "${ROUNDS:-1}"); do
      for v in ${values//,/ }; do
        echo "== $var=$v"
        env "$var=$v" timeout 250 python3 -m bench /tmp/m/*.gguf --backend cuda --dispatch recorded --reps 3 "$@" | grep -E "gguf"
      done
    done ;;
  trace)
    shift
    for name in "$@"; do
      PYTHONPATH=/tmp/site-trace:/tmp/site python3 bench/trace_step.py /tmp/m/$name.gguf /tmp/trace-$name.csv || exit 1
      echo "== $name: per kernel"
      python3 bench/trace_summary.py /tmp/trace-$name.csv ${OUT:+--save $OUT/trace-$name.csv.gz}
      echo "== $name: launch by launch"
      python3 bench/trace_summary.py /tmp/trace-$name.csv --all --first 40
    done ;;
  parts)
    # recorded tg128 with each part left out of every step (EDGERUNNER_CUDA_SKIP): what the part
    # costs a token with everything else in place
    shift
    for f in "$@"; do
      for part in none embed norm quantize qkv attention out gate_up down head sample; do
        skip=$part; [ "$part" = none ] && skip=
        printf '%s %-10s ' "$f" "$part"
        EDGERUNNER_CUDA_SKIP=$skip timeout 120 python3 -m bench /tmp/m/$f.gguf --backend cuda --dispatch recorded --pp 16 --tg 128 --reps ${REPS:-3} |
          grep -E "gguf" | tr -s ' ' | tail -1
      done
    done ;;
  peer)
    if [ -f .peer-bin/llama-bench.xz ]; then  # built here (bench/NOTES.md: how), if it runs there
      mkdir -p /tmp/peer/bin
      python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        .peer-bin/llama-bench.xz /tmp/peer/bin/llama-bench.bin
      chmod +x /tmp/peer/bin/llama-bench.bin
      libs=$( (find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null || true) | xargs -r -n1 dirname | sort -u | tr '\n' ':')
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%s$LD_LIBRARY_PATH exec /tmp/peer/bin/llama-bench.bin "$@"\n' "$libs" > /tmp/peer/bin/llama-bench
      chmod +x /tmp/peer/bin/llama-bench
      if /tmp/peer/bin/llama-bench --help > /dev/null 2>&1; then echo "llama-bench: the carried build"; exit; fi
      echo "the carried llama-bench does not run here:"; /tmp/peer/bin/llama-bench --help 2>&1 | head -3
    fi
    if [ -f .peer.tgz ]; then mkdir -p .peer && tar xzf .peer.tgz -C .peer; fi
    mkdir -p /tmp/peer && cd .peer/llama.cpp
    cmake -S . -B /tmp/peer -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF > /tmp/peer-config.log 2>&1 || { tail -20 /tmp/peer-config.log; exit 1; }
    cmake --build /tmp/peer --target llama-bench -j 16 > /tmp/peer-build.log 2>&1 ||
      { grep -m 3 -B 2 -A 12 -E "error|Killed" /tmp/peer-build.log; tail -3 /tmp/peer-build.log; exit 1; }
    tail -1 /tmp/peer-build.log ;;
  *) awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0"; exit 2 ;;
esac
