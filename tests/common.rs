//! Helpers shared by the integration tests (included with `mod common;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every bundled kernel source: (file stem, text), sorted by stem.
pub fn bundled_kernels() -> Vec<(String, String)> {
    let dir = repo_root().join("kernels-src");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kg"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            (stem, text)
        })
        .collect();
    out.sort();
    out
}

/// The real ptxas: `KGEN_PTXAS`, else `.tools/cuda/bin/ptxas` (installed by
/// `tools/install-ptxas.sh`). `None` only when `KGEN_SKIP_PTXAS=1`; a missing ptxas
/// otherwise fails the test, so CI cannot silently skip assembly.
pub fn ptxas() -> Option<PathBuf> {
    if std::env::var("KGEN_SKIP_PTXAS").as_deref() == Ok("1") {
        return None;
    }
    let p = std::env::var_os("KGEN_PTXAS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/cuda/bin/ptxas"));
    assert!(
        p.exists(),
        "ptxas not found at {} (run tools/install-ptxas.sh, or set KGEN_SKIP_PTXAS=1)",
        p.display()
    );
    Some(p)
}

/// Resource usage reported by `ptxas -v`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PtxasReport {
    pub registers: u32,
    pub stack_frame_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub shared_bytes: u32,
    pub raw: String,
}

/// Assembles `ptx` for `arch` (`sm_80`, `sm_90a`) and parses the `-v` report.
pub fn assemble(ptxas: &Path, ptx: &str, arch: &str, name: &str) -> Result<PtxasReport, String> {
    let dir = std::env::temp_dir().join(format!("kgen-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{name}_{arch}.ptx"));
    std::fs::write(&file, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.join(format!("{name}_{arch}.cubin")))
        .output()
        .map_err(|e| e.to_string())?;
    let raw = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(raw);
    }
    let num_before = |text: &str, key: &str| -> u32 {
        text.find(key)
            .and_then(|i| text[..i].split_whitespace().last())
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    let mut r = PtxasReport {
        raw: raw.clone(),
        ..Default::default()
    };
    for line in raw.lines() {
        if line.contains("bytes stack frame") {
            r.stack_frame_bytes = r
                .stack_frame_bytes
                .max(num_before(line, "bytes stack frame"));
            r.spill_stores = r.spill_stores.max(num_before(line, "bytes spill stores"));
            r.spill_loads = r.spill_loads.max(num_before(line, "bytes spill loads"));
        }
        if line.contains("registers") {
            r.registers = r.registers.max(num_before(line, "registers"));
            r.shared_bytes = r.shared_bytes.max(num_before(line, "bytes smem"));
        }
    }
    Ok(r)
}

/// Device-tensor helpers of the op-library tests.
pub mod ops {
    use kgen::cases::Rng;
    use kgen::core::DType;
    use kgen::runtime::{Device, Tensor};

    /// `n` values `scale * normalish()`, never zero (the tests never check on zeros).
    pub fn rand_vec(rng: &mut Rng, n: usize, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let v = scale * rng.normalish();
                if v == 0.0 {
                    0.25
                } else {
                    v
                }
            })
            .collect()
    }

    /// A device tensor of `v` and the values as stored (rounded to `dt`).
    pub fn put(d: &Device, dt: DType, shape: &[usize], v: &[f64]) -> (Tensor, Vec<f64>) {
        let t = d.from_f64(dt, shape, v).unwrap();
        let stored = t.to_f64_vec().unwrap();
        (t, stored)
    }

    /// A tensor of NaN (a poisoned output).
    pub fn nan_tensor(d: &Device, dt: DType, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        d.from_f64(dt, shape, &vec![f64::NAN; n]).unwrap()
    }
}
