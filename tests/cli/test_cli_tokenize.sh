#!/usr/bin/env bash
# `longtune tokenize`: ids equal the committed HF oracle's, --decode inverts them, --json,
# --delimiter, --add-special, and the usage/failure exit codes.
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(dirname "$0")/../..}"
fx="$src/tests/fixtures/tokenizer"
tok="$fx/spm/tokenizer.json"
fail=0
check() { # check NAME GOT WANT
  if [ "$2" != "$3" ]; then echo "FAIL: $1: got [$2], want [$3]"; fail=1; fi
}
# Record 1 of the corpus is "Hello world"; its expected ids are line 1 of expected.jsonl.
want=$(sed -n '1s/^{"ids": \[\([^]]*\)\].*/\1/p' "$fx/spm/expected.jsonl" | tr -d ',')
got=$(printf 'Hello world\n' | "$bin" tokenize --tokenizer "$tok")
check "encode" "$got" "$want"
got=$(printf 'Hello world\n' | "$bin" tokenize --tokenizer "$tok" --add-special)
check "add-special" "$got" "1 $want"
got=$(printf 'Hello world\n' | "$bin" tokenize --tokenizer "$tok" --json)
check "json" "$got" "[$(echo "$want" | sed 's/ /, /g')]"
got=$(printf '%s\n' "$want" | "$bin" tokenize --tokenizer "$tok" --decode)
check "decode" "$got" "Hello world"
got=$(printf '[1, %s]\n' "$(echo "$want" | sed 's/ /, /g')" | "$bin" tokenize --tokenizer "$tok" --decode --skip-special --json)
check "decode json skip-special" "$got" '"Hello world"'
# NUL-delimited records holding newlines; round trip through --decode with the same delimiter.
got=$(printf 'two\nlines\0caf\xc3\xa9 au lait\0' | "$bin" tokenize --tokenizer "$tok" --delimiter '\0' | wc -l)
check "nul records" "$got" "2"
got=$(printf 'two\nlines\0caf\xc3\xa9 au lait\0' | "$bin" tokenize --tokenizer "$tok" --delimiter '\0' \
      | "$bin" tokenize --tokenizer "$tok" --decode | od -An -tx1 | tr -d ' \n')
check "nul round trip" "$got" "74776f0a6c696e65730a636166c3a9206175206c6169740a"
# The GGUF loader through the CLI (committed SentencePiece-style GGUF).
got=$(printf 'Hello world\n' | "$bin" tokenize --model "$fx/spm/tokenizer.gguf")
check "gguf encode" "$got" "$want"
# Failures: missing file (1), bad id (1), both sources (2), neither (2), bad delimiter (2).
printf 'x\n' | "$bin" tokenize --tokenizer /nonexistent/tokenizer.json >/dev/null 2>&1; check "missing file" "$?" 1
printf '5 99999999\n' | "$bin" tokenize --tokenizer "$tok" --decode >/dev/null 2>&1; check "bad id" "$?" 1
printf 'abc\n' | "$bin" tokenize --tokenizer "$tok" --decode >/dev/null 2>&1; check "not an id" "$?" 1
"$bin" tokenize --tokenizer "$tok" --model "$tok" </dev/null >/dev/null 2>&1; check "both" "$?" 2
"$bin" tokenize </dev/null >/dev/null 2>&1; check "neither" "$?" 2
"$bin" tokenize --tokenizer "$tok" --delimiter '\q' </dev/null >/dev/null 2>&1; check "bad delimiter" "$?" 2
exit $fail
