//! The `cp.async` group accounting of every pipelined tensor-core kernel the op library
//! can launch (`kgen::ops::launchable::launchable_kernels`), for sm_80 and sm_90a.
//!
//! `passes::pipeline` fetches `S - 1` stages of `F` tiles before the K loop and waits
//! with `cp.async.wait_group (S-2)*F` at the top of each iteration: that leaves the
//! newest `(S-2)*F` groups in flight, so it is right only when the groups are
//! committed stage by stage in fetch order. The back end may defer a fetch's copies into
//! the next `dot` (`lower/staged.rs`); a fetch that is not deferred (element-wise, for a
//! 2-byte aligned operand) must still commit its group in order. Checked here on the
//! PTX: the groups the first wait completes hold exactly one stage's share of the
//! prologue's copies. (compute-sanitizer's racecheck found the out-of-order case on an
//! H200: the first K step's `ldmatrix` could read tiles still in flight.)

use kgen_core::{compile, Arch};

/// Copies per group of the PTX before the first `cp.async.wait_group`, and that wait's
/// count; `None` when the kernel has no wait.
fn prologue_groups(ptx: &str) -> Option<(Vec<usize>, usize)> {
    let mut groups = Vec::new();
    let mut copies = 0;
    for line in ptx.lines() {
        let inst = line.trim();
        let inst = match inst.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, i)| i.trim()),
            None => inst,
        };
        if inst.starts_with("cp.async.commit_group") {
            groups.push(copies);
            copies = 0;
        } else if let Some(rest) = inst.strip_prefix("cp.async.wait_group") {
            let n = rest.trim().trim_end_matches(';').parse().ok()?;
            return Some((groups, n));
        } else if inst.starts_with("cp.async.cg.") || inst.starts_with("cp.async.ca.") {
            copies += 1;
        }
    }
    None
}

#[test]
fn pipelined_dots_commit_their_groups_in_fetch_order() {
    let (requests, op_errors) =
        kgen::ops::launchable::launchable_kernels(kgen::ops::launchable::Coverage::Quick);
    assert!(op_errors.is_empty(), "{}", op_errors.join("\n"));
    let mut checked = 0;
    let mut unaligned = 0;
    let mut failures = Vec::new();
    for r in &requests {
        let Some(file) = r.source() else {
            failures.push(format!("{}: no source", r.stem));
            continue;
        };
        for arch in Arch::ALL {
            let Ok(k) = compile(&file, &r.compile_options(arch)) else {
                continue; // refused specializations are no_spills.rs's business
            };
            if !k.ptx.contains("mma.sync") {
                continue;
            }
            if k.ptx.contains("cp.async.bulk.tensor") {
                // TMA fetches (sm_90a): no groups; each read waits on its slot's mbarrier.
                continue;
            }
            let Some((groups, wait)) = prologue_groups(&k.ptx) else {
                failures.push(format!(
                    "{} {arch}: a pipelined dot without a wait",
                    k.entry
                ));
                continue;
            };
            checked += 1;
            if k.ptx.contains("st.shared.b16") {
                unaligned += 1;
            }
            let total: usize = groups.iter().sum();
            let g = groups.len();
            if total == 0 {
                continue; // both operands element-wise: complete when stored, in any order
            }
            if g <= wait {
                failures.push(format!(
                    "{} {arch}: {g} groups ({total} copies) before a wait for {wait}",
                    k.entry
                ));
                continue;
            }
            let done: usize = groups[..g - wait].iter().sum();
            // The completed prefix is one stage: its share of the copies, exactly.
            if done * g != total * (g - wait) {
                failures.push(format!(
                    "{} {arch}: the first wait ({wait} pending of {g} groups, copies per \
                     group {groups:?}) completes {done} of {total} copies",
                    k.entry
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked >= 8,
        "only {checked} pipelined specializations found"
    );
    assert!(
        unaligned > 0,
        "no specialization with an element-wise (2-byte aligned) operand was checked"
    );
}
