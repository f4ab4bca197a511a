//! Stores of values rounded to f16 / bf16: packed straight from the f32 they were
//! rounded from (one `cvt.rn.bf16x2.f32` per two elements), never across two formats.

use super::tests_gather::ptx_of;
use std::collections::HashMap;

/// For each register the PTX defines, the opcode of its (last) definition.
fn definitions(ptx: &str) -> HashMap<String, String> {
    let mut defs = HashMap::new();
    for line in ptx.lines().map(str::trim) {
        let line = line
            .strip_prefix('@')
            .map_or(line, |r| r.split_once(' ').map_or("", |x| x.1));
        if let Some((op, rest)) = line.split_once(' ') {
            if let Some(dst) = rest.split(',').next() {
                let dst = dst.trim().trim_end_matches(';');
                if dst.starts_with('%') {
                    defs.insert(dst.to_string(), op.to_string());
                }
            }
        }
    }
    defs
}

/// The opcodes defining the source operands of every `op` instruction.
fn source_defs(ptx: &str, op: &str) -> Vec<String> {
    let defs = definitions(ptx);
    let mut out = Vec::new();
    for line in ptx.lines().map(str::trim).filter(|l| l.starts_with(op)) {
        let operands: Vec<&str> = line[op.len()..].trim_end_matches(';').split(',').collect();
        for src in &operands[1..] {
            out.push(defs.get(src.trim()).cloned().unwrap_or_default());
        }
    }
    out
}

#[test]
fn a_stored_cast_is_packed_from_its_f32_source() {
    let ptx = ptx_of(
        "kernel k(x: tensor<f32, 1, contiguous>, y: tensor<bf16, 1, contiguous>) {\n\
         let i = bid(0);\n\
         store(y, [i], (load(x, [i], [1024]) * 3.0) as bf16);\n}\n",
        &[],
    );
    let srcs = source_defs(&ptx, "cvt.rn.bf16x2.f32");
    assert!(!srcs.is_empty(), "{ptx}");
    assert!(srcs.iter().all(|d| d == "mul.rn.f32"), "{srcs:?}\n{ptx}");
}

#[test]
fn a_value_rounded_through_another_format_is_packed_from_that_format() {
    // (v as f16) as bf16 rounds twice: packing v itself into bf16 would skip the f16 step.
    let ptx = ptx_of(
        "kernel k(x: tensor<f32, 1, contiguous>, y: tensor<bf16, 1, contiguous>) {\n\
         let i = bid(0);\n\
         store(y, [i], ((load(x, [i], [1024]) * 3.0) as f16) as bf16);\n}\n",
        &[],
    );
    let srcs = source_defs(&ptx, "cvt.rn.bf16x2.f32");
    assert!(!srcs.is_empty(), "{ptx}");
    assert!(srcs.iter().all(|d| d == "cvt.f32.f16"), "{srcs:?}\n{ptx}");
}
