#!/usr/bin/env python3
"""Same-size copy floors: the time of a device-to-device `copy_` of the bytes a workload
reads (and writes the same amount of), measured like the benchmarks (L2 flushed before
each timed run, CUDA events, median of 50). The 1 GiB copy is the bandwidth ceiling the
benchmarks divide by; at a few dozen MiB the copy itself no longer reaches it (launch,
ramp-up and tail weigh), so a small workload's floor is the copy of its own size.

    python3 bench/copy_floor.py            # needs torch and a GPU
"""
import statistics
import sys

SIZES = [
    (16384 * 768 * 2, "16384x768 bf16 (24 MiB): the 768-wide norms"),
    (16384 * 4096 * 2, "16384x4096 bf16 (128 MiB): the 4096-wide norms, softmax, RoPE"),
    (1 << 30, "1 GiB: the ceiling"),
]


def main() -> int:
    try:
        import torch
    except ImportError:
        print("copy_floor: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("copy_floor: no GPU", file=sys.stderr)
        return 2
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for nbytes, label in SIZES:
        src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        for _ in range(5):
            dst.copy_(src)
        times = []
        for _ in range(50):
            flush.zero_()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        med = statistics.median(times)
        print(f"copy {label}: median {med:.1f} us, {2 * nbytes / med / 1e3:.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
