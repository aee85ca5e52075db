#!/bin/sh
# Parses the Objective-C++ Metal host (metal/*.mm) on a machine without Apple's SDK: clang++ with
# ARC against declarations transcribed from the SDK (metal/lint/objc/). It catches C++ and
# Objective-C errors in the host; whether it uses the real API correctly is for a Mac build.
#   metal/lint/check_host.sh [file.mm ...]     (default: every metal/*.mm)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
CLANGXX=${CLANGXX:-clang++}
command -v "$CLANGXX" >/dev/null 2>&1 || { echo "check_host.sh: $CLANGXX not found" >&2; exit 2; }
if [ "$#" -eq 0 ]; then set -- "$root"/metal/*.mm; fi
status=0
for f in "$@"; do
    # The host's own target (glibc's headers reject a Darwin one), so @available and the SDK's
    # availability attributes are parsed but not enforced here.
    "$CLANGXX" -x objective-c++ -std=c++17 -fobjc-arc -fblocks -fobjc-runtime=macosx-13.0 \
        -isystem "$here/objc" -I "$root/metal" -I "$root/csrc/include" -DER_HAVE_METAL \
        -Wall -Wextra -Werror -fsyntax-only "$f" || status=1
done
exit $status
