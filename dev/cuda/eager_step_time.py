"""Wall time of a forward + backward through autograd, eager, steps queued back to back (one
sync at the end): where the host's time per step exceeds the GPU's, the host sets the pace, as in
an eager training loop. back_lite.attention (eager: ops.EagerAttention) against the autograd of
the op it skips (torch.ops.back_lite.attention), alternating over passes.

    BACK_LITE_LIBRARY=build/libbacklite.so PYTHONPATH=. python3 dev/cuda/eager_step_time.py \
        [--shapes 4,4096,16,64:causal,1,16384,16,128] [--negl 0.5] [--steps 50] [--passes 3]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from host_overhead import attention_steps  # noqa: E402


def wall_ms(fn, steps: int) -> float:
    """ms a step of `steps` calls of fn queued back to back, one sync at the end."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4,4096,16,64:causal,1,8192,16,128:causal,1,16384,16,128")
    ap.add_argument("--negl", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for spec in _split(args.shapes):
        dims, _, flag = spec.partition(":")
        b, s, h, d = (int(x) for x in dims.split(","))
        causal = flag == "causal"
        q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
        dout = torch.randn_like(q)
        paths = attention_steps(q, k, v, dout, causal, args.negl)
        for _ in range(args.passes):
            for name, fn in paths.items():
                print(f"{dims}{' causal' if causal else ''} negl {args.negl} {name:>30}: "
                      f"{wall_ms(fn, args.steps) * 1e3:.1f} us a step (wall)")


def _split(shapes: str):
    """'4,4096,16,64:causal,1,8192,16,128' -> ['4,4096,16,64:causal', '1,8192,16,128']"""
    parts, out = shapes.split(","), []
    while parts:
        four, parts = parts[:4], parts[4:]
        out.append(",".join(four))
    return out


if __name__ == "__main__":
    main()
