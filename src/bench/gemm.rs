//! The tensor-core rows of `kgen bench`: GEMM through `Ops::gemm` beside cuBLAS (called
//! through cudarc's `cublas` feature, dynamically loaded, on the same buffers and stream,
//! timed by the same [`Timer`]), linear layers (`Ops::linear` forward with a bias,
//! `Ops::linear_backward` for dx, dw, db) beside the same GEMMs in cuBLAS (no bias, no
//! db: a lower bound of the work) and, from `--peers`, torch's `F.linear` with
//! autograd, and a probe of the `mma.sync` ceiling of the GPU.
//!
//! The probe is a register-only loop: each warp issues [`CHAINS`] (8) or [`GEMM_CHAINS`]
//! (32, a GEMM warp tile's 4 x 8 instructions per k-step, with its 128 accumulator
//! registers) independent `mma.sync.m16n8k16` bf16 → f32 per iteration on operands in
//! registers, no memory traffic but one store of each thread's sum at the end (so nothing
//! is dead). Blocks are swept over (1, 2, 4) × SMs and warps over (4, 8, 16); the best
//! rate is the ceiling the sm_80 code path (`mma.sync`) can reach on this GPU, and the
//! whole sweep is reported (how the rate depends on the warps an SM holds).

use super::measure::{fill, Fill, Timer};
use crate::ops::gemm::Activation;
use crate::ops::{OpError, Ops};
use cudarc::driver::{CudaStream, PushKernelArg};
use kgen_core::types::DType;
use kgen_runtime::{Device, RuntimeError, Tensor};
use std::sync::Arc;

/// One GEMM row: `c [m, n] = a [m, k] @ b [k, n]`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmWorkload {
    pub name: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
}

impl GemmWorkload {
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The GEMM workloads of issue 22 (ANCHORS' tensor-core table).
pub fn gemm_workloads() -> Vec<GemmWorkload> {
    let w = |m: usize, n: usize, k: usize, dtype: DType| GemmWorkload {
        name: format!(
            "gemm_{}_{m}x{n}x{k}",
            if dtype == DType::BF16 { "bf16" } else { "fp16" }
        ),
        m,
        n,
        k,
        dtype,
    };
    vec![
        w(2048, 2048, 2048, DType::BF16),
        w(4096, 4096, 4096, DType::BF16),
        w(8192, 8192, 8192, DType::BF16),
        w(4096, 11008, 4096, DType::BF16),
        w(16384, 4096, 4096, DType::BF16),
        w(4096, 4096, 4096, DType::F16),
        // The LM head of a GPT-2-sized model: 16384 tokens, the padded 50304-word
        // vocabulary, d = 768.
        w(16384, 50304, 768, DType::BF16),
    ]
}

/// What one GEMM row measured (µs medians) and the configuration the tuner chose.
#[derive(Clone, Debug)]
pub struct GemmRow {
    pub w: GemmWorkload,
    pub kgen_us: Result<f64, String>,
    pub cublas_us: Result<f64, String>,
    /// The largest relative error of kgen's result against cuBLAS's over a sample of
    /// elements (each the same dot product), as a sanity check of what was timed.
    pub agree: Result<f64, String>,
}

impl GemmRow {
    pub fn tflops(us: &Result<f64, String>, w: &GemmWorkload) -> Option<f64> {
        us.as_ref().ok().map(|t| w.flops() / (t * 1e-6) / 1e12)
    }
}

fn cublas_err(e: impl std::fmt::Display) -> OpError {
    OpError::Runtime(RuntimeError::LaunchConfig(format!("cuBLAS: {e}")))
}

/// cuBLAS's `c = a @ b` (row-major, through the column-major `c^T = b^T a^T`), f32
/// compute, on `stream`.
struct Cublas {
    blas: cudarc::cublas::CudaBlas,
}

impl Cublas {
    fn new(stream: Arc<CudaStream>) -> Result<Cublas, OpError> {
        // SAFETY: a presence check of the shared library, no call into it.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(cublas_err(
                "libcublas was not found (set LD_LIBRARY_PATH to the CUDA toolkit's lib64, \
                 or to torch's nvidia/cublas/lib)",
            ));
        }
        let blas = cudarc::cublas::CudaBlas::new(stream).map_err(cublas_err)?;
        Ok(Cublas { blas })
    }

    fn gemm(&self, a: &Tensor, b: &Tensor, c: &Tensor, w: &GemmWorkload) -> Result<(), OpError> {
        self.gemm_rm(a, b, c, (w.m, w.n, w.k), (false, false))
    }

    /// Row-major `c [m, n] = a @ b`, `a` stored `[m, k]` (or `[k, m]` when `ta`: a is
    /// its transpose), `b` stored `[k, n]` (or `[n, k]` when `tb`), of one dtype (f16 or
    /// bf16, the dtype of `c`), f32 compute: the column-major `c.T = b.T @ a.T`.
    fn gemm_rm(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        (m, n, k): (usize, usize, usize),
        (ta, tb): (bool, bool),
    ) -> Result<(), OpError> {
        use cudarc::cublas::sys;
        let ptr = |t: &Tensor| {
            t.device_ptr()
                .ok_or_else(|| cublas_err("a tensor without device memory"))
        };
        let (pa, pb, pc) = (ptr(a)?, ptr(b)?, ptr(c)?);
        let ty = match c.dtype() {
            DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            _ => sys::cudaDataType_t::CUDA_R_16F,
        };
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let int = |x: usize| i32::try_from(x).map_err(|_| cublas_err("extent over i32"));
        // SAFETY: the pointers are live device allocations of the stated sizes (the
        // tensors outlive the call, which is ordered on their stream); the leading
        // dimensions are the row lengths of the row-major storages.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(tb),
                op(ta),
                int(n)?,
                int(m)?,
                int(k)?,
                (&alpha) as *const f32 as *const _,
                pb as *const _,
                ty,
                int(if tb { k } else { n })?,
                pa as *const _,
                ty,
                int(if ta { m } else { k })?,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                ty,
                int(n)?,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(cublas_err)
        }
    }
}

/// Times one GEMM row: kgen's `Ops::gemm_into` (tuned during warm-up) and cuBLAS, on the
/// same random inputs, then compares their outputs on a sample of elements.
pub fn run_gemm(ops: &Ops, timer: &Timer, w: &GemmWorkload, seed: u64) -> GemmRow {
    let mut row = GemmRow {
        w: w.clone(),
        kgen_us: Err("not run".into()),
        cublas_us: Err("not run".into()),
        agree: Err("not run".into()),
    };
    let r = (|| -> Result<(), OpError> {
        let d = ops.device();
        let a = d.empty(w.dtype, &[w.m, w.k])?;
        let b = d.empty(w.dtype, &[w.k, w.n])?;
        let c = d.empty(w.dtype, &[w.m, w.n])?;
        let c2 = d.empty(w.dtype, &[w.m, w.n])?;
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        fill(&a, normal, seed)?;
        fill(&b, normal, seed ^ 0x5bd1_e995)?;
        fill(&c, Fill::Nan, 0)?;
        fill(&c2, Fill::Nan, 0)?;
        row.kgen_us = timer
            .time(&mut || ops.gemm_into(&a, &b, None, Activation::None, &c))
            .map(|m| m.median_us)
            .map_err(|e| e.to_string());
        let stream = ops
            .stream()
            .cudarc()
            .cloned()
            .ok_or_else(|| cublas_err("no CUDA stream"))?;
        row.cublas_us = match Cublas::new(stream) {
            Ok(blas) => timer
                .time(&mut || blas.gemm(&a, &b, &c2, w))
                .map(|m| m.median_us)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if row.cublas_us.is_ok() {
            row.agree = sample_agreement(&c, &c2, w.m, w.n).map_err(|e| e.to_string());
        }
        Ok(())
    })();
    if let Err(e) = r {
        row.kgen_us = Err(e.to_string());
    }
    row
}

/// The largest |kgen - cuBLAS| / (|cuBLAS| + 1) over 4096 elements spread over `c`.
fn sample_agreement(c: &Tensor, c2: &Tensor, m: usize, n: usize) -> Result<f64, OpError> {
    let (x, y) = (c.to_f64_vec()?, c2.to_f64_vec()?);
    sample_agreement_of(&x, &y, m * n)
}

/// [`sample_agreement`] over host values.
fn sample_agreement_of(x: &[f64], y: &[f64], total: usize) -> Result<f64, OpError> {
    let step = (total / 4096).max(1);
    let mut worst = 0.0f64;
    for i in (0..total).step_by(step) {
        let e = (x[i] - y[i]).abs() / (y[i].abs() + 1.0);
        if !e.is_finite() {
            return Err(OpError::Runtime(RuntimeError::LaunchConfig(format!(
                "element {i}: kgen {} vs cuBLAS {}",
                x[i], y[i]
            ))));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// One linear-layer row: `y [m, n] = x [m, k] @ w.T + bias` (w `[n, k]`, torch's
/// layout), or its backward (`dx = dy @ w`, `dw = dy.T @ x`, `db = sum of dy's rows`).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearWorkload {
    /// `linear_{fwd,bwd}_fp16_{m}x{n}x{k}`: the same names as `torch_peers.py`'s.
    pub name: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub bwd: bool,
}

impl LinearWorkload {
    /// The GEMMs' flops: one for the forward, two (dx, dw) for the backward.
    pub fn flops(&self) -> f64 {
        let one = 2.0 * self.m as f64 * self.n as f64 * self.k as f64;
        if self.bwd {
            2.0 * one
        } else {
            one
        }
    }
}

/// fp16 linear forward (with a bias) and backward (dx, dw, db) at 2048³, 4096³, 8192³.
pub fn linear_workloads() -> Vec<LinearWorkload> {
    let mut v = Vec::new();
    for s in [2048usize, 4096, 8192] {
        for bwd in [false, true] {
            v.push(LinearWorkload {
                name: format!(
                    "linear_{}_fp16_{s}x{s}x{s}",
                    if bwd { "bwd" } else { "fwd" }
                ),
                m: s,
                n: s,
                k: s,
                dtype: DType::F16,
                bwd,
            });
        }
    }
    v
}

/// What one linear row measured (µs medians).
#[derive(Clone, Debug)]
pub struct LinearRow {
    pub w: LinearWorkload,
    pub kgen_us: Result<f64, String>,
    /// The same GEMMs in cuBLAS, without the bias (forward) or db (backward).
    pub cublas_us: Result<f64, String>,
    /// torch's peer from `--peers` (`F.linear` with autograd), when given.
    pub torch_us: Option<f64>,
    /// The largest |kgen - reference| / (|reference| + 1) over sampled elements of each
    /// output, the reference from cuBLAS (y + bias on the host; dx; dw; db as dy.T @ 1).
    pub agree: Result<f64, String>,
}

/// Times one linear row: kgen's `linear_into` / `linear_backward_into` (tuned during
/// warm-up) and cuBLAS's GEMMs on the same random inputs, then compares the outputs.
pub fn run_linear(ops: &Ops, timer: &Timer, w: &LinearWorkload, seed: u64) -> LinearRow {
    let mut row = LinearRow {
        w: w.clone(),
        kgen_us: Err("not run".into()),
        cublas_us: Err("not run".into()),
        torch_us: None,
        agree: Err("not run".into()),
    };
    let r = (|| -> Result<(), OpError> {
        let d = ops.device();
        let (m, n, k, t) = (w.m, w.n, w.k, w.dtype);
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let input = |shape: &[usize], s: u64| -> Result<Tensor, OpError> {
            let x = d.empty(t, shape)?;
            fill(&x, normal, seed ^ s)?;
            Ok(x)
        };
        let output = |shape: &[usize]| -> Result<Tensor, OpError> {
            let x = d.empty(t, shape)?;
            fill(&x, Fill::Nan, 0)?;
            Ok(x)
        };
        let x = input(&[m, k], 1)?;
        let wt = input(&[n, k], 2)?;
        let stream = ops
            .stream()
            .cudarc()
            .cloned()
            .ok_or_else(|| cublas_err("no CUDA stream"))?;
        let blas = Cublas::new(stream);
        if !w.bwd {
            let bias = input(&[n], 3)?;
            let (y, y2) = (output(&[m, n])?, output(&[m, n])?);
            row.kgen_us = timer
                .time(&mut || ops.linear_into(&x, &wt, Some(&bias), Activation::None, &y))
                .map(|r| r.median_us)
                .map_err(|e| e.to_string());
            row.cublas_us = match &blas {
                Ok(b) => timer
                    .time(&mut || b.gemm_rm(&x, &wt, &y2, (m, n, k), (false, true)))
                    .map(|r| r.median_us)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if row.cublas_us.is_ok() {
                let (got, mut want, bv) = (y.to_f64_vec()?, y2.to_f64_vec()?, bias.to_f64_vec()?);
                for (i, v) in want.iter_mut().enumerate() {
                    *v += bv[i % n];
                }
                row.agree = sample_agreement_of(&got, &want, m * n).map_err(|e| e.to_string());
            }
            return Ok(());
        }
        let dy = input(&[m, n], 4)?;
        let (dx, dw, db) = (output(&[m, k])?, output(&[n, k])?, output(&[n])?);
        let (dx2, dw2, db2) = (output(&[m, k])?, output(&[n, k])?, output(&[n, 1])?);
        row.kgen_us = timer
            .time(&mut || {
                ops.linear_backward_into(&dy, &x, &wt, None, Activation::None, &dx, &dw, Some(&db))
            })
            .map(|r| r.median_us)
            .map_err(|e| e.to_string());
        row.cublas_us = match &blas {
            Ok(b) => timer
                .time(&mut || {
                    b.gemm_rm(&dy, &wt, &dx2, (m, k, n), (false, false))?;
                    b.gemm_rm(&dy, &x, &dw2, (n, k, m), (true, false))
                })
                .map(|r| r.median_us)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let (Ok(b), true) = (&blas, row.cublas_us.is_ok()) {
            // db's reference: dy.T @ ones.
            let ones = d.from_f64(t, &[m, 1], &vec![1.0; m])?;
            b.gemm_rm(&dy, &ones, &db2, (n, 1, m), (true, false))?;
            let mut worst = 0.0f64;
            for (got, want, total) in [(&dx, &dx2, m * k), (&dw, &dw2, n * k), (&db, &db2, n)] {
                let e = sample_agreement_of(&got.to_f64_vec()?, &want.to_f64_vec()?, total)?;
                worst = worst.max(e);
            }
            row.agree = Ok(worst);
        }
        Ok(())
    })();
    if let Err(e) = r {
        row.kgen_us = Err(e.to_string());
    }
    row
}

/// The linear table: kgen, cuBLAS's GEMMs alone, torch's `F.linear` (from `--peers`),
/// kgen against each, and the agreement.
pub fn format_linear_table(rows: &[LinearRow]) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<32} {:>10} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        "workload", "kgen us", "TF/s", "cuBLAS us", "torch us", "vs cuBLAS", "vs torch", "agree"
    ));
    for r in rows {
        let us = |x: &Result<f64, String>| match x {
            Ok(v) => format!("{v:.1}"),
            Err(_) => "ERROR".into(),
        };
        let tf = r
            .kgen_us
            .as_ref()
            .ok()
            .map(|t| format!("{:.0}", r.w.flops() / (t * 1e-6) / 1e12))
            .unwrap_or("-".into());
        let ratio = |other: Option<f64>| match (r.kgen_us.as_ref().ok(), other) {
            (Some(k), Some(o)) => format!("{:.2}x", o / k),
            _ => "-".into(),
        };
        let agree = match &r.agree {
            Ok(e) => format!("{e:.1e}"),
            Err(_) => "-".into(),
        };
        s.push_str(&format!(
            "{:<32} {:>10} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
            r.w.name,
            us(&r.kgen_us),
            tf,
            us(&r.cublas_us),
            r.torch_us.map_or("-".into(), |t| format!("{t:.1}")),
            ratio(r.cublas_us.as_ref().ok().copied()),
            ratio(r.torch_us),
            agree
        ));
        for (who, e) in [("kgen", &r.kgen_us), ("cuBLAS", &r.cublas_us)] {
            if let Err(e) = e {
                s.push_str(&format!("  {who}: {e}\n"));
            }
        }
    }
    s
}

/// Independent accumulator chains per warp in the ceiling probe.
pub const CHAINS: usize = 8;
/// The chains of a GEMM warp's 64 x 64 tile (4 x 8 instructions per k-step).
pub const GEMM_CHAINS: usize = 32;

/// The PTX of the `mma.sync` ceiling probe with `chains` accumulator chains per warp
/// (see the module docs).
pub fn mma_probe_ptx(chains: usize) -> String {
    let mut s = String::new();
    s.push_str(".version 8.0\n.target sm_80\n.address_size 64\n\n");
    s.push_str(".visible .entry mma_probe(.param .u64 out, .param .u32 iters)\n{\n");
    s.push_str("\t.reg .pred %p;\n\t.reg .b32 %a<4>;\n\t.reg .b32 %b<2>;\n");
    s.push_str(&format!("\t.reg .f32 %c<{}>;\n", 4 * chains));
    s.push_str("\t.reg .b32 %t, %i, %n, %g;\n\t.reg .f32 %s;\n\t.reg .b64 %o, %off;\n");
    // Operands from the thread id: nonzero bf16 pairs (no early-out on zeros).
    s.push_str("\tmov.u32 %t, %tid.x;\n");
    for (k, r) in ["%a0", "%a1", "%a2", "%a3", "%b0", "%b1"]
        .iter()
        .enumerate()
    {
        s.push_str(&format!(
            "\tor.b32 {r}, %t, {};\n\tand.b32 {r}, {r}, 0x3F7F3F7F;\n",
            0x3F00_3F00u32 + k as u32
        ));
    }
    for c in 0..4 * chains {
        s.push_str(&format!("\tmov.f32 %c{c}, 0f00000000;\n"));
    }
    s.push_str("\tld.param.u32 %n, [iters];\n\tmov.u32 %i, 0;\n$LOOP:\n");
    for ch in 0..chains {
        let c: Vec<String> = (0..4).map(|j| format!("%c{}", 4 * ch + j)).collect();
        let cs = c.join(", ");
        s.push_str(&format!(
            "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{cs}}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, {{{cs}}};\n"
        ));
    }
    s.push_str("\tadd.u32 %i, %i, 1;\n\tsetp.lt.u32 %p, %i, %n;\n\t@%p bra $LOOP;\n");
    s.push_str("\tmov.f32 %s, 0f00000000;\n");
    for c in 0..4 * chains {
        s.push_str(&format!("\tadd.f32 %s, %s, %c{c};\n"));
    }
    s.push_str("\tmov.u32 %g, %ctaid.x;\n\tmov.u32 %n, %ntid.x;\n\tmad.lo.u32 %g, %g, %n, %t;\n");
    s.push_str("\tmul.wide.u32 %off, %g, 4;\n\tld.param.u64 %o, [out];\n");
    s.push_str("\tcvta.to.global.u64 %o, %o;\n\tadd.s64 %o, %o, %off;\n");
    s.push_str("\tst.global.f32 [%o], %s;\n\tret;\n}\n");
    s
}

/// One point of the ceiling probe's sweep.
#[derive(Clone, Debug)]
pub struct ProbePoint {
    pub chains: usize,
    pub blocks_per_sm: u32,
    pub warps: u32,
    pub tflops: f64,
}

/// The ceiling probe: the best rate, (TFLOP/s, "blocks x warps x chains"), and every
/// point of the sweep.
pub fn mma_ceiling(device: &Device) -> Result<((f64, String), Vec<ProbePoint>), OpError> {
    let gpu = device
        .gpu()
        .ok_or_else(|| cublas_err("the mma.sync probe needs a GPU"))?;
    let drv = |op: &'static str, e: cudarc::driver::DriverError| {
        OpError::Runtime(RuntimeError::Driver { op, err: e })
    };
    let ctx = gpu.context();
    let stream = gpu.cuda_stream().clone();
    let sms = gpu.info().sm_count;
    let iters: u32 = 4096;
    let mut best = (0.0f64, String::new());
    let mut points = Vec::new();
    for chains in [CHAINS, GEMM_CHAINS] {
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(mma_probe_ptx(chains)))
            .map_err(|e| drv("cuModuleLoadData", e))?;
        let f = module
            .load_function("mma_probe")
            .map_err(|e| drv("cuModuleGetFunction", e))?;
        let iters = if chains == GEMM_CHAINS {
            iters / 4
        } else {
            iters
        };
        for blocks_per_sm in [1u32, 2, 4] {
            for warps in [4u32, 8, 16] {
                if chains == GEMM_CHAINS && warps == 16 {
                    continue; // 512 threads of ~150 registers do not fit an SM
                }
                let blocks = sms * blocks_per_sm;
                let threads = warps * 32;
                let out = stream
                    .alloc_zeros::<f32>((blocks * threads) as usize)
                    .map_err(|e| drv("cuMemAlloc", e))?;
                let cfg = cudarc::driver::LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut times = Vec::new();
                for rep in 0..6 {
                    let e0 = ctx
                        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| drv("cuEventCreate", e))?;
                    let e1 = ctx
                        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| drv("cuEventCreate", e))?;
                    e0.record(&stream).map_err(|e| drv("cuEventRecord", e))?;
                    let mut b = stream.launch_builder(&f);
                    b.arg(&out);
                    b.arg(&iters);
                    // SAFETY: the probe's two parameters are a device pointer to
                    // blocks*threads f32 and a u32, as pushed.
                    unsafe { b.launch(cfg) }.map_err(|e| drv("cuLaunchKernel", e))?;
                    e1.record(&stream).map_err(|e| drv("cuEventRecord", e))?;
                    stream
                        .synchronize()
                        .map_err(|e| drv("cuStreamSynchronize", e))?;
                    if rep > 0 {
                        times.push(
                            e0.elapsed_ms(&e1)
                                .map_err(|e| drv("cuEventElapsedTime", e))?
                                as f64,
                        );
                    }
                }
                times.sort_by(|a, b| a.total_cmp(b));
                let ms = times[times.len() / 2];
                let flops = blocks as f64 * warps as f64 * iters as f64 * chains as f64 * 4096.0;
                let tf = flops / (ms * 1e-3) / 1e12;
                points.push(ProbePoint {
                    chains,
                    blocks_per_sm,
                    warps,
                    tflops: tf,
                });
                if tf > best.0 {
                    best = (
                        tf,
                        format!("{blocks} blocks x {warps} warps x {chains} chains"),
                    );
                }
            }
        }
    }
    Ok((best, points))
}

/// The probe's sweep as one line per chain count: TFLOP/s by warps per SM.
pub fn format_probe_sweep(points: &[ProbePoint]) -> String {
    let mut s = String::new();
    for chains in [CHAINS, GEMM_CHAINS] {
        let cells: Vec<String> = points
            .iter()
            .filter(|p| p.chains == chains)
            .map(|p| format!("{}x{}w {:.0}", p.blocks_per_sm, p.warps, p.tflops))
            .collect();
        s.push_str(&format!(
            "#   {chains} chains/warp, blocks per SM x warps: {}\n",
            cells.join(", ")
        ));
    }
    s
}

/// The GEMM table: kgen, cuBLAS, their ratio, and kgen against the ceiling.
pub fn format_gemm_table(rows: &[GemmRow], ceiling: Option<f64>) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<28} {:>10} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9}\n",
        "workload", "kgen us", "TF/s", "cuBLAS us", "TF/s", "vs cuBLAS", "vs mma", "agree"
    ));
    for r in rows {
        let k = GemmRow::tflops(&r.kgen_us, &r.w);
        let c = GemmRow::tflops(&r.cublas_us, &r.w);
        let us = |x: &Result<f64, String>| match x {
            Ok(v) => format!("{v:.1}"),
            Err(_) => "ERROR".into(),
        };
        let opt = |x: Option<f64>, p: usize| x.map(|v| format!("{v:.p$}")).unwrap_or("-".into());
        let ratio = match (k, c) {
            (Some(k), Some(c)) => format!("{:.2}x", k / c),
            _ => "-".into(),
        };
        let vs_mma = match (k, ceiling) {
            (Some(k), Some(m)) => format!("{:.0}%", 100.0 * k / m),
            _ => "-".into(),
        };
        let agree = match &r.agree {
            Ok(e) => format!("{e:.1e}"),
            Err(_) => "-".into(),
        };
        s.push_str(&format!(
            "{:<28} {:>10} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9}\n",
            r.w.name,
            us(&r.kgen_us),
            opt(k, 0),
            us(&r.cublas_us),
            opt(c, 0),
            ratio,
            vs_mma,
            agree
        ));
        for (who, e) in [("kgen", &r.kgen_us), ("cuBLAS", &r.cublas_us)] {
            if let Err(e) = e {
                s.push_str(&format!("  {who}: {e}\n"));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_assembles_and_has_its_chains() {
        for chains in [CHAINS, GEMM_CHAINS] {
            let ptx = mma_probe_ptx(chains);
            assert_eq!(ptx.matches("mma.sync").count(), chains);
            if let Some(ptxas) = std::env::var_os("KGEN_PTXAS") {
                let dir = std::env::temp_dir().join(format!("kgen-probe-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let f = dir.join("probe.ptx");
                std::fs::write(&f, &ptx).unwrap();
                let o = std::process::Command::new(ptxas)
                    .args(["-arch=sm_80", "-o", "/dev/null"])
                    .arg(&f)
                    .output()
                    .unwrap();
                let _ = std::fs::remove_dir_all(&dir);
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
        }
    }

    #[test]
    fn workloads_are_the_issue_s_shapes() {
        let w = gemm_workloads();
        assert_eq!(w.len(), 7);
        assert!(w.iter().any(|x| x.name == "gemm_bf16_4096x11008x4096"));
        assert!(w
            .iter()
            .any(|x| x.name == "gemm_bf16_16384x50304x768" && x.dtype == DType::BF16));
        assert_eq!(w[1].flops(), 2.0 * 4096f64.powi(3));
        let l = linear_workloads();
        assert_eq!(l.len(), 6);
        assert_eq!(l[0].name, "linear_fwd_fp16_2048x2048x2048");
        assert_eq!(l[5].name, "linear_bwd_fp16_8192x8192x8192");
        assert_eq!(l[5].flops(), 4.0 * 8192f64.powi(3));
        assert!(l.iter().all(|x| x.dtype == DType::F16));
    }

    /// The linear rows' names are `torch_peers.py`'s (its workload table in
    /// bench/README.md, which `--self-check` keeps in step with the Python side), and
    /// so are the GEMM rows that torch peers.
    #[test]
    fn linear_and_gemm_names_are_in_the_peer_table() {
        let readme = include_str!("../../bench/README.md");
        for w in linear_workloads() {
            assert!(readme.contains(&format!("| `{}` |", w.name)), "{}", w.name);
        }
        assert!(readme.contains("| `gemm_bf16_16384x50304x768` |"));
    }

    #[test]
    fn the_linear_table_shows_each_peer() {
        let w = linear_workloads()[1].clone();
        let row = LinearRow {
            w,
            kgen_us: Ok(100.0),
            cublas_us: Ok(90.0),
            torch_us: Some(120.0),
            agree: Ok(1e-3),
        };
        let t = format_linear_table(&[row]);
        assert!(t.contains("linear_bwd_fp16_2048x2048x2048"), "{t}");
        assert!(t.contains("0.90x") && t.contains("1.20x"), "{t}");
    }
}
