//! The IR text read back (`ir/parse.rs`): every bundled kernel's IR prints, parses and
//! prints again to the same text, before and after the passes and on both targets; the
//! passes run on parsed text give what they give on the checker's IR (so a pass can be
//! tested from text alone); malformed text is an error with its line.

use super::parse::parse;
use crate::pipeline::CompileOptions;
use crate::span::SourceFile;
use crate::target::Arch;
use std::path::PathBuf;

/// (name, source) of every bundled kernel file.
fn bundled() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels-src");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "kg"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let stem = p.file_stem()?.to_string_lossy().into_owned();
            Some((stem, std::fs::read_to_string(&p).ok()?))
        })
        .collect()
}

/// The checker's IR (no passes) and the optimized IR of each kernel of `src` on `arch`,
/// with `tweak` applied to the options.
fn irs(
    src: &str,
    name: &str,
    arch: Arch,
    tweak: &dyn Fn(&mut CompileOptions),
) -> Vec<(String, crate::ir::Function, crate::ir::Function)> {
    let file = SourceFile::new(format!("{name}.kg"), src);
    let module = crate::front::parse(&file).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let mut out = Vec::new();
    for k in &module.kernels {
        let mut o = CompileOptions::new(arch).kernel(&k.name.name);
        tweak(&mut o);
        let Ok((raw, spec)) = crate::check::lower_kernel(&module, &o) else {
            continue;
        };
        let mut opt = raw.clone();
        let passes = crate::passes::PassOptions::for_target(&spec, &arch.target());
        if crate::passes::optimize(&mut opt, &passes).is_err() {
            continue;
        }
        out.push((k.name.name.clone(), raw, opt));
    }
    out
}

#[test]
fn every_bundled_kernel_round_trips_through_its_text() {
    let files = bundled();
    assert!(files.len() >= 20, "kernels-src");
    let mut checked = 0;
    for (name, src) in &files {
        for arch in crate::source_targets(src) {
            for (k, raw, opt) in irs(src, name, arch, &|_| {}) {
                for f in [&raw, &opt] {
                    let text = f.to_string();
                    let back = parse(&text).unwrap_or_else(|e| panic!("{name}/{k} {arch}: {e}"));
                    assert_eq!(back.to_string(), text, "{name}/{k} {arch}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 100, "{checked} functions");
}

/// The passes on parsed text: the optimized IR equals the optimized checker IR, for the
/// pipelined kernels (the persistent GEMM's ring across its tiles, Newton–Schulz,
/// attention) on both targets.
#[test]
fn the_passes_run_on_parsed_text_as_on_the_checkers_ir() {
    let files = bundled();
    let pick = |n: &str| files.iter().find(|(f, _)| f == n).map(|(_, s)| s.clone());
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("gemm", vec![("PERSISTENT", "true"), ("BK", "64")]),
        (
            "gemm",
            vec![("TRANS_A", "true"), ("BIAS", "true"), ("ACT", "2")],
        ),
        ("ns", vec![]),
        ("attention", vec![]),
    ];
    let mut checked = 0;
    for (file, defines) in cases {
        let src = pick(file).expect("bundled kernel");
        for arch in [Arch::Sm90a, Arch::Sm80] {
            let tweak = |o: &mut CompileOptions| {
                for (k, v) in &defines {
                    o.defines.push((k.to_string(), v.to_string()));
                }
                o.num_warps = Some(8);
            };
            for (k, raw, opt) in irs(&src, file, arch, &tweak) {
                let mut parsed = parse(&raw.to_string()).expect("parses");
                let spec = crate::abi::Specialization {
                    kernel: k.clone(),
                    consts: vec![],
                    num_warps: 8,
                    min_blocks_per_sm: None,
                    num_stages: None,
                    tensor_align: vec![],
                    no_tma: false,
                    ws: false,
                    tma_store: false,
                    multicast: false,
                    pingpong: false,
                };
                let passes = crate::passes::PassOptions::for_target(&spec, &arch.target());
                crate::passes::optimize(&mut parsed, &passes).expect("the passes run");
                assert_eq!(parsed.to_string(), opt.to_string(), "{file}/{k} {arch}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "{checked}");
}

#[test]
fn malformed_text_is_an_error_with_its_line() {
    let ok = "kernel k (k)\n  @x: tensor<f32, [?], contiguous, align 16>\n{\n  %0: i32 = bid 0\n  %1: tile<f32, [64]> = load @x[%0] pad 0.0:f32\n  store @x[%0], %1\n}\n";
    assert_eq!(parse(ok).expect("parses").to_string(), ok);
    for (text, line, what) in [
        (ok.replace("load @x", "lode @x"), 5, "unknown instruction"),
        (
            ok.replace("@x[%0], %1", "@x[%0], %7"),
            6,
            "`%7` is used before it is defined",
        ),
        (ok.replace("load @x", "load @y"), 5, "no parameter `@y`"),
        (
            ok.replace("%1: tile<f32, [64]>", "%0: tile<f32, [64]>"),
            5,
            "`%0` is defined twice",
        ),
        (ok.replace("bid 0", "bid"), 4, "a number is missing"),
        (ok.replace("{\n", ""), 3, ""),
    ] {
        let e = parse(&text).expect_err(&text);
        assert_eq!(e.line, line, "{text}: {e}");
        assert!(e.to_string().contains(what), "{e}");
    }
}

/// Bad input never panics: every prefix of a pipelined kernel's IR text (cut anywhere,
/// on a character boundary) parses or is an error.
#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let files = bundled();
    let src = files
        .iter()
        .find(|(f, _)| f == "gemm")
        .map(|(_, s)| s.clone())
        .expect("gemm.kg");
    let (_, _, opt) = irs(&src, "gemm", Arch::Sm90a, &|o| {
        o.defines.push(("PERSISTENT".into(), "true".into()))
    })
    .into_iter()
    .next()
    .expect("gemm's IR");
    let text = opt.to_string();
    let mut errors = 0;
    for (i, _) in text.char_indices() {
        if parse(&text[..i]).is_err() {
            errors += 1;
        }
    }
    assert!(errors > text.len() / 2, "most prefixes are not IR");
}
