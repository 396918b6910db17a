"""Peer timings for dev/cuda/attn_fwd.cu: PyTorch SDPA forward with the FLASH (FlashAttention-2)
and cuDNN backends on the same shapes, bf16, (B, S, H, D) tensors viewed as (B, H, S, D).
TFLOP/s by the FlashAttention convention: 4*B*H*S*S*D, halved for causal.
Usage: python3 dev/cuda/attn_fwd_sdpa.py [csv]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 16384, 16, 128), (1, 32768, 24, 128), (4, 4096, 16, 64), (1, 16384, 16, 64)]
WARMUP, REPS = 3, 15


def median_ms(fn):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    rows = []
    for (B, S, H, D) in SHAPES:
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                   for _ in range(3))
        for causal in (False, True):
            flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    tf = flops / ms * 1e-9
                except RuntimeError as e:  # a backend that refuses the shape
                    ms, tf = float("nan"), float("nan")
                    print(f"{name} failed: {str(e)[:120]}")
                rows.append((B, S, H, D, int(causal), name, ms, tf))
                print(f"sdpa {name:5s} B={B} S={S} H={H} D={D} causal={int(causal)} | {ms:.3f} ms {tf:.1f} TFLOP/s",
                      flush=True)
        del q, k, v
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write("B,S,H,D,causal,backend,ms,tflops\n")
            for r in rows:
                f.write("%d,%d,%d,%d,%d,%s,%.4f,%.1f\n" % r)


if __name__ == "__main__":
    main()
