//! Every ```kg example in docs/LANGUAGE.md (and every kernel in tests/user_kernels/,
//! numbered from 100000 in messages) compiles for both targets, is accepted by
//! ptxas, and — when it carries a `// run: grid=G name=SPEC ...` line — runs in the
//! interpreter on random inputs, with every output element written (outputs are
//! poisoned with NaN first). Examples whose first line is `// error: E0xxx` must be
//! rejected with that code instead.

mod common;

use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::ir::ParamKind;
use kgen_core::types::DType;
use kgen_core::{compile, compile_to_ir, interp, Arch, CompileOptions, SourceFile};

fn examples() -> Vec<(usize, String)> {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/LANGUAGE.md")).unwrap();
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in doc.lines().enumerate() {
        match (&mut current, line.trim_start()) {
            (None, "```kg") => current = Some((n + 1, String::new())),
            (Some(_), "```") => out.push(current.take().unwrap()),
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            _ => {}
        }
    }
    // Kernels written from LANGUAGE.md alone, as a new user would.
    let dir = common::repo_root().join("tests/user_kernels");
    let mut user: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    user.sort();
    for (i, p) in user.iter().enumerate() {
        out.push((100_000 + i, std::fs::read_to_string(p).unwrap()));
    }
    out
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// A grid and (parameter name, value spec) pairs.
type RunSpec = ([u32; 3], Vec<(String, String)>);

/// Parses `// run: grid=4,1 x=1000x7 eps=1e-5` into a grid and per-parameter specs.
fn run_spec(text: &str) -> Option<RunSpec> {
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("// run:"))?;
    let mut grid = [1u32; 3];
    let mut args = Vec::new();
    for word in line.split_whitespace() {
        let (k, v) = word.split_once('=').expect("name=value in // run:");
        if k == "grid" {
            for (i, g) in v.split(',').enumerate() {
                grid[i] = g.parse().expect("grid");
            }
        } else {
            args.push((k.to_string(), v.to_string()));
        }
    }
    Some((grid, args))
}

#[test]
fn language_md_examples_compile_assemble_and_run() {
    let ptxas = common::ptxas();
    let examples = examples();
    assert!(
        examples.len() >= 10,
        "LANGUAGE.md has only {} kg examples",
        examples.len()
    );
    let mut rng = Lcg(0x9e3779b97f4a7c15);
    for (line, text) in examples {
        let file = SourceFile::new(format!("LANGUAGE.md:{line}"), text.clone());
        if let Some(code) = text
            .lines()
            .next()
            .and_then(|l| l.trim().strip_prefix("// error:"))
        {
            let err = compile(&file, &CompileOptions::new(Arch::Sm90a))
                .expect_err(&format!("example at line {line} should fail"));
            assert_eq!(
                err.0[0].code.code(),
                code.trim(),
                "example at line {line}:\n{}",
                err.render(&file)
            );
            continue;
        }
        // `// target: sm_90a`: the example needs Hopper features; sm_80 must refuse it
        // with a located Unsupported error.
        let sm90_only = text.lines().any(|l| l.trim() == "// target: sm_90a");
        for arch in Arch::ALL {
            if sm90_only && arch == Arch::Sm80 {
                let err = compile(&file, &CompileOptions::new(arch))
                    .expect_err(&format!("example at line {line} needs sm_90a"));
                assert_eq!(err.0[0].code, kgen_core::ErrorCode::Unsupported);
                continue;
            }
            let k = compile(&file, &CompileOptions::new(arch))
                .unwrap_or_else(|d| panic!("example at line {line}:\n{}", d.render(&file)));
            if let Some(p) = &ptxas {
                common::assemble(p, &k.ptx, arch.name(), &format!("doc{line}"))
                    .unwrap_or_else(|e| panic!("example at line {line}: ptxas: {e}"));
            }
        }
        let Some((grid, specs)) = run_spec(&text) else {
            continue;
        };
        let (func, _) = compile_to_ir(&file, &CompileOptions::new(Arch::Sm80)).unwrap();
        let mut args = Vec::new();
        let mut outputs = Vec::new();
        let info = kgen_core::valid::validate(&func).unwrap();
        for (pi, p) in func.params.iter().enumerate() {
            let spec = specs
                .iter()
                .find(|(n, _)| n == &p.name)
                .map(|(_, s)| s.clone())
                .unwrap_or_else(|| {
                    panic!("example at line {line}: no // run: value for `{}`", p.name)
                });
            match &p.kind {
                ParamKind::Tensor(t) => {
                    let shape: Vec<usize> =
                        spec.split('x').map(|d| d.parse().expect("shape")).collect();
                    let n: usize = shape.iter().product();
                    let vals: Vec<f64> = (0..n)
                        .map(|i| match t.dtype {
                            DType::Bool => (rng.next() > 0.0) as u8 as f64,
                            d if d.is_int() => ((rng.next() * 50.0) as i64 + (i % 3) as i64) as f64,
                            _ => rng.next(),
                        })
                        .collect();
                    let mut ht = HostTensor::from_f64(t.dtype, &shape, &vals);
                    let (read, written) = info.tensor_access[pi];
                    if written && !read {
                        ht.poison(0xFF);
                        outputs.push(pi);
                    }
                    args.push(ArgValue::Tensor(ht));
                }
                ParamKind::Scalar(d) => {
                    let v: f64 = spec.parse().expect("scalar");
                    args.push(ArgValue::Scalar(kgen_core::host::scalar_from_f64(*d, v)));
                }
            }
        }
        interp::run(&func, grid, &mut args)
            .unwrap_or_else(|e| panic!("example at line {line}: {e}"));
        for o in outputs {
            if let ArgValue::Tensor(t) = &args[o] {
                if t.dtype.is_float() {
                    let nan = t.to_f64_vec().iter().filter(|v| v.is_nan()).count();
                    assert_eq!(
                        nan, 0,
                        "example at line {line}: {nan} output elements of `{}` not written",
                        func.params[o].name
                    );
                }
            }
        }
    }
}
