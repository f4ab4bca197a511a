//! Fingerprints the compiler: a SHA-256 over every file under `src/` (paths and
//! contents, in sorted order), exported as `KGEN_CORE_FINGERPRINT` for
//! `kgen_core::COMPILER_FINGERPRINT`. Caches of compiled kernels key on it, so a
//! compiler built from other sources never reuses their entries, even at the same
//! package version.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let src = root.join("src");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    let mut files = Vec::new();
    files_under(&src, &mut files);
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap_or(f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(std::fs::read(f).unwrap_or_default());
        h.update([0]);
    }
    let hex: String = h
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    println!(
        "cargo:rustc-env=KGEN_CORE_FINGERPRINT={}+{hex}",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
    );
}
