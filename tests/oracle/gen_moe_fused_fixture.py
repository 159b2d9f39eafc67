#!/usr/bin/env python3
"""tests/fixtures/moe/qwen3moe_fused: the qwen3moe fixture's model in transformers 5's fused expert
layout (model.layers.N.mlp.experts.gate_up_proj (E, 2*moe_F, C), gate rows first, and
mlp.experts.down_proj (E, C, moe_F) instead of one tensor per expert), with the same config.json
and expected.safetensors: transformers loads it to the same model (checked here), so the model test
holds it to the same oracle. Run after gen_moe_fixtures.py with /work/pyenv/bin/python; CI never
runs this, only its outputs."""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..", "fixtures", "moe", "qwen3moe")
    dst = os.path.join(here, "..", "fixtures", "moe", "qwen3moe_fused")
    os.makedirs(dst, exist_ok=True)
    for f in ("config.json", "expected.safetensors"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    sd = load_file(os.path.join(src, "model.safetensors"))
    c = json.load(open(os.path.join(src, "config.json")))
    E = c["num_local_experts"]
    out = {k: v for k, v in sd.items() if ".mlp.experts." not in k}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}.mlp.experts."
        out[p + "gate_up_proj"] = torch.stack(
            [torch.cat([sd[f"{p}{e}.gate_proj.weight"], sd[f"{p}{e}.up_proj.weight"]], 0) for e in range(E)], 0
        ).contiguous()
        out[p + "down_proj"] = torch.stack([sd[f"{p}{e}.down_proj.weight"] for e in range(E)], 0).contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for f in os.listdir(dst):
        os.chmod(os.path.join(dst, f), 0o644)
    a = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    b = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    x = torch.randint(4, c["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits), "the fused folder loads to a different model"
    print("qwen3moe_fused: written")


if __name__ == "__main__":
    main()
