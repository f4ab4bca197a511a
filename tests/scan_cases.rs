//! Every specialization of `kernels-src/scan.kg` that the case table runs (`kgen
//! selftest`, on the GPU too) compiles for sm_80 and sm_90a and is assembled by the real
//! ptxas with zero spills and zero stack: rows of 1 to 8192 elements and 2-D / 3-D tiles
//! in every dtype, each combine op, reversed and exclusive.

mod common;

use kgen::cases::{scan, SizeSet};
use kgen_core::{compile, Arch};

#[test]
fn every_scan_case_assembles_without_spills() {
    let ptxas = common::ptxas();
    let cases = scan::cases(1, SizeSet::Full);
    assert!(cases.len() > 50, "{} scan cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let file = case.source();
        for arch in Arch::ALL {
            let k = match compile(&file, &case.compile_options(arch)) {
                Ok(k) => k,
                Err(d) => {
                    failures.push(format!("{} {arch}:\n{}", case.label, d.render(&file)));
                    continue;
                }
            };
            let Some(p) = &ptxas else { continue };
            match common::assemble(p, &k.ptx, arch.name(), &k.entry) {
                Ok(r) if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 => failures.push(
                    format!("{} {arch}: local memory used:\n{}", case.label, r.raw),
                ),
                Ok(_) => {}
                Err(e) => failures.push(format!("{} {arch}: ptxas:\n{e}", case.label)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
