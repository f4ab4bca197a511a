//! The two small kernels the GPT needs that the op library does not have, written next to
//! their caller with `#[kgen::kernel]` (the same language, checked when the crate builds):
//! a dtype cast over a flat buffer (the f32 master parameters to their bf16 working
//! copies, the bf16 gradients to the optimizers' f32 gradient buffers) and the one-hot
//! rows of a batch's input bytes (what the embedding lookup multiplies: see the module
//! docs of [`crate::gpt`]).

use crate::ops::{shape_err, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Tensor;

/// Elements per block of [`gpt_cast`].
const CAST_BLOCK: usize = 2048;
/// Rows per block of [`gpt_onehot`].
const ONEHOT_ROWS: usize = 16;
/// The vocabulary: bytes.
pub const VOCAB: usize = 256;

/// `y = x as T`, elementwise over a flat buffer (f32 → bf16 rounds to nearest even).
#[kgen::kernel]
fn gpt_cast<S: Float = f32, T: Float = bf16, const BLOCK: i32 = 2048>(
    x: Tensor<S, 1, Contiguous>,
    y: Tensor<T, 1, Contiguous>,
) {
    let i = bid(0);
    store(y, [i], load(x, [i], [BLOCK]) as T);
}

/// `out[r, c] = (tokens[r] == c)` as bf16: the one-hot rows of `tokens` over a
/// vocabulary of `V`.
#[kgen::kernel]
fn gpt_onehot<const ROWS: i32 = 16, const V: i32 = 256>(
    tokens: Tensor<i32, 1, Contiguous>,
    out: Tensor<bf16, 2, Contiguous>,
) {
    let r = bid(0);
    let t = load(tokens, [r], [ROWS]);
    let hit = expand_dims(t, 1) == expand_dims(arange(0, V), 0);
    store(out, [r, 0], hit as bf16);
}

/// `y = x as y.dtype` for two flat (1-D, contiguous) buffers of one length, on `ops`'
/// stream.
pub fn cast_into(ops: &Ops, x: &Tensor, y: &Tensor) -> Result<(), OpError> {
    const OP: &str = "gpt_cast";
    if x.rank() != 1 || y.shape() != x.shape() {
        return Err(shape_err(
            OP,
            format!(
                "flat buffers of one length expected, got {:?} and {:?}",
                x.shape(),
                y.shape()
            ),
        ));
    }
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let opts = gpt_cast::options(ops.device().arch())
        .define("S", x.dtype())
        .define("T", y.dtype())
        .define("BLOCK", CAST_BLOCK);
    let grid = [n.div_ceil(CAST_BLOCK) as u32, 1, 1];
    Ok(gpt_cast::launch_with(ops.stream(), &opts, grid, x, y)?)
}

/// The one-hot rows `[N, 256]` (bf16) of `tokens` (i32 `[N]`, each in `0..256`) into
/// `out`, on `ops`' stream.
pub fn onehot_into(ops: &Ops, tokens: &Tensor, out: &Tensor) -> Result<(), OpError> {
    const OP: &str = "gpt_onehot";
    let n = tokens.numel();
    if tokens.dtype() != DType::I32 || tokens.rank() != 1 {
        return Err(shape_err(OP, "tokens must be i32 [N]"));
    }
    if out.dtype() != DType::BF16 || out.shape() != [n, VOCAB] {
        return Err(shape_err(
            OP,
            format!(
                "out must be bf16 [{n}, {VOCAB}], got {} {:?}",
                out.dtype(),
                out.shape()
            ),
        ));
    }
    if n == 0 {
        return Ok(());
    }
    let opts = gpt_onehot::options(ops.device().arch())
        .define("ROWS", ONEHOT_ROWS)
        .define("V", VOCAB);
    let grid = [n.div_ceil(ONEHOT_ROWS) as u32, 1, 1];
    Ok(gpt_onehot::launch_with(
        ops.stream(),
        &opts,
        grid,
        tokens,
        out,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::Arch;
    use kgen_runtime::Device;

    /// Every specialization the GPT launches compiles for both targets and, with
    /// `KGEN_PTXAS`, assembles without spills or stack.
    #[test]
    fn kernels_compile_and_assemble_for_both_targets() {
        for arch in [Arch::Sm80, Arch::Sm90a] {
            let mut ptx = Vec::new();
            for (s, t) in [("f32", "bf16"), ("bf16", "f32")] {
                let o = gpt_cast::options(arch)
                    .define("S", s)
                    .define("T", t)
                    .define("BLOCK", CAST_BLOCK);
                ptx.push((format!("cast_{s}_{t}"), gpt_cast::compile(&o).unwrap().ptx));
            }
            let o = gpt_onehot::options(arch)
                .define("ROWS", ONEHOT_ROWS)
                .define("V", VOCAB);
            ptx.push(("onehot".into(), gpt_onehot::compile(&o).unwrap().ptx));
            let Some(ptxas) = std::env::var_os("KGEN_PTXAS") else {
                continue;
            };
            let dir = std::env::temp_dir().join(format!("kgen-gpt-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            for (name, text) in ptx {
                let f = dir.join(format!("{name}_{arch}.ptx"));
                std::fs::write(&f, text).unwrap();
                let out = std::process::Command::new(&ptxas)
                    .arg(format!("-arch={arch}"))
                    .args(["-v", "-o", "/dev/null"])
                    .arg(&f)
                    .output()
                    .unwrap();
                let log = String::from_utf8_lossy(&out.stderr).into_owned();
                assert!(out.status.success(), "{name} {arch}: {log}");
                assert!(
                    log.contains("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"),
                    "{name} {arch}: {log}"
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn cast_and_onehot_on_the_interpreter() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let v: Vec<f64> = (0..3000).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        let x = d.from_f64(DType::F32, &[3000], &v).unwrap();
        let y = ops.empty(DType::BF16, &[3000]).unwrap();
        cast_into(&ops, &x, &y).unwrap();
        let back = ops.empty(DType::F32, &[3000]).unwrap();
        cast_into(&ops, &y, &back).unwrap();
        let got = back.to_f64_vec().unwrap();
        let want = d
            .from_f64(DType::BF16, &[3000], &v)
            .unwrap()
            .to_f64_vec()
            .unwrap();
        assert_eq!(got, want);

        let toks: Vec<i32> = (0..37).map(|i| i * 97 % 256).collect();
        let t = d.from_slice(&[37], &toks).unwrap();
        let out = ops.empty(DType::BF16, &[37, VOCAB]).unwrap();
        onehot_into(&ops, &t, &out).unwrap();
        let o = out.to_f64_vec().unwrap();
        for (r, &tok) in toks.iter().enumerate() {
            for c in 0..VOCAB {
                assert_eq!(o[r * VOCAB + c], (c as i32 == tok) as u8 as f64);
            }
        }
    }
}
