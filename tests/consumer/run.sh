#!/usr/bin/env bash
# Consumer test: installs the built library into a temporary prefix, checks that the install holds
# the library, the CLI, every public header (each one included by the umbrella longtune.h) and a
# pkg-config file, then builds the README's C API example (examples/api_example.c) as a user would,
# with `cc $(pkg-config --cflags --libs --static longtune)` ($CC when set: the compiler that built the
# library, whose OpenMP flag the .pc file carries), runs it on a fixture model, and checks that
# README.md shows the same file.
# usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/longtune-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

fail() { echo "consumer: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log" >&2; fail "install failed"; }

pc=$(find "$prefix" -name longtune.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no pkgconfig/longtune.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")
ls "$libdir"/liblongtune.* >/dev/null 2>&1 || fail "no liblongtune.* in $libdir"
[ -x "$prefix/bin/longtune" ] || fail "no bin/longtune"
[ -f "$prefix/include/longtune.h" ] || fail "no include/longtune.h"
for h in "$src"/include/longtune/*.h; do
  name=longtune/$(basename "$h")
  [ -f "$prefix/include/$name" ] || fail "$name is not installed"
  grep -q "#include \"$name\"" "$src/include/longtune.h" || fail "longtune.h does not include $name"
done

# Every global symbol the library defines starts with lt_ (C++ names demangled; DW.ref.* are the
# compiler's hidden personality references, __odr_asan.* AddressSanitizer's one-definition markers), and a shared library exports only LT_API functions.
if command -v nm >/dev/null 2>&1; then
  if [ -f "$libdir/liblongtune.a" ]; then
    bad=$(nm -g --defined-only -C "$libdir/liblongtune.a" 2>/dev/null \
          | awk 'NF >= 3 && $1 ~ /^[0-9a-f]+$/ { $1 = ""; $2 = ""; sub(/^  /, ""); print }' \
          | grep -v -e '^lt_' -e '^DW\.ref\.' -e '^__odr_asan\.' | sort -u || true)
    [ -z "$bad" ] || fail "liblongtune.a defines global symbols without the lt_ prefix: $bad"
  fi
  if [ -f "$libdir/liblongtune.so" ]; then
    bad=$(nm -D --defined-only "$libdir/liblongtune.so" | awk '{ print $3 }' | grep -v '^lt_' || true)
    [ -z "$bad" ] || fail "liblongtune.so exports symbols without the lt_ prefix: $bad"
    declared=$(grep -ho --exclude=export.h 'LT_API [^(]*(' "$src"/include/longtune/*.h | sed -E 's/.*[ *]([A-Za-z_0-9]+)\($/\1/' | sort -u)
    exported=$(nm -D --defined-only "$libdir/liblongtune.so" | awk '{ print $3 }' | sort -u)
    [ "$declared" = "$exported" ] || fail "liblongtune.so's exports differ from the LT_API declarations: $(diff <(echo "$declared") <(echo "$exported") | grep '^[<>]' | tr '\n' ' ')"
  fi
fi

# The .pc file's prefix is the configure-time one; point pkg-config at the temporary prefix.
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --define-variable=prefix="$prefix" --cflags --libs --static longtune) \
  || fail "pkg-config cannot read longtune.pc"
cc=${CC:-cc}
echo "$cc examples/api_example.c $flags"
# shellcheck disable=SC2086 # the flags are words
# LT_CONSUMER_CFLAGS: the sanitizer flags of an instrumented build (its archive needs their runtime).
"$cc" -std=c11 -Wall -Wextra -Werror ${LT_CONSUMER_CFLAGS:-} -o "$work/api_example" "$src/examples/api_example.c" $flags \
  || fail "examples/api_example.c does not build against the installed library"

# The README shows the example: its first C block must be this file, byte for byte.
awk '/^```c$/ {on = 1; next} on && /^```$/ {exit} on {print}' "$src/README.md" >"$work/readme_example.c"
cmp -s "$work/readme_example.c" "$src/examples/api_example.c" \
  || fail "README.md's C example differs from examples/api_example.c"

# A shared build installs liblongtune.so next to the archive and the example links it: let the
# loader find it in the temporary prefix.
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
out=$("$work/api_example" "$src/tests/fixtures/model/llama_tied" 256) || fail "api_example failed"
echo "$out"
grep -q "^peak .* MiB, [0-9]* trainable parameters$" <<<"$out" || fail "unexpected output"
if "$work/api_example" "$work/no-such-model" 2>"$work/err"; then fail "a missing model was accepted"; fi
grep -q "^error: " "$work/err" || fail "a missing model gave no error message"
echo "consumer: ok"
