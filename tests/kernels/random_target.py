"""Write an untrained HF Llama (config.json + safetensors, no tokenizer) of a given shape, for
`bench verify` on a GPU machine that has no model to download: a verify pass costs the same with
random weights.

    python tests/kernels/random_target.py DIR [--hidden 2048 --layers 16 --heads 32 --kv-heads 8
        --intermediate 8192 --vocab 32000]     (the defaults: a Llama-3.2-1B-shaped body)
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    for name, default in (("hidden", 2048), ("layers", 16), ("heads", 32), ("kv-heads", 8), ("intermediate", 8192),
                          ("vocab", 32000)):
        ap.add_argument(f"--{name}", type=int, default=default)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=8192, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(args.out)


if __name__ == "__main__":
    main()
