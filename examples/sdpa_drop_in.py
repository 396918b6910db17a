"""BackLite in place of torch.nn.functional.scaled_dot_product_attention, two ways.

    python examples/sdpa_drop_in.py

1. Call the drop-in directly: same arguments as PyTorch's, plus negl_prob.
2. Keep the model code as it is and route its F.scaled_dot_product_attention calls through
   BackLite inside a `with sdpa_through_back_lite(...)` block.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from back_lite.integrations.sdpa import scaled_dot_product_attention, sdpa_through_back_lite


class SelfAttention(nn.Module):
    """Ordinary model code: knows nothing about BackLite."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        # x: (B, S, dim) -> q, k, v: (B, heads, S, head_dim), as PyTorch's SDPA wants them
        batch, seqlen, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seqlen, dim))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    # 1. the drop-in, called directly: q (B, H, Sq, D), k / v (B, Hk, Sk, D)
    q = torch.randn(2, 8, 1024, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 1024, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, 1024, 64, device=device, dtype=dtype, requires_grad=True)
    out = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, negl_prob=0.05)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.sum().backward()
    print(f"drop-in: out {tuple(out.shape)}, max |BackLite - PyTorch| = "
          f"{(out - ref).abs().max().item():.2e} (the forward is exact)")

    # 2. unchanged model code, routed through BackLite for a few training steps
    model = nn.Sequential(SelfAttention(256, 4), nn.GELU(), SelfAttention(256, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(2, 1024, 256, device=device)
    for step in range(3):
        with sdpa_through_back_lite(negl_prob=0.05) as calls:
            loss = model(x).square().mean()
        loss.backward()  # BackLite's sparse backward runs here, outside the block: fine
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}, attention calls {calls}")


if __name__ == "__main__":
    main()
