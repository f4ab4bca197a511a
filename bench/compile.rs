//! Compile-time benchmark: DSL → PTX for every bundled kernel and both targets.
//!
//! `cargo bench --bench compile` prints, per kernel and arch, the median and minimum
//! wall time of the whole pipeline (parse, check, passes, validation, PTX) over many
//! runs, after warm-up. The target is ≤ 5 ms per kernel on the 2-core development machine.
//! Exits non-zero if a median exceeds the target, so a regression is visible.

use kgen_core::{compile, source_targets, CompileOptions, SourceFile};
use std::time::{Duration, Instant};

const TARGET: Duration = Duration::from_millis(5);

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels-src");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("kernels-src")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "kg"))
        .collect();
    files.sort();
    println!(
        "{:<14} {:<7} {:>10} {:>10} {:>8}",
        "kernel", "arch", "median", "min", "PTX lines"
    );
    let mut worst = Duration::ZERO;
    for path in files {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).expect("read");
        // Hopper-only files (`// target: sm_90a`) are timed for their targets only.
        let targets = source_targets(&text);
        let file = SourceFile::new(format!("{stem}.kg"), text);
        for arch in targets {
            let opts = CompileOptions::new(arch);
            let Ok(first) = compile(&file, &opts) else {
                println!("{stem:<14} {arch:<7} compile error");
                std::process::exit(1);
            };
            for _ in 0..5 {
                let _ = compile(&file, &opts);
            }
            let mut times: Vec<Duration> = (0..60)
                .map(|_| {
                    let t = Instant::now();
                    let r = compile(&file, &opts);
                    let dt = t.elapsed();
                    std::hint::black_box(r.is_ok());
                    dt
                })
                .collect();
            times.sort();
            let median = times[times.len() / 2];
            worst = worst.max(median);
            println!(
                "{stem:<14} {arch:<7} {:>8.3}ms {:>8.3}ms {:>8}",
                median.as_secs_f64() * 1e3,
                times[0].as_secs_f64() * 1e3,
                first.ptx.lines().count()
            );
        }
    }
    println!(
        "worst median {:.3} ms (target ≤ {} ms): {}",
        worst.as_secs_f64() * 1e3,
        TARGET.as_millis(),
        if worst <= TARGET { "PASS" } else { "FAIL" }
    );
    if worst > TARGET {
        std::process::exit(1);
    }
}
