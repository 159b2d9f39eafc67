"""What the model-family fixture generators (gen_model_fixtures.py, gen_family_fixtures.py,
gen_gemma_fixtures.py) share: random weights for a tiny transformers model, its LoRA adapter from
PEFT, the packed batch and its per-sequence forward/backward, the expected.safetensors every e2e
model test reads, and the GGUF writing steps of llama.cpp's converter that do not depend on the
architecture. It builds no model config and picks no case: each generator keeps its own.

Integers are stored as F32 (exact below 2^24) because the fixture reader takes F32/F16/BF16 only.
"""
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

B, T = 2, 12
RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Row 0 packs two sequences (5 + 7 tokens); row 1 holds one of 12 with the first 3 targets ignored
# (a prompt mask) — offsets as attention.h: (B, S+1) with S = 2, row 1 padded by T.
SEQS = [(0, 0, 5), (0, 5, 12), (1, 0, 12)]
OFFSETS = [[0, 5, 12], [0, 12, 12]]


def randomize_weights(model, scale, norm_center=1.0, bf16=False):
    """Every weight N(0, scale²), every norm weight norm_center + N(0, 0.01) (away from the
    identity so a wrong norm shows); bf16 rounds them to bf16 values (computed in fp32)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                r = 0.1 * torch.randn_like(p)
                p.copy_(norm_center + r if norm_center else r)
            else:
                p.copy_(scale * torch.randn_like(p))
            if bf16:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.eval()


def state_dict(model, tied=False, bf16=False):
    """The model's tensors as save_file takes them; tied drops lm_head.weight."""
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if tied:
        sd.pop("lm_head.weight", None)
    if bf16:
        sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    return sd


def save_model(path, sd):
    save_file(sd, path, metadata={"format": "pt"})


def attach_lora(model, seed, targets=TARGETS, layers=None, train=True):
    """The PEFT adapter (rank RANK, alpha ALPHA, no dropout) on `targets` (of `layers`, all when
    None), A and B both random: B = 0 at init would make every A gradient zero."""
    kw = {} if layers is None else {"layers_to_transform": layers}
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                  target_modules=targets, bias="none", **kw))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    if train:
        peft_model.train()  # dropout is 0; train mode only to keep autograd semantics obvious
    return peft_model


def packed_batch(seed, V, lo=3):
    """Tokens in [lo, V), targets (-100 ignored) and positions of the (B, T) packed batch SEQS."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(lo, V, (B, T), generator=g)
    targets = torch.full((B, T), -100)
    positions = torch.zeros((B, T), dtype=torch.long)
    for r, a, b in SEQS:
        targets[r, a:b - 1] = tokens[r, a + 1:b]
        positions[r, a:b] = torch.arange(b - a)
    targets[1, 0:3] = -100
    return tokens, targets, positions, torch.tensor(OFFSETS)


def run_packed(model, tokens, targets, V):
    """Packing reproduced the unambiguous way: every sequence run alone (batch of one, positions
    from 0), its logits placed where the packed row holds it; the loss is the mean over all
    non-ignored targets of the batch (longtune's default grad_scale). Returns logits (B, T, V),
    per-token loss (B, T) and the loss, still attached for backward."""
    logits = torch.zeros(B, T, V)
    total = torch.zeros(())
    token_loss = torch.zeros(B, T)
    n_tok = int((targets != -100).sum())
    for r, a, b in SEQS:
        out = model(input_ids=tokens[r, a:b].unsqueeze(0), position_ids=torch.arange(b - a).unsqueeze(0))
        lg = out.logits[0].float()
        logits[r, a:b] = lg.detach()
        tl = torch.nn.functional.cross_entropy(lg, targets[r, a:b], ignore_index=-100, reduction="none")
        token_loss[r, a:b] = tl.detach()
        total = total + tl.sum()
    return logits, token_loss, total / n_tok


def write_expected(path, peft_model, batch, logits, token_loss, loss, generator, num_layers):
    """expected.safetensors: the batch, logits, loss, per-token loss, then every LoRA tensor (PEFT
    name without ".default") and its gradient. Returns the number of LoRA tensors."""
    tokens, targets, positions, offsets = batch
    exp = {
        "tokens": tokens.float(), "targets": targets.float(), "positions": positions.float(),
        "seq_offsets": offsets.float(), "logits": logits, "loss": loss.detach().reshape(1),
        "token_loss": token_loss,
    }
    n_lora = 0
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "")
            exp[key] = p.detach().clone().contiguous()
            exp[key + ".grad"] = p.grad.detach().clone().contiguous()
            n_lora += 1
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "num_layers": str(num_layers), "n_lora": str(n_lora),
            "B": str(B), "T": str(T), "S": "2", "generator": generator, "torch": torch.__version__}
    save_file(exp, path, metadata=meta)
    return n_lora


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute: rotate-half rows → interleaved rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_shape(w, L, ctx, C, F, H, Hkv):
    """The block count, context, widths and head counts, in the converter's order."""
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)


def gguf_tensors(w, sd, names, convert=None):
    """Every state-dict tensor as f32 under its GGUF name (names: HF module path after the layer
    index → GGUF tensor stem); convert(hf_name, module, array) may change the array (Q/K row
    permutation, Gemma's norm shift); module is None outside the layers."""
    for k, v in sd.items():
        a = v.float()
        mod = None
        if k == "model.embed_tokens.weight":
            n = "token_embd.weight"
        elif k == "lm_head.weight":
            n = "output.weight"
        elif k == "model.norm.weight":
            n = "output_norm.weight"
        else:
            parts = k.split(".")
            layer, mod = parts[2], ".".join(parts[3:-1])
            n = f"blk.{layer}.{names[mod]}.weight"
        if convert:
            a = convert(k, mod, a)
        w.add_tensor(n, a.contiguous().numpy())


def gguf_finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def out_arg(default_folder):
    """The generators' one option: --out, by default tests/fixtures/<default_folder>."""
    import argparse

    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", default_folder))
    return ap.parse_args().out
