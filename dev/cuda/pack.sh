#!/usr/bin/env bash
# Packs what one device session needs into DEST (default /work/main/.cudawt): this worktree's
# sources, the binaries built here (bin/), and the shared libraries the device image may lack
# (libs.tar.xz: OpenBLAS, cJSON, PCRE2, cmocka, gfortran runtime). The device image is another
# distribution; glibc there is newer, so binaries built here run there.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.cudawt}
make build JOBS=2 >/dev/null
gcc -O2 -std=c11 -Iinclude dev/cuda/bench_kernels.c build/liblongtune.a -L/usr/local/cuda/lib64 \
  -lcudart -lcublasLt -lcublas -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lpcre2-8 \
  -lcjson -fopenmp -lm -lstdc++ -o build/bench_kernels
rm -rf "$DEST" && mkdir -p "$DEST"
git ls-files -co --exclude-standard | tar cf - -T - | tar xf - -C "$DEST"
mkdir -p "$DEST/bin"
# The device copy has no .git: the benches read the commit from LONGTUNE_COMMIT.
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
cp build/test_cuda_attention build/test_cuda_lce build/bench_kernels build/longtune "$DEST/bin/"
tmp=$(mktemp -d)
cp -L /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 /lib/x86_64-linux-gnu/libgfortran.so.5 \
  /lib/x86_64-linux-gnu/libquadmath.so.0 /lib/x86_64-linux-gnu/libcmocka.so.0 \
  /lib/x86_64-linux-gnu/libpcre2-8.so.0 /lib/x86_64-linux-gnu/libcjson.so.1 "$tmp/"
tar cJf "$DEST/libs.tar.xz" -C "$tmp" .
rm -rf "$tmp"
du -sh "$DEST"
