//! `kgen run`: one kernel on random inputs, in the interpreter and (when there is one)
//! on the GPU, with a comparison of the two; `--bench` times it on the GPU instead
//! (`run_bench`).

use super::common::{
    checked_options, fmt_err, open_gpu, print_diags, read_source, say, CliError, CliResult,
};
use super::RunArgs;
use kgen::cases::compare::compare_values;
use kgen::cases::{Rng, Tolerance};
use kgen::core::abi::SourceParam;
use kgen::core::host::{scalar_from_f64, ArgValue, HostTensor};
use kgen::core::ir::{Function, ParamKind};
use kgen::core::types::{DType, Scalar};
use kgen::core::{compile_to_ir, interp, Arch};
use kgen::runtime::natural_alignment;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The most elements `kgen run` allocates for one tensor.
const MAX_ELEMENTS: usize = 1 << 30;

fn param_hint(name: &str, kind: &ParamKind) -> String {
    match kind {
        ParamKind::Scalar(d) => {
            let ex = match d {
                DType::Bool => "true",
                d if d.is_float() => "1e-5",
                _ => "42",
            };
            format!("{name}: {d} (e.g. --arg {name}={ex})")
        }
        ParamKind::Tensor(t) => {
            let dims: Vec<String> = t
                .dims
                .iter()
                .map(|d| d.map_or("_".to_string(), |v| v.to_string()))
                .collect();
            let ex: Vec<String> = t
                .dims
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    d.map_or(
                        if i == 0 {
                            "1000".to_string()
                        } else {
                            "512".to_string()
                        },
                        |v| v.to_string(),
                    )
                })
                .collect();
            format!(
                "{name}: tensor<{}, [{}]{}> (e.g. --arg {name}={})",
                t.dtype,
                dims.join(", "),
                if t.contiguous { ", contiguous" } else { "" },
                ex.join("x")
            )
        }
    }
}

fn params_help(func: &Function) -> String {
    let lines: Vec<String> = func
        .params
        .iter()
        .map(|p| format!("  {}", param_hint(&p.name, &p.kind)))
        .collect();
    format!("`{}` takes:\n{}", func.source_name, lines.join("\n"))
}

fn parse_shape(name: &str, spec: &str, dims: &[Option<u32>]) -> Result<Vec<usize>, String> {
    let parts: Vec<&str> = spec.split(['x', 'X', ',']).map(str::trim).collect();
    let mut shape = Vec::with_capacity(parts.len());
    for p in &parts {
        shape.push(p.parse::<usize>().map_err(|_| {
            format!("--arg {name}={spec}: `{p}` is not an extent (a tensor takes a shape such as `1000x4097`)")
        })?);
    }
    if shape.len() != dims.len() {
        return Err(format!(
            "--arg {name}={spec}: `{name}` has rank {}, the shape has {} dimension(s)",
            dims.len(),
            shape.len()
        ));
    }
    for (i, (d, &s)) in dims.iter().zip(&shape).enumerate() {
        if let Some(c) = d {
            if *c as usize != s {
                return Err(format!(
                    "--arg {name}={spec}: dimension {i} of `{name}` is declared as {c}, got {s}"
                ));
            }
        }
    }
    let n = shape.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s));
    match n {
        Some(n) if n <= MAX_ELEMENTS => Ok(shape),
        _ => Err(format!(
            "--arg {name}={spec}: more than {MAX_ELEMENTS} elements"
        )),
    }
}

fn parse_scalar(name: &str, spec: &str, dtype: DType) -> Result<Scalar, String> {
    let bad = || format!("--arg {name}={spec}: not a {dtype} value");
    let s = spec.trim();
    match dtype {
        DType::Bool => match s {
            "true" | "1" => Ok(Scalar::Bool(true)),
            "false" | "0" => Ok(Scalar::Bool(false)),
            _ => Err(bad()),
        },
        d if d.is_int() => {
            let (neg, digits) = match s.strip_prefix('-') {
                Some(r) => (true, r),
                None => (false, s),
            };
            let digits = digits.replace('_', "");
            let v = match digits
                .strip_prefix("0x")
                .or_else(|| digits.strip_prefix("0X"))
            {
                Some(h) => i128::from_str_radix(h, 16),
                None => digits.parse::<i128>(),
            }
            .map_err(|_| bad())?;
            let v = if neg { -v } else { v };
            let (lo, hi) = match d {
                DType::I32 => (i32::MIN as i128, i32::MAX as i128),
                DType::U32 => (0, u32::MAX as i128),
                _ => (i64::MIN as i128, i64::MAX as i128),
            };
            if v < lo || v > hi {
                return Err(format!("--arg {name}={spec}: out of range for {d}"));
            }
            Ok(Scalar::Int(v as i64, d))
        }
        d => {
            let v: f64 = match s {
                "inf" | "+inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" => f64::NAN,
                _ => s.parse::<f64>().map_err(|_| bad())?,
            };
            Ok(scalar_from_f64(d, v))
        }
    }
}

/// Random contents: floats uniform in [-1, 1), signed integers in [-8, 8), unsigned in
/// [0, 16), bools half and half; one draw of `rng` per element, in row-major order.
/// Large tensors are drawn in pieces on every core (each piece from the stream's copy
/// that many draws ahead), with the same values as one sequential pass.
fn random_tensor(rng: &mut Rng, dtype: DType, shape: &[usize]) -> HostTensor {
    const PIECE: usize = 1 << 20;
    let n: usize = shape.iter().product();
    let draw = |rng: &mut Rng| match dtype {
        d if d.is_float() => rng.uniform(-1.0, 1.0),
        DType::U32 => (rng.next_u64() % 16) as f64,
        DType::Bool => (rng.next_u64() & 1) as f64,
        _ => (rng.next_u64() % 16) as f64 - 8.0,
    };
    let mut t = HostTensor::zeros(dtype, shape);
    let es = dtype.size_bytes() as usize;
    let pieces: Vec<(usize, &mut [u8])> = t
        .data
        .chunks_mut(PIECE * es)
        .enumerate()
        .map(|(i, c)| (i * PIECE, c))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per_thread = pieces.len().div_ceil(threads).max(1);
    let base = &*rng;
    std::thread::scope(|s| {
        let mut pieces = pieces;
        while !pieces.is_empty() {
            let mine: Vec<(usize, &mut [u8])> =
                pieces.drain(..per_thread.min(pieces.len())).collect();
            s.spawn(move || {
                for (start, bytes) in mine {
                    let len = bytes.len() / es;
                    let mut r = base.ahead(start as u64);
                    let vals: Vec<f64> = (0..len).map(|_| draw(&mut r)).collect();
                    bytes.copy_from_slice(&HostTensor::from_f64(dtype, &[len], &vals).data);
                }
            });
        }
    });
    *rng = rng.ahead(n as u64);
    t
}

/// The arguments, in parameter order, and for each whether it is random data (only
/// random pure outputs are poisoned: an --input array is the user's).
fn build_args(
    func: &Function,
    given: &[(String, String)],
    inputs: &[(String, PathBuf)],
    seed: u64,
) -> Result<(Vec<ArgValue>, Vec<bool>), String> {
    for (i, (n, _)) in given.iter().enumerate() {
        if given[..i].iter().any(|(m, _)| m == n) {
            return Err(format!("--arg {n} is given twice"));
        }
        if !func.params.iter().any(|p| &p.name == n) {
            return Err(format!(
                "`{}` has no parameter `{n}`\n{}",
                func.source_name,
                params_help(func)
            ));
        }
    }
    for (i, (n, path)) in inputs.iter().enumerate() {
        if inputs[..i].iter().any(|(m, _)| m == n) {
            return Err(format!("--input {n} is given twice"));
        }
        match func.params.iter().find(|p| &p.name == n) {
            None => {
                return Err(format!(
                    "--input {n}={}: `{}` has no parameter `{n}`\n{}",
                    path.display(),
                    func.source_name,
                    params_help(func)
                ))
            }
            Some(p) if matches!(p.kind, ParamKind::Scalar(_)) => {
                return Err(format!(
                    "--input {n}={}: `{n}` is a scalar; give its value with --arg\n  {}",
                    path.display(),
                    param_hint(n, &p.kind)
                ))
            }
            Some(_) => {}
        }
        if let Some((_, spec)) = given.iter().find(|(m, _)| m == n) {
            return Err(format!(
                "`{n}` is given twice: --arg {n}={spec} and --input {n}={}; give one",
                path.display()
            ));
        }
    }
    let missing: Vec<String> = func
        .params
        .iter()
        .filter(|p| {
            !given.iter().any(|(n, _)| n == &p.name) && !inputs.iter().any(|(n, _)| n == &p.name)
        })
        .map(|p| format!("  {}", param_hint(&p.name, &p.kind)))
        .collect();
    if !missing.is_empty() {
        return Err(format!("missing --arg for:\n{}", missing.join("\n")));
    }
    let mut rng = Rng::new(seed);
    let mut args = Vec::with_capacity(func.params.len());
    let mut random = Vec::with_capacity(func.params.len());
    // `grid_sync` counters start at 0, never random (a random count would release the
    // grid early or never).
    let mut counters = std::collections::HashSet::new();
    kgen_core::ir::visit_insts(func, vec![&func.body], |op| {
        if let kgen_core::ir::Op::GridSync { counter } = op {
            counters.insert(*counter as usize);
        }
    });
    for (index, p) in func.params.iter().enumerate() {
        if let Some((_, path)) = inputs.iter().find(|(n, _)| n == &p.name) {
            let ParamKind::Tensor(t) = &p.kind else {
                return Err(format!("--input {}: not a tensor", p.name));
            };
            args.push(ArgValue::Tensor(super::npy::read_input(
                &p.name,
                path,
                t.dtype,
                &t.dims,
                MAX_ELEMENTS,
            )?));
            random.push(false);
            continue;
        }
        let spec = &given
            .iter()
            .find(|(n, _)| n == &p.name)
            .ok_or_else(|| format!("internal: no --arg for `{}`", p.name))?
            .1;
        args.push(match &p.kind {
            ParamKind::Scalar(d) => ArgValue::Scalar(parse_scalar(&p.name, spec, *d)?),
            ParamKind::Tensor(t) if counters.contains(&index) => {
                let shape = parse_shape(&p.name, spec, &t.dims)?;
                random.push(false);
                args.push(ArgValue::Tensor(HostTensor::zeros(t.dtype, &shape)));
                continue;
            }
            ParamKind::Tensor(t) => {
                let shape = parse_shape(&p.name, spec, &t.dims)?;
                ArgValue::Tensor(random_tensor(&mut rng, t.dtype, &shape))
            }
        });
        random.push(true);
    }
    Ok((args, random))
}

/// Writes every output tensor to `dir/NAME.npy`; notes (bf16 as f32) go to stderr.
fn save_outputs(
    dir: &Path,
    func: &Function,
    outputs: &[usize],
    args: &[ArgValue],
    from: &str,
) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        CliError::Msg(format!(
            "--save-outputs: cannot create `{}`: {e}",
            dir.display()
        ))
    })?;
    let mut written = Vec::new();
    for &i in outputs {
        let Some(t) = tensor(&args[i]) else { continue };
        let path = dir.join(format!("{}.npy", func.params[i].name));
        if let Some(note) = super::npy::write_output(&path, t).map_err(CliError::Msg)? {
            eprintln!("note: {note}");
        }
        written.push(path.display().to_string());
    }
    if !written.is_empty() {
        say(format_args!(
            "saved the {from}'s outputs: {}",
            written.join(", ")
        ));
    }
    Ok(())
}

fn tensor(a: &ArgValue) -> Option<&HostTensor> {
    match a {
        ArgValue::Tensor(t) => Some(t),
        ArgValue::Scalar(_) => None,
    }
}

fn summary(t: &HostTensor) -> String {
    let v = t.to_f64_vec();
    let nans = v.iter().filter(|x| x.is_nan()).count();
    let sum: f64 = v.iter().filter(|x| !x.is_nan()).sum();
    let first: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    format!(
        "checksum {sum:.6e}, first [{}{}]{}",
        first.join(", "),
        if v.len() > 6 { ", ..." } else { "" },
        if nans > 0 {
            format!(", {nans} NaN (unwritten or computed NaN)")
        } else {
            String::new()
        }
    )
}

/// GPU vs interpreter: f32 allows a few ulp of the approximate transcendentals; half
/// types about one ulp of rounding more. The absolute part is at least one rounding
/// unit of the output's largest magnitude (`want`'s): an element that is a sum taken in
/// another order (a reduction, a tensor-core product, attention's weighted average)
/// carries the rounding of its largest terms, however small it ends up (a near-zero
/// element of a bf16 attention output differed by 2.4e-4 where its largest was 3).
fn run_tolerance(dtype: DType, want: &[f64]) -> Tolerance {
    let base = Tolerance {
        rel: 1e-4,
        abs: 1e-5,
    };
    let unit = match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-22),
    };
    let largest = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    match dtype {
        d if d.is_float() => {
            let t = Tolerance::for_dtype(d, base);
            Tolerance {
                abs: t.abs.max(unit * largest),
                ..t
            }
        }
        _ => Tolerance { rel: 0.0, abs: 0.0 },
    }
}

pub fn run(a: RunArgs) -> CliResult {
    let file = read_source(&a.file)?;
    let (gpu, no_gpu_why) = if a.no_gpu {
        (None, "--no-gpu".to_string())
    } else {
        match open_gpu() {
            Ok(g) => (Some(g), String::new()),
            Err(why) => (None, why),
        }
    };
    let arch = a
        .arch
        .or_else(|| gpu.as_ref().and_then(|g| g.arch()))
        .unwrap_or(Arch::Sm90a);
    let mut opts = checked_options(&file, arch, &a.spec)?;
    let (mut func, _) = compile_to_ir(&file, &opts).map_err(|d| {
        print_diags(&d, &file);
        CliError::Exit(1)
    })?;
    let Some(grid) = a.grid else {
        return Err(CliError::Msg(format!(
            "--grid is required: the number of blocks along each grid axis (`bid(axis)` ranges over \
             it), e.g. `--grid 64` or `--grid 8,4`. A kernel that handles BLOCK elements per block \
             needs cdiv(n, BLOCK) blocks.\n{}",
            params_help(&func)
        )));
    };
    let (mut args, random) = build_args(&func, &a.args, &a.inputs, a.seed)?;

    // Specialize for the alignment the inputs really have (the default assumes 16 bytes).
    let mut realigned = Vec::new();
    for (p, arg) in func.params.iter().zip(&args) {
        if let (ParamKind::Tensor(tp), ArgValue::Tensor(t)) = (&p.kind, arg) {
            if opts.tensor_align.iter().any(|(n, _)| n == &p.name) {
                continue;
            }
            let nat = natural_alignment(t, tp.contiguous);
            if nat < tp.align_bytes {
                opts.tensor_align.push((p.name.clone(), nat));
                realigned.push(format!("{}={nat}", p.name));
            }
        }
    }
    if !realigned.is_empty() {
        say(format_args!(
            "note: compiling for the inputs' alignment (--align {})",
            realigned.join(" --align ")
        ));
        func = compile_to_ir(&file, &opts)
            .map_err(|d| {
                print_diags(&d, &file);
                CliError::Exit(1)
            })?
            .0;
    }
    let kernel = kgen::core::compile(&file, &opts).map_err(|d| {
        print_diags(&d, &file);
        CliError::Exit(1)
    })?;
    for n in &kernel.notes {
        eprintln!("note: {n}");
    }
    // Outputs: tensors the kernel writes. Pure outputs of random data start poisoned
    // (NaN); an --input array is kept as given.
    let outputs: Vec<usize> = kernel
        .abi
        .source_params
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, SourceParam::Tensor { written: true, .. }))
        .map(|(i, _)| i)
        .collect();
    for &i in &outputs {
        if let (SourceParam::Tensor { read: false, .. }, ArgValue::Tensor(t), true) =
            (&kernel.abi.source_params[i], &mut args[i], random[i])
        {
            t.poison(0xFF);
        }
    }
    say(format_args!(
        "kernel {} ({}), grid [{}, {}, {}], {} threads/block",
        kernel.entry, kernel.arch, grid[0], grid[1], grid[2], kernel.launch.threads_per_block
    ));
    if let Some(runs) = a.bench {
        if gpu.is_none() {
            return Err(CliError::Msg(format!(
                "--bench times the kernel on a GPU, and there is none ({no_gpu_why})"
            )));
        }
        return super::run_bench::time_kernel(&file, &opts, &args, grid, runs);
    }

    let mut iargs = args.clone();
    let t0 = Instant::now();
    interp::run(&func, grid, &mut iargs).map_err(|e| CliError::Msg(format!("interpreter: {e}")))?;
    say(format_args!(
        "interpreter: {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    ));

    let mut gargs = None;
    if let Some(g) = &gpu {
        let loaded = g.load(&kernel).map_err(|e| CliError::Msg(e.to_string()))?;
        let mut ga = args.clone();
        let stats = g
            .run(&loaded, grid, &mut ga)
            .map_err(|e| CliError::Msg(e.to_string()))?;
        say(format_args!(
            "GPU {}: kernel {:.4} ms ({} registers/thread{})",
            g.info().name,
            stats.kernel_ms,
            loaded.num_regs,
            if loaded.local_bytes > 0 {
                format!(
                    ", {} bytes/thread of local memory: spills",
                    loaded.local_bytes
                )
            } else {
                String::new()
            }
        ));
        gargs = Some(ga);
    }

    let mut mismatches = 0;
    for &i in &outputs {
        let name = &func.params[i].name;
        let Some(it) = tensor(&iargs[i]) else {
            continue;
        };
        say(format_args!("output `{name}`: {} {:?}", it.dtype, it.shape));
        say(format_args!("  interpreter: {}", summary(it)));
        if let Some(ga) = &gargs {
            let Some(gt) = tensor(&ga[i]) else { continue };
            say(format_args!("  GPU:         {}", summary(gt)));
            let want = it.to_f64_vec();
            let c = compare_values(i, &gt.to_f64_vec(), &want, run_tolerance(it.dtype, &want));
            let ok = c.num_failed == 0;
            if !ok {
                mismatches += 1;
            }
            say(format_args!(
                "  GPU vs interpreter: max abs {}, max rel {}, {} of {} outside tolerance{}: {}",
                fmt_err(Some(c.max_abs_err)),
                fmt_err(Some(c.max_rel_err)),
                c.num_failed,
                c.len,
                c.first_failure
                    .map(|m| format!(" (first at {}: GPU {} vs {})", m.index, m.got, m.want))
                    .unwrap_or_default(),
                if ok { "ok" } else { "MISMATCH" }
            ));
        }
    }
    if outputs.is_empty() {
        say("the kernel writes no tensor");
    }
    if let Some(dir) = &a.save_outputs {
        match &gargs {
            Some(ga) => save_outputs(dir, &func, &outputs, ga, "GPU")?,
            None => save_outputs(dir, &func, &outputs, &iargs, "interpreter")?,
        }
    }
    if gpu.is_none() {
        say(format_args!(
            "no GPU: ran on the interpreter only ({no_gpu_why})"
        ));
    }
    if mismatches > 0 {
        return Err(CliError::Msg(format!(
            "{mismatches} output(s) differ between the GPU and the interpreter"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A near-zero element of a 16-bit output is judged against the output's largest
    /// magnitude (one rounding unit of it), not only against itself; a real error still
    /// fails, and f32 and integer outputs keep their tight tolerances.
    #[test]
    fn run_tolerance_scales_with_the_largest_output() {
        use kgen::cases::compare::within;
        let want = [3.0, -0.000437, 1.5];
        let t = run_tolerance(DType::BF16, &want);
        assert!(within(-0.000452, -0.000437, t));
        assert!(!within(0.02, -0.000437, t));
        assert!(!within(3.1, 3.0, t));
        let t32 = run_tolerance(DType::F32, &want);
        assert!(!within(-0.000452, -0.000437, t32));
        let ti = run_tolerance(DType::I32, &want);
        assert!(!within(1.0, 0.0, ti));
    }

    #[test]
    fn shapes_and_scalars() {
        assert_eq!(
            parse_shape("x", "1000x4097", &[None, None]),
            Ok(vec![1000, 4097])
        );
        assert_eq!(parse_shape("x", "7", &[None]), Ok(vec![7]));
        assert!(parse_shape("x", "7x3", &[None])
            .unwrap_err()
            .contains("rank 1"));
        assert!(parse_shape("w", "100", &[Some(64)])
            .unwrap_err()
            .contains("declared as 64"));
        assert!(parse_shape("x", "ax3", &[None, None]).is_err());
        assert!(parse_shape("x", "100000x100000", &[None, None]).is_err());
        assert_eq!(
            parse_scalar("n", "42", DType::I32),
            Ok(Scalar::Int(42, DType::I32))
        );
        assert_eq!(
            parse_scalar("n", "-0x10", DType::I32),
            Ok(Scalar::Int(-16, DType::I32))
        );
        assert!(parse_scalar("n", "3000000000", DType::I32).is_err());
        assert_eq!(
            parse_scalar("n", "3000000000", DType::U32),
            Ok(Scalar::Int(3_000_000_000, DType::U32))
        );
        assert!(parse_scalar("n", "-1", DType::U32).is_err());
        assert_eq!(
            parse_scalar("f", "true", DType::Bool),
            Ok(Scalar::Bool(true))
        );
        assert_eq!(
            parse_scalar("e", "1e-5", DType::F32),
            Ok(Scalar::Float(1e-5f32 as f64, DType::F32))
        );
        assert!(parse_scalar("e", "x", DType::F32).is_err());
        assert!(
            matches!(parse_scalar("e", "-inf", DType::BF16), Ok(Scalar::Float(v, DType::BF16)) if v == f64::NEG_INFINITY)
        );
    }

    #[test]
    fn random_data_has_the_dtype_and_range() {
        let mut rng = Rng::new(3);
        let t = random_tensor(&mut rng, DType::BF16, &[5, 7]);
        assert_eq!(t.shape, vec![5, 7]);
        assert!(t.to_f64_vec().iter().all(|v| (-1.0..1.0).contains(v)));
        let t = random_tensor(&mut rng, DType::U32, &[100]);
        assert!(t.to_f64_vec().iter().all(|v| (0.0..16.0).contains(v)));
    }

    /// Drawn in pieces on several threads, a tensor larger than a piece holds the values
    /// of one sequential pass, and the stream goes on after it as after that pass.
    #[test]
    fn random_data_in_pieces_is_one_sequential_pass() {
        let n = (1 << 20) * 2 + 12345;
        let mut rng = Rng::new(9);
        let t = random_tensor(&mut rng, DType::F32, &[n]);
        let mut seq = Rng::new(9);
        let want: Vec<f64> = (0..n)
            .map(|_| seq.uniform(-1.0, 1.0) as f32 as f64)
            .collect();
        assert_eq!(t.to_f64_vec(), want);
        assert_eq!(rng.next_u64(), seq.next_u64());
    }
}
