//! `adamw.kg`: one fused torch.optim.AdamW step (amsgrad = False).

use super::*;

const PARAMS: &[&str] = &[
    "p",
    "g",
    "m",
    "v",
    "lr",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "bc1",
    "bc2_sqrt",
];

/// Argument indices of the tensors the kernel updates in place.
pub const P: usize = 0;
pub const G: usize = 1;
pub const M: usize = 2;
pub const V: usize = 3;

/// Hyperparameters of one AdamW step, as torch takes them (Python floats, i.e. f64).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Parameter and gradient dtype (`T`).
    pub param_dtype: DType,
    /// Moment dtype (`S`).
    pub state_dtype: DType,
    pub block: usize,
    pub maximize: bool,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The step number after increment (1 for the first step), as torch's `state["step"]`.
    pub step: u64,
}

impl AdamWConfig {
    pub fn new(param_dtype: DType, state_dtype: DType) -> AdamWConfig {
        AdamWConfig {
            param_dtype,
            state_dtype,
            block: 1024,
            maximize: false,
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
            step: 1,
        }
    }

    /// `1 - beta1^step`, in f64 on the host like torch's non-capturable path.
    pub fn bc1(&self) -> f64 {
        1.0 - self.beta1.powi(self.step as i32)
    }

    /// `sqrt(1 - beta2^step)`.
    pub fn bc2_sqrt(&self) -> f64 {
        (1.0 - self.beta2.powi(self.step as i32)).sqrt()
    }

    pub fn label(&self, n: usize) -> String {
        format!(
            "adamw T={} S={} BLOCK={} MAXIMIZE={} n={n} step={} lr={:e} wd={} betas=({},{})",
            self.param_dtype,
            self.state_dtype,
            self.block,
            self.maximize,
            self.step,
            self.lr,
            self.weight_decay,
            self.beta1,
            self.beta2
        )
    }
}

/// One row of the case table: (T, S, n, step, lr, wd, maximize, beta2, BLOCK).
type CaseRow = (DType, DType, usize, u64, f64, f64, bool, f64, usize);

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    let mut v = Vec::new();
    let quick: &[CaseRow] = &[
        (F32, F32, 4097, 1, 1e-3, 1e-2, false, 0.999, 1024),
        (F32, F32, 1000, 10, 1e-3, 0.0, true, 0.999, 1024),
        (F32, F32, 7, 1000, 1e-2, 0.1, false, 0.95, 1024),
        (F32, F32, 1, 2, 3e-4, 0.1, true, 0.999, 1024),
        (F32, F32, 4097, 3, 1e-3, 1e-2, false, 0.999, 1000),
        (BF16, F32, 4097, 5, 1e-3, 1e-2, false, 0.999, 1024),
        (BF16, F32, 7, 1, 1e-2, 0.0, true, 0.95, 1024),
        (F16, F32, 1000, 100, 3e-4, 0.0, true, 0.999, 1024),
        (F16, F32, 4097, 1, 1e-3, 0.1, false, 0.999, 512),
        (BF16, BF16, 1, 3, 1e-3, 0.1, false, 0.999, 1024),
        (BF16, BF16, 1000, 20, 1e-2, 1e-2, true, 0.95, 1024),
        (F16, F16, 7, 1, 1e-3, 1e-2, false, 0.999, 1024),
    ];
    let mut push = |t: DType, s: DType, n, step, lr, wd, maximize, beta2, block| {
        let cfg = AdamWConfig {
            block,
            maximize,
            lr,
            beta2,
            weight_decay: wd,
            step,
            ..AdamWConfig::new(t, s)
        };
        v.push(random_case(seed, &cfg, n));
    };
    for &(t, s, n, step, lr, wd, mx, b2, blk) in quick {
        push(t, s, n, step, lr, wd, mx, b2, blk);
    }
    if sizes == SizeSet::Full {
        let full: &[CaseRow] = &[
            (F32, F32, 1_000_003, 7, 1e-3, 1e-2, false, 0.999, 1024),
            (BF16, BF16, 262_147, 50, 6e-4, 0.1, false, 0.95, 2048),
            (BF16, F32, 262_147, 2, 6e-4, 0.1, true, 0.95, 1024),
            (F16, F32, 65_537, 10_000, 1e-3, 1e-2, false, 0.999, 4096),
        ];
        for &(t, s, n, step, lr, wd, mx, b2, blk) in full {
            push(t, s, n, step, lr, wd, mx, b2, blk);
        }
    }
    v
}

/// A case with random parameters, gradients and moments of realistic magnitudes
/// (all nonzero; v > 0).
pub fn random_case(seed: u64, cfg: &AdamWConfig, n: usize) -> Case {
    let label = cfg.label(n);
    let mut rng = Rng::for_case(seed, &label);
    let p = random_tensor(&mut rng, cfg.param_dtype, &[n], |r| {
        r.signed_magnitude(1e-2, 1.0)
    });
    let g = random_tensor(&mut rng, cfg.param_dtype, &[n], |r| {
        r.signed_magnitude(1e-3, 1e-1)
    });
    let m = random_tensor(&mut rng, cfg.state_dtype, &[n], |r| {
        r.signed_magnitude(1e-4, 1e-2)
    });
    let v = random_tensor(&mut rng, cfg.state_dtype, &[n], |r| r.uniform(1e-6, 1e-3));
    case(cfg, p, g, m, v, label)
}

/// A case from given tensors (all contiguous, 1-D, of the same length; p and g of
/// `cfg.param_dtype`, m and v of `cfg.state_dtype`). The kernel updates p, m and v in
/// place: after a run, `args[P]`, `args[M]` and `args[V]` hold the next state.
pub fn case(
    cfg: &AdamWConfig,
    p: HostTensor,
    g: HostTensor,
    m: HostTensor,
    v: HostTensor,
    label: String,
) -> Case {
    let n = p.num_elements();
    assert!(g.num_elements() == n && m.num_elements() == n && v.num_elements() == n);
    assert_eq!((p.dtype, g.dtype), (cfg.param_dtype, cfg.param_dtype));
    assert_eq!((m.dtype, v.dtype), (cfg.state_dtype, cfg.state_dtype));
    let args = vec![
        ArgValue::Tensor(p),
        ArgValue::Tensor(g),
        ArgValue::Tensor(m),
        ArgValue::Tensor(v),
        f32_arg(cfg.lr),
        f32_arg(cfg.beta1),
        f32_arg(cfg.beta2),
        f32_arg(cfg.eps),
        f32_arg(cfg.weight_decay),
        f32_arg(cfg.bc1()),
        f32_arg(cfg.bc2_sqrt()),
    ];
    let maximize = cfg.maximize;
    // f32: a handful of roundings on values of magnitude <= 1, plus the update's error
    // where m cancels (|m| ~ 1e-9 absolute, amplified by step_size / denom).
    let f32_tol = Tolerance {
        rel: 5e-6,
        abs: 2e-7,
    };
    let tolerance = Tolerance::for_dtype(cfg.param_dtype, f32_tol)
        .max(Tolerance::for_dtype(cfg.state_dtype, f32_tol));
    Case {
        options: Default::default(),
        kernel: "adamw",
        kernel_name: None,
        label,
        defines: defines(&[
            ("T", cfg.param_dtype.to_string()),
            ("S", cfg.state_dtype.to_string()),
            ("BLOCK", cfg.block.to_string()),
            ("MAXIMIZE", cfg.maximize.to_string()),
        ]),
        tensor_align: aligns(PARAMS, &args),
        grid: [cdiv(n, cfg.block) as u32, 1, 1],
        args,
        outputs: vec![P, M, V],
        reference: Box::new(move |args| {
            let s = |i| scalar_at(args, i);
            let (p, m, v) = reference(
                &tensor_at(args, P).to_f64_vec(),
                &tensor_at(args, G).to_f64_vec(),
                &tensor_at(args, M).to_f64_vec(),
                &tensor_at(args, V).to_f64_vec(),
                Scalars {
                    lr: s(4),
                    beta1: s(5),
                    beta2: s(6),
                    eps: s(7),
                    weight_decay: s(8),
                    bc1: s(9),
                    bc2_sqrt: s(10),
                },
                maximize,
            );
            vec![p, m, v]
        }),
        tolerance,
    }
}

/// The kernel's scalar arguments, as the kernel sees them (f32 values, widened).
#[derive(Clone, Copy, Debug)]
pub struct Scalars {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub bc1: f64,
    pub bc2_sqrt: f64,
}

/// One AdamW step in f64, in the kernel's (and torch's fused kernel's) order. Returns
/// (p, m, v).
pub fn reference(
    p: &[f64],
    g: &[f64],
    m: &[f64],
    v: &[f64],
    s: Scalars,
    maximize: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = p.len();
    let (mut po, mut mo, mut vo) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for i in 0..n {
        let g = if maximize { -g[i] } else { g[i] };
        let pd = p[i] * (1.0 - s.lr * s.weight_decay);
        let mn = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        let vn = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        let denom = vn.sqrt() / s.bc2_sqrt + s.eps;
        po.push(pd - (s.lr / s.bc1) * mn / denom);
        mo.push(mn);
        vo.push(vn);
    }
    (po, mo, vo)
}
