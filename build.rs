//! Embeds every `kernels-src/*.kg` into the crate: writes `$OUT_DIR/bundled_kernels.rs`
//! with `(stem, include_str!(absolute path))` pairs, sorted by stem, so the `kgen`
//! binary is self-contained (the GPU machine has no source tree).

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = root.join("kernels-src");
    println!("cargo:rerun-if-changed=kernels-src");
    println!("cargo:rerun-if-changed=build.rs");
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("kg") || !path.is_file() {
                continue;
            }
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            println!("cargo:rerun-if-changed={}", path.display());
            files.push((stem.to_string(), path.clone()));
        }
    }
    files.sort();
    let mut out = String::new();
    out.push_str("/// (file stem, source text) of every `kernels-src/*.kg`, sorted by stem.\n");
    out.push_str("pub static BUNDLED_SOURCES: &[(&str, &str)] = &[\n");
    for (stem, path) in &files {
        let p = path.to_str().expect("kernels-src paths must be UTF-8");
        writeln!(out, "    ({stem:?}, include_str!({p:?})),").unwrap();
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bundled_kernels.rs");
    std::fs::write(&dest, out).expect("writing bundled_kernels.rs");
}
