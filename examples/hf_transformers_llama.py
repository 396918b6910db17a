"""Train a Hugging Face transformers model with BackLite attention (attn_implementation).

    pip install transformers
    python examples/hf_transformers_llama.py                   # tiny random Llama, no download
    python examples/hf_transformers_llama.py --model <hub id>  # any model with
                                                               # _supports_attention_backend

register() adds "back_lite" to transformers' AttentionInterface; a model loaded or switched to it
runs its attention through BackLite: exact forward, backward that skips the key tiles carrying
< negl_prob of each 64-query tile's softmax mass. Batches must be unpadded (BackLite computes
causal or full attention, no masks).
"""
import argparse

import torch

import back_lite.integrations.transformers as bl_hf


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None, help="a hub id; default: a tiny random Llama")
    p.add_argument("--negl-prob", type=float, default=0.05)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    name = bl_hf.register(negl_prob=args.negl_prob)  # -> "back_lite"
    torch.manual_seed(0)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation=name)
    else:
        config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=4096)
        model = LlamaForCausalLM(config)
        model.set_attn_implementation(name)  # on a model that is already built
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).train()
    if device == "cuda":
        model.to(torch.bfloat16)
    print(f"attn_implementation = {model.config._attn_implementation}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    for step in range(args.steps):
        ids = torch.randint(0, vocab, (2, args.seqlen), device=device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
