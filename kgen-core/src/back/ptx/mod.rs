//! The PTX back end: layout assignment, lowering to PTX instructions, and one printer.
//!
//! ```text
//!   ir::Function ──assign──▶ layouts ──limits──▶ lower ──wgmma_waits──▶ dead_code ──▶ isa::Module ──writer──▶ text
//! ```
//!
//! Assumes: validated IR (`valid::validate` gave the `ModuleInfo`). Guarantees: a
//! `CompiledKernel` whose PTX declares one `.param` per `AbiSlot` (for each source
//! parameter in order — tensor: `.u64` pointer, `.s32` runtime extents, `.s32` strides
//! except a contiguous last one; scalar: by value), or `Diagnostics`: `TargetLimit` for
//! threads, shared memory and an estimated register count that the target cannot hold,
//! `Unsupported` for constructs this back end does not lower.

pub mod assign;
pub mod axis;
pub mod cheap_layouts;
pub mod dead_code;
pub mod dot_chains;
pub mod isa;
pub mod layout;
pub mod limits;
pub mod lower;
pub mod mma_layout;
pub mod pingpong;
pub mod smem;
pub mod swizzle;
pub mod sync;
pub mod tma;
pub mod wgmma_waits;
pub mod writer;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_chains;
#[cfg(test)]
mod tests_erf;
#[cfg(test)]
mod tests_gather;
#[cfg(test)]
mod tests_grid_sync;
#[cfg(test)]
mod tests_limits;
#[cfg(test)]
mod tests_packed;
#[cfg(test)]
mod tests_pingpong;
#[cfg(test)]
mod tests_red;
#[cfg(test)]
mod tests_rotate;
#[cfg(test)]
mod tests_rounding;
#[cfg(test)]
mod tests_scan;
#[cfg(test)]
mod tests_scratch;
#[cfg(test)]
mod tests_tf32;
#[cfg(test)]
mod tests_tma;

use crate::abi::{
    AbiParam, AbiSlot, CompiledKernel, KernelAbi, LaunchHints, SourceParam, Specialization,
};
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::{Block, Function, Op, ParamKind};
use crate::span::Span;
use crate::target::Target;
use crate::types::DType;
use crate::valid::ModuleInfo;
use lower::ParamLoad;

/// Writes PTX for one validated function.
pub fn write(
    func: &Function,
    info: &ModuleInfo,
    target: &Target,
    spec: &Specialization,
) -> Result<CompiledKernel, Diagnostics> {
    let num_warps = spec.num_warps;
    let threads = num_warps.saturating_mul(target.warp_size);
    let first_span = func
        .body
        .insts
        .first()
        .map(|&i| func.insts[i].span)
        .unwrap_or(Span::DUMMY);
    if threads > target.max_threads_per_block {
        return Err(limit(
            first_span,
            format!(
                "{num_warps} warps make {threads} threads per block; {} allows at most {}",
                target.arch, target.max_threads_per_block
            ),
            "use fewer warps",
        ));
    }
    if num_warps == 0 || !num_warps.is_power_of_two() {
        return Err(Diagnostics::single(Diagnostic::error(
            ErrorCode::Unsupported,
            first_span,
            format!("the warp count must be a power of two from 1 to 32, not {num_warps}"),
        )));
    }

    let min_blocks = spec.min_blocks_per_sm.unwrap_or(1).max(1);
    if threads.saturating_mul(min_blocks) > target.max_threads_per_sm {
        return Err(limit(
            first_span,
            format!(
                "{min_blocks} blocks of {threads} threads per SM need {} threads; {} allows {} per SM",
                threads.saturating_mul(min_blocks),
                target.arch,
                target.max_threads_per_sm
            ),
            "use fewer warps or a smaller --min-blocks-per-sm",
        ));
    }

    let asg = assign::assign(func, num_warps, target.caps.wgmma);
    // The estimate is checked against one block's budget; a `min_blocks_per_sm` bound is
    // ptxas's to meet (`.minnctapersm`, like `__launch_bounds__`), which spills rather
    // than fails when it cannot: `tests/no_spills.rs` checks the op library's bounds.
    let est = assign::estimate_registers(func, &asg);

    let tma = tma::plan(func, target, spec);
    let (mut abi, loads) = build_abi(func, info);
    for m in &tma.maps {
        abi.params.push(AbiParam {
            ptx_name: m.ptx_name.clone(),
            ptx_type: "tmap",
            size: crate::abi::TENSOR_MAP_BYTES,
            slot: AbiSlot::TensorMap {
                param: m.param,
                map: m.spec,
            },
        });
    }
    // Warp specialization adds a producer warpgroup: only where the registers the
    // estimate counts still fit with its threads, and one block per SM is asked for; and
    // only for rings of 3 or more slots (with 1 or 2 the pipeline waits inside its loop
    // with `scratch_wait(0)`, which the consumers lower as the drain that releases every
    // unread slot: the fill about to be read would be released before its read), or
    // buffers filled once outside every loop (a resident operand, never released).
    let ws_threads = threads + lower::PRODUCER_THREADS;
    let once = lower::fetched_once(func);
    let deep_rings = func
        .scratch
        .iter()
        .enumerate()
        .all(|(i, b)| !b.shared || b.slots >= 3 || once.contains(&(i as u32)));
    // Two consumer warpgroups take `CONSUMER_REGS` each (`setmaxnreg`); otherwise the
    // block's threads share the register file evenly.
    let regs_fit = if threads == 2 * lower::PRODUCER_THREADS {
        est.regs + limits::REG_OVERHEAD <= lower::CONSUMER_REGS
    } else {
        est.regs <= limits::register_limit(target, ws_threads)
    };
    let specialize = spec.ws
        && deep_rings
        && min_blocks == 1
        && ws_threads <= target.max_threads_per_block
        && regs_fit;
    // Two consumer warpgroups of a specialized block get `CONSUMER_REGS` each, past the
    // soft limit that holds for every other block.
    let two_consumer_wgs = specialize && threads == 2 * lower::PRODUCER_THREADS;
    // Why a requested producer warpgroup is not there (the kernel is still correct and
    // complete without one): said in the PTX header and in `CompiledKernel::notes`.
    let mut ws_refused = if !spec.ws {
        None
    } else if !target.caps.wgmma {
        Some(format!(
            "{} has no TMA copy engine or wgmma: the kernel is the same without it",
            target.arch
        ))
    } else if specialize {
        None
    } else if !deep_rings {
        Some("a pipelined ring has fewer than 3 slots (`--stages 3` or more)".to_string())
    } else if min_blocks != 1 {
        Some(format!(
            "{min_blocks} blocks per SM are asked for (`--min-blocks-per-sm`); the producer needs a block per SM"
        ))
    } else if ws_threads > target.max_threads_per_block {
        Some(format!(
            "the producer's {} threads would make {ws_threads}, over {}'s {} per block",
            lower::PRODUCER_THREADS,
            target.arch,
            target.max_threads_per_block
        ))
    } else {
        Some(format!(
            "the estimated {} registers per thread do not fit beside the producer's threads",
            est.regs + limits::REG_OVERHEAD
        ))
    };
    // Over the register limit without a producer (whose consumers get more): E0801,
    // with the reason a requested producer is not there.
    let over_limit = |why: &Option<String>| {
        let mut d = limits::too_many_registers(func, &est, target, num_warps, first_span);
        if let Some(why) = why {
            d.0 =
                d.0.into_iter()
                    .map(|x| {
                        x.with_note(format!(
                            "warp specialization (`--ws`) was not applied: {why}"
                        ))
                    })
                    .collect();
        }
        d
    };
    let over = est.regs > limits::register_limit(target, threads);
    if !two_consumer_wgs && over {
        return Err(over_limit(&ws_refused));
    }
    let mut lowered = lower::Lowerer::new(func, &asg, target)
        .with_tma(tma.clone(), specialize)
        .with_pingpong(spec.pingpong && two_consumer_wgs)
        .run(&loads)?;
    if specialize && lowered.producer_threads == 0 {
        ws_refused = Some(if target.caps.wgmma {
            "no pipelined `dot` loop is fed by TMA copies (sm_90a's wgmma path, without `--no-tma`)"
                .to_string()
        } else {
            format!(
                "{} has no TMA copy engine or wgmma: the kernel is the same without it",
                target.arch
            )
        });
        // The limit was waived for a producer that did not come.
        if over {
            return Err(over_limit(&ws_refused));
        }
    }
    if lowered.producer_threads > 0
        && lowered.smem_bytes + lowered.cluster_slots * lower::SLOT_BYTES
            > target.max_shared_bytes_per_block
    {
        // The rings, alive across the persistent loop, leave the epilogue too little
        // shared memory: the kernel without a producer warpgroup (its rings are freed
        // before the epilogue) may fit.
        ws_refused = Some(format!(
            "with it the rings stay alive through the epilogue, and {} bytes of shared memory exceed {}'s {}",
            lowered.smem_bytes + lowered.cluster_slots * lower::SLOT_BYTES,
            target.arch,
            target.max_shared_bytes_per_block
        ));
        lowered = lower::Lowerer::new(func, &asg, target)
            .with_tma(tma, false)
            .run(&loads)?;
    }
    // Why requested turns are not taken (the kernel is correct without them).
    let pingpong_refused = if !spec.pingpong || lowered.turn_loops > 0 {
        None
    } else if lowered.producer_threads == 0 || threads != 2 * lower::PRODUCER_THREADS {
        Some("it needs a warp-specialized block (`--ws`) of two consumer warpgroups (8 warps)")
    } else {
        Some("no loop issues two or more products back to back")
    };
    let notes: Vec<String> = ws_refused
        .map(|why| format!("warp specialization (`--ws`) not applied: {why}"))
        .into_iter()
        .chain(pingpong_refused.map(|why| format!("ping-pong (`--pingpong`) not applied: {why}")))
        .collect();
    let threads = threads + lowered.producer_threads;
    let cluster_bytes = lowered.cluster_slots * lower::SLOT_BYTES;
    if lowered.smem_bytes + cluster_bytes > target.max_shared_bytes_per_block {
        // Point at the largest scratch buffer when there is one: it is what to shrink.
        let largest = lowered
            .scratch_slot_bytes
            .iter()
            .enumerate()
            .zip(&func.scratch)
            .filter(|(_, b)| !b.shared)
            .max_by_key(|((_, &slot), b)| slot as u64 * b.slots as u64);
        let at_peak = format!(
            "at the peak these buffers are alive: {}",
            smem::describe(&lowered.smem_at_peak)
        );
        if let Some(((_, &slot_bytes), b)) = largest {
            return Err(limit(
                b.span,
                format!(
                    "the kernel needs {} bytes of shared memory, {} of them for scratch buffers; {} allows {} per block",
                    lowered.smem_bytes + cluster_bytes,
                    lowered.scratch_bytes,
                    target.arch,
                    target.max_shared_bytes_per_block
                ),
                &format!(
                    "use fewer or smaller slots: `{}` holds {} tiles of {slot_bytes} bytes; {at_peak}",
                    b.name, b.slots
                ),
            ));
        }
        return Err(limit(
            first_span,
            format!(
                "the kernel needs {} bytes of shared memory; {} allows {} per block",
                lowered.smem_bytes + cluster_bytes,
                target.arch,
                target.max_shared_bytes_per_block
            ),
            &format!("use smaller tiles, or fewer pipeline stages (`--stages`); {at_peak}"),
        ));
    }
    // Static shared memory is limited to the default window; beyond it the buffer is
    // dynamic and the launcher opts in.
    let dynamic = lowered.smem_bytes > target.default_shared_bytes_per_block;
    let shared = (lowered.smem_bytes > 0).then(|| isa::SharedDecl {
        name: lower::SMEM.to_string(),
        align: lowered.smem_align,
        bytes: lowered.smem_bytes,
        dynamic,
    });
    let entry = func.name.clone();
    let mut body = lowered.body;
    wgmma_waits::place_waits(&mut body);
    dead_code::remove_dead_instructions(&mut body);
    // Every opcode lowering emits has a row in the ISA table (its effects and operand
    // roles); one without is a compiler bug, reported rather than printed.
    if let Some(text) = body.iter().find_map(|s| match s {
        isa::Stmt::Inst(i) if i.opcode.family == isa::Family::Unknown => {
            Some(i.opcode.text.clone())
        }
        _ => None,
    }) {
        return Err(Diagnostics::single(Diagnostic::error(
            ErrorCode::InvalidIr,
            first_span,
            format!("internal compiler error: opcode `{text}` has no entry in the ISA table"),
        )));
    }
    // The target's PTX version, raised where an instruction needs a later one.
    let version = body
        .iter()
        .filter_map(|s| match s {
            isa::Stmt::Inst(i) => Some(i.opcode.min_version()),
            _ => None,
        })
        .fold(target.ptx_version, std::cmp::max);
    let module = isa::Module {
        version,
        target: target.ptx_target(),
        entry: entry.clone(),
        params: abi
            .params
            .iter()
            .map(|p| isa::ParamDecl {
                name: p.ptx_name.clone(),
                ty: p.ptx_type,
            })
            .collect(),
        max_ntid: threads,
        max_nreg: register_budget(target, threads, min_blocks),
        min_ctas_per_sm: spec.min_blocks_per_sm,
        reg_counts: lowered.reg_counts,
        shared,
        cluster: info.cluster_size.map(|c| (c, lowered.cluster_slots)),
        body,
        header_comments: vec![
            format!(
                "kernel {} ({}), {} warps",
                func.name, func.source_name, num_warps
            ),
            format!("specialization: {}", spec.key()),
            format!(
                "shared memory: {} bytes{}",
                lowered.smem_bytes,
                if dynamic { " (dynamic)" } else { "" }
            ),
        ]
        .into_iter()
        .chain(notes.iter().cloned())
        .collect(),
    };
    let launch = LaunchHints {
        threads_per_block: threads,
        static_shared_bytes: cluster_bytes + if dynamic { 0 } else { lowered.smem_bytes },
        dynamic_shared_bytes: if dynamic { lowered.smem_bytes } else { 0 },
        grid_rank: info.grid_rank.max(1),
        cluster_size: info.cluster_size.unwrap_or(1),
        programmatic_dependency: target.caps.grid_dependency && waits_on_grid(func, &func.body),
        cooperative: crate::ir::has_grid_sync(func),
    };
    Ok(CompiledKernel {
        ptx: module.to_string(),
        entry,
        arch: target.arch,
        abi,
        launch,
        spec: spec.clone(),
        notes,
    })
}

/// The registers per thread that `min_blocks` blocks of `threads` threads may use on
/// one SM: `registers_per_sm / (threads * min_blocks)`, at most the target's 255, else
/// rounded down to a multiple of 8 (registers are allocated to warps in units of 256,
/// 8 per thread: 85 per thread would take 88 and fit one block fewer). Written as
/// `.maxnreg`: without it ptxas picks its own limit, which can be lower (64 for 128
/// threads: `rmsnorm_bwd<f32, RESIDUAL>` spilled there, and uses 84 registers without
/// spilling under `.maxnreg`); with `.minnctapersm` it is the same limit ptxas derives.
pub fn register_budget(target: &Target, threads: u32, min_blocks: u32) -> u32 {
    let per_thread = target.registers_per_sm / threads.saturating_mul(min_blocks).max(1);
    if per_thread >= target.max_registers_per_thread {
        target.max_registers_per_thread
    } else {
        per_thread / 8 * 8
    }
}

fn limit(span: Span, msg: String, help: &str) -> Diagnostics {
    Diagnostics::single(
        Diagnostic::error(ErrorCode::TargetLimit, span, msg).with_note(format!("help: {help}")),
    )
}

/// The PTX type and size of a scalar parameter.
fn scalar_param_type(dt: DType) -> (&'static str, u32) {
    match dt {
        DType::Bool => ("u32", 4),
        DType::I32 => ("s32", 4),
        DType::U32 => ("u32", 4),
        DType::I64 => ("s64", 8),
        DType::F16 | DType::BF16 => ("b16", 2),
        DType::F32 => ("f32", 4),
    }
}

/// The kernel ABI and how the prologue reads each parameter (which tensors are read
/// and written: the validator's `ModuleInfo::tensor_access`).
fn build_abi(func: &Function, info: &ModuleInfo) -> (KernelAbi, Vec<ParamLoad>) {
    let access = |i: usize| info.tensor_access.get(i).copied().unwrap_or((true, true));
    let mut abi = KernelAbi::default();
    let mut loads = Vec::new();
    for (i, p) in func.params.iter().enumerate() {
        let param = i as u32;
        match &p.kind {
            ParamKind::Tensor(t) => {
                abi.source_params.push(SourceParam::Tensor {
                    name: p.name.clone(),
                    dtype: t.dtype,
                    dims: t.dims.clone(),
                    contiguous: t.contiguous,
                    align_bytes: t.align_bytes,
                    written: access(i).1,
                    read: access(i).0,
                });
                let ptr = format!("p_{}_ptr", p.name);
                abi.params.push(AbiParam {
                    ptx_name: ptr.clone(),
                    ptx_type: "u64",
                    size: 8,
                    slot: AbiSlot::TensorPtr { param },
                });
                let mut dims = Vec::new();
                for (d, ext) in t.dims.iter().enumerate() {
                    match ext {
                        Some(c) => dims.push(Err(*c)),
                        None => {
                            let name = format!("p_{}_dim{d}", p.name);
                            abi.params.push(AbiParam {
                                ptx_name: name.clone(),
                                ptx_type: "s32",
                                size: 4,
                                slot: AbiSlot::TensorDim {
                                    param,
                                    dim: d as u8,
                                },
                            });
                            dims.push(Ok(name));
                        }
                    }
                }
                let mut strides = Vec::new();
                for d in 0..t.rank() {
                    if t.contiguous && d + 1 == t.rank() {
                        strides.push(None);
                        continue;
                    }
                    let name = format!("p_{}_stride{d}", p.name);
                    abi.params.push(AbiParam {
                        ptx_name: name.clone(),
                        ptx_type: "s32",
                        size: 4,
                        slot: AbiSlot::TensorStride {
                            param,
                            dim: d as u8,
                        },
                    });
                    strides.push(Some(name));
                }
                loads.push(ParamLoad::Tensor { ptr, dims, strides });
            }
            ParamKind::Scalar(dt) => {
                abi.source_params.push(SourceParam::Scalar {
                    name: p.name.clone(),
                    dtype: *dt,
                });
                let (ty, size) = scalar_param_type(*dt);
                let name = format!("p_{}", p.name);
                abi.params.push(AbiParam {
                    ptx_name: name.clone(),
                    ptx_type: ty,
                    size,
                    slot: AbiSlot::Scalar { param, dtype: *dt },
                });
                loads.push(ParamLoad::Scalar { name, dtype: *dt });
            }
        }
    }
    (abi, loads)
}

/// Whether the kernel calls `gdc_wait()` (then it may be launched as a programmatic
/// dependent of the kernel before it).
fn waits_on_grid(func: &Function, b: &Block) -> bool {
    b.insts.iter().any(|&i| match &func.insts[i].op {
        Op::GridDependency(crate::ir::GridDependency::Wait) => true,
        Op::For { body, .. } => waits_on_grid(func, body),
        Op::If {
            then_body,
            else_body,
            ..
        } => waits_on_grid(func, then_body) || waits_on_grid(func, else_body),
        _ => false,
    })
}
