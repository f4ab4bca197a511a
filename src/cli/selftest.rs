//! `kgen selftest`: every bundled kernel's cases (from `kgen::cases`), interpreter vs the
//! float64 reference, and on a GPU also GPU vs interpreter and GPU vs reference.

use super::common::{fmt_err, open_gpu, say, CliError, CliResult};
use super::SelftestArgs;
use kgen::cases::{all_cases, compare_against, output_values, Case, SizeSet};
use kgen::core::ir::Function;
use kgen::core::{compile_to_ir, interp, Arch, CompiledKernel, SourceFile};
use kgen::runtime::{Gpu, LoadedKernel};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::time::Instant;

/// "kgen" in ASCII.
pub const DEFAULT_SEED: u64 = 0x6b67_656e;

/// The source of `kernels-src/<stem>.kg`: from `$KGEN_KERNELS_DIR` when set (to test
/// edited kernels without rebuilding), else the copy embedded at build time
/// (`src/cases/lang.kg` for the language cases).
fn kernel_source(stem: &str) -> Result<SourceFile, String> {
    let bundled = kgen::bundled::source(stem).is_some();
    if let (Some(dir), true) = (std::env::var_os("KGEN_KERNELS_DIR"), bundled) {
        let path = std::path::Path::new(&dir).join(format!("{stem}.kg"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        return Ok(SourceFile::new(path.display().to_string(), text));
    }
    let name = kgen::cases::sources::kernel_file_name(stem);
    kgen::cases::kernel_source(stem)
        .map(|t| SourceFile::new(name.clone(), t))
        .ok_or_else(|| format!("no kernel file `{name}`"))
}

struct Compiled {
    func: Function,
    kernel: CompiledKernel,
    loaded: Option<LoadedKernel>,
}

/// One line of the table.
struct Row {
    interp_ref: Option<f64>,
    gpu_interp: Option<f64>,
    gpu_ref: Option<f64>,
    ms: Option<f32>,
    problems: Vec<String>,
}

impl Row {
    fn new() -> Row {
        Row {
            interp_ref: None,
            gpu_interp: None,
            gpu_ref: None,
            ms: None,
            problems: Vec::new(),
        }
    }
}

type Cache = HashMap<String, Rc<Result<Compiled, String>>>;

fn compile_case(
    case: &Case,
    arch: Arch,
    gpu: Option<&Gpu>,
    cache: &mut Cache,
) -> Rc<Result<Compiled, String>> {
    let opts = case.compile_options(arch);
    let key = format!(
        "{}|{:?}|{:?}|{:?}|{:?}|{:?}",
        case.kernel, opts.kernel, opts.defines, opts.tensor_align, opts.num_warps, arch
    );
    if let Some(c) = cache.get(&key) {
        return c.clone();
    }
    let result = (|| -> Result<Compiled, String> {
        let file = kernel_source(case.kernel)?;
        let (func, _) = compile_to_ir(&file, &opts)
            .map_err(|d| format!("compile error:\n{}", d.render(&file)))?;
        let kernel = kgen::core::compile(&file, &opts)
            .map_err(|d| format!("compile error:\n{}", d.render(&file)))?;
        let loaded = match gpu {
            Some(g) => Some(g.load(&kernel).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Compiled {
            func,
            kernel,
            loaded,
        })
    })();
    let rc = Rc::new(result);
    cache.insert(key, rc.clone());
    rc
}

fn run_case(case: &Case, arch: Arch, gpu: Option<&Gpu>, cache: &mut Cache) -> Row {
    let mut row = Row::new();
    let needs_clusters = case.kernel_name.is_some_and(|k| k.contains("_cluster"))
        || case.defines.iter().any(|(k, v)| k == "CLUSTER" && v != "1");
    if needs_clusters && !arch.target().caps.clusters {
        row.problems.push(format!(
            "note: skipped on {arch} (thread-block clusters need sm_90a)"
        ));
        return row;
    }
    let compiled = compile_case(case, arch, gpu, cache);
    let c = match compiled.as_ref() {
        Ok(c) => c,
        Err(e) => {
            row.problems.push(e.clone());
            return row;
        }
    };
    let want = case.expected();
    let mut iargs = case.args.clone();
    let interp_out = match interp::run(&c.func, case.grid, &mut iargs) {
        Ok(()) => {
            let r = compare_against(&iargs, &want, case);
            row.interp_ref = Some(r.max_rel_err());
            if !r.passed() {
                row.problems.push(format!("interpreter vs reference: {r}"));
            }
            output_values(&iargs, case).ok()
        }
        Err(e) => {
            row.problems.push(format!("interpreter: {e}"));
            None
        }
    };
    if let (Some(g), Some(loaded)) = (gpu, &c.loaded) {
        if loaded.local_bytes > 0 {
            // Not a failure, but worth seeing.
            row.problems.push(format!(
                "note: {} spills ({} bytes/thread of local memory)",
                c.kernel.entry, loaded.local_bytes
            ));
        }
        let mut gargs = case.args.clone();
        match g.run(loaded, case.grid, &mut gargs) {
            Ok(stats) => {
                row.ms = Some(stats.kernel_ms);
                if let Some(io) = &interp_out {
                    let r = compare_against(&gargs, io, case);
                    row.gpu_interp = Some(r.max_rel_err());
                    if !r.passed() {
                        row.problems.push(format!("GPU vs interpreter: {r}"));
                    }
                }
                let r = compare_against(&gargs, &want, case);
                row.gpu_ref = Some(r.max_rel_err());
                if !r.passed() {
                    row.problems.push(format!("GPU vs reference: {r}"));
                }
            }
            Err(e) => row.problems.push(format!("GPU: {e}")),
        }
    }
    row
}

fn passed(row: &Row) -> bool {
    row.problems.iter().all(|p| p.starts_with("note:"))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".to_string())
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('~');
        t
    }
}

pub fn selftest(a: SelftestArgs) -> CliResult {
    let sizes = if a.full {
        SizeSet::Full
    } else {
        SizeSet::Quick
    };
    let gpu: Option<Gpu> = if a.no_gpu {
        say("--no-gpu: running on the interpreter");
        None
    } else {
        match open_gpu() {
            Ok(g) => {
                say(format_args!("{}", g.info()));
                Some(g)
            }
            Err(why) => {
                if a.gpu {
                    return Err(CliError::Msg(format!("--gpu: no usable GPU: {why}")));
                }
                say(format_args!(
                    "no GPU found: running on the interpreter ({why})"
                ));
                None
            }
        }
    };
    let arch = a
        .arch
        .or_else(|| gpu.as_ref().and_then(|g| g.arch()))
        .unwrap_or(Arch::Sm90a);
    // `--filter ops`: only the op library and #[kernel] checks; `--filter ops:ns,optim`:
    // only those groups of op checks (kgen::checks::ops::GROUPS).
    let op_groups: Option<Vec<String>> = a
        .filter
        .as_deref()
        .and_then(|f| f.strip_prefix("ops:"))
        .map(|g| g.split(',').map(str::to_string).collect());
    let ops_only = a.filter.as_deref() == Some("ops") || op_groups.is_some();
    let mut cases = all_cases(a.seed, sizes);
    if let Some(pat) = &a.filter {
        cases.retain(|c| !ops_only && c.label.contains(pat.as_str()));
    }
    if cases.is_empty() && !ops_only {
        return Err(CliError::Msg(match &a.filter {
            Some(p) => format!("no test case label contains `{p}`"),
            None => "the case table is empty".to_string(),
        }));
    }
    say(format_args!(
        "{} case(s), {} sizes, seed {}, compiled for {arch}; errors are max relative errors |got-want|/|want|, \
         PASS = every element within the case's tolerance",
        cases.len(),
        if a.full { "full" } else { "quick" },
        a.seed
    ));
    let w = cases
        .iter()
        .map(|c| c.label.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 80);
    let header = format!(
        "{:<12} {:<w$} {:>10} {:>10} {:>10} {:>9}  {}",
        "kernel", "case", "interp/ref", "gpu/interp", "gpu/ref", "kernel ms", "result"
    );
    say(&header);
    say("-".repeat(header.len()));
    let start = Instant::now();
    let mut cache: Cache = HashMap::new();
    let mut failures: Vec<(String, Vec<String>)> = Vec::new();
    let mut notes: Vec<(String, Vec<String>)> = Vec::new();
    for case in &cases {
        let row = match catch_unwind(AssertUnwindSafe(|| {
            run_case(case, arch, gpu.as_ref(), &mut cache)
        })) {
            Ok(r) => r,
            Err(p) => {
                let mut r = Row::new();
                r.problems.push(format!(
                    "internal error (panic): {}",
                    panic_message(p.as_ref())
                ));
                r
            }
        };
        let ok = passed(&row);
        say(format_args!(
            "{:<12} {:<w$} {:>10} {:>10} {:>10} {:>9}  {}",
            clip(case.kernel, 12),
            clip(&case.label, w),
            fmt_err(row.interp_ref),
            fmt_err(row.gpu_interp),
            fmt_err(row.gpu_ref),
            row.ms.map_or("-".to_string(), |m| format!("{m:.4}")),
            if ok { "PASS" } else { "FAIL" }
        ));
        if !ok {
            failures.push((case.label.clone(), row.problems));
        } else if !row.problems.is_empty() {
            notes.push((case.label.clone(), row.problems));
        }
    }
    say("-".repeat(header.len()));
    for (label, problems) in &notes {
        for p in problems {
            say(format_args!("{label}: {p}"));
        }
    }
    // A compile error is shown once, not once per case that uses the specialization.
    let mut shown: Vec<&String> = Vec::new();
    for (label, problems) in &failures {
        for p in problems {
            if shown.contains(&p) {
                say(format_args!("FAIL {label}: (the same error as above)"));
            } else {
                say(format_args!("FAIL {label}: {p}"));
                shown.push(p);
            }
        }
    }
    // The op library and #[kernel] launchers, on the same device.
    let device = match &gpu {
        Some(_) => {
            // `--arch sm_80` on an H100: the op library runs the Ampere path too.
            kgen::runtime::Device::cuda_as(0, arch)
                .map_err(|e| CliError::Msg(format!("--arch {arch}: {e}")))?
        }
        None => kgen::runtime::Device::interpreter_as(arch),
    };
    let (op_passed, op_failures) = if a.filter.is_none() || ops_only {
        super::selftest_ops::run(&device, op_groups.as_deref())?
    } else {
        (0, 0)
    };
    let n_fail = failures.len() + op_failures;
    // Cases and op checks counted apart: `--filter ops:...` runs no case.
    say(format_args!(
        "selftest: {} case(s) passed, {} failed; {} op check(s) passed, {} failed; {:.1} s, {}",
        cases.len() - failures.len(),
        failures.len(),
        op_passed,
        op_failures,
        start.elapsed().as_secs_f64(),
        match &gpu {
            Some(g) => format!("GPU {} ({arch}) and interpreter", g.info().name),
            None => "interpreter only (no GPU)".to_string(),
        }
    ));
    if n_fail > 0 {
        return Err(CliError::Exit(1));
    }
    Ok(())
}
