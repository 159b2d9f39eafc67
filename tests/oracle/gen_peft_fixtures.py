#!/usr/bin/env python3
"""Oracle fixtures for tests/unit/test_peft.c: PEFT adapter files in both directions, on the tiny random
SmolLM2-like model of tests/fixtures/model/llama_tied (bf16 weights, tied embeddings).

Stage "peft": builds a LoRA adapter with PEFT (r=4, alpha=8, all seven projections, last layer
only, random non-zero A and B), saves it with save_pretrained into <out>/peft_written and writes
<out>/expected.safetensors with input_ids and the PEFT model's fp32 logits ("logits_peft").
Stage "longtune" (a manual check on a machine with both): loads an adapter folder written by
longtune (--adapter DIR) with PeftModel.from_pretrained and prints how far its logits are from
logits_peft when it holds the same weights.

Needs torch, transformers, peft and safetensors (pip); CI never runs this, only its outputs.
Usage: python3 tests/oracle/gen_peft_fixtures.py peft [--out tests/fixtures/peft]
       python3 tests/oracle/gen_peft_fixtures.py longtune --adapter DIR [--out tests/fixtures/peft]
"""
import argparse
import os

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "..", "fixtures", "model", "llama_tied")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
INPUT_IDS = [1, 17, 42, 5, 93, 64, 8, 33, 71, 2]


def base_model():
    m = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def logits(model):
    with torch.no_grad():
        ids = torch.tensor([INPUT_IDS])
        return model(input_ids=ids).logits[0].float().contiguous()


def stage_peft(out):
    torch.manual_seed(1234)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, layers_to_transform=[1],
                     bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base_model(), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    model.eval()
    model.save_pretrained(os.path.join(out, "peft_written"))
    exp = {"input_ids": torch.tensor(INPUT_IDS, dtype=torch.float32), "logits_peft": logits(model)}
    save_file(exp, os.path.join(out, "expected.safetensors"), metadata={"format": "pt"})


def stage_longtune(out, adapter):
    model = PeftModel.from_pretrained(base_model(), adapter)
    model.eval()
    exp = load_file(os.path.join(out, "expected.safetensors"))
    d = (logits(model) - exp["logits_peft"]).abs().max().item()
    print(f"PEFT logits with the longtune-written adapter vs logits_peft: max |diff| {d:.3g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["peft", "longtune"])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "peft"))
    ap.add_argument("--adapter", help="longtune-written adapter folder (stage longtune)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.stage == "peft":
        stage_peft(a.out)
    else:
        stage_longtune(a.out, a.adapter)


if __name__ == "__main__":
    main()
