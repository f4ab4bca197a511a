//! The `kgen` command line as a user meets it (issue 21's CLI items): the real binary,
//! its exit status and what it prints. Each case failed before the fix.
//!
//! `kgen run` cases pass `--no-gpu` where the numbers are checked, so that they mean the
//! same on every machine; on a GPU machine `tools/launch-with-cupy.py --launcher
//! kgen-run` exercises `--input` / `--save-outputs` on the GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kgen"))
        .args(args)
        .env("KGEN_CACHE", "0")
        .env("NO_COLOR", "1")
        .output()
        .expect("runs kgen")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kgen-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(d: &Path, name: &str, bytes: &[u8]) -> String {
    let p = d.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.display().to_string()
}

/// Fails with status 1 (2 for a usage error caught by the argument parser) and an
/// stderr containing every `needle`.
#[track_caller]
fn fails(o: &Output, status: i32, needles: &[&str]) {
    let e = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(status),
        "stderr: {e}\nstdout: {}",
        stdout(o)
    );
    for n in needles {
        assert!(e.contains(n), "`{n}` not in stderr:\n{e}");
    }
}

const VEC_ADD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels-src/vec_add.kg");

#[test]
fn check_compile_and_run_say_e0205_for_a_file_without_kernels() {
    let d = dir("empty");
    for (name, text) in [
        ("empty.kg", ""),
        (
            "comments.kg",
            "// only a comment\n/* and a block\n comment */\n\n",
        ),
    ] {
        let f = write(&d, name, text.as_bytes());
        let check = kgen(&["check", &f]);
        fails(&check, 1, &["error[E0205]: this file defines no kernel"]);
        assert!(!stdout(&check).contains("ok:"), "{}", stdout(&check));
        let compile = kgen(&["compile", &f]);
        let run = kgen(&["run", &f, "--no-gpu", "--grid", "1"]);
        // The same words from every command.
        assert_eq!(stderr(&check), stderr(&compile));
        assert_eq!(stderr(&check), stderr(&run));
    }
}

#[test]
fn kernel_name_errors_are_worded_the_same_by_check_and_compile() {
    let check = kgen(&["check", VEC_ADD, "--kernel", "vec_sub"]);
    let compile = kgen(&["compile", VEC_ADD, "--kernel", "vec_sub"]);
    fails(
        &check,
        1,
        &[
            "error[E0205]: no kernel named `vec_sub` in this file",
            "kernels in this file: vec_add",
        ],
    );
    fails(&compile, 1, &[]);
    assert_eq!(stderr(&check), stderr(&compile));
}

#[test]
fn non_utf8_input_names_the_byte_and_its_position() {
    let d = dir("utf8");
    let bytes = b"kernel k(x: tensor<f32, 1>) {\n    // caf\xC3\xA9 \xFF\n}\n";
    let off = bytes.iter().position(|&b| b == 0xFF).unwrap();
    let f = write(&d, "bad.kg", bytes);
    for cmd in ["check", "compile"] {
        let o = kgen(&[cmd, &f]);
        // Line 2, column 13: `é` is one character of two bytes.
        fails(
            &o,
            1,
            &[&format!(
                "bad.kg:2:13: not UTF-8 text: byte 0xFF at offset {off} is not valid UTF-8"
            )],
        );
    }
}

#[test]
fn sm_90_is_refused_with_the_reason_and_the_fix() {
    for cmd in [
        vec!["compile", VEC_ADD, "--arch", "sm_90"],
        vec!["check", VEC_ADD, "--arch", "sm_90"],
    ] {
        let o = kgen(&cmd);
        fails(
            &o,
            2,
            &["kgen does not target plain sm_90", "Pass `--arch sm_90a`"],
        );
        assert!(stdout(&o).is_empty());
    }
    assert_eq!(
        kgen(&["compile", VEC_ADD, "--arch", "sm_90a"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn a_repeated_define_or_alignment_is_an_error_naming_both() {
    for cmd in ["compile", "check"] {
        let o = kgen(&[
            cmd,
            VEC_ADD,
            "-D",
            "BLOCK=128",
            "-D",
            "T=f16",
            "-D",
            "BLOCK=256",
        ]);
        fails(
            &o,
            1,
            &["`-D BLOCK` is given twice: `-D BLOCK=128` and `-D BLOCK=256`"],
        );
        let o = kgen(&[cmd, VEC_ADD, "--align", "x=4", "--align", "x=8"]);
        fails(
            &o,
            1,
            &["`--align x` is given twice: `--align x=4` and `--align x=8`"],
        );
    }
    let o = kgen(&[
        "run", VEC_ADD, "--no-gpu", "--grid", "1", "--arg", "x=8", "--arg", "y=8", "--arg",
        "out=8", "-D", "BLOCK=16", "-D", "BLOCK=32",
    ]);
    fails(&o, 1, &["`-D BLOCK=16` and `-D BLOCK=32`"]);
}

#[test]
fn align_naming_no_tensor_lists_the_tensor_parameters() {
    for cmd in ["compile", "check"] {
        let o = kgen(&[cmd, VEC_ADD, "--align", "z=4"]);
        fails(
            &o,
            1,
            &["`--align z=4`: kernel `vec_add` has no tensor parameter `z` (its tensor parameters: x, y, out)"],
        );
    }
    let d = dir("align");
    let f = write(
        &d,
        "two.kg",
        b"kernel a(x: tensor<f32, 1, contiguous>, s: f32) {\n store(x, [bid(0)], load(x, [bid(0)], [128]) * s);\n}\n\
          kernel b(w: tensor<f16, 1, contiguous>) {\n store(w, [bid(0)], load(w, [bid(0)], [128]));\n}\n",
    );
    let o = kgen(&["compile", &f, "--align", "s=4"]);
    fails(
        &o,
        1,
        &["`s` is a scalar parameter of kernel `a`; --align takes a tensor parameter"],
    );
    // check compiles both kernels: a name is good if one of them has such a tensor, and
    // goes only to those.
    let o = kgen(&["check", &f, "--align", "w=4"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok: 2 kernel(s)"));
    let o = kgen(&["check", &f, "--align", "q=4"]);
    fails(
        &o,
        1,
        &["no kernel in the file has a tensor parameter `q` (tensor parameters: `a`: x; `b`: w)"],
    );
    // The alignment really is used: a 4-byte alignment changes the entry name.
    let o = kgen(&["compile", &f, "--kernel", "b", "--align", "w=4"]);
    assert!(stdout(&o).contains("__w_a4("), "{}", stdout(&o));
}

#[test]
fn zero_and_oversized_grids_are_refused_before_anything_runs() {
    let base = [
        "run", VEC_ADD, "--no-gpu", "--arg", "x=8", "--arg", "y=8", "--arg", "out=8", "--grid",
    ];
    for (grid, needle) in [
        ("0", "axis 0 has 0 blocks"),
        ("4,0", "axis 1 has 0 blocks"),
        ("1,1,0", "axis 2 has 0 blocks"),
        (
            "2147483648",
            "axis 0 has 2147483648 blocks; a launch allows at most 2147483647",
        ),
        (
            "1,65536",
            "axis 1 has 65536 blocks; a launch allows at most 65535",
        ),
        ("1,1,70000", "axis 2 has 70000 blocks"),
    ] {
        let mut args = base.to_vec();
        args.push(grid);
        let t0 = std::time::Instant::now();
        let o = kgen(&args);
        fails(&o, 2, &[needle]);
        assert!(
            !stdout(&o).contains("interpreter:"),
            "it ran: {}",
            stdout(&o)
        );
        assert!(t0.elapsed().as_secs() < 60);
    }
    // The largest legal grid on axes 1 and 2 still runs (the kernel ignores them here:
    // a grid of 1 x 2 x 1 is enough to show the parse accepts the limit form).
    let mut args = base.to_vec();
    args.push("1,2,1");
    assert_eq!(kgen(&args).status.code(), Some(0));
}

#[test]
fn bench_without_a_gpu_fails_with_a_clear_message() {
    if kgen::runtime::driver_present() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let o = kgen(&["bench", "--quick"]);
    fails(
        &o,
        1,
        &["kgen bench: no usable GPU", "nothing was measured"],
    );
}

// ---- kgen run --input / --save-outputs ----------------------------------------------

fn save_npy<T: npyz::Serialize + npyz::AutoSerialize>(
    path: &Path,
    shape: &[u64],
    order: npyz::Order,
    v: Vec<T>,
) -> String {
    use npyz::WriterBuilder;
    let f = std::fs::File::create(path).unwrap();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .order(order)
        .writer(std::io::BufWriter::new(f))
        .begin_nd()
        .unwrap();
    w.extend(v).unwrap();
    w.finish().unwrap();
    path.display().to_string()
}

/// (descr, shape, values as f64) of a saved file.
fn load_npy(path: &Path) -> (String, Vec<u64>, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let descr = f.dtype().descr();
    let shape = f.shape().to_vec();
    let vals: Vec<f64> = match descr.as_str() {
        "'<f4'" => f
            .into_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        "'<f2'" => f
            .into_vec::<half::f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        "'<i4'" => f
            .into_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        "'<i8'" => f
            .into_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        "'|b1'" => f
            .into_vec::<bool>()
            .unwrap()
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
        other => panic!("unexpected dtype {other}"),
    };
    (descr, shape, vals)
}

/// Deterministic, irregular values in [-2, 2).
fn vals(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5);
            ((h >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

const AFFINE: &str =
    "kernel affine<B: int = 256>(x: tensor<f32, 2>, a: f32, y: tensor<f32, 2>) {\n\
    let t = load(x, [bid(0), bid(1)], [1, B]);\n\
    store(y, [bid(0), bid(1)], t * a + 1.0);\n}\n";

/// Inputs from .npy files (C and Fortran order, f64 converted to the f32 parameter)
/// give the float64 reference's results in the saved outputs, on awkward sizes.
#[test]
fn run_reads_npy_inputs_and_saves_outputs() {
    let d = dir("npy");
    let k = write(&d, "affine.kg", AFFINE.as_bytes());
    for (rows, cols) in [(1usize, 1usize), (7, 1000), (3, 4097)] {
        for order in [npyz::Order::C, npyz::Order::Fortran] {
            let v = vals(rows * cols, (rows * cols) as u64);
            // The file's storage order: row-major values laid out as `order` wants.
            let stored: Vec<f64> = match order {
                npyz::Order::C => v.clone(),
                npyz::Order::Fortran => (0..rows * cols)
                    .map(|k| v[(k % rows) * cols + k / rows])
                    .collect(),
            };
            let x = save_npy(&d.join("x.npy"), &[rows as u64, cols as u64], order, stored);
            let out = d.join(format!("out_{rows}_{cols}_{order:?}"));
            let grid = format!("{rows},{}", cols.div_ceil(256));
            let o = kgen(&[
                "run",
                &k,
                "--no-gpu",
                "--grid",
                &grid,
                "--input",
                &format!("x={x}"),
                "--arg",
                "a=-0.75",
                "--arg",
                &format!("y={rows}x{cols}"),
                "--save-outputs",
                &out.display().to_string(),
            ]);
            assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
            let (descr, shape, got) = load_npy(&out.join("y.npy"));
            assert_eq!(descr, "'<f4'");
            assert_eq!(shape, vec![rows as u64, cols as u64]);
            for (i, (g, x)) in got.iter().zip(&v).enumerate() {
                let xf = *x as f32 as f64;
                let want = xf * -0.75 + 1.0;
                assert!(
                    (g - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{i}: {g} vs {want}"
                );
            }
        }
    }
}

const WIDEN: &str = "kernel widen(a: bf16, x: tensor<bf16, 1, contiguous>, h: tensor<f16, 1, contiguous>, y: tensor<f32, 1, contiguous>, b: tensor<bf16, 1, contiguous>, n: tensor<i32, 1, contiguous>, m: tensor<bool, 1, contiguous>) {\n\
    let t = load(x, [0], [4]);\n\
    store(y, [0], where(arange(0, 4) == 3, a as f32, t as f32));\n\
    store(h, [0], (t as f32) as f16);\n\
    store(b, [0], t);\n\
    store(n, [0], arange(0, 4) * 3 - 5);\n\
    store(m, [0], t > 0.0);\n}\n";

/// `kgen run`'s inputs round once to nearest even (issue 21: 1 + 2^-8 + 2^-40 became
/// 1.0 in a bf16 input and in a bf16 scalar), and every output dtype is saved in its
/// numpy dtype, bf16 as float32 with a note.
#[test]
fn run_inputs_round_once_and_outputs_keep_their_dtypes() {
    let d = dir("widen");
    let k = write(&d, "widen.kg", WIDEN.as_bytes());
    let p = |e: i32| 2f64.powi(e);
    let v = 1.0 + p(-8) + p(-40);
    let x = save_npy(
        &d.join("x.npy"),
        &[4],
        npyz::Order::C,
        vec![v, -v, 0.5, 0.0],
    );
    let out = d.join("out");
    let o = kgen(&[
        "run",
        &k,
        "--no-gpu",
        "--grid",
        "1",
        "--arg",
        &format!("a={v}"),
        "--input",
        &format!("x={x}"),
        "--arg",
        "h=4",
        "--arg",
        "y=4",
        "--arg",
        "b=4",
        "--arg",
        "n=4",
        "--arg",
        "m=4",
        "--save-outputs",
        &out.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let want = 1.0 + p(-7);
    let (descr, _, y) = load_npy(&out.join("y.npy"));
    assert_eq!(descr, "'<f4'");
    assert_eq!(y, vec![want, -want, 0.5, want]);
    let (descr, _, h) = load_npy(&out.join("h.npy"));
    assert_eq!((descr.as_str(), h), ("'<f2'", vec![want, -want, 0.5, 0.0]));
    let (descr, _, b) = load_npy(&out.join("b.npy"));
    assert_eq!((descr.as_str(), b), ("'<f4'", vec![want, -want, 0.5, 0.0]));
    assert!(
        stderr(&o).contains("b.npy` holds bf16 values written as float32"),
        "{}",
        stderr(&o)
    );
    let (descr, _, n) = load_npy(&out.join("n.npy"));
    assert_eq!((descr.as_str(), n), ("'<i4'", vec![-5.0, -2.0, 1.0, 4.0]));
    let (descr, _, m) = load_npy(&out.join("m.npy"));
    assert_eq!((descr.as_str(), m), ("'|b1'", vec![1.0, 0.0, 1.0, 0.0]));
}

/// An --input array for a tensor the kernel only writes is kept as given where the
/// kernel does not write (random outputs are poisoned instead).
#[test]
fn an_input_output_array_is_not_poisoned() {
    let d = dir("keep");
    let k = write(
        &d,
        "half.kg",
        b"kernel half(y: tensor<f32, 1, contiguous>) {\n store(y, [0], arange(0, 16) as f32);\n}\n",
    );
    let init: Vec<f32> = (0..32).map(|i| 100.0 + i as f32).collect();
    let y = save_npy(&d.join("y.npy"), &[32], npyz::Order::C, init.clone());
    let out = d.join("out");
    let o = kgen(&[
        "run",
        &k,
        "--no-gpu",
        "--grid",
        "1",
        "--input",
        &format!("y={y}"),
        "--save-outputs",
        &out.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (_, _, got) = load_npy(&out.join("y.npy"));
    let want: Vec<f64> = (0..32)
        .map(|i| if i < 16 { i as f64 } else { init[i] as f64 })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn bad_inputs_are_errors_that_say_what_is_wrong() {
    let d = dir("badin");
    let k = write(&d, "affine.kg", AFFINE.as_bytes());
    let x23 = save_npy(&d.join("x23.npy"), &[2, 3], npyz::Order::C, vec![1.0f64; 6]);
    let x3 = save_npy(&d.join("x3.npy"), &[3], npyz::Order::C, vec![1.0f64; 3]);
    let xi = save_npy(&d.join("xi.npy"), &[2, 3], npyz::Order::C, vec![1u8; 6]);
    let run = |extra: &[&str]| {
        let mut a = vec!["run", k.as_str(), "--no-gpu", "--grid", "1"];
        a.extend_from_slice(extra);
        kgen(&a)
    };
    let o = run(&[
        "--input",
        &format!("x={x3}"),
        "--arg",
        "a=1",
        "--arg",
        "y=2x3",
    ]);
    fails(&o, 1, &["the array has shape [3] (rank 1), `x` has rank 2"]);
    let o = run(&[
        "--input",
        &format!("x={xi}"),
        "--arg",
        "a=1",
        "--arg",
        "y=2x3",
    ]);
    fails(
        &o,
        1,
        &["arrays of `|u1` are not read; --input takes bool, int32"],
    );
    let o = run(&[
        "--input",
        &format!("a={x3}"),
        "--arg",
        "x=2x3",
        "--arg",
        "y=2x3",
    ]);
    fails(
        &o,
        1,
        &["--input a=", "`a` is a scalar; give its value with --arg"],
    );
    let o = run(&[
        "--input",
        &format!("x={x23}"),
        "--arg",
        "x=2x3",
        "--arg",
        "a=1",
        "--arg",
        "y=2x3",
    ]);
    fails(&o, 1, &["`x` is given twice: --arg x=2x3 and --input x="]);
    let o = run(&[
        "--input",
        &format!("z={x23}"),
        "--arg",
        "x=2x3",
        "--arg",
        "a=1",
        "--arg",
        "y=2x3",
    ]);
    fails(&o, 1, &["`affine` has no parameter `z`"]);
    let missing = d.join("nope.npy").display().to_string();
    let o = run(&[
        "--input",
        &format!("x={missing}"),
        "--arg",
        "a=1",
        "--arg",
        "y=2x3",
    ]);
    fails(&o, 1, &["cannot open"]);
    // --save-outputs with --bench: the timing run saves nothing.
    let o = kgen(&["run", &k, "--grid", "1", "--bench", "--save-outputs", "o"]);
    fails(&o, 2, &["--save-outputs", "--bench"]);
}
