"""Peer timings for the backward (DESIGN §3): PyTorch SDPA backward with the FLASH
(FlashAttention-2) and cuDNN backends, same shapes as `attn_bwd bench`, bf16, CUDA events,
median of several runs. Backward only: the forward runs once and its graph is kept.

Run on the GPU machine: python3 dev/cuda/sdpa_bwd_ref.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # (B, S, H, D, causal)
    (1, 16384, 16, 128, False),
    (1, 16384, 16, 128, True),
    (1, 32768, 24, 128, False),
    (4, 4096, 16, 64, False),
]


def time_backward(backend, b, s, h, d, causal, reps):
    # SDPA's own layout is (B, H, S, D).
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for _ in range(2):
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
        times = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def main():
    print(torch.cuda.get_device_name(), torch.__version__)
    for b, s, h, d, causal in SHAPES:
        flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                ms = time_backward(backend, b, s, h, d, causal, 3 if s >= 32768 else 7)
                print(f"sdpa-{name} B{b} S{s} H{h} D{d} {'causal' if causal else 'full  '}: "
                      f"{ms:8.3f} ms  {flops / ms * 1e-9:6.1f} TFLOP/s")
            except Exception as e:  # a backend may refuse a shape; say so and go on
                print(f"sdpa-{name} B{b} S{s} H{h} D{d}: unavailable ({type(e).__name__}: {e})")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
