//! Ping-pong (`pingpong.rs`, `lower/turns.rs`): the attention forward's lagged loop,
//! warp-specialized on two consumer warpgroups, takes turns; the plain loop, sm_80 and a
//! kernel without a producer do not, and say why. Every kernel is assembled by ptxas
//! where it is installed.

use super::tests::assemble;
use crate::{compile, compile_to_ir, Arch, CompileOptions, SourceFile};

fn attention() -> SourceFile {
    SourceFile::new(
        "attention.kg",
        include_str!("../../../../kernels-src/attention.kg"),
    )
}

/// The forward at D = 128 with BM = BN = 128 on 8 warps (two warpgroups), as sm_90a
/// runs it; on sm_80 (where that tile spills without a producer) the op's 64 × 64 on 4.
fn options(arch: Arch, lag: bool, ws: bool, pingpong: bool) -> CompileOptions {
    let (tile, warps) = if arch == Arch::Sm90a {
        (128, 8)
    } else {
        (64, 4)
    };
    let mut o = CompileOptions::new(arch)
        .kernel("attention_fwd")
        .define("D", 128)
        .define("BM", tile)
        .define("BN", tile)
        .define("CAUSAL", true)
        .define("LAG", lag);
    o.num_warps = Some(warps);
    o.ws = ws;
    o.pingpong = pingpong;
    o
}

/// The PTX and notes of one form, assembled without spills.
fn forward(arch: Arch, lag: bool, ws: bool, pingpong: bool) -> (String, Vec<String>) {
    let file = attention();
    let k = compile(&file, &options(arch, lag, ws, pingpong))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let name = format!("attention_fwd_lag{lag}_ws{ws}_pp{pingpong}");
    if let Some(log) = assemble(&k.ptx, arch.name(), &name) {
        assert!(
            log.contains("0 bytes spill stores") && log.contains("0 bytes stack frame"),
            "{name} ({arch:?}) spills:\n{log}"
        );
        if pingpong && arch == Arch::Sm90a && lag && ws {
            // Immediate barrier ids: 0, the consumers' 1 and the two turns.
            assert!(log.contains("used 4 barriers"), "{name}:\n{log}");
        }
    }
    (k.ptx, k.notes)
}

fn lines(ptx: &str) -> Vec<&str> {
    ptx.lines().map(str::trim).collect()
}

fn position(ls: &[&str], from: usize, needle: &str) -> usize {
    from + ls[from..]
        .iter()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no `{needle}` after line {from}"))
}

#[test]
fn the_lagged_forward_takes_turns() {
    let (ptx, notes) = forward(Arch::Sm90a, true, true, true);
    assert!(notes.is_empty(), "{notes:?}");
    let ls = lines(&ptx);
    let count = |s: &str| ls.iter().filter(|l| l.ends_with(s)).count();
    // Warpgroup 1's arrival before the loop and in the window; warpgroup 0's in the
    // window; each warpgroup's wait.
    assert_eq!(count("bar.arrive 2, 256;"), 2, "{ptx}");
    assert_eq!(count("bar.arrive 3, 256;"), 1, "{ptx}");
    assert_eq!(count("bar.sync 2, 256;"), 1, "{ptx}");
    assert_eq!(count("bar.sync 3, 256;"), 1, "{ptx}");
    // Order: the first arrival, then in the loop the two waits (predicated on the
    // warpgroup, opposite ways), the two products, and the arrivals, with no wait for a
    // product in between: the products run on past the hand-over.
    let first = position(&ls, 0, "bar.arrive 2, 256;");
    let wait0 = position(&ls, first, "bar.sync 2, 256;");
    let wait1 = position(&ls, first, "bar.sync 3, 256;");
    assert_eq!(wait0 + 1, wait1, "{ptx}");
    assert!(
        ls[wait0].starts_with("@!%p") && ls[wait1].starts_with("@%p"),
        "{ptx}"
    );
    let give = position(&ls, wait1, "bar.arrive 3, 256;");
    let window = &ls[wait1..give];
    let commits = window
        .iter()
        .filter(|l| l.starts_with("wgmma.commit_group"))
        .count();
    assert_eq!(
        commits,
        2,
        "the window holds both products:\n{}",
        window.join("\n")
    );
    assert!(
        !window.iter().any(|l| l.contains("wgmma.wait_group")),
        "a wait inside the window:\n{}",
        window.join("\n")
    );
    assert!(ls[give].starts_with("@!%p"), "{ptx}");
    assert!(ls[give + 1].ends_with("bar.arrive 2, 256;"), "{ptx}");
    // Nothing else changed: the same products, waits and block barriers as without.
    let (plain, _) = forward(Arch::Sm90a, true, true, false);
    let pl = lines(&plain);
    for needle in [
        "wgmma.mma_async",
        "wgmma.wait_group",
        "bar.sync 1,",
        "mbarrier",
    ] {
        let n = |ls: &[&str]| ls.iter().filter(|l| l.contains(needle)).count();
        assert_eq!(n(&ls), n(&pl), "`{needle}` count changed");
    }
}

#[test]
fn the_plain_loop_and_other_targets_do_not_and_say_why() {
    // The plain loop's products stand apart (the softmax between them).
    let (ptx, notes) = forward(Arch::Sm90a, false, true, true);
    assert!(!ptx.contains("bar.arrive 2"), "{ptx}");
    assert_eq!(
        notes,
        ["ping-pong (`--pingpong`) not applied: no loop issues two or more products back to back"]
    );
    // No producer warpgroup: no consumer warpgroups to take turns.
    for (arch, ws) in [(Arch::Sm90a, false), (Arch::Sm80, true)] {
        let (ptx, notes) = forward(arch, true, ws, true);
        assert!(!ptx.contains("bar.arrive 2"), "{ptx}");
        let pp: Vec<&String> = notes.iter().filter(|n| n.contains("ping-pong")).collect();
        assert_eq!(
            pp,
            ["ping-pong (`--pingpong`) not applied: it needs a warp-specialized block (`--ws`) of two consumer warpgroups (8 warps)"],
            "{arch:?} ws={ws}"
        );
    }
}

#[test]
fn the_plan_takes_loops_whose_products_stand_together() {
    let file = attention();
    let plan = |lag: bool| {
        let (func, _) = compile_to_ir(&file, &options(Arch::Sm90a, lag, true, true))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)));
        super::pingpong::plan(&func)
    };
    let lagged = plan(true);
    assert_eq!(lagged.len(), 1, "{lagged:?}");
    let w = lagged.values().next().copied().unwrap();
    assert_ne!(w.first, w.last);
    assert!(plan(false).is_empty());
}
