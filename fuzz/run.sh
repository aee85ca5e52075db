#!/usr/bin/env bash
# Builds the libFuzzer target for the GGUF reader with clang (ASan + UBSan) and runs it.
#   fuzz/run.sh [SECONDS]    (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
python=${PYTHON:-python3}
CXX=clang++ cmake -S . -B "$build" -G Ninja -DEDGERUNNER_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_gguf > "$build/build.log" 2>&1 || { tail -n 40 "$build/build.log"; exit 1; }
corpus="$build/corpus"
"$python" fuzz/make_seeds.py "$corpus"
"$build/fuzz/fuzz_gguf" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
