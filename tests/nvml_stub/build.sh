#!/bin/sh
# kvpin.fleet: build the stub libnvidia-ml.so.1 (tests/nvml_stub/build/, git-ignored).
# Idempotent: rebuilds only when the source or this script is newer than the library.
# Prints the library's path on stdout. CC overrides the compiler (default gcc).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src="$here/nvml_stub.c"
out="$here/build/libnvidia-ml.so.1"
mkdir -p "$here/build"
if [ ! -f "$out" ] || [ -n "$(find "$src" "$here/build.sh" -newer "$out")" ]; then
    # Unused parameters: the NOT_SUPPORTED entry points keep NVML's full signatures.
    tmp="$out.tmp.$$"
    ${CC:-gcc} -std=c99 -O2 -Wall -Wextra -Wno-unused-parameter -Werror \
        -fvisibility=hidden -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 \
        -o "$tmp" "$src"
    # rename is atomic: parallel test workers never load a half-written library
    mv -f "$tmp" "$out"
fi
echo "$out"
