"""Host time a call through back_lite's eager direct path (back_lite/ops.py direct_call_ok) against
the same call through the torch.library op it skips, on the device.

    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/host_paths.py \
        [--shape 1,16384,16,128] [--causal] [--keep 0.03] [--passes 2]

Each row queues `CALLS` calls while the GPU is held busy by a sleep kernel, so no launch waits for
the GPU, and prints the wall time a call. The functional rows include back_lite's argument checks;
the op rows call torch.ops.back_lite.* directly (no checks). Rows alternate over `--passes`
passes: a single pass's first rows read high (bench/results/host-s93-call-overhead.txt, call 7).
For the pieces of a call (C launch path, workspace, checks) see dev/cuda/host_overhead.py.
"""
import argparse
import time

import torch

import back_lite
from back_lite import functional as blf

CALLS = 40
SLEEP_CYCLES = 400_000_000  # ~0.2 s at 1.98 GHz: longer than CALLS calls' host work


def host_us(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t = (time.perf_counter() - t0) / CALLS * 1e6
    torch.cuda.synchronize()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16384,16,128", help="B,S,H,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--keep", type=float, default=0.03, help="random tile mask's keep")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    causal = args.causal
    # q, k, v: (B, S, H, D) bf16
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    out, lse, _ = back_lite.forward(q, k, v, causal=causal)
    tm, tn = back_lite.num_tiles(s, s, "cuda")
    mask = torch.rand(b, h, tm, tn, device="cuda") < args.keep
    scale = d ** -0.5
    rows = {
        "functional.backward dense (direct)":
            lambda: blf.backward(dout, q, k, v, out, lse, causal=causal),
        "torch.ops.back_lite.backward dense":
            lambda: torch.ops.back_lite.backward(dout, q, k, v, out, lse, None, 0.0, None,
                                                 scale, causal),
        f"functional.backward mask {args.keep:g} (direct)":
            lambda: blf.backward(dout, q, k, v, out, lse, mask=mask, causal=causal),
        f"torch.ops.back_lite.backward mask {args.keep:g}":
            lambda: torch.ops.back_lite.backward(dout, q, k, v, out, lse, None, 0.0, mask,
                                                 scale, causal),
        "functional.forward stats (direct)":
            lambda: blf.forward(q, k, v, causal=causal, with_stats=True),
        "torch.ops.back_lite.forward stats":
            lambda: torch.ops.back_lite.forward(q, k, v, scale, causal, True),
    }
    label = f"{b}x{s}x{h}x{d} causal={causal}"
    for _ in range(args.passes):
        for name, fn in rows.items():
            for _ in range(3):  # warm: workspace pool, first-call attributes
                fn()
            print(f"{label}  {name:40s} {host_us(fn):7.1f} us host a call")


if __name__ == "__main__":
    main()
