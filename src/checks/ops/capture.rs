//! Ops captured into a CUDA graph ([`kgen_runtime::Stream::begin_capture`]): the
//! self-test's check that a training step's forward, recorded once, replays like the
//! same ops launched one by one.

use super::common::{poisoned_on, random_on};
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Device, RuntimeError, Tensor};

/// One check: on a GPU, the forward of a small MLP block with its loss (rmsnorm, matmul,
/// concatenated SwiGLU, matmul, cross-entropy with ignored targets) captured on a new
/// stream after an eager warm-up, replayed on fresh inputs against the same ops run
/// eagerly on those inputs (max relative error over every output); `AdamW::step` refused
/// inside a capture, and in capturable mode one eager step plus three replays of a
/// captured step bit-identical to four eager steps; on the interpreter, capture is
/// refused with `RuntimeError::Graph`.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    vec![
        (
            "graph capture: rmsnorm, matmul, swiglu, matmul, cross_entropy, capturable AdamW replayed vs eager".into(),
            check_capture(device),
        ),
        (
            "graph capture: linear bf16 +bias GELU with pre-activation, linear_backward (dx, dw, db) replayed vs eager".into(),
            check_linear_capture(device),
        ),
        (
            "graph capture: Muon step (momentum, batched Newton-Schulz, update) replayed vs eager".into(),
            check_muon_capture(device),
        ),
    ]
}

/// Muon's step captured after one eager step (which compiles and tunes), replayed three
/// times: bit for bit four eager steps of an optimizer with the same parameters and
/// gradients. On the interpreter: nothing to capture (0).
fn check_muon_capture(device: &Device) -> Result<f64, String> {
    use crate::optim::{Muon, MuonGroup};
    if !device.is_gpu() {
        return Ok(0.0);
    }
    let e = |x: OpError| x.to_string();
    let s = device.new_stream().map_err(|x| x.to_string())?;
    let ops = Ops::with_stream(device, s.clone());
    let groups = vec![MuonGroup {
        shapes: vec![[300, 128], [128, 300], [64, 64], [64, 64]],
        ..MuonGroup::new(0.02)
    }];
    let make = || -> Result<Muon, String> {
        let opt = Muon::new(&ops, DType::F32, groups.clone()).map_err(e)?;
        let mut rng = crate::cases::Rng::new(9);
        for t in [opt.params_flat().clone(), opt.grads_flat().clone()] {
            let v: Vec<f64> = (0..t.numel()).map(|_| rng.normalish()).collect();
            t.copy_from_host(&kgen_core::host::HostTensor::from_f64(
                DType::F32,
                t.shape(),
                &v,
            ))
            .map_err(|x| x.to_string())?;
        }
        s.wait_for(&device.stream()).map_err(|x| x.to_string())?;
        Ok(opt)
    };
    let (mut eager, mut replayed) = (make()?, make()?);
    for _ in 0..4 {
        eager.step(&ops).map_err(e)?;
    }
    replayed.step(&ops).map_err(e)?;
    s.begin_capture().map_err(|x| x.to_string())?;
    let captured = replayed.step(&ops);
    let graph = s.end_capture().map_err(|x| x.to_string())?;
    captured.map_err(e)?;
    for _ in 0..3 {
        graph.launch().map_err(|x| x.to_string())?;
    }
    s.synchronize().map_err(|x| x.to_string())?;
    let read = |t: &Tensor| t.to_f64_vec().map_err(|x| x.to_string());
    let (a, b) = (read(eager.params_flat())?, read(replayed.params_flat())?);
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        return Err(format!(
            "Muon: 4 eager steps vs 1 + 3 replays differ at {i}: {} vs {}",
            a[i], b[i]
        ));
    }
    if a.iter().any(|v| !v.is_finite()) {
        return Err("Muon: non-finite parameters".into());
    }
    Ok(0.0)
}

/// A bf16 linear layer with a bias and GELU, forward (saving the pre-activation) and
/// backward (whose dz is allocated during the capture: the graph keeps it), captured
/// after an eager warm-up, replayed on fresh x and dy: bit for bit the eager results on
/// the same inputs. On the interpreter: nothing to capture (0).
fn check_linear_capture(device: &Device) -> Result<f64, String> {
    use crate::ops::gemm::Activation;
    if !device.is_gpu() {
        return Ok(0.0);
    }
    let e = |x: OpError| x.to_string();
    let r = |x: RuntimeError| x.to_string();
    let s = device.new_stream().map_err(r)?;
    let ops = Ops::with_stream(device, s.clone());
    let (m, n, k, t) = (65, 80, 96, DType::BF16);
    let act = Activation::GeluTanh;
    let mut rng = crate::cases::Rng::new(78);
    let (x, _) = random_on(device, &mut rng, t, &[m, k], None)?;
    let (w, _) = random_on(device, &mut rng, t, &[n, k], Some((0.02, 0.2)))?;
    let (bias, _) = random_on(device, &mut rng, t, &[n], None)?;
    let (dy, _) = random_on(device, &mut rng, t, &[m, n], None)?;
    let outs = || -> Result<Vec<Tensor>, String> {
        [&[m, n][..], &[m, n], &[m, k], &[n, k], &[n]]
            .iter()
            .map(|shape| poisoned_on(device, t, shape))
            .collect()
    };
    let step = |o: &[Tensor]| -> Result<(), OpError> {
        ops.linear_with_preact_into(&x, &w, Some(&bias), act, &o[0], &o[1])?;
        ops.linear_backward_into(&dy, &x, &w, Some(&o[1]), act, &o[2], &o[3], Some(&o[4]))
    };
    let captured_outs = outs()?;
    s.wait_for(&device.stream()).map_err(r)?;
    step(&captured_outs).map_err(e)?;
    s.synchronize().map_err(r)?;
    s.begin_capture().map_err(r)?;
    let captured = step(&captured_outs);
    let graph = s.end_capture().map_err(r)?;
    captured.map_err(e)?;
    // Fresh inputs, poisoned outputs, the replay; then the same inputs eagerly.
    for (src, scale) in [(&x, 1.5), (&dy, 0.5)] {
        let v: Vec<f64> = (0..src.numel()).map(|_| rng.normalish() * scale).collect();
        src.copy_from_host(&kgen_core::host::HostTensor::from_f64(t, src.shape(), &v))
            .map_err(r)?;
    }
    for o in &captured_outs {
        let nan = vec![f64::NAN; o.numel()];
        o.copy_from_host(&kgen_core::host::HostTensor::from_f64(t, o.shape(), &nan))
            .map_err(r)?;
    }
    s.wait_for(&device.stream()).map_err(r)?;
    graph.launch().map_err(r)?;
    let eager_outs = outs()?;
    s.wait_for(&device.stream()).map_err(r)?;
    step(&eager_outs).map_err(e)?;
    s.synchronize().map_err(r)?;
    let names = ["y", "preact", "dx", "dw", "db"];
    for ((name, a), b) in names.iter().zip(&captured_outs).zip(&eager_outs) {
        let (a, b) = (a.to_f64_vec().map_err(r)?, b.to_f64_vec().map_err(r)?);
        if let Some(i) =
            (0..a.len()).find(|&i| !a[i].is_finite() || a[i].to_bits() != b[i].to_bits())
        {
            return Err(format!("{name}[{i}]: replay {}, eager {}", a[i], b[i]));
        }
    }
    Ok(0.0)
}

/// The block's tensors: inputs (x, w_norm, w_in, w_out, targets) and outputs.
struct Block {
    x: Tensor,
    w_norm: Tensor,
    w_in: Tensor,
    w_out: Tensor,
    targets: Tensor,
    outputs: [Tensor; 7],
}

const B: usize = 33;
const D: usize = 96;
const F: usize = 80;
const C: usize = 1003;
const IGNORE: i64 = -100;

fn outputs(d: &Device) -> Result<[Tensor; 7], String> {
    let f = DType::F32;
    Ok([
        poisoned_on(d, f, &[B, D])?,     // h
        poisoned_on(d, f, &[B])?,        // rstd
        poisoned_on(d, f, &[B, 2 * F])?, // u
        poisoned_on(d, f, &[B, F])?,     // a
        poisoned_on(d, f, &[B, C])?,     // logits
        poisoned_on(d, f, &[B, C])?,     // dlogits
        poisoned_on(d, f, &[1])?,        // loss
    ])
}

/// Queues the block's forward and loss on `ops`' stream.
fn forward(ops: &Ops, b: &Block, row_loss: &Tensor, stats: &Tensor) -> Result<(), OpError> {
    let [h, rstd, u, a, logits, dlogits, loss] = &b.outputs;
    ops.rmsnorm_into(&b.x, &b.w_norm, h, rstd, 1e-6)?;
    ops.matmul_into(h, &b.w_in, u)?;
    ops.swiglu_concat_into(u, a)?;
    ops.matmul_into(a, &b.w_out, logits)?;
    ops.cross_entropy_into(logits, &b.targets, IGNORE, loss, dlogits, row_loss, stats)
}

fn check_capture(device: &Device) -> Result<f64, String> {
    let e = |x: OpError| x.to_string();
    let s = device.new_stream().map_err(|x| x.to_string())?;
    if !device.is_gpu() {
        return match s.begin_capture() {
            Err(RuntimeError::Graph(_)) => Ok(0.0),
            other => Err(format!(
                "capture on the interpreter: expected a Graph error, got {other:?}"
            )),
        };
    }
    let ops = Ops::with_stream(device, s.clone());
    let mut rng = crate::cases::Rng::new(77);
    let f = DType::F32;
    let targets: Vec<i64> = (0..B)
        .map(|r| {
            if r % 7 == 3 {
                IGNORE
            } else {
                (rng.next_u64() % C as u64) as i64
            }
        })
        .collect();
    let block = Block {
        x: random_on(device, &mut rng, f, &[B, D], None)?.0,
        w_norm: random_on(device, &mut rng, f, &[D], None)?.0,
        w_in: random_on(device, &mut rng, f, &[D, 2 * F], None)?.0,
        w_out: random_on(device, &mut rng, f, &[F, C], None)?.0,
        targets: device
            .from_slice(&[B], &targets)
            .map_err(|x| x.to_string())?,
        outputs: outputs(device)?,
    };
    let row_loss = poisoned_on(device, f, &[B])?;
    let stats = poisoned_on(device, f, &[2])?;
    let sync = |s: &kgen_runtime::Stream| s.synchronize().map_err(|x| x.to_string());
    // Eager warm-up on the stream: compiles, loads and tunes every kernel.
    s.wait_for(&device.stream()).map_err(|x| x.to_string())?;
    forward(&ops, &block, &row_loss, &stats).map_err(e)?;
    sync(&s)?;
    s.begin_capture().map_err(|x| x.to_string())?;
    let captured = forward(&ops, &block, &row_loss, &stats);
    let graph = s.end_capture().map_err(|x| x.to_string())?;
    captured.map_err(e)?;
    if graph.launches() < 5 {
        return Err(format!(
            "{} launches captured, expected >= 5",
            graph.launches()
        ));
    }
    // AdamW's step: refused inside a capture unless capturable; capturable, one eager
    // step and three replays of a captured step equal four eager steps.
    let adamw = || -> Result<crate::optim::AdamW, String> {
        let opt = crate::optim::AdamW::new(
            &ops,
            f,
            f,
            vec![crate::optim::ParamGroup {
                shapes: vec![vec![D, F], vec![C]],
                ..crate::optim::ParamGroup::new(1e-2)
            }],
        )
        .map_err(e)?;
        let mut rng = crate::cases::Rng::new(5);
        for t in [opt.params_flat().clone(), opt.grads_flat().clone()] {
            let v: Vec<f64> = (0..t.numel()).map(|_| rng.normalish()).collect();
            t.copy_from_host(&kgen_core::host::HostTensor::from_f64(f, t.shape(), &v))
                .map_err(|x| x.to_string())?;
        }
        s.wait_for(&device.stream()).map_err(|x| x.to_string())?;
        Ok(opt)
    };
    let mut eager = adamw()?;
    let mut replayed = adamw()?;
    s.begin_capture().map_err(|x| x.to_string())?;
    let refused = replayed.step(&ops);
    let empty = s.end_capture().map_err(|x| x.to_string())?;
    match refused {
        Err(OpError::Runtime(RuntimeError::Graph(_))) if empty.launches() == 0 => {}
        other => {
            return Err(format!(
                "AdamW::step inside a capture: expected a Graph error and nothing \
                 captured, got {other:?} and {} launches",
                empty.launches()
            ))
        }
    }
    for opt in [&mut eager, &mut replayed] {
        opt.set_capturable(&ops, true).map_err(e)?;
        opt.step(&ops).map_err(e)?;
    }
    for _ in 0..3 {
        eager.step(&ops).map_err(e)?;
    }
    s.begin_capture().map_err(|x| x.to_string())?;
    let captured = replayed.step(&ops);
    let step_graph = s.end_capture().map_err(|x| x.to_string())?;
    captured.map_err(e)?;
    for _ in 0..3 {
        step_graph.launch().map_err(|x| x.to_string())?;
    }
    let read = |t: &Tensor| t.to_f64_vec().map_err(|x| x.to_string());
    sync(&s)?;
    let (a, b) = (read(eager.params_flat())?, read(replayed.params_flat())?);
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        return Err(format!(
            "capturable AdamW: 4 eager steps vs 1 + 3 replays differ at {i}: {} vs {}",
            a[i], b[i]
        ));
    }
    let counted = replayed.device_step_count(&ops).map_err(e)?;
    if counted != 4 {
        return Err(format!(
            "capturable AdamW: the device counted {counted} steps, not 4"
        ));
    }
    // New inputs and poisoned outputs, then the replay.
    let x2: Vec<f64> = (0..B * D).map(|_| rng.normalish() * 1.5).collect();
    block
        .x
        .copy_from_host(&kgen_core::host::HostTensor::from_f64(f, &[B, D], &x2))
        .map_err(|x| x.to_string())?;
    for t in &block.outputs {
        let n = t.numel();
        t.copy_from_host(&kgen_core::host::HostTensor::from_f64(
            f,
            t.shape(),
            &vec![f64::NAN; n],
        ))
        .map_err(|x| x.to_string())?;
    }
    s.wait_for(&device.stream()).map_err(|x| x.to_string())?;
    graph.launch().map_err(|x| x.to_string())?;
    sync(&s)?;
    let replayed: Vec<Vec<f64>> = block
        .outputs
        .iter()
        .map(|t| t.to_f64_vec().map_err(|x| x.to_string()))
        .collect::<Result<_, _>>()?;
    // The same inputs, eagerly, into fresh outputs.
    let eager = Block {
        x: block.x.clone(),
        w_norm: block.w_norm.clone(),
        w_in: block.w_in.clone(),
        w_out: block.w_out.clone(),
        targets: block.targets.clone(),
        outputs: outputs(device)?,
    };
    s.wait_for(&device.stream()).map_err(|x| x.to_string())?;
    forward(&ops, &eager, &row_loss, &stats).map_err(e)?;
    sync(&s)?;
    let names = ["h", "rstd", "u", "a", "logits", "dlogits", "loss"];
    let mut worst = 0.0f64;
    for ((name, got), t) in names.iter().zip(&replayed).zip(&eager.outputs) {
        let want = t.to_f64_vec().map_err(|x| x.to_string())?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if !g.is_finite() || !w.is_finite() {
                return Err(format!("{name}[{i}]: replay {g}, eager {w}"));
            }
            worst = worst.max((g - w).abs() / w.abs().max(1e-3));
        }
    }
    if worst > 1e-5 {
        return Err(format!("replay differs from eager by {worst:.2e}"));
    }
    Ok(worst)
}
