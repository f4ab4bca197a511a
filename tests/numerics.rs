//! Numerics of the bundled kernels: every case of `kgen::cases` (the quick set; the full
//! set with `KGEN_FULL=1`) is compiled for sm_80, run in the interpreter and compared
//! with its float64 reference. Also: every bundled kernel compiles to PTX for both
//! targets with its default generics, and the AdamW reference agrees with a direct port
//! of torch's `_single_tensor_adamw` over ten steps.

use kgen::cases::{self, adamw, all_cases, compare, Case, CompareResult, SizeSet, Tolerance};
use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::types::DType;
use kgen_core::{compile, compile_to_ir, interp, Arch, CompileOptions, SourceFile};
use std::time::{Duration, Instant};

/// Compiles the case for `arch` and runs it in the interpreter on a copy of its
/// arguments; returns the arguments after the run.
fn run_in_interpreter(case: &Case, arch: Arch) -> Result<Vec<ArgValue>, String> {
    let src = case.source();
    let (func, _spec) = compile_to_ir(&src, &case.compile_options(arch))
        .map_err(|d| format!("compile: {}", d.render(&src)))?;
    let mut args = case.args.clone();
    interp::run(&func, case.grid, &mut args).map_err(|e| format!("interpreter: {e}"))?;
    Ok(args)
}

struct Outcome {
    label: String,
    result: Result<CompareResult, String>,
    time: Duration,
}

fn run_all(cases: &[Case]) -> Vec<Outcome> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Outcome>> = (0..cases.len()).map(|_| None).collect();
    let results = std::sync::Mutex::new(&mut out);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let t0 = Instant::now();
                let result = run_in_interpreter(case, Arch::Sm80).map(|args| compare(&args, case));
                let o = Outcome {
                    label: case.label.clone(),
                    result,
                    time: t0.elapsed(),
                };
                results.lock().unwrap()[i] = Some(o);
            });
        }
    });
    out.into_iter().map(|o| o.unwrap()).collect()
}

#[test]
fn bundled_cases_match_reference() {
    let sizes = if std::env::var("KGEN_FULL").as_deref() == Ok("1") {
        SizeSet::Full
    } else {
        SizeSet::Quick
    };
    let cases = all_cases(0x6b67_656e, sizes);
    let outcomes = run_all(&cases);
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for (case, o) in cases.iter().zip(&outcomes) {
        slowest = slowest.max(o.time);
        match &o.result {
            Ok(r) if r.passed() => {}
            Ok(r) => failures.push(format!(
                "  {:<70} {}  (tol rel {:.0e} abs {:.0e})",
                o.label, r, case.tolerance.rel, case.tolerance.abs
            )),
            Err(e) => failures.push(format!(
                "  {:<70} {}",
                o.label,
                e.lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            )),
        }
        if std::env::var("KGEN_VERBOSE").is_ok() {
            eprintln!(
                "{:>8.1} ms  {:<70} {}",
                o.time.as_secs_f64() * 1e3,
                o.label,
                match &o.result {
                    Ok(r) => r.to_string(),
                    Err(e) => e.lines().next().unwrap_or("").to_string(),
                }
            );
        }
    }
    eprintln!(
        "{} cases ({sizes:?}), {} failed, slowest {:.2} s",
        cases.len(),
        failures.len(),
        slowest.as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn bundled_kernels_compile_with_defaults_for_both_targets() {
    let mut errors = Vec::new();
    for &(stem, name) in cases::BUNDLED_KERNELS {
        let src = SourceFile::new(
            format!("kernels-src/{stem}.kg"),
            cases::kernel_source(stem).expect("bundled"),
        );
        for arch in kgen_core::source_targets(&src.text) {
            let opts = CompileOptions::new(arch).kernel(name);
            match compile(&src, &opts) {
                Ok(k) => assert!(!k.ptx.is_empty()),
                Err(d) => errors.push(format!("{stem}.kg/{name} for {arch}:\n{}", d.render(&src))),
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

// ---- AdamW against torch ----

/// A direct f64 port of torch.optim.adamw's `_single_tensor_adamw` (torch 2.x,
/// amsgrad=False, capturable=False, differentiable=False) for one parameter.
struct TorchAdamWParam {
    param: Vec<f64>,
    exp_avg: Vec<f64>,
    exp_avg_sq: Vec<f64>,
    step: u64,
}

#[derive(Clone, Copy)]
struct Group {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    maximize: bool,
}

impl TorchAdamWParam {
    fn step(&mut self, grad: &[f64], gr: &Group) {
        let (beta1, beta2) = gr.betas;
        // grad = grad if not maximize else -grad
        let grad: Vec<f64> = grad
            .iter()
            .map(|g| if gr.maximize { -g } else { *g })
            .collect();
        // step_t += 1
        self.step += 1;
        // param.mul_(1 - lr * weight_decay)
        for p in &mut self.param {
            *p *= 1.0 - gr.lr * gr.weight_decay;
        }
        // exp_avg.lerp_(grad, 1 - beta1)   (lerp: self + weight * (end - self))
        for (m, g) in self.exp_avg.iter_mut().zip(&grad) {
            *m += (1.0 - beta1) * (g - *m);
        }
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad.conj(), value=1 - beta2)
        for (v, g) in self.exp_avg_sq.iter_mut().zip(&grad) {
            *v = *v * beta2 + (1.0 - beta2) * g * g;
        }
        let step = self.step as f64;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        let step_size = gr.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.sqrt();
        // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        // param.addcdiv_(exp_avg, denom, value=-step_size)
        for i in 0..self.param.len() {
            let denom = self.exp_avg_sq[i].sqrt() / bias_correction2_sqrt + gr.eps;
            self.param[i] += -step_size * self.exp_avg[i] / denom;
        }
    }
}

fn tensor(args: &[ArgValue], i: usize) -> HostTensor {
    match &args[i] {
        ArgValue::Tensor(t) => t.clone(),
        _ => panic!("arg {i} is not a tensor"),
    }
}

fn check_close(what: &str, got: &[f64], want: &[f64], tol: Tolerance) {
    let r = cases::compare::compare_values(0, got, want, tol);
    assert!(
        r.num_failed == 0,
        "{what}: {} of {} elements off (max abs {:e}, max rel {:e}), first {:?}",
        r.num_failed,
        r.len,
        r.max_abs_err,
        r.max_rel_err,
        r.first_failure
    );
}

/// Ten AdamW steps on two parameter groups (different lr, betas, eps, weight decay,
/// maximize), fresh gradients every step. Three trajectories start from the same state
/// and the same gradients: the torch port in f64, the case reference chained with its
/// outputs rounded to f32, and the kernel in the interpreter chained on its own outputs.
/// Both are compared with the torch port after every step.
#[test]
fn adamw_matches_torch_single_tensor_port_over_ten_steps() {
    let groups = [
        (
            Group {
                lr: 1e-3,
                betas: (0.9, 0.999),
                eps: 1e-8,
                weight_decay: 1e-2,
                maximize: false,
            },
            vec![7usize, 1000],
        ),
        (
            Group {
                lr: 3e-2,
                betas: (0.8, 0.95),
                eps: 1e-6,
                weight_decay: 0.1,
                maximize: true,
            },
            vec![4097usize],
        ),
    ];
    let mut rng = cases::Rng::new(2024);
    let f32_round = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| *x as f32 as f64).collect() };
    let t32 = |v: &[f64]| HostTensor::from_f64(DType::F32, &[v.len()], v);
    let p_tol = Tolerance {
        rel: 2e-5,
        abs: 1e-6,
    };
    // m mixes terms of ~1e-2 with either sign: f32 rounding leaves ~1e-9 absolute.
    let m_tol = Tolerance {
        rel: 2e-5,
        abs: 2e-8,
    };
    let v_tol = Tolerance {
        rel: 2e-5,
        abs: 1e-12,
    };
    for (gi, (group, sizes)) in groups.iter().enumerate() {
        for &n in sizes {
            let p0 = f32_round(
                &(0..n)
                    .map(|_| rng.signed_magnitude(1e-2, 1.0))
                    .collect::<Vec<_>>(),
            );
            let mut torch = TorchAdamWParam {
                param: p0.clone(),
                exp_avg: vec![0.0; n],
                exp_avg_sq: vec![0.0; n],
                step: 0,
            };
            // (p, m, v) of the reference chain and of the kernel chain.
            let mut refs = (t32(&p0), t32(&vec![0.0; n]), t32(&vec![0.0; n]));
            let mut kern = refs.clone();
            for step in 1..=10u64 {
                let g = f32_round(
                    &(0..n)
                        .map(|_| rng.signed_magnitude(1e-3, 1e-1))
                        .collect::<Vec<_>>(),
                );
                torch.step(&g, group);
                let cfg = adamw::AdamWConfig {
                    maximize: group.maximize,
                    lr: group.lr,
                    beta1: group.betas.0,
                    beta2: group.betas.1,
                    eps: group.eps,
                    weight_decay: group.weight_decay,
                    step,
                    ..adamw::AdamWConfig::new(DType::F32, DType::F32)
                };
                let what =
                    |chain: &str, t: &str| format!("group {gi} n={n} step {step} {chain} {t}");

                // The case reference, fed its own outputs rounded to f32.
                let c = adamw::case(
                    &cfg,
                    refs.0.clone(),
                    t32(&g),
                    refs.1.clone(),
                    refs.2.clone(),
                    cfg.label(n),
                );
                let want = c.expected();
                refs = (t32(&want[0]), t32(&want[1]), t32(&want[2]));
                check_close(&what("reference", "p"), &want[0], &torch.param, p_tol);
                check_close(&what("reference", "m"), &want[1], &torch.exp_avg, m_tol);
                check_close(&what("reference", "v"), &want[2], &torch.exp_avg_sq, v_tol);

                // The kernel, fed its own outputs.
                let c = adamw::case(
                    &cfg,
                    kern.0.clone(),
                    t32(&g),
                    kern.1.clone(),
                    kern.2.clone(),
                    cfg.label(n),
                );
                let args = run_in_interpreter(&c, Arch::Sm80).unwrap_or_else(|e| panic!("{e}"));
                kern = (
                    tensor(&args, adamw::P),
                    tensor(&args, adamw::M),
                    tensor(&args, adamw::V),
                );
                check_close(
                    &what("kernel", "p"),
                    &kern.0.to_f64_vec(),
                    &torch.param,
                    p_tol,
                );
                check_close(
                    &what("kernel", "m"),
                    &kern.1.to_f64_vec(),
                    &torch.exp_avg,
                    m_tol,
                );
                check_close(
                    &what("kernel", "v"),
                    &kern.2.to_f64_vec(),
                    &torch.exp_avg_sq,
                    v_tol,
                );
            }
        }
    }
}

/// The other references against independent formulations on small inputs.
#[test]
fn references_agree_with_independent_formulations() {
    let mut rng = cases::Rng::new(99);
    let (rows, cols) = (3usize, 37usize);
    let x: Vec<f64> = (0..rows * cols)
        .map(|_| 3.0 + 2.0 * rng.normalish())
        .collect();
    let w: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
    let b: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.1, 0.5)).collect();
    let tol = Tolerance {
        rel: 1e-12,
        abs: 1e-12,
    };

    // softmax = exp(x - logsumexp(x)), with logsumexp computed without the max shift.
    let y = cases::softmax::reference(&x, cols);
    let alt: Vec<f64> = x
        .chunks(cols)
        .flat_map(|r| {
            let lse = r.iter().map(|v| v.exp()).sum::<f64>().ln();
            r.iter().map(move |v| (v - lse).exp()).collect::<Vec<_>>()
        })
        .collect();
    check_close("softmax", &y, &alt, tol);

    // layernorm with the one-pass variance E[x^2] - E[x]^2 (fine in f64 here), and the
    // normalized rows have mean 0 and variance var / (var + eps).
    let eps = 1e-5;
    let (y, mean, rstd) = cases::layernorm::reference(&x, &w, &b, cols, eps);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mu = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| v * v).sum::<f64>() / cols as f64 - mu * mu;
        check_close("layernorm mean", &[mean[r]], &[mu], tol);
        check_close(
            "layernorm rstd",
            &[rstd[r]],
            &[1.0 / (var + eps).sqrt()],
            Tolerance {
                rel: 1e-9,
                abs: 0.0,
            },
        );
        let z: Vec<f64> = (0..cols).map(|c| (y[r * cols + c] - b[c]) / w[c]).collect();
        let zm = z.iter().sum::<f64>() / cols as f64;
        let zv = z.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        check_close(
            "layernorm normalized mean",
            &[zm],
            &[0.0],
            Tolerance {
                rel: 0.0,
                abs: 1e-12,
            },
        );
        check_close(
            "layernorm normalized var",
            &[zv],
            &[var / (var + eps)],
            Tolerance {
                rel: 1e-9,
                abs: 0.0,
            },
        );
    }

    // rmsnorm: y / w has mean square ms / (ms + eps).
    let (y, rstd) = cases::rmsnorm::reference(&x, &w, cols, eps);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        check_close(
            "rmsnorm rstd",
            &[rstd[r]],
            &[(ms + eps).powf(-0.5)],
            Tolerance {
                rel: 1e-12,
                abs: 0.0,
            },
        );
        let zs = (0..cols)
            .map(|c| (y[r * cols + c] / w[c]).powi(2))
            .sum::<f64>()
            / cols as f64;
        check_close(
            "rmsnorm normalized ms",
            &[zs],
            &[ms / (ms + eps)],
            Tolerance {
                rel: 1e-9,
                abs: 0.0,
            },
        );
    }
}

#[test]
fn bundled_kernels_parse() {
    for &(stem, _) in cases::BUNDLED_KERNELS {
        let src = SourceFile::new(
            format!("kernels-src/{stem}.kg"),
            cases::kernel_source(stem).unwrap(),
        );
        if let Err(d) = kgen_core::front::parse(&src) {
            panic!("{}", d.render(&src));
        }
    }
}
