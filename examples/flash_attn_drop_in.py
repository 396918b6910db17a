"""BackLite in place of FlashAttention's flash_attn_func: the import changes, the call does not.

    python examples/flash_attn_drop_in.py

Model code written for flash_attn works in the (B, S, H, D) layout, which is BackLite's own, so
q / k / v go in as they are. negl_prob (keyword only) sets how much of each query tile's softmax
mass the backward may skip. Runs on the CPU backend without a GPU, on the CUDA backend on an
H100 / H200.
"""
import torch
import torch.nn as nn

# was: from flash_attn import flash_attn_func
# (FlashAttention-3's flash_attn_interface.flash_attn_func: back_lite.integrations.flash_attn3)
from back_lite.integrations.flash_attn import flash_attn_func


class CausalSelfAttention(nn.Module):
    """GQA self-attention as flash_attn users write it: q (B, S, Hq, D), k / v (B, S, Hk, D)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, negl_prob: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.proj = nn.Linear(dim, dim)
        self.negl_prob = negl_prob

    def forward(self, x):
        batch, seqlen, dim = x.shape
        q = self.q(x).view(batch, seqlen, self.heads, self.head_dim)
        k, v = self.kv(x).view(batch, seqlen, 2, self.kv_heads, self.head_dim).unbind(2)
        out = flash_attn_func(q, k, v, causal=True, negl_prob=self.negl_prob)
        return self.proj(out.reshape(batch, seqlen, dim))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = nn.Sequential(CausalSelfAttention(512, 8, 2, negl_prob=0.05), nn.GELU(),
                          CausalSelfAttention(512, 8, 2, negl_prob=0.05)).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 1024, 512, device=device, dtype=dtype)
    for step in range(3):
        loss = model(x).float().square().mean()
        loss.backward()  # BackLite's block-sparse backward
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
