//! The register limit: the per-thread budget the estimate is checked against, and the
//! diagnostic of a kernel over it (E0801 "the kernel needs about N registers").
//!
//! Assumes: the estimate of `assign::estimate_registers` (live tiles at the peak, in
//! registers per thread). Guarantees: the diagnostic points at the peak, names the
//! largest tile live there (its type, the power-of-two shape it is laid out in, its
//! registers per thread), and gives concrete ways to fit: the warps with which the
//! re-estimated kernel fits, if any, else (or also) a chunk size for that tile's longest
//! dimension whose scaled estimate fits, with the loop and the scratch buffer to write.
//!
//! Why not pad to less than a power of two: a `Linear` layout (`layout.rs`) gives every
//! bit of a padded coordinate to one register, lane or warp bit, so that a coordinate is
//! a sum of `%tid.x` bit fields plus a constant and every conversion, reduction and
//! reshape is a bit permutation. Padding 11008 to 3 x 4096 instead of 16384 would make
//! the register index a mixed-radix digit: every consumer of the bit-field model (weight
//! maps, `free_remap`, the shuffle reductions' lane masks, reshapes) would need a second
//! form. The padding costs registers, not memory traffic (padded lanes are predicated
//! off), so the diagnostic says where it matters and how to chunk instead.

use super::assign::{self, RegisterEstimate};
use super::layout::padded;
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::{Function, ValueId};
use crate::span::Span;
use crate::target::Target;
use crate::types::ValueType;

/// Registers (32-bit) that we leave for addresses, predicates and temporaries when
/// checking the estimate against the per-thread budget.
pub const REG_OVERHEAD: u32 = 16;
/// The most registers per thread the estimate may reach (ptxas allows 255; beyond
/// about 200 live tile registers it starts spilling).
pub const REG_SOFT_LIMIT: u32 = 200;

/// The most tile registers the estimate may count for blocks of `threads` threads.
pub fn register_limit(target: &Target, threads: u32) -> u32 {
    let per_thread =
        (target.registers_per_sm / threads.max(1)).min(target.max_registers_per_thread);
    REG_SOFT_LIMIT.min(per_thread.saturating_sub(REG_OVERHEAD))
}

/// The E0801 diagnostic of `func` compiled with `num_warps` warps, whose estimate `est`
/// is over the limit.
pub fn too_many_registers(
    func: &Function,
    est: &RegisterEstimate,
    target: &Target,
    num_warps: u32,
    fallback_span: Span,
) -> Diagnostics {
    let threads = num_warps * target.warp_size;
    let limit = register_limit(target, threads);
    let span = est.at.map(|i| func.insts[i].span).unwrap_or(fallback_span);
    let mut d = Diagnostic::error(
        ErrorCode::TargetLimit,
        span,
        format!(
            "the kernel needs about {} registers per thread with {num_warps} warps; the limit is {}",
            est.regs + REG_OVERHEAD,
            limit + REG_OVERHEAD
        ),
    );
    let tiles: Vec<(ValueId, u32)> = est
        .live
        .iter()
        .copied()
        .filter(|&(v, _)| matches!(func.value_type(v), ValueType::Tile(..)))
        .collect();
    let Some(&(top, top_regs)) = tiles.first() else {
        return Diagnostics::single(d.with_note(
            "help: use smaller tiles or more warps (tiles live here hold too many elements per thread)",
        ));
    };
    let ValueType::Tile(dtype, shape) = func.value_type(top).clone() else {
        return Diagnostics::single(d);
    };
    // A chunk kept on chip holds what was loaded: the cast's source dtype for a tile
    // cast from another of its shape (`load(...) as f32`).
    let stored = match defining(func, top).map(|i| &func.insts[i].op) {
        Some(crate::ir::Op::Cast(src)) => match func.value_type(*src) {
            ValueType::Tile(d, s) if *s == shape => *d,
            _ => dtype,
        },
        _ => dtype,
    };
    let dims = shape.dims().to_vec();
    let pad = padded(&dims);
    let name = match &func.values[top].name {
        Some(n) => format!("`{n}`, "),
        None => String::new(),
    };
    if let Some(def) = defining(func, top) {
        d = d.with_secondary(
            func.insts[def].span,
            "the largest tile live there is made here",
        );
    }
    let others: u32 = tiles.iter().skip(1).map(|t| t.1).sum();
    let more = match tiles.len() - 1 {
        0 => String::new(),
        1 => format!("; one more tile live there holds {others}"),
        n => format!("; {n} more tiles live there hold {others}"),
    };
    let laid_out = if pad != dims {
        format!(
            ", laid out as {} (tile extents are padded to powers of two)",
            shape_text(&pad)
        )
    } else {
        String::new()
    };
    d = d.with_note(format!(
        "the largest tile live there is {name}tile<{dtype}, {}>{laid_out}: {top_regs} registers \
         per thread with {num_warps} warps{more}",
        shape_text(&dims),
    ));
    // More warps: re-estimated, as compiled.
    let mut more_warps = false;
    let mut w = num_warps * 2;
    while w * target.warp_size <= target.max_threads_per_block {
        let asg = assign::assign(func, w, target.caps.wgmma);
        let e = assign::estimate_registers(func, &asg);
        let lim = register_limit(target, w * target.warp_size);
        if e.regs <= lim {
            d = d.with_note(format!(
                "help: with {w} warps it needs about {} registers, within the limit of {}: \
                 compile with `--warps {w}` (`CompileOptions::num_warps`)",
                e.regs + REG_OVERHEAD,
                lim + REG_OVERHEAD
            ));
            more_warps = true;
            break;
        }
        w *= 2;
    }
    // Chunks of the tile's longest dimension: the live tiles' registers scale with it.
    let tile_regs: u32 = tiles.iter().map(|t| t.1).sum();
    let fixed = est.regs.saturating_sub(tile_regs);
    // The longest dimension (the first of equals: the last one is the contiguous one,
    // which keeps its vectors).
    let (axis, &full) = pad
        .iter()
        .enumerate()
        .max_by_key(|&(i, &e)| (e, std::cmp::Reverse(i)))
        .unwrap_or((0, &1));
    let mut chunk = full / 2;
    let fits = |c: u32| fixed + (tile_regs as u64 * c as u64).div_ceil(full as u64) as u32 <= limit;
    while chunk >= 32 && !fits(chunk) {
        chunk /= 2;
    }
    if chunk >= 32 {
        let extent = dims[axis];
        let n = extent.div_ceil(chunk);
        let mut chunk_dims = dims.clone();
        chunk_dims[axis] = chunk;
        let slot_elems: u64 = chunk_dims.iter().map(|&e| e as u64).product();
        let scratch_bytes = n as u64 * slot_elems * stored.size_bytes() as u64;
        let est_chunk = fixed + (tile_regs as u64 * chunk as u64).div_ceil(full as u64) as u32;
        let index: Vec<String> = (0..dims.len())
            .map(|i| {
                if i == axis {
                    "k".to_string()
                } else {
                    "..".to_string()
                }
            })
            .collect();
        let mut help = format!(
            "help: {}process dimension {axis} ({extent}) in chunks of {chunk}: a loop over {} \
             tiles (`for k in 0..cdiv({extent}, {chunk}) {{ ... load(t, [{}], {}) ... }}`), \
             about {} registers per thread; a reduction along it adds up the chunks' \
             partial results",
            if more_warps { "or " } else { "" },
            shape_text(&chunk_dims),
            index.join(", "),
            shape_text(&chunk_dims),
            est_chunk + REG_OVERHEAD,
        );
        if scratch_bytes <= target.max_shared_bytes_per_block as u64 {
            help.push_str(&format!(
                "; to use the chunks again after it (a norm, a softmax) without reading them \
                 twice, keep them on chip in `scratch({n}, {}, {stored})` ({scratch_bytes} \
                 bytes of shared memory)",
                shape_text(&chunk_dims)
            ));
        }
        d = d.with_note(help);
    } else if !more_warps {
        d = d.with_note(
            "help: use smaller tiles or more warps (tiles live here hold too many elements per thread)",
        );
    }
    Diagnostics::single(d)
}

/// `[a, b]`.
fn shape_text(dims: &[u32]) -> String {
    let parts: Vec<String> = dims.iter().map(u32::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The instruction that defines `v`.
fn defining(func: &Function, v: ValueId) -> Option<crate::ir::InstId> {
    func.insts
        .iter()
        .find(|(_, inst)| inst.results.contains(&v))
        .map(|(i, _)| i)
}
