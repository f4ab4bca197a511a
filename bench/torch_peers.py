#!/usr/bin/env python3
"""torch_peers.py: the PyTorch peer benchmarks for every workload in shared/ANCHORS.md.

What it does: on the current CUDA GPU, times each bandwidth-bound workload of ANCHORS
(AdamW, RMSNorm, LayerNorm, SwiGLU, RoPE, softmax, cross-entropy, grad norm / clipping),
the device-to-device copy ceiling (a 1 GiB `copy_`), bf16 GEMM through torch.matmul
(the cuBLAS peer), fp16 linear layers (F.linear with a bias, forward, and its autograd
backward), Muon's Newton-Schulz iteration (single and batched matrices), a whole
torch.optim.Muon step over GPT-2's hidden matrices and causal bf16 fused attention
(F.scaled_dot_product_attention forward, and its backward alone, on the cuDNN and
FlashAttention backends), once per peer (eager, torch.compile, AdamW fused / foreach,
cuDNN / FlashAttention, ...). Prints a table and, with --json FILE, writes a list of
records {workload, shape, dtype, peer, median_us, gbps, bytes, ...} that `kgen bench`
reads to print kgen and torch side by side.

Assumes: torch with CUDA (it exits with a message, status 2, when CUDA is unavailable);
triton for `triton.testing.do_bench` (falls back to an own CUDA-event loop that does the
same: flush L2 by writing 256 MB before each run, time each run with events, median).

Guarantees: workload names and floor-bytes formulas are stable identifiers, defined once
in WORKLOADS below and mirrored in bench/README.md (`--self-check` fails when the two
disagree, and when a floor, or the TFLOP/s of a median ANCHORS quotes, differs from
ANCHORS' by more than 2%). Every peer is warmed up (torch.compile peers are compiled)
before timing; every median is over >= 20 timed runs (>= 50 without --quick), with L2
flushed before each run. Inputs are random (never zeros). A peer that fails (a
torch.compile error, out of memory, an unavailable SDPA backend) is recorded with its
error and the run continues. Runs without torch: --self-check, --list, --markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------
# Pure-python part: shapes, workloads, floor-bytes formulas (no torch needed).
# ----------------------------------------------------------------------------------------

# Bandwidth ceiling ANCHORS divides floor bytes by (H100 D2D copy, read + write).
ANCHOR_COPY_BYTES_PER_S = 3.0e12

DTYPE_SIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def gpt2_param_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """The 148 parameter tensors of GPT-2 small (124M), in nanoGPT order, with the
    weight-tied lm_head not counted. Linear weights are stored as HF's Conv1D does:
    [in, out]."""
    d, vocab, ctx, layers = 768, 50257, 1024, 12
    shapes: list[tuple[str, tuple[int, ...]]] = [("wte", (vocab, d)), ("wpe", (ctx, d))]
    for i in range(layers):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", (d,)),
            (h + "ln_1.bias", (d,)),
            (h + "attn.c_attn.weight", (d, 3 * d)),
            (h + "attn.c_attn.bias", (3 * d,)),
            (h + "attn.c_proj.weight", (d, d)),
            (h + "attn.c_proj.bias", (d,)),
            (h + "ln_2.weight", (d,)),
            (h + "ln_2.bias", (d,)),
            (h + "mlp.c_fc.weight", (d, 4 * d)),
            (h + "mlp.c_fc.bias", (4 * d,)),
            (h + "mlp.c_proj.weight", (4 * d, d)),
            (h + "mlp.c_proj.bias", (d,)),
        ]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return shapes


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def gpt2_hidden_matrices() -> list[tuple[str, tuple[int, int]]]:
    """The 48 hidden matrices of GPT-2 small that Muon updates (embeddings, biases and
    norms go to AdamW), in torch's nn.Linear layout [out, in] (what torch.optim.Muon
    users hold; HF's Conv1D stores the transpose, which costs Muon the same)."""
    d, layers = 768, 12
    shapes: list[tuple[str, tuple[int, int]]] = []
    for i in range(layers):
        h = f"h.{i}."
        shapes += [
            (h + "attn.c_attn.weight", (3 * d, d)),
            (h + "attn.c_proj.weight", (d, d)),
            (h + "mlp.c_fc.weight", (4 * d, d)),
            (h + "mlp.c_proj.weight", (d, 4 * d)),
        ]
    return shapes


GPT2_SHAPES = gpt2_param_shapes()
GPT2_NUMEL = sum(numel(s) for _, s in GPT2_SHAPES)
GPT2_HIDDEN = gpt2_hidden_matrices()
GPT2_HIDDEN_NUMEL = sum(numel(s) for _, s in GPT2_HIDDEN)


@dataclass(frozen=True)
class Workload:
    """One benchmark workload: a stable name, its shape, its floor bytes and peers."""

    name: str
    shape: str  # human-readable shape, e.g. "16384x4096"
    dtype: str
    bytes: int  # floor: the minimum bytes a kernel must move (ANCHORS' definition)
    formula: str  # how `bytes` is computed; mirrored in bench/README.md
    peers: tuple[str, ...]
    kind: str  # which builder makes the timed function
    args: dict = field(default_factory=dict)
    flops: int = 0  # for tensor-core work (GEMM, Newton-Schulz); 0 otherwise


def _adamw(name, shape, dtype, n, args):
    per = 3 * DTYPE_SIZE[dtype] + 4 * DTYPE_SIZE[dtype]
    return Workload(
        name, shape, dtype, per * n,
        f"N*(3+4)*{DTYPE_SIZE[dtype]}: read p,g,m,v + write p,m,v; "
        f"params, grads, states all {dtype}",
        ("fused", "foreach"), "adamw", args)


def _norm(norm, rows, hidden, bwd):
    n = rows * hidden
    stage = "fwdbwd" if bwd else "fwd"
    formula = (
        "10*R*H: fwd read x, write y; bwd read x, dy, write dx (bf16; weight/bias, "
        "dw/db and per-row stats excluded)"
        if bwd else
        "4*R*H: read x, write y (bf16; weight/bias and per-row stats excluded)"
    )
    return Workload(
        f"{norm}_{stage}_bf16_{rows}x{hidden}", f"{rows}x{hidden}", "bf16",
        (10 if bwd else 4) * n, formula, ("eager", "compile"), "norm",
        {"norm": norm, "rows": rows, "hidden": hidden, "bwd": bwd})


def _gemm(m, n, k):
    return Workload(
        f"gemm_bf16_{m}x{n}x{k}", f"M={m} N={n} K={k}", "bf16",
        2 * (m * k + k * n + m * n),
        "2*(M*K + K*N + M*N): read A[M,K], B[K,N] once, write C[M,N] once "
        "(gbps is not the figure of merit: see tflops)",
        ("cublas",), "gemm", {"m": m, "n": n, "k": k}, flops=2 * m * n * k)


def _linear(m, n, k, bwd):
    """fp16 F.linear(x [M,K], w [N,K], b [N]) with autograd: the forward with the bias,
    or the backward alone (dx, dw, db from a saved graph)."""
    stage = "bwd" if bwd else "fwd"
    if bwd:
        floor = 2 * (m * n + 2 * m * k + 2 * n * k + n)
        formula = ("2*(M*N + 2*M*K + 2*N*K + N): read dy[M,N], x[M,K], w[N,K] once, write "
                   "dx[M,K], dw[N,K], db[N] once (fp16; see tflops: flops = 4*M*N*K)")
    else:
        floor = 2 * (m * k + n * k + n + m * n)
        formula = ("2*(M*K + N*K + N + M*N): read x[M,K], w[N,K], b[N] once, write y[M,N] "
                   "once (fp16; see tflops: flops = 2*M*N*K)")
    return Workload(
        f"linear_{stage}_fp16_{m}x{n}x{k}", f"M={m} N={n} K={k}", "fp16", floor, formula,
        ("eager",), "linear", {"m": m, "n": n, "k": k, "bwd": bwd},
        flops=(4 if bwd else 2) * m * n * k)


def _ns_flops(rows, cols, steps):
    """One Newton-Schulz orthogonalization of a [rows, cols] matrix: per step A = X X^T
    (2*m*m*n), A @ A (2*m^3), B @ X (2*m*m*n), m = min(rows, cols), n = max."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m ** 3)


def _newton_schulz(rows, cols, batch=1, steps=5):
    """Muon's Newton-Schulz on one bf16 [rows, cols] matrix, or on a batch of them
    ([batch, rows, cols], each matrix orthogonalized on its own)."""
    dims = f"{batch}x{rows}x{cols}" if batch > 1 else f"{rows}x{cols}"
    return Workload(
        f"newton_schulz{steps}_bf16_{dims}", dims, "bf16",
        2 * 2 * batch * rows * cols,
        "4*batch*rows*cols: read G, write X once (bf16); flops = "
        "batch*steps*(4*m*m*n + 2*m^3), m = min(rows, cols), n = max",
        ("eager", "compile"), "newton_schulz",
        {"rows": rows, "cols": cols, "batch": batch, "steps": steps},
        flops=batch * _ns_flops(rows, cols, steps))


def _muon_step(steps=5):
    """torch.optim.Muon's step over GPT-2 small's 48 hidden matrices: fp32 params, grads
    and momentum, the Newton-Schulz iteration in bf16."""
    n = GPT2_HIDDEN_NUMEL
    return Workload(
        "muon_step_gpt2",
        f"GPT-2 124M hidden matrices ({len(GPT2_HIDDEN)} tensors, [out, in])", "fp32",
        20 * n,
        f"N*(1+2+2)*4: read g, read+write momentum, read+write p (fp32; N = {n:,} "
        "elements of the 48 matrices; the bf16 Newton-Schulz temporaries excluded); "
        "flops = sum over matrices of steps*(4*m*m*n + 2*m^3)",
        ("torch_muon",), "muon", {"steps": steps},
        flops=sum(_ns_flops(r, c, steps) for _, (r, c) in GPT2_HIDDEN))


def _attention_flops(b, h, s, d, bwd):
    """Causal attention: the forward's two [S, S]-sized products (Q K^T and P V), 2*S*S*D
    each per head, half of the score matrix computed: 2*2*B*H*S*S*D/2. The backward is
    2.5 times that (FlashAttention's convention: 5 products instead of 2)."""
    fwd = 2 * 2 * b * h * s * s * d // 2
    return fwd * 5 // 2 if bwd else fwd


def _attention(b, h, s, d, bwd):
    """Causal bf16 F.scaled_dot_product_attention on contiguous q, k, v [B, H, S, D]
    (torch's layout), scale 1/sqrt(D): the forward (inputs requiring grad, as in
    training, so the backends also write the f32 logsumexp), or the backward alone
    (dq, dk, dv from a graph built once)."""
    stage = "bwd" if bwd else "fwd"
    n, rows = b * h * s * d, b * h * s
    if bwd:
        floor = 2 * (5 * n + 3 * n) + 4 * rows
        formula = ("2*8*B*H*S*D + 4*B*H*S: read q, k, v, o, dout [B,H,S,D] and the f32 "
                   "logsumexp [B,H,S] once, write dq, dk, dv once (bf16; the f32 "
                   "rowsum(dout*o) scratch excluded); flops = 2.5 * 2*B*H*S*S*D")
    else:
        floor = 2 * 4 * n + 4 * rows
        formula = ("2*4*B*H*S*D + 4*B*H*S: read q, k, v [B,H,S,D] once, write o once "
                   "(bf16) and the f32 logsumexp [B,H,S]; flops = 2*2*B*H*S*S*D/2 "
                   "(causal: half the scores)")
    return Workload(
        f"attention_{stage}_bf16_causal_{b}x{h}x{s}x{d}",
        f"q,k,v [B,H,S,D] B={b} H={h} S={s} D={d}, causal", "bf16", floor, formula,
        ("cudnn", "flash"), "attention",
        {"b": b, "h": h, "s": s, "d": d, "bwd": bwd, "scale": 1 / math.sqrt(d)},
        flops=_attention_flops(b, h, s, d, bwd))


def _workloads() -> list[Workload]:
    w: list[Workload] = []
    copy_bytes = 1 << 30
    w.append(Workload(
        "copy_d2d_1GiB", "1 GiB", "bf16", 2 * copy_bytes,
        "2*S: read S = 2^30 bytes, write S (the bandwidth ceiling)",
        ("eager",), "copy", {"bytes": copy_bytes}))
    # AdamW (torch's same-dtype state: states have the params' dtype).
    w.append(_adamw("adamw_fp32_gpt2", f"GPT-2 124M ({len(GPT2_SHAPES)} tensors)", "fp32",
                    GPT2_NUMEL, {"gpt2": True}))
    w.append(_adamw("adamw_fp32_4096x1024", "4096x1024", "fp32", 4096 * 1024,
                    {"shape": (4096, 1024)}))
    w.append(_adamw("adamw_bf16_gpt2", f"GPT-2 124M ({len(GPT2_SHAPES)} tensors)", "bf16",
                    GPT2_NUMEL, {"gpt2": True}))
    w.append(_adamw("adamw_fp16_4096x1024", "4096x1024", "fp16", 4096 * 1024,
                    {"shape": (4096, 1024)}))
    # Normalizations.
    for norm in ("rmsnorm", "layernorm"):
        w.append(_norm(norm, 16384, 4096, bwd=False))
        w.append(_norm(norm, 16384, 4096, bwd=True))
    for norm in ("rmsnorm", "layernorm"):
        w.append(_norm(norm, 16384, 768, bwd=False))
    # The residual add fused with the RMSNorm after it (no ANCHORS target).
    w.append(Workload(
        "add_rmsnorm_fwd_bf16_16384x4096", "16384x4096", "bf16", 8 * 16384 * 4096,
        "8*R*H: read x, residual, write h, y (bf16; weight and per-row stats excluded)",
        ("eager", "compile"), "add_rmsnorm", {"rows": 16384, "hidden": 4096, "bwd": False}))
    w.append(Workload(
        "add_rmsnorm_fwdbwd_bf16_16384x4096", "16384x4096", "bf16", 16 * 16384 * 4096,
        "16*R*H: fwd read x, residual, write h, y; bwd read h, dy, dh_residual, write dh "
        "(bf16; weight, dw and per-row stats excluded)",
        ("eager", "compile"), "add_rmsnorm", {"rows": 16384, "hidden": 4096, "bwd": True}))
    # SwiGLU: out = silu(gate) * up.
    n = 8192 * 11008
    w.append(Workload(
        "swiglu_fwd_bf16_8192x11008", "gate,up 8192x11008", "bf16", 6 * n,
        "6*N: read gate, up, write out (bf16)", ("eager", "compile"), "swiglu",
        {"rows": 8192, "cols": 11008, "bwd": False}))
    w.append(Workload(
        "swiglu_fwdbwd_bf16_8192x11008", "gate,up 8192x11008", "bf16", 16 * n,
        "16*N: fwd read gate, up, write out; bwd read gate, up, dout, write dgate, dup",
        ("eager", "compile"), "swiglu", {"rows": 8192, "cols": 11008, "bwd": True}))
    # RoPE on q [B, S, H, D] (rotate-half form; cos/sin tables excluded).
    b, s, h, d = 8, 2048, 32, 128
    n = b * s * h * d
    for bwd in (False, True):
        stage = "fwdbwd" if bwd else "fwd"
        w.append(Workload(
            f"rope_{stage}_bf16_{b}x{s}x{h}x{d}", f"q B={b} S={s} H={h} D={d}", "bf16",
            (8 if bwd else 4) * n,
            "8*N: fwd read q, write out; bwd read dout, write dq (tables excluded)" if bwd
            else "4*N: read q, write out (bf16; cos/sin tables excluded)",
            ("eager", "compile"), "rope", {"b": b, "s": s, "h": h, "d": d, "bwd": bwd}))
    w.append(Workload(
        "softmax_fwd_bf16_16384x4096", "16384x4096", "bf16", 4 * 16384 * 4096,
        "4*R*C: read x, write y (bf16)", ("eager", "compile"), "softmax",
        {"rows": 16384, "cols": 4096}))
    # Cross-entropy, mean reduction, fwd+bwd (grad of the loss w.r.t. the logits).
    # 50304: GPT-2's vocabulary padded to a multiple of 64 (nanoGPT), 16-byte aligned rows.
    for rows, vocab, ignore in ((8192, 50257, True), (4096, 128256, False), (8192, 50304, True)):
        w.append(Workload(
            f"cross_entropy_fwdbwd_bf16_{rows}x{vocab}", f"logits {rows}x{vocab}"
            + (", 1 in 7 ignored" if ignore else ""), "bf16", 4 * rows * vocab,
            "4*N*V: read logits once, write dlogits once (bf16; targets excluded)",
            ("eager", "compile"), "cross_entropy",
            {"rows": rows, "vocab": vocab, "ignore_every": 7 if ignore else 0}))
    # Gradient norm and clipping over the GPT-2 fp32 gradients.
    w.append(Workload(
        "clip_grad_norm_fp32_gpt2", f"GPT-2 grads ({len(GPT2_SHAPES)} tensors)", "fp32",
        12 * GPT2_NUMEL, "12*N: read g for the norm, then read g and write g*scale (fp32)",
        ("foreach",), "clip_grad_norm", {}))
    w.append(Workload(
        "grad_norm_fp32_gpt2", f"GPT-2 grads ({len(GPT2_SHAPES)} tensors)", "fp32",
        4 * GPT2_NUMEL, "4*N: read g once (fp32)",
        ("per_tensor_stack", "foreach"), "grad_norm", {}))
    # Tensor-core work.
    # (16384, 50304, 768): a GPT-2-sized LM head (16384 tokens, the padded vocabulary).
    for m, n_, k in ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                     (16384, 4096, 4096), (4096, 11008, 4096), (16384, 50304, 768)):
        w.append(_gemm(m, n_, k))
    for size in (2048, 4096, 8192):
        for bwd in (False, True):
            w.append(_linear(size, size, size, bwd))
    # Muon: Newton-Schulz on square matrices, a GPT-2 MLP's shape, and 12 matrices of
    # 768x768 in one batched call; then a whole Muon step over GPT-2's hidden matrices.
    for rows, cols in ((1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (768, 3072)):
        w.append(_newton_schulz(rows, cols))
    w.append(_newton_schulz(768, 768, batch=12))
    w.append(_muon_step())
    # Fused causal attention (ANCHORS' shapes, B x H x S x D): forward, backward.
    for b, h, s, d in ((4, 32, 4096, 128), (8, 16, 2048, 128), (16, 12, 1024, 64),
                       (1, 32, 16384, 128)):
        for bwd in (False, True):
            w.append(_attention(b, h, s, d, bwd))
    return w


WORKLOADS: list[Workload] = _workloads()

# Floors as ANCHORS.md states them (µs at 3.0 TB/s), for --self-check.
ANCHOR_FLOORS_US = {
    "adamw_fp32_gpt2": 1160, "adamw_fp32_4096x1024": 39, "adamw_bf16_gpt2": 580,
    "rmsnorm_fwd_bf16_16384x4096": 89, "rmsnorm_fwdbwd_bf16_16384x4096": 224,
    "layernorm_fwd_bf16_16384x4096": 89, "layernorm_fwdbwd_bf16_16384x4096": 224,
    "rmsnorm_fwd_bf16_16384x768": 17, "layernorm_fwd_bf16_16384x768": 17,
    "swiglu_fwd_bf16_8192x11008": 180, "swiglu_fwdbwd_bf16_8192x11008": 481,
    "rope_fwd_bf16_8x2048x32x128": 89.5, "rope_fwdbwd_bf16_8x2048x32x128": 179,
    "softmax_fwd_bf16_16384x4096": 89.5, "cross_entropy_fwdbwd_bf16_8192x50257": 549,
    "cross_entropy_fwdbwd_bf16_4096x128256": 700, "clip_grad_norm_fp32_gpt2": 498,
    "grad_norm_fp32_gpt2": 166,
}

# Tensor-core rows where ANCHORS quotes a peer's median with its TFLOP/s, for
# --self-check of the flops formulas: name -> (median µs, TFLOP/s as ANCHORS states them).
# (ANCHORS gives attention no byte floor: its targets are relative to cuDNN.)
ANCHOR_TFLOPS = {
    "gemm_bf16_4096x4096x4096": (177.6, 774), "gemm_bf16_8192x8192x8192": (1582, 695),
    "attention_fwd_bf16_causal_4x32x4096x128": (1015, 542),
}

# Bytes formula per workload name (the README mirrors it).
BYTES_FORMULAS = {w.name: w.formula for w in WORKLOADS}


def markdown_table() -> str:
    lines = ["| workload | shape | dtype | peers | floor bytes | formula |",
             "|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        lines.append(f"| `{w.name}` | {w.shape} | {w.dtype} | {', '.join(w.peers)} | "
                     f"{w.bytes} | {w.formula} |")
    return "\n".join(lines)


def self_check(readme_path: str | None) -> int:
    """Pure-python checks; returns the number of failures (printed)."""
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    check(len(GPT2_SHAPES) == 148, f"GPT-2 parameter tensors: {len(GPT2_SHAPES)} (want 148)")
    check(abs(GPT2_NUMEL - 124.4e6) < 0.05e6,
          f"GPT-2 parameters: {GPT2_NUMEL:,} (want ~124.4M, lm_head tied)")
    hidden = sorted(s for _, s in GPT2_HIDDEN)
    conv1d = sorted((s[1], s[0]) for n, s in GPT2_SHAPES
                    if len(s) == 2 and n not in ("wte", "wpe"))
    check(len(GPT2_HIDDEN) == 48 and hidden == conv1d,
          f"GPT-2 hidden matrices: {len(GPT2_HIDDEN)} (want 48), the [in, out] weights "
          "of the GPT-2 list transposed")
    check(GPT2_HIDDEN_NUMEL == 84_934_656,
          f"GPT-2 hidden matrix elements: {GPT2_HIDDEN_NUMEL:,} (want 84,934,656)")
    names = [w.name for w in WORKLOADS]
    check(len(names) == len(set(names)), "workload names are unique")
    check(all(n.replace("_", "").isalnum() for n in names), "names are [A-Za-z0-9_]")
    for name, floor_us in ANCHOR_FLOORS_US.items():
        w = next((w for w in WORKLOADS if w.name == name), None)
        if w is None:
            check(False, f"{name}: ANCHORS workload missing")
            continue
        ours = w.bytes / ANCHOR_COPY_BYTES_PER_S * 1e6
        check(abs(ours - floor_us) <= 0.02 * floor_us,
              f"{name}: floor {ours:.1f} us vs ANCHORS {floor_us} us")
    for name, (median_us, tflops) in ANCHOR_TFLOPS.items():
        w = next((w for w in WORKLOADS if w.name == name), None)
        if w is None:
            check(False, f"{name}: ANCHORS workload missing")
            continue
        ours = w.flops / (median_us * 1e-6) / 1e12
        check(abs(ours - tflops) <= 0.02 * tflops,
              f"{name}: {w.flops:,} flops in {median_us} us = {ours:.1f} TFLOP/s vs "
              f"ANCHORS {tflops}")
    if readme_path:
        try:
            with open(readme_path, encoding="utf-8") as f:
                readme = f.read()
        except OSError as e:
            check(False, f"read {readme_path}: {e}")
            readme = None
        if readme is not None:
            rows = {}
            for line in readme.splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) >= 5 and cells[0].startswith("`"):
                    rows[cells[0].strip("`")] = cells
            for w in WORKLOADS:
                cells = rows.get(w.name)
                ok = cells is not None and cells[4] == str(w.bytes) and \
                    cells[5] == w.formula
                check(ok, f"README row for {w.name} matches (bytes {w.bytes})")
            extra = set(rows) - set(names)
            check(not extra, f"README has no unknown workloads {sorted(extra)}")
    print(f"{len(failures)} failure(s)")
    return len(failures)


# ----------------------------------------------------------------------------------------
# GPU part: builders return a zero-argument function that runs the workload once.
# ----------------------------------------------------------------------------------------

TORCH_DTYPES = {}  # filled in main() once torch is imported


def _compile(torch, f):
    """A fresh torch.compile (mode default, static shapes) of f."""
    torch._dynamo.reset()
    return torch.compile(f, dynamic=False)


def _fwd_or_fwdbwd(torch, f, args, grad_args, bwd, peer, dy_like=None):
    """Forward only, or one forward + backward through autograd with a random upstream
    gradient (torch.autograd.grad, so no .grad accumulation adds traffic)."""
    if peer == "compile":
        f = _compile(torch, f)
    elif peer != "eager":
        raise ValueError(f"unknown peer {peer}")
    if not bwd:
        return lambda: f(*args)
    out = f(*args)
    dy = torch.randn_like(out) if out.dim() > 0 else torch.rand_like(out) + 0.5
    del out
    return lambda: torch.autograd.grad(f(*args), grad_args, dy)


def build_copy(torch, w, peer):
    n = w.args["bytes"] // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def build_adamw(torch, w, peer):
    dt = TORCH_DTYPES[w.dtype]
    shapes = [s for _, s in GPT2_SHAPES] if w.args.get("gpt2") else [w.args["shape"]]
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dt) * 0.02)
        p.grad = torch.randn(s, device="cuda", dtype=dt) * 1e-2
        params.append(p)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1, fused=(peer == "fused") or None,
                            foreach=(peer == "foreach") or None)
    return opt.step


def build_norm(torch, w, peer):
    F = torch.nn.functional
    rows, hidden, bwd = w.args["rows"], w.args["hidden"], w.args["bwd"]
    bf16 = torch.bfloat16
    x = torch.randn(rows, hidden, device="cuda", dtype=bf16).requires_grad_(bwd)
    weight = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(bf16).requires_grad_(bwd)
    if w.args["norm"] == "rmsnorm":
        if hasattr(F, "rms_norm"):
            def f(x, weight):
                return F.rms_norm(x, (hidden,), weight, 1e-6)
        else:  # torch < 2.4
            def f(x, weight):
                xf = x.float()
                r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
                return (xf * r).to(x.dtype) * weight
        return _fwd_or_fwdbwd(torch, f, (x, weight), (x, weight), bwd, peer)
    bias = (0.1 * torch.randn(hidden, device="cuda")).to(bf16).requires_grad_(bwd)

    def g(x, weight, bias):
        return F.layer_norm(x, (hidden,), weight, bias, 1e-5)

    return _fwd_or_fwdbwd(torch, g, (x, weight, bias), (x, weight, bias), bwd, peer)


def build_add_rmsnorm(torch, w, peer):
    F = torch.nn.functional
    rows, hidden, bwd = w.args["rows"], w.args["hidden"], w.args["bwd"]
    bf16 = torch.bfloat16
    x = torch.randn(rows, hidden, device="cuda", dtype=bf16).requires_grad_(bwd)
    res = torch.randn(rows, hidden, device="cuda", dtype=bf16).requires_grad_(bwd)
    weight = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(bf16).requires_grad_(bwd)

    def f(x, res, weight):  # h is the new residual stream, y the normalized input
        h = x + res
        if hasattr(F, "rms_norm"):
            return h, F.rms_norm(h, (hidden,), weight, 1e-6)
        hf = h.float()
        return h, (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16) * weight

    if not bwd:
        return _fwd_or_fwdbwd(torch, f, (x, res, weight), (), False, peer)
    if peer == "compile":
        f = _compile(torch, f)
    # Upstream gradients of both outputs: dy for y, the residual stream's for h.
    dh, dy = torch.randn_like(x), torch.randn_like(x)
    return lambda: torch.autograd.grad(f(x, res, weight), (x, res, weight), (dh, dy))


def build_swiglu(torch, w, peer):
    F = torch.nn.functional
    shape, bwd = (w.args["rows"], w.args["cols"]), w.args["bwd"]
    gate = torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_(bwd)
    up = torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_(bwd)

    def f(gate, up):
        return F.silu(gate) * up

    return _fwd_or_fwdbwd(torch, f, (gate, up), (gate, up), bwd, peer)


def build_rope(torch, w, peer):
    b, s, h, d, bwd = (w.args[k] for k in ("b", "s", "h", "d", "bwd"))
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).requires_grad_(bwd)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(s, device="cuda", dtype=torch.float32), inv_freq)
    ang = torch.cat((ang, ang), dim=-1)  # [S, D], Llama/HF layout
    cos = ang.cos().to(torch.bfloat16)[:, None, :]  # [S, 1, D] broadcast over B and H
    sin = ang.sin().to(torch.bfloat16)[:, None, :]

    def f(q, cos, sin):  # HF Llama apply_rotary_pos_emb: q*cos + rotate_half(q)*sin
        half = q.shape[-1] // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rot * sin

    return _fwd_or_fwdbwd(torch, f, (q, cos, sin), (q,), bwd, peer)


def build_softmax(torch, w, peer):
    x = torch.randn(w.args["rows"], w.args["cols"], device="cuda", dtype=torch.bfloat16)
    return _fwd_or_fwdbwd(torch, lambda x: torch.softmax(x, dim=-1), (x,), (x,), False, peer)


def build_cross_entropy(torch, w, peer):
    F = torch.nn.functional
    rows, vocab, every = w.args["rows"], w.args["vocab"], w.args["ignore_every"]
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16,
                         requires_grad=True)
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    if every:
        targets[::every] = -100  # rows i with i % 7 == 0 are ignored

    def f(logits, targets):
        return F.cross_entropy(logits, targets, ignore_index=-100, reduction="mean")

    return _fwd_or_fwdbwd(torch, f, (logits, targets), (logits,), True, peer)


def _gpt2_grads(torch):
    return [torch.randn(s, device="cuda", dtype=torch.float32) * 1e-2 for _, s in GPT2_SHAPES]


def build_clip_grad_norm(torch, w, peer):
    params = []
    for g in _gpt2_grads(torch):
        p = torch.nn.Parameter(torch.randn(g.shape, device="cuda"))
        p.grad = g
        params.append(p)
    # max_norm 1.0 < the grads' norm (~11): every call scales (foreach does either way).
    return lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)


def build_grad_norm(torch, w, peer):
    grads = _gpt2_grads(torch)
    norm = torch.linalg.vector_norm
    if peer == "per_tensor_stack":
        return lambda: norm(torch.stack([norm(g) for g in grads]))
    if hasattr(torch.nn.utils, "get_total_norm"):
        return lambda: torch.nn.utils.get_total_norm(grads, foreach=True)
    return lambda: norm(torch.stack(torch._foreach_norm(grads)))


def build_gemm(torch, w, peer):
    m, n, k = w.args["m"], w.args["n"], w.args["k"]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.matmul(a, b)


def build_linear(torch, w, peer):
    """F.linear with autograd, fp16, bias included: the forward (inputs requiring grad,
    as in training), or the backward alone: one forward builds the graph, the timed call
    is torch.autograd.grad of it (dx, dw, db) with retain_graph, so no forward is timed."""
    if peer != "eager":
        raise ValueError(f"unknown peer {peer}")
    F = torch.nn.functional
    m, n, k = w.args["m"], w.args["n"], w.args["k"]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, requires_grad=True)
    wt = torch.randn(n, k, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.float16, requires_grad=True)
    if not w.args["bwd"]:
        return lambda: F.linear(x, wt, b)
    y = F.linear(x, wt, b)
    dy = torch.randn_like(y)
    return lambda: torch.autograd.grad(y, (x, wt, b), dy, retain_graph=True)


def newton_schulz5(torch, G, steps=5, coeffs=(3.4445, -4.7750, 2.0315)):
    """Muon's quintic Newton-Schulz orthogonalization, Keller Jordan's reference form
    (`zeropower_via_newtonschulz5`), on [m, n] or batched [..., m, n] input (each matrix
    on its own: .mT and the norm over the last two dims).

    torch.optim.Muon's own `_zeropower_via_newtonschulz` (2-D only) differs in form, not
    in work: it normalizes in place with `X.div_(X.norm().clamp(min=eps))`, eps = 1e-7,
    where this adds eps to the norm, and newer torch can fold the scale-and-add into
    `torch.addmm(C, A, B, beta=.., alpha=..)` (`use_addmm`). Both do the same three
    products per step, so the same FLOPs: steps*(4*m*m*n + 2*m^3)."""
    a, b, c = coeffs
    X = G.bfloat16()
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X


def build_newton_schulz(torch, w, peer):
    rows, cols, batch = w.args["rows"], w.args["cols"], w.args["batch"]
    shape = (batch, rows, cols) if batch > 1 else (rows, cols)
    G = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    steps = w.args["steps"]

    def f(G):
        return newton_schulz5(torch, G, steps)

    if peer == "compile":
        f = _compile(torch, f)
    elif peer != "eager":
        raise ValueError(f"unknown peer {peer}")
    return lambda: f(G)


def build_muon(torch, w, peer):
    """torch.optim.Muon (torch >= 2.9) over GPT-2's 48 hidden matrices in nn.Linear's
    [out, in] layout: fp32 params N(0, 0.02^2) and grads N(0, 0.01^2), set once; each
    timed call is one opt.step() (momentum, Newton-Schulz in bf16, decay, update; the
    warm-up's first step allocates the momentum buffers)."""
    if peer != "torch_muon":
        raise ValueError(f"unknown peer {peer}")
    Muon = getattr(torch.optim, "Muon", None)
    if Muon is None:
        raise RuntimeError(f"torch.optim.Muon is missing in torch {torch.__version__} "
                           "(it needs torch >= 2.9)")
    params = []
    for _, s in GPT2_HIDDEN:
        p = torch.nn.Parameter(torch.randn(s, device="cuda", dtype=torch.float32) * 0.02)
        p.grad = torch.randn(s, device="cuda", dtype=torch.float32) * 1e-2
        params.append(p)
    opt = Muon(params, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True,
               ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-07,
               ns_steps=w.args["steps"], adjust_lr_fn=None)
    return opt.step


def build_attention(torch, w, peer):
    """F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1/sqrt(D)) on
    contiguous bf16 [B, H, S, D] tensors, one backend forced by sdpa_kernel (`cudnn`:
    SDPBackend.CUDNN_ATTENTION, `flash`: SDPBackend.FLASH_ATTENTION; an unavailable
    backend raises, and run_one records the error). q, k, v require grad in both rows.
    Forward: each timed call is one SDPA call. Backward: one forward outside the timed
    region builds the graph (the backend's own backward node, chosen there); each timed
    call is torch.autograd.grad(o, (q, k, v), dout, retain_graph=True) alone."""
    F = torch.nn.functional
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        raise RuntimeError(f"torch.nn.attention.sdpa_kernel is missing in torch "
                           f"{torch.__version__} (it needs torch >= 2.3)") from e
    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}
    if peer not in names:
        raise ValueError(f"unknown peer {peer}")
    backend = getattr(SDPBackend, names[peer], None)
    if backend is None:
        raise RuntimeError(f"SDPBackend.{names[peer]} is missing in torch "
                           f"{torch.__version__}")
    b, h, s, d, scale = (w.args[k] for k in ("b", "h", "s", "d", "scale"))
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    def f():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    if not w.args["bwd"]:
        return f
    o = f()
    dout = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)


BUILDERS = {
    "copy": build_copy, "adamw": build_adamw, "norm": build_norm, "swiglu": build_swiglu,
    "add_rmsnorm": build_add_rmsnorm,
    "rope": build_rope, "softmax": build_softmax, "cross_entropy": build_cross_entropy,
    "clip_grad_norm": build_clip_grad_norm, "grad_norm": build_grad_norm,
    "gemm": build_gemm, "newton_schulz": build_newton_schulz, "linear": build_linear,
    "muon": build_muon, "attention": build_attention,
}


class Timer:
    """Median (and 20th / 80th percentiles) of one call, in µs, L2 flushed before each
    run: triton.testing.do_bench when importable, else an equivalent CUDA-event loop."""

    def __init__(self, torch, min_runs: int, min_rep_ms: float, warmup_ms: float):
        self.torch, self.min_runs = torch, min_runs
        self.min_rep_ms, self.warmup_ms = min_rep_ms, warmup_ms
        try:
            from triton.testing import do_bench
            self.do_bench, self.name = do_bench, "triton.testing.do_bench"
        except Exception:  # triton absent or broken: own loop
            self.do_bench, self.name = None, "cuda-events"
        self.flush_buf = None

    def _estimate_ms(self, fn) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(3):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 3

    def time_us(self, fn) -> tuple[float, float, float, int]:
        est = max(self._estimate_ms(fn), 1e-3)
        # do_bench runs int(rep / estimate) times, its estimate including a 256 MB L2
        # flush (~0.1 ms): ask for enough rep time that this is >= min_runs.
        runs = max(self.min_runs, int(self.min_rep_ms / (est + 0.15)))
        rep_ms = runs * (est + 0.15) * 1.2
        if self.do_bench is not None:
            q = self.do_bench(fn, warmup=self.warmup_ms, rep=rep_ms,
                              quantiles=[0.5, 0.2, 0.8])
            return q[0] * 1e3, q[1] * 1e3, q[2] * 1e3, runs
        return self._own_loop(fn, est, runs)

    def host_us(self, fn, calls: int = 10) -> float:
        """Mean host time to issue one call (no sync between calls). When it is close to
        the median the peer is launch-bound (host-bound): its timing then follows the
        CPU and varies more from run to run than the GPU-bound ones."""
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6

    def _own_loop(self, fn, est_ms, runs):
        torch = self.torch
        if self.flush_buf is None:
            self.flush_buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        for _ in range(max(1, int(self.warmup_ms / est_ms))):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for s, e in zip(starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        t = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

        def q(p):
            return t[min(len(t) - 1, int(p * len(t)))]

        return q(0.5), q(0.2), q(0.8), runs


def _short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def run_one(torch, timer, w: Workload, peer: str, meta: dict) -> dict:
    rec = {"workload": w.name, "shape": w.shape, "dtype": w.dtype, "peer": peer,
           "median_us": None, "gbps": None, "bytes": w.bytes, "p20_us": None,
           "p80_us": None, "runs_at_least": None, "host_us": None,
           "flops": w.flops or None, "tflops": None,
           "compile_s": None, "error": None, **meta}
    fn = None
    try:
        t0 = time.perf_counter()
        fn = BUILDERS[w.kind](torch, w, peer)
        for _ in range(3):  # warm-up: compiles (torch.compile), allocates optimizer state
            fn()
        torch.cuda.synchronize()
        if peer == "compile":
            rec["compile_s"] = round(time.perf_counter() - t0, 2)
        med, p20, p80, runs = timer.time_us(fn)
        rec.update(median_us=round(med, 3), p20_us=round(p20, 3), p80_us=round(p80, 3),
                   runs_at_least=runs, gbps=round(w.bytes / (med * 1e-6) / 1e9, 1),
                   host_us=round(timer.host_us(fn), 1))
        if w.flops:
            rec["tflops"] = round(w.flops / (med * 1e-6) / 1e12, 1)
    except Exception as e:  # a peer failing (compile error, OOM) must not stop the run
        rec["error"] = _short_error(e)
    finally:
        del fn
        if peer == "compile":
            try:
                torch._dynamo.reset()
            except Exception:
                pass
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rec


def print_row(rec: dict, copy_gbps: float | None):
    if rec["error"]:
        print(f"{rec['workload']:<40} {rec['peer']:<17} ERROR {rec['error']}", flush=True)
        return
    frac = f"{rec['gbps'] / copy_gbps:6.1%}" if copy_gbps else "     -"
    extra = f" {rec['tflops']:7.1f} TF" if rec["tflops"] else ""
    host = "  host-bound" if rec["host_us"] >= 0.8 * rec["median_us"] else ""
    comp = f"  (compile {rec['compile_s']} s)" if rec["compile_s"] is not None else ""
    print(f"{rec['workload']:<40} {rec['peer']:<17} {rec['median_us']:11.1f} "
          f"[{rec['p20_us']:9.1f} ..{rec['p80_us']:9.1f}] {rec['gbps']:8.1f} {frac}"
          f"{extra}{host}{comp}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    ap.add_argument("--filter", metavar="SUBSTR", action="append", default=[],
                    help="run only 'workload:peer' strings containing SUBSTR "
                         "(repeatable or comma-separated; any match). copy_d2d_1GiB "
                         "always runs.")
    ap.add_argument("--quick", action="store_true",
                    help="fewer reps: median of >= 20 runs and ~20 ms per peer")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    ap.add_argument("--list", action="store_true", help="list workloads and exit")
    ap.add_argument("--markdown", action="store_true",
                    help="print the README workload table and exit")
    ap.add_argument("--self-check", action="store_true",
                    help="check GPT-2 shapes, floors and quoted TF/s vs ANCHORS and "
                         "bench/README.md; "
                         "no torch needed")
    ap.add_argument("--readme", default=None,
                    help="README for --self-check (default: README.md beside this file)")
    a = ap.parse_args(argv)

    if a.self_check:
        import os
        readme = a.readme or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "README.md")
        return 1 if self_check(readme) else 0
    if a.markdown:
        print(markdown_table())
        return 0

    # --filter a,b is --filter a --filter b (as kgen bench reads its --filter).
    filters = [p for f in a.filter for p in f.split(",") if p.strip()]

    def selected(w, peer):
        if a.no_compile and peer == "compile":
            return False
        key = f"{w.name}:{peer}"
        return w.kind == "copy" or not filters or any(f.strip() in key for f in filters)

    plan = [(w, p) for w in WORKLOADS for p in w.peers if selected(w, p)]
    if a.list:
        for w, p in plan:
            print(f"{w.name:<40} {p:<17} {w.dtype:<5} {w.bytes:>14}  {w.shape}")
        return 0

    try:
        import torch
    except ImportError:
        print("torch_peers.py: PyTorch is not installed; it needs torch with CUDA "
              "(--self-check/--list/--markdown run without it)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_peers.py: CUDA is unavailable (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU", file=sys.stderr)
        return 2
    TORCH_DTYPES.update(fp32=torch.float32, bf16=torch.bfloat16, fp16=torch.float16)
    torch.manual_seed(0)

    if a.quick:
        timer = Timer(torch, min_runs=20, min_rep_ms=20, warmup_ms=10)
    else:
        timer = Timer(torch, min_runs=50, min_rep_ms=200, warmup_ms=25)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton_version, "timer": timer.name}
    print(f"# {meta['device']}, torch {meta['torch']}, triton {triton_version}, "
          f"timer {timer.name}, {'quick' if a.quick else 'full'}; "
          f"GPT-2 list: {len(GPT2_SHAPES)} tensors, {GPT2_NUMEL:,} params", flush=True)
    print(f"{'workload':<40} {'peer':<17} {'median_us':>11} [{'p20':>9} ..{'p80':>9}] "
          f"{'GB/s':>8} {'of D2D':>6}", flush=True)

    records, copy_gbps = [], None
    for w, peer in plan:
        rec = run_one(torch, timer, w, peer, meta)
        if w.kind == "copy" and rec["gbps"]:
            copy_gbps = rec["gbps"]
        print_row(rec, copy_gbps)
        records.append(rec)
        if a.json:  # rewrite after each peer so a killed run keeps what it measured
            with open(a.json, "w", encoding="utf-8") as f:
                json.dump(records, f, indent=1)
    failed = sum(1 for r in records if r["error"])
    print(f"# {len(records) - failed} measured, {failed} failed"
          + (f"; wrote {a.json}" if a.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
