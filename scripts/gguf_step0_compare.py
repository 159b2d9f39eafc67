#!/usr/bin/env python3
"""Step-0 loss of longtune against transformers on the same GGUF files.

For each GGUF (any mix of block types: Q4_1, Q4_K_M, Q5_K_M, Q6_K, ...) the validation loss that
`longtune train` records at step 0 (before any update, metrics.jsonl) is compared with the loss of
transformers' AutoModelForCausalLM loaded from the same file (from_pretrained(dir,
gguf_file=...), which dequantizes every tensor with gguf-py) on the same token ids: plain-text
records, tokenized by `longtune tokenize --add-special` plus the EOS the data loader appends,
one record per row (no packing), cut at --max-seq-length, the loss the token-weighted mean over
every next-token target.

Usage: /work/pyenv/bin/python scripts/gguf_step0_compare.py --longtune build/longtune \
           --data ~/.cache/longtune/data/python-faq --examples 4 FILE.gguf [FILE.gguf ...]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantization progress bars


def records(data_dir, n, max_chars):
    out = []
    with open(os.path.join(data_dir, "valid.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "text" in r:
                text = r["text"]
            elif "messages" in r:
                text = "\n".join(m["content"] for m in r["messages"])
            else:
                text = r.get("prompt", "") + r.get("completion", "")
            out.append(text[:max_chars])
            if len(out) == n:
                break
    return out


def longtune_ids(lt, gguf, texts):
    p = subprocess.run([lt, "tokenize", "--model", gguf, "--add-special", "--json", "--delimiter", "\\0"],
                       input="\0".join(texts).encode(), capture_output=True, check=True)
    return [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()]


def longtune_step0(lt, gguf, data, T, work):
    adapters = os.path.join(work, "adapters")
    cmd = [lt, "train", "--model", gguf, "--data", data, "--adapter-path", adapters, "--iters", "1",
           "--batch-size", "1", "--max-seq-length", str(T), "--no-pack", "--val-batches", "-1",
           "--steps-per-eval", "1000", "--learning-rate", "0"]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(os.path.join(adapters, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("step") == 0 and "val_loss" in r:
                return r["val_loss"]
    raise RuntimeError("no step-0 val_loss in metrics.jsonl")


def hf_loss(gguf, ids_list, eos, T):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf)),
                                                 gguf_file=os.path.basename(gguf), dtype=torch.float32)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in ids_list:
            ids = (ids + ([eos] if eos is not None and (not ids or ids[-1] != eos) else []))[:T]
            x = torch.tensor([ids])
            logits = model(x).logits[0, :-1].double()
            tgt = x[0, 1:]
            total += torch.nn.functional.cross_entropy(logits, tgt, reduction="sum").item()
            count += len(ids) - 1
    return total / count, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--longtune", default="build/longtune")
    ap.add_argument("--data", default=os.path.expanduser("~/.cache/longtune/data/python-faq"))
    ap.add_argument("--examples", type=int, default=4)
    ap.add_argument("--max-chars", type=int, default=1200)
    ap.add_argument("--max-seq-length", type=int, default=512)
    a = ap.parse_args()
    texts = records(a.data, a.examples, a.max_chars)
    from gguf import GGUFReader
    print(f"{'file':44s} {'longtune':>10s} {'transformers':>13s} {'rel diff':>9s} tokens")
    worst = 0.0
    for g in a.files:
        rd = GGUFReader(g)
        f = rd.fields.get("tokenizer.ggml.eos_token_id")
        eos = int(f.parts[f.data[0]][0]) if f else None
        types = sorted({t.tensor_type.name for t in rd.tensors})
        with tempfile.TemporaryDirectory() as work:
            data = os.path.join(work, "data")
            os.makedirs(data)
            for split in ("train", "valid"):
                with open(os.path.join(data, split + ".jsonl"), "w") as fo:
                    for t in texts:
                        fo.write(json.dumps({"text": t}) + "\n")
            lt = longtune_step0(a.longtune, g, data, a.max_seq_length, work)
        ids = longtune_ids(a.longtune, g, texts)
        hf, n = hf_loss(g, ids, eos, a.max_seq_length)
        rel = abs(lt - hf) / hf
        worst = max(worst, rel)
        print(f"{os.path.basename(g):44s} {lt:10.5f} {hf:13.5f} {rel:9.2e} {n}   ({', '.join(types)})")
        sys.stdout.flush()
    print(f"largest relative difference {worst:.2e}")


if __name__ == "__main__":
    main()
