//! `#[kgen::kernel]` parity: the macro form of `vec_add` and `softmax` compiles to the
//! same PTX as the `.kg` files in `kernels-src/`, for both archs. No GPU needed.

use kgen::core::{compile, Arch, CompileOptions, SourceFile};

#[kgen::kernel]
fn vec_add<T: Float = f32, const BLOCK: i32 = 1024>(
    x: Tensor<T, 1, Contiguous>,
    y: Tensor<T, 1, Contiguous>,
    out: Tensor<T, 1, Contiguous>,
) {
    let i = bid(0);
    let a = load(x, [i], [BLOCK]);
    let b = load(y, [i], [BLOCK]);
    store(out, [i], a + b);
}

#[kgen::kernel]
fn softmax<T: Float = f32, const BLOCK: i32 = 1024, const ONE_TILE: bool = false>(
    x: Tensor<T, 2, Contiguous>,
    y: Tensor<T, 2, Contiguous>,
) {
    let row = bid(0);
    let cols = shape(x, 1);
    let ntiles = cdiv(cols, BLOCK);
    if ONE_TILE || ntiles == 1 {
        let xt = load(x, [row, 0], [1, BLOCK], pad = -inf).reshape([BLOCK]) as f32;
        let mx = max(xt, axis = 0);
        let e = exp(xt - mx);
        let inv = fdiv(1.0, sum(e, 0));
        store(y, [row, 0], (e * inv).reshape([1, BLOCK]) as T);
    } else {
        let mut m: f32 = -f32::INFINITY;
        let mut s: f32 = 0.0;
        for k in 0..ntiles {
            let xt = load(x, [row, k], [1, BLOCK], pad = -inf).reshape([BLOCK]) as f32;
            let m_new = max(m, max(xt, axis = 0));
            s = s * exp(m - m_new) + sum(exp(xt - m_new), 0);
            m = m_new;
        }
        let inv = fdiv(1.0, s);
        for k in 0..ntiles {
            let xt = load(x, [row, k], [1, BLOCK], pad = -inf).reshape([BLOCK]) as f32;
            store(y, [row, k], (exp(xt - m) * inv).reshape([1, BLOCK]) as T);
        }
    }
}

/// Every kind of statement and parameter the macro maps, compiled for both archs
/// (this doc comment documents the generated module).
#[kgen::kernel]
fn features<
    T: DType = f32,
    const B: i32 = 64,
    const D: i32 = { B * 2 },
    const NEG: bool = false,
>(
    x: Tensor<f32, Dims<_, D>>,
    y: Tensor<f32, 2>,
    scale: f32,
    n: i32,
    alpha: T,
) {
    static_assert!(D % 2 == 0, "D must be even");
    static_assert(B > 0);
    let r = bid(0);
    let mut t = load(x, [r, 0], [1, D], pad = f32::NEG_INFINITY);
    let mut c = 0;
    for j in (0..10).step_by(3) {
        c += j;
    }
    if NEG && n > 0 {
        t = -t;
    } else if n < 0 {
        t *= 2.0;
    } else {
        t = t.abs() * scale;
    }
    let a = alpha as f32;
    store(y, [r, 0], t + (c as f32) + a + (n << 1) as f32);
}

type T = kgen::runtime::Tensor;
type FeaturesLaunch = fn(
    &kgen::runtime::Stream,
    [u32; 3],
    &T,
    &T,
    f32,
    i32,
    f64,
) -> Result<(), kgen::runtime::RuntimeError>;

fn kg(name: &str) -> String {
    let path = format!("{}/kernels-src/{name}.kg", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("kernel source")
}

fn kg_ptx(name: &str, opts: &CompileOptions) -> String {
    let file = SourceFile::new(format!("{name}.kg"), kg(name));
    compile(&file, opts).expect("kernel compiles").ptx
}

#[test]
fn vec_add_matches_kg() {
    for arch in Arch::ALL {
        assert_eq!(
            vec_add::ptx(arch),
            kg_ptx("vec_add", &CompileOptions::new(arch))
        );
        let opts = CompileOptions::new(arch)
            .define("T", "bf16")
            .define("BLOCK", 300);
        let m = vec_add::compile(&opts).expect("macro kernel compiles").ptx;
        assert_eq!(m, kg_ptx("vec_add", &opts));
    }
}

#[test]
fn softmax_matches_kg() {
    for arch in Arch::ALL {
        assert_eq!(
            softmax::ptx(arch),
            kg_ptx("softmax", &CompileOptions::new(arch))
        );
        let opts = CompileOptions::new(arch)
            .define("T", "f16")
            .define("BLOCK", 512);
        let m = softmax::compile(&opts).expect("macro kernel compiles").ptx;
        assert_eq!(m, kg_ptx("softmax", &opts));
        // ONE_TILE: `true || ...` is a constant condition in both front ends, so only
        // the one-tile branch is compiled (a shorter kernel).
        let one = opts.clone().define("ONE_TILE", true);
        let m1 = softmax::compile(&one).expect("macro kernel compiles").ptx;
        assert_eq!(m1, kg_ptx("softmax", &one));
        assert!(m1.lines().count() < m.lines().count());
    }
}

#[test]
fn module_items() {
    assert_eq!(vec_add::NAME, "vec_add");
    assert!(vec_add::SOURCE.starts_with("kernel vec_add<T: float = f32, BLOCK: int = 1024>("));
    assert_eq!(
        kgen::core::front::parse(&SourceFile::new("a", vec_add::SOURCE))
            .expect("parses")
            .kernels
            .len(),
        1
    );
    for arch in Arch::ALL {
        let k = features::compile(&features::options(arch)).expect("compiles");
        assert!(
            k.entry
                .starts_with("features__T_f32__B_64__D_128__NEG_false"),
            "{}",
            k.entry
        );
    }
    // The launchers have the typed signatures (not called: no GPU needed).
    let _: FeaturesLaunch = features::launch;
}

/// The Debug text of a parsed module with every `Span { .. }` removed.
fn ast_without_spans(name: &str, text: &str) -> String {
    let m = kgen::core::front::parse(&SourceFile::new(name, text)).expect("parses");
    let s = format!("{m:?}");
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(i) = rest.find("Span { start: ") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        rest = &after[after.find('}').map_or(after.len(), |j| j + 1)..];
    }
    out.push_str(rest);
    out
}

#[test]
fn same_ast_as_kg() {
    assert_eq!(
        ast_without_spans("macro", vec_add::SOURCE),
        ast_without_spans("kg", &kg("vec_add"))
    );
    assert_eq!(
        ast_without_spans("macro", softmax::SOURCE),
        ast_without_spans("kg", &kg("softmax"))
    );
}

/// Parameters named like the launcher's own parameters and locals still give a
/// launcher that compiles.
#[kgen::kernel]
fn clashing_names(
    gpu: Tensor<f32, 1>,
    grid: Tensor<f32, 1>,
    compile: f32,
    args: i32,
    t: Tensor<f32, 1>,
) {
    let v = load(grid, [0], [64]) * compile + (args as f32) + load(t, [0], [64]);
    store(gpu, [0], v);
}

#[test]
fn clashing_names_compile() {
    let _ = clashing_names::launch;
    assert!(clashing_names::compile(&clashing_names::options(Arch::Sm80)).is_ok());
}

/// The typed launchers end to end on one device: results against values computed here
/// in f64, typed errors before launch.
fn launch_on(device: &kgen::runtime::Device) -> Vec<Vec<f64>> {
    use kgen::core::DType;
    let stream = device.stream();
    let n = 4001;
    let xs: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - 7.25).collect();
    let ys: Vec<f64> = (0..n).map(|i| 1.0 - i as f64 * 0.125).collect();
    let x = device.from_f64(DType::F32, &[n], &xs).unwrap();
    let y = device.from_f64(DType::F32, &[n], &ys).unwrap();
    let out = device
        .from_f64(DType::F32, &[n], &vec![f64::NAN; n])
        .unwrap();
    vec_add::launch(&stream, [4, 1, 1], &x, &y, &out).expect("launch");
    let got = out.to_f64_vec().unwrap();
    for i in 0..n {
        assert_eq!(got[i], xs[i] + ys[i], "element {i}");
    }
    // A wrong dtype, or an output aliasing an input, is refused before the launch.
    let bad = device.zeros(DType::I32, &[n]).unwrap();
    assert!(matches!(
        vec_add::launch(&stream, [4, 1, 1], &x, &y, &bad),
        Err(kgen::runtime::RuntimeError::Arg(
            kgen::runtime::ArgError::DtypeMismatch { .. }
        ))
    ));
    assert!(matches!(
        vec_add::launch(&stream, [4, 1, 1], &x, &y, &x),
        Err(kgen::runtime::RuntimeError::Arg(
            kgen::runtime::ArgError::Aliasing { .. }
        ))
    ));

    // Rows of 3000 columns take softmax's two-pass path with BLOCK = 1024.
    let (rows, cols) = (3, 3000);
    let vals: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 37 % 101) as f64) * 0.07 - 3.0)
        .collect();
    let sx = device.from_f64(DType::F32, &[rows, cols], &vals).unwrap();
    let sy = device
        .from_f64(DType::F32, &[rows, cols], &vec![f64::NAN; rows * cols])
        .unwrap();
    softmax::launch(&stream, [rows as u32, 1, 1], &sx, &sy).expect("softmax launch");
    let sm = sy.to_f64_vec().unwrap();
    for r in 0..rows {
        let row = &vals[r * cols..(r + 1) * cols];
        let m = row.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..cols {
            let want = (row[c] - m).exp() / z;
            assert!(
                (sm[r * cols + c] - want).abs() <= 1e-5 * want,
                "softmax [{r}, {c}]"
            );
        }
    }

    // Scalars of every kind reach the kernel: features stores t + c + alpha + 2n.
    let fx = device
        .from_f64(DType::F32, &[2, 128], &vec![1.0; 256])
        .unwrap();
    let fy = device
        .from_f64(DType::F32, &[2, 64], &vec![f64::NAN; 128])
        .unwrap();
    features::launch(&stream, [2, 1, 1], &fx, &fy, 3.0, 5, 0.25).expect("features");
    // n = 5 > 0 but NEG = false: else branch, t = |1| * 3; c = 0+3+6+9 = 18; 5 << 1 = 10.
    let f = fy.to_f64_vec().unwrap();
    assert_eq!(f[0], 3.0 + 18.0 + 0.25 + 10.0);
    vec![got, sm, f]
}

#[test]
fn launch_on_the_interpreter() {
    launch_on(&kgen::runtime::Device::interpreter());
}

/// The same on a GPU, compared with the interpreter; skipped (passes) without a driver.
#[test]
fn launch_on_gpu_if_present() {
    let gpu = match kgen::runtime::Device::cuda(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let on_gpu = launch_on(&gpu);
    let on_interp = launch_on(&kgen::runtime::Device::interpreter());
    assert_eq!(on_gpu[0], on_interp[0]);
    assert_eq!(on_gpu[2], on_interp[2]);
}

/// The example of docs/MACRO.md, verbatim.
mod doc_example {
    #[kgen::kernel]
    fn rmsnorm<T: Float = bf16, const BLOCK: i32 = 1024>(
        x: Tensor<T, 2, Contiguous>,
        w: Tensor<T, 1, Contiguous>,
        y: Tensor<T, 2, Contiguous>,
        eps: f32,
    ) {
        let row = bid(0);
        let xt = load(x, [row, 0], [1, BLOCK]).reshape([BLOCK]) as f32;
        let r = rsqrt(sum(xt * xt, 0) / (shape(x, 1) as f32) + eps);
        let wt = load(w, [0], [BLOCK]) as f32;
        store(y, [row, 0], (xt * r * wt).reshape([1, BLOCK]) as T);
    }

    #[test]
    fn doc_example_compiles_and_is_in_the_doc() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/MACRO.md")).unwrap();
        assert!(doc.contains("let r = rsqrt(sum(xt * xt, 0) / (shape(x, 1) as f32) + eps);"));
        for arch in [kgen::core::Arch::Sm80, kgen::core::Arch::Sm90a] {
            assert!(rmsnorm::ptx(arch).contains(".entry rmsnorm__T_bf16__BLOCK_1024"));
        }
    }
}

/// Eviction policies are names in both front ends (`eviction_policy = evict_last`).
#[kgen::kernel]
fn hinted_copy<const BLOCK: i32 = 1024>(
    x: Tensor<f32, 1, Contiguous>,
    y: Tensor<f32, 1, Contiguous>,
) {
    let i = bid(0);
    let a = load(x, [i], [BLOCK], pad = 1.0, eviction_policy = evict_last);
    store(y, [i], a, eviction_policy = evict_first);
}

const HINTED_COPY_KG: &str = "
kernel hinted_copy<BLOCK: int = 1024>(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let i = bid(0);
    let a = load(x, [i], [BLOCK], pad = 1.0, eviction_policy = evict_last);
    store(y, [i], a, eviction_policy = evict_first);
}
";

/// For every arch: the `.kg` text compiles to PTX containing `needle`, and the macro
/// form's PTX (`macro_ptx`) is identical to it.
fn assert_macro_matches_kg(kg_src: &str, macro_ptx: fn(Arch) -> String, needle: &str) {
    for arch in Arch::ALL {
        let file = SourceFile::new("inline.kg", kg_src);
        let kg = compile(&file, &CompileOptions::new(arch))
            .expect("compiles")
            .ptx;
        assert!(kg.contains(needle), "{kg}");
        assert_eq!(macro_ptx(arch), kg);
    }
}

#[test]
fn eviction_policies_match_kg() {
    assert_macro_matches_kg(HINTED_COPY_KG, hinted_copy::ptx, "L2::cache_hint");
}

/// Scratch buffers are builtins like any other in both front ends.
#[kgen::kernel]
fn cached_reverse<const BLOCK: i32 = 256>(
    x: Tensor<f32, 2, Contiguous>,
    y: Tensor<f32, 2, Contiguous>,
) {
    let row = bid(0);
    let cache = scratch(4, [1, BLOCK], f32);
    for k in 0..4 {
        scratch_store(cache, k, load(x, [row, k], [1, BLOCK]));
    }
    for k in 0..4 {
        store(y, [row, k], scratch_load(cache, 3 - k));
    }
}

const CACHED_REVERSE_KG: &str = "
kernel cached_reverse<BLOCK: int = 256>(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {
    let row = bid(0);
    let cache = scratch(4, [1, BLOCK], f32);
    for k in 0..4 {
        scratch_store(cache, k, load(x, [row, k], [1, BLOCK]));
    }
    for k in 0..4 {
        store(y, [row, k], scratch_load(cache, 3 - k));
    }
}
";

#[test]
fn scratch_buffers_match_kg() {
    assert_macro_matches_kg(CACHED_REVERSE_KG, cached_reverse::ptx, "st.shared");
}

/// Asynchronous fetches are builtins like any other in both front ends.
#[kgen::kernel]
fn fetched_copy<const BLOCK: i32 = 256>(
    x: Tensor<f32, 2, Contiguous>,
    y: Tensor<f32, 2, Contiguous>,
) {
    let row = bid(0);
    let buf = scratch(2, [1, BLOCK], f32);
    scratch_fetch(
        buf,
        0,
        x,
        [row, 0],
        pad = 0.0,
        eviction_policy = evict_first,
    );
    scratch_fetch(buf, 1, x, [row, 1]);
    scratch_wait(1);
    store(y, [row, 0], scratch_load(buf, 0));
    scratch_wait(0);
    store(y, [row, 1], scratch_load(buf, 1));
}

const FETCHED_COPY_KG: &str = "
kernel fetched_copy<BLOCK: int = 256>(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {
    let row = bid(0);
    let buf = scratch(2, [1, BLOCK], f32);
    scratch_fetch(buf, 0, x, [row, 0], pad = 0.0, eviction_policy = evict_first);
    scratch_fetch(buf, 1, x, [row, 1]);
    scratch_wait(1);
    store(y, [row, 0], scratch_load(buf, 0));
    scratch_wait(0);
    store(y, [row, 1], scratch_load(buf, 1));
}
";

#[test]
fn scratch_fetches_match_kg() {
    assert_macro_matches_kg(FETCHED_COPY_KG, fetched_copy::ptx, "cp.async.wait_group 1");
}

/// Offsets over aligned windows (vectorized gathers and scatters) and `scratch_gather`,
/// in both front ends.
#[kgen::kernel]
fn window_copy<const BLOCK: i32 = 256>(
    x: Tensor<bf16, 1, Contiguous>,
    y: Tensor<bf16, 1, Contiguous>,
    n: i32,
) {
    let start = (bid(0) as i64) * (n as i64);
    let wbase = (start / 8) * 8;
    let lead = (start - wbase) as i32;
    let rel = arange(0, BLOCK);
    let buf = scratch(1, [BLOCK], bf16);
    scratch_gather(
        buf,
        0,
        x,
        [wbase + (rel as i64)],
        mask = rel < BLOCK,
        other = 0.0,
        eviction_policy = evict_first,
    );
    scratch_wait(0);
    let v = scratch_load(buf, 0);
    scatter(
        y,
        [wbase + (rel as i64)],
        v,
        mask = rel >= lead && rel < lead + n,
    );
}

const WINDOW_COPY_KG: &str = "
kernel window_copy<BLOCK: int = 256>(x: tensor<bf16, 1, contiguous>, y: tensor<bf16, 1, contiguous>, n: i32) {
    let start = (bid(0) as i64) * (n as i64);
    let wbase = (start / 8) * 8;
    let lead = (start - wbase) as i32;
    let rel = arange(0, BLOCK);
    let buf = scratch(1, [BLOCK], bf16);
    scratch_gather(buf, 0, x, [wbase + (rel as i64)], mask = rel < BLOCK, other = 0.0, eviction_policy = evict_first);
    scratch_wait(0);
    let v = scratch_load(buf, 0);
    scatter(y, [wbase + (rel as i64)], v, mask = rel >= lead && rel < lead + n);
}
";

#[test]
fn scratch_gathers_and_vector_scatters_match_kg() {
    assert_macro_matches_kg(
        WINDOW_COPY_KG,
        window_copy::ptx,
        "cp.async.cg.shared.global",
    );
}

/// `barrier()` is a builtin like any other in both front ends.
#[kgen::kernel]
fn barrier_copy<const BLOCK: i32 = 512>(
    x: Tensor<f32, 1, Contiguous>,
    y: Tensor<f32, 1, Contiguous>,
) {
    let t = load(x, [bid(0)], [BLOCK]) * 2.0;
    barrier();
    store(y, [bid(0)], t);
}

const BARRIER_COPY_KG: &str = "
kernel barrier_copy<BLOCK: int = 512>(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {
    let t = load(x, [bid(0)], [BLOCK]) * 2.0;
    barrier();
    store(y, [bid(0)], t);
}
";

#[test]
fn barrier_matches_kg() {
    assert_macro_matches_kg(BARRIER_COPY_KG, barrier_copy::ptx, "bar.red.or.pred");
}

/// The issue-21 language features in both front ends: a compile-time float value
/// (`const EPS: f32`), `x.dtype`, `lowest`/`highest`, `item`, `erf`, `pow` (Rust has no
/// `**`: the `.kg` text below writes it, and both give `pow`), `maximum`/`minimum`,
/// `arange(n)` and reductions without an axis.
#[kgen::kernel]
fn port_features<const EPS: f32 = 1e-5, const BLOCK: i32 = 256>(
    x: Tensor<f32, 1, Contiguous>,
    xi: Tensor<i32, 1, Contiguous>,
    y: Tensor<f32, 1, Contiguous>,
    yi: Tensor<i32, 1, Contiguous>,
) {
    let i = bid(0);
    let v = load(x, [i], [BLOCK], pad = lowest(f32));
    let g = 0.5 * v * (1.0 + erf(v * 0.70710677));
    let m = item(load(x, [0], [1])) + max(v) + sum(maximum(v, 0)) + EPS;
    let c = cast(pow(v, 2) + minimum(v, 1.0), x.dtype);
    store(y, [i], g + c + m);
    let t = load(xi, [i], [BLOCK]);
    store(
        yi,
        [i],
        maximum(pow(t, 3), 0) + arange(BLOCK) + argmax(v) + (highest(i32) - highest(i32)),
    );
}

const PORT_FEATURES_KG: &str = "
kernel port_features<EPS: f32 = 1e-5, BLOCK: int = 256>(x: tensor<f32, 1, contiguous>, xi: tensor<i32, 1, contiguous>, y: tensor<f32, 1, contiguous>, yi: tensor<i32, 1, contiguous>) {
    let i = bid(0);
    let v = load(x, [i], [BLOCK], pad = lowest(f32));
    let g = 0.5 * v * (1.0 + erf(v * 0.70710677));
    let m = item(load(x, [0], [1])) + max(v) + sum(maximum(v, 0)) + EPS;
    let c = cast(v ** 2 + minimum(v, 1.0), x.dtype);
    store(y, [i], g + c + m);
    let t = load(xi, [i], [BLOCK]);
    store(yi, [i], maximum(t ** 3, 0) + arange(BLOCK) + argmax(v) + (highest(i32) - highest(i32)));
}
";

#[test]
fn port_features_match_kg() {
    assert_macro_matches_kg(PORT_FEATURES_KG, port_features::ptx, "ex2.approx.ftz.f32");
    // `-D EPS=...` reaches the macro's kernel too, with the same entry name.
    for arch in Arch::ALL {
        let file = SourceFile::new("inline.kg", PORT_FEATURES_KG);
        let opts = port_features::options(arch).define("EPS", "2.5e-4");
        let kg = compile(&file, &opts).expect("compiles");
        let m = port_features::compile(&opts).expect("compiles");
        assert_eq!(m.entry, kg.entry);
        assert!(
            m.entry
                .starts_with("port_features__EPS_0p00025__BLOCK_256__"),
            "{}",
            m.entry
        );
        assert_eq!(m.ptx, kg.ptx);
    }
}

/// Scans in both front ends: `combine = ...` names an op, `reverse` / `exclusive` take
/// constants (a generic too).
#[kgen::kernel]
fn scans<const EXCL: bool = true>(
    x: Tensor<f32, 2, Contiguous>,
    n: Tensor<i32, 2, Contiguous>,
    y: Tensor<f32, 2, Contiguous>,
    m: Tensor<i32, 2, Contiguous>,
) {
    let t = load(x, [bid(0), 0], [4, 300]);
    let c = cumsum(t, 1) + t.cummax(0, reverse = true) + cumprod(t, axis = 1, exclusive = EXCL);
    store(
        y,
        [bid(0), 0],
        c + scan(t, 1, combine = min, reverse = true, exclusive = false),
    );
    let k = load(n, [bid(0), 0], [4, 300]);
    let b = scan(k > 0, 1, combine = xor) as i32;
    store(
        m,
        [bid(0), 0],
        scan(k, 1, combine = and) + cummin(k, 0, exclusive = true) + b,
    );
}

const SCANS_KG: &str = "
kernel scans<EXCL: bool = true>(x: tensor<f32, 2, contiguous>, n: tensor<i32, 2, contiguous>, y: tensor<f32, 2, contiguous>, m: tensor<i32, 2, contiguous>) {
    let t = load(x, [bid(0), 0], [4, 300]);
    let c = cumsum(t, 1) + t.cummax(0, reverse = true) + cumprod(t, axis = 1, exclusive = EXCL);
    store(y, [bid(0), 0], c + scan(t, 1, combine = min, reverse = true, exclusive = false));
    let k = load(n, [bid(0), 0], [4, 300]);
    let b = scan(k > 0, 1, combine = xor) as i32;
    store(m, [bid(0), 0], scan(k, 1, combine = and) + cummin(k, 0, exclusive = true) + b);
}
";

#[test]
fn scans_match_kg() {
    assert_macro_matches_kg(SCANS_KG, scans::ptx, "shfl.sync.bfly.b32");
    assert_eq!(
        ast_without_spans("macro", scans::SOURCE),
        ast_without_spans("kg", SCANS_KG)
    );
}

/// `dot`'s input precision is a name in both front ends (`input_precision = tf32`).
#[kgen::kernel]
fn tf32_product<const BM: i32 = 32, const BN: i32 = 32, const BK: i32 = 16>(
    a: Tensor<f32, 2, Contiguous>,
    b: Tensor<f32, 2, Contiguous>,
    c: Tensor<f32, 2, Contiguous>,
) {
    let mut acc = zeros([BM, BN], f32);
    for k in 0..cdiv(shape(a, 1), BK) {
        let ta = load(a, [bid(0), k], [BM, BK]);
        let tb = load(b, [k, bid(1)], [BK, BN]);
        acc = dot(ta, tb, acc, input_precision = tf32);
    }
    store(c, [bid(0), bid(1)], acc);
}

const TF32_PRODUCT_KG: &str = "
kernel tf32_product<BM: int = 32, BN: int = 32, BK: int = 16>(
    a: tensor<f32, 2, contiguous>, b: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>,
) {
    let mut acc = zeros([BM, BN], f32);
    for k in 0..cdiv(shape(a, 1), BK) {
        let ta = load(a, [bid(0), k], [BM, BK]);
        let tb = load(b, [k, bid(1)], [BK, BN]);
        acc = dot(ta, tb, acc, input_precision = tf32);
    }
    store(c, [bid(0), bid(1)], acc);
}
";

#[test]
fn the_input_precision_of_dot_is_a_name_in_both_front_ends() {
    assert_macro_matches_kg(
        TF32_PRODUCT_KG,
        tf32_product::ptx,
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    );
}

/// A helper function written as an `fn` item inside the kernel (its parameter and
/// return types are not read: `_`), the same kernel as `.kg` text with a top-level `fn`.
#[kgen::kernel]
fn scaled_rows<const BLOCK: i32 = 256>(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    fn masked_scale(t: _, n: _, s: _, b: _) -> _ {
        let offs = arange(0, b);
        let mut r = t;
        for k in 0..2 {
            r = r * s + (k as f32);
        }
        r#where(offs < n, r, 0.0)
    }
    let i = bid(0);
    let t = load(x, [i], [BLOCK]);
    store(y, [i], masked_scale(t, shape(x, 0) - i * BLOCK, 2.0, BLOCK));
}

const SCALED_ROWS_KG: &str = r#"
fn masked_scale(t, n, s, b) {
    let offs = arange(0, b);
    let mut r = t;
    for k in 0..2 {
        r = r * s + (k as f32);
    }
    return where(offs < n, r, 0.0);
}
kernel scaled_rows<BLOCK: int = 256>(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    let t = load(x, [i], [BLOCK]);
    store(y, [i], masked_scale(t, shape(x, 0) - i * BLOCK, 2.0, BLOCK));
}
"#;

#[test]
fn helper_functions_match_kg() {
    assert!(
        scaled_rows::SOURCE.starts_with("fn masked_scale(t, n, s, b) {"),
        "{}",
        scaled_rows::SOURCE
    );
    let file = SourceFile::new("scaled_rows.kg", SCALED_ROWS_KG);
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let opts = scaled_rows::options(arch);
        let m = scaled_rows::compile(&opts)
            .expect("macro kernel compiles")
            .ptx;
        assert_eq!(m, compile(&file, &opts).expect("kg compiles").ptx);
    }
}

/// A helper returning two values, bound with `let [a, b]` (a slice pattern in Rust).
#[kgen::kernel]
fn halves(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    fn split(t: _, s: _) -> _ {
        [t * s, t * (1.0 - s)]
    }
    let [lo, hi] = split(load(x, [bid(0)], [64]), 0.25);
    let [mut a, mut b] = split(lo, 0.5);
    a += hi;
    b += hi;
    store(y, [bid(0)], a + b);
}

const HALVES_KG: &str = r#"
fn split(t, s) {
    return [t * s, t * (1.0 - s)];
}
kernel halves(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let [lo, hi] = split(load(x, [bid(0)], [64]), 0.25);
    let mut [a, b] = split(lo, 0.5);
    a += hi;
    b += hi;
    store(y, [bid(0)], a + b);
}
"#;

#[test]
fn list_returns_match_kg() {
    let file = SourceFile::new("halves.kg", HALVES_KG);
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let opts = halves::options(arch);
        let m = halves::compile(&opts).expect("macro kernel compiles").ptx;
        assert_eq!(m, compile(&file, &opts).expect("kg compiles").ptx);
    }
}

/// Two kernels sharing a helper: `#[kgen::kernels]` on a module, the helper a plain
/// `fn` beside them (and one kernel with a nested helper of its own), against the same
/// `.kg` file compiled for each kernel.
#[kgen::kernels]
mod rows {
    /// `t` clamped to `[-c, c]`, with the lanes past `n` zeroed.
    fn clamp_rows(t: _, n: _, c: _, b: _) -> _ {
        let offs = arange(0, b);
        r#where(offs < n, minimum(maximum(t, -c), c), 0.0)
    }

    /// Clamps each row of 256 elements.
    #[kernel]
    pub fn clamp<const BLOCK: i32 = 256>(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
        let i = bid(0);
        let t = load(x, [i], [BLOCK]);
        store(y, [i], clamp_rows(t, shape(x, 0) - i * BLOCK, 1.5, BLOCK));
    }

    /// Clamps and doubles, through a helper of its own too.
    #[kernel]
    pub fn clamp2<const BLOCK: i32 = 128>(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
        fn twice(t: _) -> _ {
            t + t
        }
        let i = bid(0);
        let t = twice(load(x, [i], [BLOCK]));
        store(y, [i], clamp_rows(t, shape(x, 0) - i * BLOCK, 3.0, BLOCK));
    }
}

const ROWS_KG: &str = r#"
fn clamp_rows(t, n, c, b) {
    let offs = arange(0, b);
    return where(offs < n, minimum(maximum(t, -c), c), 0.0);
}
fn twice(t) {
    return t + t;
}
kernel clamp<BLOCK: int = 256>(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    let t = load(x, [i], [BLOCK]);
    store(y, [i], clamp_rows(t, shape(x, 0) - i * BLOCK, 1.5, BLOCK));
}
kernel clamp2<BLOCK: int = 128>(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    let t = twice(load(x, [i], [BLOCK]));
    store(y, [i], clamp_rows(t, shape(x, 0) - i * BLOCK, 3.0, BLOCK));
}
"#;

#[test]
fn kernels_in_one_module_share_helpers() {
    // Each kernel's source holds the shared helper; only `clamp2`'s its nested one.
    assert!(rows::clamp::SOURCE.starts_with("fn clamp_rows(t, n, c, b) {"));
    assert!(!rows::clamp::SOURCE.contains("fn twice"));
    assert!(rows::clamp2::SOURCE.contains("fn twice(t) {"));
    let file = SourceFile::new("rows.kg", ROWS_KG);
    for arch in [Arch::Sm80, Arch::Sm90a] {
        for (name, m) in [
            ("clamp", rows::clamp::compile(&rows::clamp::options(arch))),
            (
                "clamp2",
                rows::clamp2::compile(&rows::clamp2::options(arch)),
            ),
        ] {
            let kg = compile(&file, &CompileOptions::new(arch).kernel(name)).expect("kg compiles");
            assert_eq!(
                m.expect("macro kernel compiles").ptx,
                kg.ptx,
                "{name} {arch:?}"
            );
        }
    }
}

/// docs/MACRO.md's `#[kgen::kernels]` example is the `rows` module above, verbatim.
#[test]
fn the_kernels_module_example_of_the_docs_is_this_test() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/MACRO.md")).expect("docs/MACRO.md");
    let me = std::fs::read_to_string(root.join("tests/macro_parity.rs")).expect("this file");
    let start = doc
        .find("#[kgen::kernels]\nmod rows {")
        .expect("the example");
    let end = start + doc[start..].find("\n}\n").expect("its end") + 3;
    assert!(
        me.contains(&doc[start..end]),
        "docs/MACRO.md's example differs from `rows`"
    );
}
