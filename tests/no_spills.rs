//! No spills: every kernel specialization the op library can launch
//! (`kgen::ops::launchable::launchable_kernels`: every candidate of every tuning list,
//! every dtype, alignment class and path) and every generic combination of every bundled
//! kernel (each dtype generic over its kind, each bool both ways, the int generics at
//! their defaults and at every tuple of values the ops use), compiled for sm_80 and
//! sm_90a and assembled by the real ptxas (`KGEN_PTXAS`), with zero spill bytes and a
//! zero stack frame. Combinations that the compiler refuses (a `dtype` generic that the
//! kernel cannot take, a tile too large for the default warps) are counted, not failed:
//! no one can launch them; a refused op request fails.
//!
//! Identical PTX bodies (other entry names, the same instructions) are assembled once;
//! ptxas runs on every core. `KGEN_VERBOSE=1` prints each specialization's registers.

mod common;

use kgen::ops::launchable::Coverage;
use kgen::ops::KernelRequest;
use kgen_core::front::ast::GenericKind;
use kgen_core::{compile, source_targets, Arch, ErrorCode, SourceFile};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const DTYPES: [&str; 7] = ["bool", "i32", "u32", "i64", "f16", "bf16", "f32"];
const FLOATS: [&str; 3] = ["f32", "f16", "bf16"];

/// One specialization to assemble: where it comes from and what to compile.
struct Spec {
    /// An op asks for it (a compile error fails the test), or it is a generic
    /// combination (a checker or target-limit error only counts it as not launchable).
    from_op: bool,
    request: KernelRequest,
}

/// The generics of every kernel of every bundled file: (stem, kernel) → [(name, kind)].
fn generics() -> BTreeMap<(String, String), Vec<(String, GenericKind)>> {
    let mut out = BTreeMap::new();
    for (stem, text) in common::bundled_kernels() {
        let file = SourceFile::new(format!("kernels-src/{stem}.kg"), text);
        let module =
            kgen_core::front::parse(&file).unwrap_or_else(|d| panic!("{}", d.render(&file)));
        for k in module.kernels {
            let g = k
                .generics
                .iter()
                .map(|g| (g.name.name.clone(), g.kind))
                .collect();
            out.insert((stem.clone(), k.name.name.clone()), g);
        }
    }
    out
}

/// Every combination of the dtype and bool generics of `base`'s kernel, the other
/// defines (ints) as `base` has them.
fn combinations(base: &KernelRequest, generics: &[(String, GenericKind)]) -> Vec<KernelRequest> {
    let mut out = vec![base.clone()];
    for (name, kind) in generics {
        let values: &[&str] = match kind {
            GenericKind::Bool => &["false", "true"],
            GenericKind::DType => &DTYPES,
            GenericKind::Float => &FLOATS,
            _ => continue,
        };
        out = out
            .into_iter()
            .flat_map(|r| {
                values.iter().map(move |v| {
                    let mut r = r.clone();
                    r.defines.retain(|(k, _)| k != name);
                    r.defines.push((name.clone(), v.to_string()));
                    r.defines.sort();
                    r
                })
            })
            .collect();
    }
    out
}

/// The op requests, then the generic combinations of every kernel: over its defaults,
/// and over every op request of it (its ints, warps, bound and alignments).
fn specs(full: bool) -> (Vec<Spec>, Vec<String>) {
    let coverage = if full {
        Coverage::Full
    } else {
        Coverage::Quick
    };
    let (requests, op_errors) = kgen::ops::launchable::launchable_kernels(coverage);
    let generics = generics();
    let mut seen: BTreeSet<KernelRequest> = BTreeSet::new();
    let mut specs = Vec::new();
    for r in &requests {
        let mut r = r.clone();
        r.defines.sort();
        if seen.insert(r.clone()) {
            specs.push(Spec {
                from_op: true,
                request: r,
            });
        }
    }
    for ((stem, kernel), g) in &generics {
        let default = KernelRequest {
            stem: stem.clone(),
            kernel: kernel.clone(),
            defines: Vec::new(),
            num_warps: None,
            min_blocks_per_sm: None,
            tensor_align: Vec::new(),
            num_stages: None,
            no_tma: false,
            ws: false,
            arch: None,
        };
        // The int generics the ops use (with `full`; the warps, bound and alignments
        // the kernel then takes by default: those are not generics).
        let op_ints = requests
            .iter()
            .filter(|r| full && &r.stem == stem && &r.kernel == kernel)
            .map(|r| {
                let mut ints = r.clone();
                ints.defines.retain(|(k, _)| {
                    g.iter()
                        .any(|(n, kind)| n == k && matches!(kind, GenericKind::Int))
                });
                ints.num_warps = None;
                ints.min_blocks_per_sm = None;
                ints.tensor_align.clear();
                ints.num_stages = None;
                ints.no_tma = false;
                ints.ws = false;
                ints.arch = None;
                ints
            });
        let bases: BTreeSet<KernelRequest> = std::iter::once(default).chain(op_ints).collect();
        for base in bases {
            for r in combinations(&base, g) {
                if seen.insert(r.clone()) {
                    specs.push(Spec {
                        from_op: false,
                        request: r,
                    });
                }
            }
        }
    }
    (specs, op_errors)
}

/// The PTX without its header comments and with the entry's name replaced: what ptxas
/// sees of the instructions (two specializations whose generics the kernel ignores
/// compile to the same body).
fn body_key(ptx: &str, entry: &str) -> String {
    ptx.lines()
        .filter(|l| !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(entry, "ENTRY")
}

/// Entries per PTX module given to one ptxas process.
const BATCH: usize = 24;

/// The module-level lines of a kernel's PTX (`.version`, `.target`, `.address_size`, a
/// dynamic shared-memory declaration) and its entry (from `.visible .entry` on).
fn split_module(ptx: &str) -> (Vec<&str>, &str) {
    let at = ptx.find(".visible .entry").unwrap_or(0);
    let head = ptx[..at].lines().filter(|l| l.starts_with('.')).collect();
    (head, &ptx[at..])
}

/// Assembles `jobs` ((label, PTX) of one arch) as one module and reports each entry;
/// when the module is rejected, each job alone (to name the one ptxas refuses).
fn assemble_batch(
    ptxas: &std::path::Path,
    arch: Arch,
    jobs: &[(String, String)],
    n: usize,
) -> Result<Vec<(String, common::PtxasReport)>, String> {
    let mut head: Vec<&str> = Vec::new();
    let mut entries = String::new();
    let mut labels: HashMap<String, String> = HashMap::new();
    for (label, ptx) in jobs {
        let (h, entry) = split_module(ptx);
        for l in h {
            if !head.contains(&l) {
                head.push(l);
            }
        }
        let name = entry
            .split_whitespace()
            .nth(2)
            .map(|s| s.trim_end_matches('(').to_string())
            .unwrap_or_default();
        labels.insert(name, label.clone());
        entries.push_str(entry);
        entries.push('\n');
    }
    let module = format!("{}\n\n{entries}", head.join("\n"));
    match common::assemble(ptxas, &module, arch.name(), &format!("batch{n}")) {
        Ok(r) => {
            let reports = per_entry(&r.raw);
            if reports.len() != jobs.len() {
                return Err(format!(
                    "ptxas reported {} of {} entries:\n{}",
                    reports.len(),
                    jobs.len(),
                    r.raw
                ));
            }
            Ok(reports
                .into_iter()
                .map(|(name, rep)| (labels.get(&name).cloned().unwrap_or(name), rep))
                .collect())
        }
        Err(_) if jobs.len() > 1 => {
            let mut out = Vec::new();
            for (i, job) in jobs.iter().enumerate() {
                out.extend(assemble_batch(
                    ptxas,
                    arch,
                    std::slice::from_ref(job),
                    n * BATCH + i,
                )?);
            }
            Ok(out)
        }
        Err(e) => Err(format!("{}: ptxas rejected it:\n{e}", jobs[0].0)),
    }
}

/// Each entry's report in a `ptxas -v` output of several entries.
fn per_entry(raw: &str) -> Vec<(String, common::PtxasReport)> {
    let mut out: Vec<(String, common::PtxasReport)> = Vec::new();
    let num_before = |text: &str, key: &str| -> u32 {
        text.find(key)
            .and_then(|i| text[..i].split_whitespace().last())
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    for line in raw.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push((rest.trim().to_string(), common::PtxasReport::default()));
        } else if let Some((_, r)) = out.last_mut() {
            if line.contains("bytes stack frame") {
                r.stack_frame_bytes = num_before(line, "bytes stack frame");
                r.spill_stores = num_before(line, "bytes spill stores");
                r.spill_loads = num_before(line, "bytes spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                r.registers = num_before(line, "registers");
            }
        }
    }
    out
}

/// Assembles each distinct body once (`bodies`: one (label, PTX) per body and target), in
/// modules of up to [`BATCH`] entries, one ptxas process per module on every core.
/// Returns (label, registers) of the clean ones and a line for each that spilled, used a
/// stack frame or was rejected.
fn assemble_all(
    ptxas: &std::path::Path,
    bodies: impl IntoIterator<Item = (Arch, (String, String))>,
    first_batch: usize,
) -> (Vec<(String, u32)>, Vec<String>) {
    let mut by_arch: BTreeMap<Arch, Vec<(String, String)>> = BTreeMap::new();
    for (arch, job) in bodies {
        by_arch.entry(arch).or_default().push(job);
    }
    let mut batches: Vec<(Arch, Vec<(String, String)>)> = Vec::new();
    for (arch, mut jobs) in by_arch {
        jobs.sort();
        for chunk in jobs.chunks(BATCH) {
            batches.push((arch, chunk.to_vec()));
        }
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicUsize::new(0);
    let reports: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
    let bad: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((arch, jobs)) = batches.get(i) else {
                    break;
                };
                match assemble_batch(ptxas, *arch, jobs, first_batch + i) {
                    Ok(rs) => {
                        for (label, r) in rs {
                            if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 {
                                bad.lock().unwrap().push(format!(
                                    "{label}: {} registers, {} bytes stack, {} / {} bytes spilled",
                                    r.registers, r.stack_frame_bytes, r.spill_stores, r.spill_loads
                                ));
                            } else {
                                reports.lock().unwrap().push((label, r.registers));
                            }
                        }
                    }
                    Err(e) => bad.lock().unwrap().push(e),
                }
            });
        }
    });
    (reports.into_inner().unwrap(), bad.into_inner().unwrap())
}

#[test]
fn every_launchable_specialization_assembles_without_spills() {
    let Some(ptxas) = common::ptxas() else {
        eprintln!("KGEN_SKIP_PTXAS=1: not assembling");
        return;
    };
    let t0 = Instant::now();
    let full = std::env::var("KGEN_FULL").as_deref() == Ok("1");
    let (specs, op_errors) = specs(full);
    let t_enum = t0.elapsed();
    let mut failures: Vec<String> = op_errors
        .iter()
        .map(|e| format!("an op failed in the recording run: {e}"))
        .collect();
    // Compile everything (in parallel), keep one PTX per distinct body and arch.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicUsize::new(0);
    let bodies: Mutex<HashMap<(String, Arch), (String, String)>> = Mutex::new(HashMap::new());
    let refused = AtomicUsize::new(0);
    let compiled = AtomicUsize::new(0);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(spec) = specs.get(i) else { break };
                let r = &spec.request;
                let Some(file) = r.source() else {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("no kernels-src/{}.kg", r.stem));
                    continue;
                };
                // An op's request is compiled for the target it was recorded on.
                let targets = source_targets(&file.text)
                    .into_iter()
                    .filter(|&a| r.arch.is_none_or(|want| want == a));
                for arch in targets {
                    match compile(&file, &r.compile_options(arch)) {
                        Ok(k) => {
                            compiled.fetch_add(1, Ordering::Relaxed);
                            let key = (body_key(&k.ptx, &k.entry), arch);
                            bodies
                                .lock()
                                .unwrap()
                                .entry(key)
                                .or_insert_with(|| (format!("{} {arch}", k.entry), k.ptx));
                        }
                        Err(d) => {
                            let internal = d.0.iter().any(|x| x.code == ErrorCode::InvalidIr);
                            if spec.from_op || internal {
                                errors.lock().unwrap().push(format!(
                                    "{}.kg {} {:?} warps {:?} min_blocks {:?} stages {:?} \
                                     no_tma {} ws {} align {:?} for {arch}:\n{}",
                                    r.stem,
                                    r.kernel,
                                    r.defines,
                                    r.num_warps,
                                    r.min_blocks_per_sm,
                                    r.num_stages,
                                    r.no_tma,
                                    r.ws,
                                    r.tensor_align,
                                    d.render(&file)
                                ));
                            } else {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
    });
    failures.extend(errors.into_inner().unwrap());
    let t_compile = t0.elapsed();
    let bodies = bodies.into_inner().unwrap();
    let distinct = bodies.len();
    let (mut reports, bad) = assemble_all(
        &ptxas,
        bodies.into_iter().map(|((_, arch), job)| (arch, job)),
        0,
    );
    failures.extend(bad);
    reports.sort();
    if std::env::var("KGEN_VERBOSE").is_ok() {
        for (label, regs) in &reports {
            eprintln!("{regs:>4} registers  {label}");
        }
    }
    let ops = specs.iter().filter(|s| s.from_op).count();
    eprintln!(
        "{} specializations ({ops} from the ops, {} generic combinations, {} refused by the \
         compiler), {} compiled, {} distinct PTX assembled; max {} registers; enumerated in \
         {:.1} s, compiled by {:.1} s, assembled by {:.1} s ({threads} threads)",
        specs.len(),
        specs.len() - ops,
        refused.load(Ordering::Relaxed),
        compiled.load(Ordering::Relaxed),
        distinct,
        reports.iter().map(|r| r.1).max().unwrap_or(0),
        t_enum.as_secs_f64(),
        t_compile.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
    );
    assert!(
        ops > 100,
        "only {ops} op specializations: the enumeration broke"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// No spills in the self-test either: every case of `kgen selftest` (the quick set, the
/// specializations `kgen selftest --gpu` builds, unaligned rows and all, which the ops
/// never launch) compiled for every target its source supports and assembled by ptxas.
/// A case its target refuses (a cluster kernel on sm_80) is counted, not failed.
#[test]
fn every_selftest_case_assembles_without_spills() {
    let Some(ptxas) = common::ptxas() else {
        eprintln!("KGEN_SKIP_PTXAS=1: not assembling");
        return;
    };
    let cases = kgen::cases::all_cases(1, kgen::cases::SizeSet::Quick);
    let mut bodies: BTreeMap<(String, Arch), (String, String)> = BTreeMap::new();
    let (mut refused, mut failures) = (0, Vec::new());
    for c in &cases {
        let file = c.source();
        for arch in source_targets(&file.text) {
            match compile(&file, &c.compile_options(arch)) {
                Ok(k) => {
                    bodies
                        .entry((body_key(&k.ptx, &k.entry), arch))
                        .or_insert_with(|| (format!("{} ({arch})", c.label), k.ptx));
                }
                Err(d) if d.0.iter().any(|x| x.code == ErrorCode::InvalidIr) => {
                    failures.push(format!("{} ({arch}):\n{}", c.label, d.render(&file)))
                }
                Err(_) => refused += 1,
            }
        }
    }
    let distinct = bodies.len();
    let (_, bad) = assemble_all(
        &ptxas,
        bodies.into_iter().map(|((_, arch), job)| (arch, job)),
        100_000,
    );
    failures.extend(bad);
    eprintln!(
        "{} cases, {distinct} distinct PTX assembled, {refused} refused by a target",
        cases.len()
    );
    assert!(
        cases.len() > 300,
        "only {} cases: the list broke",
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
