"""Peer of `longtune bench packed`: the same batches trained with PyTorch + transformers + PEFT
(train_peft_gpu.py's model: random bf16 weights of a bench shape, LoRA r=8 on q,k,v,o,gate,up,down,
gradient checkpointing on every layer, SDPA attention without its cuDNN backend, AdamW over the LoRA parameters; with
--liger, Liger-Kernel's fused kernels patched in first).

The C bench writes every arm's batches, in the order it trained them, to --batches; this script
replays them the way a transformers user feeds each kind of batch:
  packed rows   one row, its sequences concatenated and cut at the last real token, position_ids
                restarting at every sequence and no attention mask: transformers builds the
                block-diagonal causal mask from the position ids (what DataCollatorWithFlattening
                produces), SDPA runs with that mask
  unpadded      one sequence per step, no mask
  padded        the rows padded on the right to the batch's longest, attention_mask marking the
                real tokens
labels are the C bench's targets moved one place right (transformers shifts them back), so each
position predicts the same token with the same prompt masking. Before the timed arms it checks
that a packed row keeps its sequences apart: the gradient of the last sequence's outputs with
respect to the earlier sequences' input embeddings must be exactly zero.

Batches file (little-endian): "LTBATv1\\0", u64 record count; per record i32 arm, B, T, 0, then
B i32 real lengths (a row's real tokens are its first ones), then input ids, targets and position
ids, B*T i32 each. Targets of -100 contribute no loss.

Output: JSON lines on stdout.
  {"ready": true, ... train_peft_gpu.py's fields ..., "packing_check": {...}}
  {"arm", "steps", "seconds", "real_tokens", "real_tokens_per_s", "targets_per_s", "median_ms",
   "step_ms", "max_allocated_bytes", "max_reserved_bytes", "loss"}       one per arm
  {"arm", "oom": true}                                                    an arm that ran out of memory
It measures and prints; it never compares itself with longtune (the C bench does that)."""
import argparse
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peft_peer as peer  # noqa: E402
import train_peft_gpu as shapes  # noqa: E402  (SHAPES and the model build both GPU peers share)

MAGIC = b"LTBATv1\0"
IGNORE = -100


def read_batches(path, n_arms):
    """[[(B, T, lengths, ids, targets, positions) ...] per arm]; raises ValueError on a bad file."""
    import numpy as np
    data = open(path, "rb").read()
    if len(data) < 16 or data[:8] != MAGIC:
        raise ValueError("%s: not a batches file (bad magic)" % path)
    (n,) = struct.unpack_from("<Q", data, 8)
    off, arms = 16, [[] for _ in range(n_arms)]
    for r in range(n):
        if off + 16 > len(data):
            raise ValueError("%s: truncated at record %d" % (path, r))
        arm, B, T, _ = struct.unpack_from("<4i", data, off)
        off += 16
        if not (0 <= arm < n_arms) or B < 1 or T < 1:
            raise ValueError("%s: record %d: arm %d, B %d, T %d out of range" % (path, r, arm, B, T))
        need = 4 * (B + 3 * B * T)
        if off + need > len(data):
            raise ValueError("%s: truncated at record %d" % (path, r))
        lens = np.frombuffer(data, np.int32, B, off)
        off += 4 * B
        ids, tgt, pos = (np.frombuffer(data, np.int32, B * T, off + 4 * B * T * k).reshape(B, T) for k in range(3))
        off += 12 * B * T
        if lens.min() < 0 or lens.max() > T or lens.max() < 1:
            raise ValueError("%s: record %d: a row length outside 0..%d, or no row with tokens" % (path, r, T))
        keep = lens > 0
        if not keep.all():  # the last padded batch's unfilled rows: no token to train
            lens, ids, tgt, pos = lens[keep], ids[keep], tgt[keep], pos[keep]
            B = int(keep.sum())
        arms[arm].append((B, T, lens, ids, tgt, pos))
    if off != len(data):
        raise ValueError("%s: %d trailing bytes" % (path, len(data) - off))
    return arms


def labels_of(np, tgt):
    """Targets moved one place right: transformers' loss compares logits[t] with labels[t + 1]."""
    lab = np.full(tgt.shape, IGNORE, np.int64)
    lab[:, 1:] = tgt[:, :-1]
    return lab


def inputs(torch, np, batch, kind, dev):
    """The forward's keyword arguments for one batch, and its count of supervised targets."""
    B, T, lens, ids, tgt, pos = batch
    if kind == "packed" or B == 1:
        n = int(lens[0])  # cut at the last real token: flattened sequences carry no padding
        kw = {"input_ids": ids[:, :n], "labels": labels_of(np, tgt[:, :n])}
        if kind == "packed":
            kw["position_ids"] = pos[:, :n]
    else:
        Tm = int(lens.max())
        mask = (np.arange(Tm)[None, :] < lens[:, None]).astype(np.int64)
        kw = {"input_ids": ids[:, :Tm], "labels": np.where(mask == 1, labels_of(np, tgt[:, :Tm]), IGNORE),
              "attention_mask": mask}
    n_tgt = int((kw["labels"] != IGNORE).sum())
    return {k: torch.from_numpy(np.ascontiguousarray(v).astype(np.int64)).to(dev) for k, v in kw.items()}, n_tgt


def packing_check(torch, np, model, opt, batch, dev):
    """Exact isolation of a packed row's sequences: d(last sequence's outputs)/d(earlier inputs) = 0."""
    B, T, lens, ids, tgt, pos = batch
    n = int(lens[0])
    p = pos[0, :n]
    starts = [i for i in range(n) if p[i] == 0]
    if len(starts) < 2:
        return {"checked": False, "why": "the first packed row holds one sequence"}
    cut = starts[-1]
    inner = model.get_base_model().model
    x = torch.from_numpy(ids[:, :n].astype(np.int64)).to(dev)
    emb = inner.embed_tokens(x).detach().requires_grad_(True)
    out = inner(inputs_embeds=emb, position_ids=torch.from_numpy(p[None, :].astype(np.int64)).to(dev))
    out.last_hidden_state[:, cut:].float().sum().backward()
    leak = float(emb.grad[:, :cut].abs().max())
    own = float(emb.grad[:, cut:].abs().max())
    opt.zero_grad(set_to_none=True)
    return {"checked": True, "sequences": len(starts), "tokens": n, "leak_max_abs_grad": leak,
            "own_max_abs_grad": own, "isolated": leak == 0.0 and own > 0.0}


def run_arm(torch, np, model, opt, batches, kind, args, cuda, dev):
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms, real, tgts, secs, loss = [], 0, 0, 0.0, float("nan")
    k = 0
    try:
        while True:
            batch = batches[k % len(batches)]
            kw, n_tgt = inputs(torch, np, batch, kind, dev)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            if n_tgt > 0:
                out = model(**kw)
                out.loss.backward()
                loss = float(out.loss.detach())
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            k += 1
            if k <= args.warmup:
                continue
            ms.append(dt * 1e3)
            secs += dt
            real += int(batch[2].sum())
            tgts += n_tgt
            if secs >= args.seconds or (args.max_steps and len(ms) >= args.max_steps):
                break
    except torch.OutOfMemoryError:
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()
        return None
    rec = {"steps": len(ms), "seconds": secs, "real_tokens": real, "real_tokens_per_s": real / secs,
           "targets_per_s": tgts / secs, "median_ms": statistics.median(ms), "step_ms": ms, "loss": loss}
    rec.update(peer.mem(torch, cuda))
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(shapes.SHAPES), required=True)
    ap.add_argument("--batches", required=True, help="the batches file the C bench wrote")
    ap.add_argument("--arms", required=True, help="comma list: arm names in the file's index order")
    ap.add_argument("--kinds", required=True, help="comma list, one per arm: packed | unpadded | padded")
    ap.add_argument("--seconds", type=float, default=10.0, help="timed seconds per arm")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first per arm")
    ap.add_argument("--max-steps", type=int, default=0, help="at most this many timed steps per arm (0: no limit)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--liger", action="store_true", help="patch Liger-Kernel's fused kernels in first")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (to check the script only)")
    args = ap.parse_args()
    args.no_grad_checkpointing = False
    args.memory_fraction = 1.0
    names, kinds = args.arms.split(","), args.kinds.split(",")
    if len(names) != len(kinds) or any(k not in ("packed", "unpadded", "padded") for k in kinds):
        ap.error("--arms and --kinds: one kind (packed | unpadded | padded) per arm")
    if not (args.seconds > 0) or args.warmup < 0 or args.max_steps < 0:
        ap.error("bad --seconds / --warmup / --max-steps")
    try:
        import numpy as np
        torch, cuda = peer.start_torch(args)
    except ImportError as e:
        peer.emit({"ready": False, "error": "torch is not importable: %s" % e})
        return 1
    if torch is None:
        return 1
    try:
        arms = read_batches(args.batches, len(names))
    except (OSError, ValueError) as e:
        peer.emit({"ready": False, "error": str(e)})
        return 1
    max_T = max(b[1] for a in arms for b in a)
    try:
        model, opt, info = shapes.build(args, torch, max_T)
    except ImportError as e:
        peer.emit({"ready": False, "error": "liger-kernel is not importable: %s" % e})
        return 1
    dev = torch.device(args.device)
    info["batch"] = "per arm, as the batches file gives"
    # Every batch here has its own length, and SDPA's cuDNN backend builds an execution plan for
    # each new shape: on an H100 that made a packed step 2.0 s against 0.28 s with it off. The
    # peer runs as a user who noticed would: cuDNN off, SDPA choosing among its other backends.
    torch.backends.cuda.enable_cudnn_sdp(False)
    info["sdpa_cudnn"] = "off: every batch has a new shape, and cuDNN plans each one"
    first_packed = next((arms[i][0] for i, k in enumerate(kinds) if k == "packed" and arms[i]), None)
    info["packing_check"] = packing_check(torch, np, model, opt, first_packed, dev) if first_packed else \
        {"checked": False, "why": "no packed arm"}
    peer.emit(info)
    for name, kind, batches in zip(names, kinds, arms):
        if not batches:
            continue
        rec = run_arm(torch, np, model, opt, batches, kind, args, cuda, dev)
        peer.emit(dict({"arm": name}, **(rec if rec else {"oom": True})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
