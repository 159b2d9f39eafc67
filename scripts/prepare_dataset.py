#!/usr/bin/env python3
"""Builds longtune's default dataset: the question/answer pairs of the Python FAQ shipped in
Debian's python3.11-doc (reST sources under /usr/share/doc/python3.11/html/_sources/faq/), as
mlx-lm chat JSONL ({"messages": [user question, assistant answer]}) split deterministically into
train/valid/test. Standard library only. It does not download anything: install the package with
`apt-get install python3.11-doc` (scripts/setup.sh does).

Answers are turned from reST into plain text (roles, links and directives reduced to their text,
literal blocks kept indented). Pairs whose answer is longer than --max-answer-chars, or has more
than --max-answer-units words, symbols and newlines (a stdlib stand-in for a token count: BPE
tokenizers give about 0.9-1.5 tokens per unit on this text), are left out so the demo's
max-seq-length of 512 holds whole examples with the chat template around them; the count is
printed. Output is written to a temporary folder, fsynced and renamed over --out; a stamp
(SOURCE.json) records the inputs' hashes so a second run with the same inputs does nothing.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

VERSION = 2
DEFAULT_SRC = "/usr/share/doc/python3.11/html/_sources/faq"
ADORN = set("=-~^\"'`#*+.:_")
UNIT = re.compile(r"\w+|[^\w\s]|\n")
KEEP_BODY = {"note", "seealso", "warning", "code-block", "sourcecode", "doctest", "testcode", "versionadded",
             "versionchanged", "deprecated"}


def is_underline(line, title):
    s = line.rstrip()
    return len(s) >= 3 and len(set(s)) == 1 and s[0] in ADORN and len(s) >= len(title.rstrip())


def headings(lines):
    """Yields (index of title line, index of first body line, title) for every section title."""
    i = 0
    while i < len(lines) - 1:
        title = lines[i]
        if title.strip() and not title.startswith(" ") and is_underline(lines[i + 1], title):
            # a title with an overline: the line above is the same adornment
            yield i, i + 2, title.strip()
            i += 2
            continue
        i += 1


def strip_roles(text):
    text = re.sub(r":pep:`(\d+)[^`]*`", r"PEP \1", text)
    # :role:`Title <target>` -> Title ; :role:`~a.b.c` -> c ; :role:`x` -> `x`
    def role(m):
        body = m.group(2)
        t = re.match(r"(.*?)\s*<[^>]*>$", body, re.S)
        if t and t.group(1):
            return t.group(1)
        if body.startswith("~"):
            body = body[1:].split(".")[-1]
        body = body.lstrip("!")
        if m.group(1) in ("ref", "term", "doc", "newsgroup", "menuselection", "kbd", "program", "envvar"):
            return body
        return "`" + body + "`"
    text = re.sub(r":([a-z]+(?::[a-z]+)?):`([^`]+)`", role, text)
    text = re.sub(r"`([^`<]+?)\s*<[^>]+>`__?", r"\1", text)  # hyperlinks
    text = re.sub(r"`([^`]+)`_\b", r"\1", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)  # inline literals
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    return text


def clean_answer(body):
    """reST body lines -> plain text answer."""
    out = []
    i = 0
    while i < len(body):
        line = body[i]
        m = re.match(r"^(\s*)\.\. ([a-z-]+)::(.*)$", line)
        if m or re.match(r"^\s*\.\. ", line):
            indent = len(line) - len(line.lstrip())
            keep = bool(m) and m.group(2) in KEEP_BODY
            if keep and m.group(2) in ("note", "seealso", "warning") and m.group(3).strip():
                out.append(" " * indent + m.group(3).strip())
            i += 1
            # the directive's options and body: blank lines or lines indented deeper
            while i < len(body) and (not body[i].strip() or len(body[i]) - len(body[i].lstrip()) > indent):
                if keep and not re.match(r"^\s+:[a-z-]+:", body[i]):
                    out.append(body[i][indent + 3:] if body[i].strip() else "")
                i += 1
            continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    text = re.sub(r"(?m)^\s*::\s*$", "", text)   # a lone literal-block marker
    text = re.sub(r"(\S)\s*::$", r"\1:", text, flags=re.M)
    text = strip_roles(text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return "\n".join(l.rstrip() for l in text.strip("\n").split("\n")).strip()


def extract(path):
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    heads = list(headings(lines))
    pairs = []
    for k, (ti, bi, title) in enumerate(heads):
        if not title.endswith("?"):
            continue
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        # an overline of the next title belongs to it
        if k + 1 < len(heads) and end > 0 and is_underline(lines[end - 1], lines[end]):
            end -= 1
        answer = clean_answer(lines[bi:end])
        if answer:
            pairs.append((strip_roles(title).replace("`", ""), answer))
    return pairs


def split_of(question, valid_pct, test_pct):
    h = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % 1000
    if h < test_pct * 10:
        return "test"
    if h < (test_pct + valid_pct) * 10:
        return "valid"
    return "train"


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (train.jsonl, valid.jsonl, test.jsonl)")
    ap.add_argument("--src", default=DEFAULT_SRC, help="folder of the FAQ reST sources (default %(default)s)")
    ap.add_argument("--max-answer-chars", type=int, default=1600)
    ap.add_argument("--max-answer-units", type=int, default=400)
    ap.add_argument("--valid-percent", type=int, default=10)
    ap.add_argument("--test-percent", type=int, default=10)
    ap.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = ap.parse_args()

    if not os.path.isdir(args.src):
        sys.exit(f"prepare_dataset: {args.src} not found; install it with: apt-get install python3.11-doc")
    files = sorted(f for f in os.listdir(args.src) if f.endswith(".rst.txt") and f != "index.rst.txt")
    if not files:
        sys.exit(f"prepare_dataset: no FAQ sources (*.rst.txt) in {args.src}")
    digest = hashlib.sha256()
    for f in files:
        with open(os.path.join(args.src, f), "rb") as fh:
            digest.update(f.encode() + b"\0" + fh.read())
    stamp = {"version": VERSION, "sources": digest.hexdigest(), "max_answer_chars": args.max_answer_chars,
             "max_answer_units": args.max_answer_units,
             "valid_percent": args.valid_percent, "test_percent": args.test_percent}
    stamp_path = os.path.join(args.out, "SOURCE.json")
    if not args.force and os.path.exists(stamp_path):
        try:
            with open(stamp_path, encoding="utf-8") as fh:
                old = json.load(fh)
            if all(old.get(k) == v for k, v in stamp.items()) and all(
                    os.path.exists(os.path.join(args.out, s + ".jsonl")) for s in ("train", "valid", "test")):
                print(f"prepare_dataset: {args.out} is up to date")
                return
        except (OSError, ValueError):
            pass

    splits = {"train": [], "valid": [], "test": []}
    seen = set()
    total = dropped = 0
    for f in files:
        for q, a in extract(os.path.join(args.src, f)):
            total += 1
            if q in seen:
                continue
            seen.add(q)
            if len(a) > args.max_answer_chars or len(UNIT.findall(a)) > args.max_answer_units:
                dropped += 1
                continue
            rec = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            splits[split_of(q, args.valid_percent, args.test_percent)].append(rec)
    if not splits["train"] or not splits["valid"] or not splits["test"]:
        sys.exit("prepare_dataset: too few pairs to fill train/valid/test")

    parent = os.path.dirname(os.path.abspath(args.out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".prepare_dataset.", dir=parent)
    try:
        for name, recs in splits.items():
            p = os.path.join(tmp, name + ".jsonl")
            with open(p, "w", encoding="utf-8") as fh:
                for r in recs:
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        stamp.update({"pairs": {k: len(v) for k, v in splits.items()}, "dropped_long": dropped,
                      "source_files": files, "format": "mlx-lm chat jsonl"})
        with open(os.path.join(tmp, "SOURCE.json"), "w", encoding="utf-8") as fh:
            json.dump(stamp, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        old = None
        if os.path.exists(args.out):
            old = args.out.rstrip("/") + f".old.{os.getpid()}"
            os.rename(args.out, old)
        os.rename(tmp, args.out)
        fsync_dir(parent)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n = {k: len(v) for k, v in splits.items()}
    print(f"prepare_dataset: {total} FAQ pairs, {dropped} left out as longer than {args.max_answer_chars} "
          f"chars or {args.max_answer_units} units; wrote train {n['train']}, valid {n['valid']}, test {n['test']} to {args.out}")


if __name__ == "__main__":
    main()
