#!/usr/bin/env python3
"""gpt_torch.py: the PyTorch twin of kgen's main job, the byte-level GPT of src/gpt/.

What it does, from the files `kgen train --dump-batches DIR` writes (on the same GPU):
  (a) builds the same model with the same initial weights (DIR/*.npy), runs the same
      first steps on the same batches (DIR/batches_x.npy, batches_y.npy) with the same
      optimizers and learning rates, and compares each step's loss with kgen's
      (DIR/kgen.json) within bf16 tolerance;
  (b) times whole training steps of the same model and batch size in PyTorch eager and
      with torch.compile, and prints tokens/s beside kgen's (measured by the Rust run).

    cargo build --release
    ./target/release/kgen train --dump-batches /tmp/gpt     # on the GPU: ~1 minute
    python3 bench/gpt_torch.py /tmp/gpt                     # --no-compile, --steps N

The model (src/gpt/mod.rs): bytes -> embedding (tied with the head) -> per layer
`x += Wo·attn(rope(q), rope(k), v)` after an RMSNorm, `x += Wdown·(silu(gate)·up)` after
an RMSNorm -> RMSNorm -> logits -> cross-entropy. Precision as kgen's: f32 master
parameters, cast to bf16 for every forward; bf16 activations; RMSNorm, RoPE, SwiGLU and
the cross-entropy computed in f32 from bf16 inputs and rounded to bf16 once; GEMMs and
attention in bf16 with f32 accumulation (F.linear, F.scaled_dot_product_attention).
Optimizers as kgen's MuonWithAdamW: torch.optim.Muon (lr muon_lr, momentum 0.95,
Nesterov, 5 quintic Newton-Schulz steps, adjust_lr_fn=None) on each layer's q, k, v, o,
gate, up, down matrices separately, torch.optim.AdamW (fused; betas 0.9, 0.95; no weight
decay) on the embedding and the norm weights, clip_grad_norm_(1.0) over AdamW's
parameters before the steps; every learning rate times kgen's per-step multiplier.

Assumes: torch >= 2.9 (torch.optim.Muon) with CUDA, and numpy; nothing else. Exits with
status 2 without CUDA (`--cpu` runs (a) alone on the CPU, e.g. against an interpreter
run: `kgen train --no-gpu --dump-batches DIR`), 1 when a loss differs by more than the
tolerance.
Guarantees: the throughput is the median of timed rounds of whole steps (forward,
backward, clipping, both optimizer steps), batches already on the GPU, after warm-up
steps (which include torch.compile's compilation); the optimizer steps stay eager in
both modes (torch.compile wraps the model's forward + loss, as a user would).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np


def load_run(d: str) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    with open(os.path.join(d, "kgen.json")) as f:
        cfg = json.load(f)
    names = ["emb"] + [f"norm{k}" for k in range(2 * cfg["layers"] + 1)]
    for l in range(cfg["layers"]):
        names += [f"l{l}.qkv", f"l{l}.o", f"l{l}.fc", f"l{l}.down"]
    weights = {n: np.load(os.path.join(d, n + ".npy")) for n in names}
    xs = np.load(os.path.join(d, "batches_x.npy"))
    ys = np.load(os.path.join(d, "batches_y.npy"))
    return cfg, weights, xs, ys


def build(torch, cfg: dict, weights: dict):
    """The model as a torch.nn.Module whose forward(x, y) returns the mean loss."""
    nn = torch.nn
    F = torch.nn.functional
    bf = torch.bfloat16
    d, f, h, hd = cfg["d_model"], cfg["hidden"], cfg["heads"], cfg["head_dim"]
    layers, seq, eps = cfg["layers"], cfg["seq"], float(cfg["eps"])

    # RoPE tables as kgen builds them: angles in float64, cos/sin rounded to f32 once.
    pos = np.arange(seq, dtype=np.float64)[:, None]
    inv = cfg["rope_base"] ** (-(2.0 * np.arange(hd // 2, dtype=np.float64)) / hd)
    cos = torch.tensor(np.cos(pos * inv), dtype=torch.float32)
    sin = torch.tensor(np.sin(pos * inv), dtype=torch.float32)

    def param(a: np.ndarray) -> nn.Parameter:
        return nn.Parameter(torch.tensor(np.ascontiguousarray(a), dtype=torch.float32))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = param(weights["emb"])
            self.norms = nn.ParameterList(
                [param(weights[f"norm{k}"]) for k in range(2 * layers + 1)])
            self.q, self.k, self.v, self.o = (nn.ParameterList() for _ in range(4))
            self.gate, self.up, self.down = (nn.ParameterList() for _ in range(3))
            for l in range(layers):
                qkv, fc = weights[f"l{l}.qkv"], weights[f"l{l}.fc"]
                self.q.append(param(qkv[:d]))
                self.k.append(param(qkv[d:2 * d]))
                self.v.append(param(qkv[2 * d:]))
                self.o.append(param(weights[f"l{l}.o"]))
                self.gate.append(param(fc[:f]))
                self.up.append(param(fc[f:]))
                self.down.append(param(weights[f"l{l}.down"]))
            self.register_buffer("cos", cos[:, None, :], persistent=False)  # [S, 1, hd/2]
            self.register_buffer("sin", sin[:, None, :], persistent=False)

        def muon_params(self) -> list:
            out = []
            for l in range(layers):
                out += [self.q[l], self.k[l], self.v[l], self.o[l],
                        self.gate[l], self.up[l], self.down[l]]
            return out

        def adamw_groups(self) -> list:
            return [[self.emb], list(self.norms)]

        @staticmethod
        def rmsnorm(x, w):
            xf = x.float()
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return (xf * r * w.to(bf).float()).to(bf)

        def rope(self, x):  # x [B, S, H, hd] bf16, rotate-half, f32 math
            s = x.shape[1]
            x1, x2 = x.float().chunk(2, dim=-1)
            c, sn = self.cos[:s], self.sin[:s]
            return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], dim=-1).to(bf)

        def forward(self, x, y):
            b, s = x.shape
            emb = self.emb.to(bf)
            st = F.embedding(x, emb)  # [B, S, d]: the one-hot GEMM picks the same entries
            hcur = self.rmsnorm(st, self.norms[0])
            for l in range(layers):
                wqkv = torch.cat([self.q[l], self.k[l], self.v[l]], dim=0).to(bf)
                qkv = F.linear(hcur, wqkv).view(b, s, 3, h, hd)
                q, k, v = qkv.unbind(2)
                q, k = self.rope(q), self.rope(k)
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                o = o.transpose(1, 2).reshape(b, s, d)
                st = st + F.linear(o, self.o[l].to(bf))
                hcur = self.rmsnorm(st, self.norms[2 * l + 1])
                wfc = torch.cat([self.gate[l], self.up[l]], dim=0).to(bf)
                g, u = F.linear(hcur, wfc).split(f, dim=-1)
                a = (F.silu(g.float()) * u.float()).to(bf)
                st = st + F.linear(a, self.down[l].to(bf))
                hcur = self.rmsnorm(st, self.norms[2 * l + 2])
            logits = F.linear(hcur, emb)
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))

    return GPT()


class Trainer:
    """The model, its two optimizers and kgen's step: clip AdamW's gradients, Muon step,
    AdamW step; learning rates set per step."""

    def __init__(self, torch, cfg: dict, weights: dict, compile_model: bool, device: str):
        self.torch = torch
        self.cfg = cfg
        self.model = build(torch, cfg, weights).to(device)
        Muon = getattr(torch.optim, "Muon", None)
        if Muon is None:
            raise SystemExit(f"torch {torch.__version__} has no torch.optim.Muon (need >= 2.9)")
        self.muon = Muon(self.model.muon_params(), lr=cfg["muon_lr"],
                         weight_decay=cfg["muon_weight_decay"], momentum=cfg["muon_momentum"],
                         nesterov=cfg["muon_nesterov"], ns_steps=cfg["muon_ns_steps"],
                         adjust_lr_fn=None)
        b1, b2 = cfg["adamw_betas"]
        groups = [{"params": g, "lr": cfg["lr"]} for g in self.model.adamw_groups()]
        self.adamw = torch.optim.AdamW(groups, lr=cfg["lr"], betas=(b1, b2),
                                       eps=cfg["adamw_eps"],
                                       weight_decay=cfg["adamw_weight_decay"],
                                       fused=device == "cuda")
        self.adamw_params = [p for g in self.model.adamw_groups() for p in g]
        self.fwd = torch.compile(self.model) if compile_model else self.model

    def step(self, x, y, lr_scale: float):
        for g in self.muon.param_groups:
            g["lr"] = self.cfg["muon_lr"] * lr_scale
        for g in self.adamw.param_groups:
            g["lr"] = self.cfg["lr"] * lr_scale
        loss = self.fwd(x, y)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.adamw_params, self.cfg["clip_grad_norm"])
        self.muon.step()
        self.adamw.step()
        self.muon.zero_grad(set_to_none=True)
        self.adamw.zero_grad(set_to_none=True)
        return loss


def check_losses(torch, cfg, weights, xs, ys, atol: float, rtol: float, device: str) -> bool:
    t = Trainer(torch, cfg, weights, compile_model=False, device=device)
    kgen = cfg["losses"]
    scales = cfg["lr_scales"]
    ok = True
    print(f"(a) the first {len(kgen)} steps, same weights, batches and optimizers "
          f"(tolerance {atol} + {rtol} x |loss|)")
    print(f"{'step':>5} {'kgen':>9} {'torch':>9} {'diff':>9}")
    worst = 0.0
    for i in range(len(kgen)):
        x = torch.from_numpy(xs[i]).to(device)
        y = torch.from_numpy(ys[i]).to(device)
        lt = t.step(x, y, scales[i]).item()
        diff = kgen[i] - lt
        bad = abs(diff) > atol + rtol * abs(lt) or not math.isfinite(kgen[i])
        ok &= not bad
        worst = max(worst, abs(diff))
        print(f"{i + 1:>5} {kgen[i]:>9.4f} {lt:>9.4f} {diff:>+9.4f}{'  <-- off' if bad else ''}")
    print(f"largest difference {worst:.4f}: {'match' if ok else 'MISMATCH'}")
    return ok


def throughput(torch, cfg, weights, xs, ys, compile_model: bool, steps: int) -> float:
    t = Trainer(torch, cfg, weights, compile_model, "cuda")
    xg = [torch.from_numpy(a).cuda() for a in xs]
    yg = [torch.from_numpy(a).cuda() for a in ys]
    n = len(xg)
    for i in range(5):  # warm-up (compiles)
        t.step(xg[i % n], yg[i % n], 1.0)
    torch.cuda.synchronize()
    rounds = []
    for r in range(3):
        start = time.perf_counter()
        for i in range(steps):
            t.step(xg[i % n], yg[i % n], 1.0)
        torch.cuda.synchronize()
        rounds.append(time.perf_counter() - start)
    tokens = steps * cfg["batch"] * cfg["seq"]
    return tokens / statistics.median(rounds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="what `kgen train --dump-batches DIR` wrote")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per round (3 rounds)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--atol", type=float, default=0.02)
    ap.add_argument("--rtol", type=float, default=0.01)
    ap.add_argument("--cpu", action="store_true",
                    help="check (a) on the CPU (e.g. against `kgen train --no-gpu "
                         "--dump-batches DIR`, the interpreter's run); no timing")
    args = ap.parse_args()
    cfg, weights, xs, ys = load_run(args.dir)
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpt_torch.py: needs a CUDA GPU (or --cpu for the loss check alone)",
              file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name() if device == "cuda" else "the CPU"
    print(f"torch {torch.__version__} on {where}; kgen ran on {cfg.get('device', '?')}")
    print(f"model: {cfg['layers']} layers, d {cfg['d_model']}, {cfg['heads']} heads of "
          f"{cfg['head_dim']}, hidden {cfg['hidden']}, context {cfg['seq']}, batch "
          f"{cfg['batch']}")
    ok = check_losses(torch, cfg, weights, xs, ys, args.atol, args.rtol, device)
    if device == "cpu":
        return 0 if ok else 1

    print(f"\n(b) tokens/s, whole training steps, batch {cfg['batch']} x {cfg['seq']}")
    kg = cfg.get("tokens_per_s")
    rows = [("kgen (its own run)", kg)]
    rows.append(("torch eager", throughput(torch, cfg, weights, xs, ys, False, args.steps)))
    if not args.no_compile:
        try:
            tc = throughput(torch, cfg, weights, xs, ys, True, args.steps)
        except Exception as e:  # a compile failure is reported, not fatal
            print(f"torch.compile failed: {type(e).__name__}: {e}")
            tc = None
        rows.append(("torch.compile", tc))
    for name, v in rows:
        if v is None or not math.isfinite(v):
            print(f"{name:>20}: n/a")
            continue
        ratio = f"   kgen / this = {kg / v:.2f}x" if kg and name != rows[0][0] else ""
        print(f"{name:>20}: {v:>12,.0f} tokens/s{ratio}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
