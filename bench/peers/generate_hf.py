"""Peer of scripts/gpu-generate.sh: greedy decoding with transformers' `generate` (KV cache, SDPA) on
an HF folder, on one CUDA device: the chat-templated prompt, exactly --new-tokens new tokens
(min = max, so EOS does not end it early), timed after a warm-up call; prints one JSON line with
the prompt and new-token counts, prefill (time to the first token) and decode tokens/s, medians of
--repeats. It installs nothing."""
import argparse
import json
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype),
                                                              attn_implementation="sdpa").cuda().eval()
    msgs = [{"role": "user", "content": a.prompt}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    ids = ids.cuda()

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    run(4)  # warm-up
    first, full = [], []
    for _ in range(a.repeats):
        first.append(run(1)[0])
        t, out = run(a.new_tokens)
        full.append(t)
    t1, tn = statistics.median(first), statistics.median(full)
    decode = (a.new_tokens - 1) / max(tn - t1, 1e-9)
    print(json.dumps({"peer": "transformers-generate", "transformers": transformers.__version__,
                      "torch": torch.__version__, "dtype": a.dtype, "prompt_tokens": int(ids.shape[1]),
                      "new_tokens": a.new_tokens, "prefill_s": t1, "total_s": tn,
                      "prefill_tokens_per_s": ids.shape[1] / t1, "decode_tokens_per_s": decode,
                      "text": tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)[:200]}))


if __name__ == "__main__":
    main()
