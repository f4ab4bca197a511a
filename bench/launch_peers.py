#!/usr/bin/env python3
"""Host cost of one kernel launch from the peers, on this host: the other side of
`kgen bench`'s launch-cost line (ANCHORS: Triton's launch from Python 4-9 us on the
anchor host; kgen's target <= 3 us from Rust).

Same method as `kgen bench`: 400 launches of a 1-block relu over 1024 f32, queued behind
a long GPU wait (torch.cuda._sleep here, a spin kernel in C++) so the GPU never catches
up and the launch queue never makes the host wait; median of 9 rounds; the peers
interleaved round by round. Peers: a Triton kernel, torch eager ops, a cupy RawKernel
(if cupy is installed) and, when nvcc is on PATH, CUDA C++ (bench/launch_peer.cu: the
runtime's <<<>>>, cudaLaunchKernel and the driver's cuLaunchKernel).

Writes torch_peers.py-format records (workload "launch_host") with --json; the GPU
benchmark (tools/gpu-bench.sh) merges them into the peers file it gives `kgen bench`,
which prints them beside its own launch cost.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

LAUNCHES, ROUNDS = 400, 9
WORKLOAD = "launch_host"
HERE = os.path.dirname(os.path.abspath(__file__))


def python_peers(torch):
    """name -> (description, zero-argument launch) of the Python-side peers."""
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    peers = {
        "torch_relu_inplace": ("torch.relu_(y)", lambda: torch.relu_(y)),
        "torch_add_out": ("torch.add(x, 1.0, out=y)", lambda: torch.add(x, 1.0, out=y)),
    }
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            o = tl.arange(0, BLOCK)
            m = o < n
            tl.store(y_ptr + o, tl.maximum(tl.load(x_ptr + o, mask=m), 0.0), mask=m)

        peers["triton"] = (f"Triton {triton.__version__} relu_kernel[(1,)](x, y, 1024, "
                           "BLOCK=1024)",
                           lambda: relu_kernel[(1,)](x, y, 1024, BLOCK=1024))
    except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
        print(f"launch_peers: no Triton peer: {e}", file=sys.stderr)
    try:
        import cupy as cp

        k = cp.RawKernel(r'''extern "C" __global__ void relu(const float* x, float* y, int n)
            { int i = threadIdx.x; if (i < n) y[i] = fmaxf(x[i], 0.f); }''', "relu")
        cx = cp.random.standard_normal(1024, dtype=cp.float32)
        cy = cp.empty_like(cx)
        n = cp.int32(1024)
        peers["cupy_rawkernel"] = ("cupy RawKernel((1,), (1024,), (x, y, n))",
                                   lambda: k((1,), (1024,), (cx, cy, n)))
    except Exception as e:  # noqa: BLE001
        print(f"launch_peers: no cupy peer: {e}", file=sys.stderr)
    return peers


def measure_python(torch, peers):
    """Median / min / max host µs per launch of each peer (see the module docstring)."""
    for _, f in peers.values():
        for _ in range(20):
            f()
    torch.cuda.synchronize()
    times = {name: [] for name in peers}
    for _ in range(ROUNDS):
        for name, (_, f) in peers.items():
            torch.cuda.synchronize()
            torch.cuda._sleep(30_000_000)  # cycles: ~15-20 ms, longer than 400 launches
            t = time.perf_counter()
            for _ in range(LAUNCHES):
                f()
            times[name].append((time.perf_counter() - t) / LAUNCHES * 1e6)
            torch.cuda.synchronize()
    return [{"workload": WORKLOAD, "peer": name, "what": peers[name][0],
             "median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
            for name, v in times.items()]


def measure_cpp():
    """The CUDA C++ peers (bench/launch_peer.cu), or [] when nvcc is not on PATH."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("launch_peers: no nvcc on PATH: no CUDA C++ peer", file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "launch_peer")
        build = subprocess.run([nvcc, "-O2", "-arch=sm_80",
                                os.path.join(HERE, "launch_peer.cu"), "-lcuda", "-o", exe],
                               capture_output=True, text=True, check=False)
        if build.returncode != 0:
            print(f"launch_peers: nvcc failed:\n{build.stderr}", file=sys.stderr)
            return []
        run = subprocess.run([exe], capture_output=True, text=True, check=False, timeout=120)
        if run.returncode != 0:
            print(f"launch_peers: launch_peer failed:\n{run.stderr}", file=sys.stderr)
            return []
        return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("launch_peers.py: needs PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("launch_peers.py: CUDA is unavailable", file=sys.stderr)
        return 2
    records = measure_cpp() + measure_python(torch, python_peers(torch))
    for r in records:
        print(f"{r['peer']:<28} {r['median_us']:7.2f} us  (min {r['min_us']:.2f}, "
              f"max {r['max_us']:.2f})  {r['what']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
