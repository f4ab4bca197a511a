//! Software pipelining of the loops that feed tensor-core `dot`s (Triton's
//! `num_stages`).
//!
//! A `for` loop whose body loads the tiles a `dot` multiplies, with the plain source
//!
//! ```text
//! for k in lo..hi step st { a = load(A, idx_a(k)); b = load(B, idx_b(k)); acc = dot(a, b, acc) }
//! ```
//!
//! becomes, with `S` stages and `F` loads staged per iteration,
//!
//! ```text
//! bufs: shared scratch buffers of S slots, one per staged load
//! fetch iteration s into slot s, for s in 0..S-1            (the prologue)
//! for k ... carrying slot (0 at the start) {
//!     scratch_wait((S-2) * F)                               (iteration k's tiles are in)
//!     fetch iteration k + (S-1)*st into slot (slot-1) mod S (the slot read last iteration)
//!     a = scratch_load(buf_a, slot); ...                    (where the loads were)
//!     slot = (slot + 1) mod S
//! }
//! scratch_wait(0)
//! ```
//!
//! (With `S = 1`: fetch, `scratch_wait(0)`, load, in each iteration.)
//!
//! With a *lag* of 1 (`PipelineOptions::wgmma`, see `in_place_wgmma_dot`, and `S ≥ 4`;
//! such a loop's default depth is 4) the fetch
//! distance is `D = S - 2` instead of `S - 1`: the prologue fetches `D` iterations, the
//! wait is `scratch_wait((D-1) * F)`, and iteration k fetches iteration `k + D` into slot
//! `(slot + D) mod S`, the slot read two iterations ago, so the slot read one iteration
//! ago is free to be read still (by the previous iteration's wgmma, which the back end
//! lets run on across the back edge and waits for in the next iteration's `dot`, before
//! that iteration's barrier). The buffers record it (`ScratchBuf::lag`). Fetches of
//! iterations past the loop's end get a tile index of -1 in their first dimension: out of
//! bounds, so they copy zeros and read no memory; their slots are never read.
//!
//! Assumes: valid IR; `num_warps` is the block's warp count. A load is staged only when:
//! it is at the top level of the loop body; its tensor is never written by the kernel (the
//! runtime refuses a launch where a written tensor overlaps another argument, so moving
//! such a read earlier cannot change what it reads), or, in a kernel that calls
//! `grid_sync`, never written by this loop, which holds no `barrier()` or `grid_sync`
//! (the fetches move ahead only past the loop's own iterations; a block reads back
//! what it or another block wrote only after a `barrier()` or a `grid_sync`, and in
//! such a kernel both order the generic-proxy writes before TMA reads); every index is computed, by
//! element-wise and constant ops at the top level of the body, from the induction
//! variable and values defined outside the loop; and its value reaches a `dot` that the
//! tensor-core lowering takes (f16/bf16 operands of one dtype, or f32 operands with a TF32
//! `input_precision`; an f32 accumulator; tile shapes that hold whole `mma.m16n8k16`, or
//! for TF32 `mma.m16n8k8`, instructions on the warp grid), directly or through
//! `transpose`.
//! Guarantees: ordinary IR with the scratch ops' documented semantics, so the interpreter
//! runs the pipelined kernel (and its in-flight checks reject a slot read or overwritten
//! while a fetch into it is pending: every kernel the tests run checks the rewrite). The
//! staged buffers are `ScratchBuf::shared`: the back end lays them out for `ldmatrix`
//! and places the block barriers (`back/ptx/sync.rs`). An explicit stage count whose
//! buffers exceed the target's shared memory is a located `TargetLimit` diagnostic; the
//! default (3) is lowered until they fit.

use super::cross_round::{self, Pipelined};
use crate::back::ptx::mma_layout::MmaKind;
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::{
    props, BinaryOp, Block, Builder, CmpOp, Function, InputPrecision, InstId, Op, OpClass,
    ScratchBuf, ValueId,
};
use crate::span::Span;
use crate::types::{DType, Scalar, ValueType};
use std::collections::{HashMap, HashSet};

/// The default pipeline depth.
pub const DEFAULT_STAGES: u32 = 3;

/// The default depth of a loop whose `dot` wgmma computes in place (a lag of 1 needs 4
/// slots to fetch 2 iterations ahead).
pub const WGMMA_DEFAULT_STAGES: u32 = 4;

/// What the pass needs to know about the target and the specialization.
#[derive(Clone, Copy, Debug)]
pub struct PipelineOptions {
    /// `Some(n)`: the user's `num_stages`; `None`: [`DEFAULT_STAGES`], lowered to fit.
    pub num_stages: Option<u32>,
    pub num_warps: u32,
    /// Shared memory one block may use.
    pub max_shared_bytes: u32,
    /// The target's name, for diagnostics.
    pub target_name: &'static str,
    /// The target's whole per-block shared memory (`max_shared_bytes` before the
    /// kernel's own scratch buffers are taken out).
    pub full_shared_bytes: u32,
    /// The target has `wgmma` (sm_90a): a loop whose one tensor-core `dot` will run on
    /// it (`mma_layout::wgmma_grid`) and accumulates in place (its accumulator is the
    /// carried value, its result only yielded) gets a lag of 1 (module docs).
    pub wgmma: bool,
    /// A pipelined loop nested in another `for` (a persistent loop over tiles) keeps its
    /// ring across the rounds: each round's prologue is issued at the end of the previous
    /// round (`passes/cross_round.rs`).
    pub cross_round: bool,
}

/// Pipelines every qualifying loop of `func` (inner loops first).
pub fn run(func: &mut Function, opts: &PipelineOptions) -> Result<(), Diagnostics> {
    let written = written_tensors(func);
    let grid_sync = crate::ir::has_grid_sync(func);
    let written = Written {
        anywhere: written,
        grid_sync,
    };
    let body = std::mem::take(&mut func.body);
    let r = visit_block(func, body, &written, opts);
    match r {
        Ok((b, _)) => {
            func.body = b;
            Ok(())
        }
        Err((b, e)) => {
            func.body = b;
            Err(e)
        }
    }
}

/// The block, and the loops pipelined at its top level; or the block and the error.
type Visit = Result<(Block, Vec<Pipelined>), (Block, Diagnostics)>;

fn visit_block(
    func: &mut Function,
    mut block: Block,
    written: &Written,
    o: &PipelineOptions,
) -> Visit {
    let mut k = 0;
    let mut done = Vec::new();
    while k < block.insts.len() {
        let id = block.insts[k];
        // Inner regions first.
        let mut op = func.insts[id].op.clone();
        let mut err = None;
        let mut inner = Vec::new();
        match &mut op {
            Op::For { body, .. } => match visit_block(func, std::mem::take(body), written, o) {
                Ok((b, p)) => {
                    *body = b;
                    inner = p;
                }
                Err((b, e)) => {
                    *body = b;
                    err = Some(e);
                }
            },
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                for b in [then_body, else_body] {
                    match visit_block(func, std::mem::take(b), written, o) {
                        Ok((nb, _)) => *b = nb,
                        Err((nb, e)) => {
                            *b = nb;
                            err = Some(e);
                        }
                    }
                }
            }
            _ => {}
        }
        func.insts[id].op = op;
        if let Some(e) = err {
            return Err((block, e));
        }
        if matches!(func.insts[id].op, Op::For { .. }) {
            let around = match pipeline_loop(func, id, written, o) {
                Ok(Some((before, after))) => {
                    done.push(Pipelined {
                        before: before.clone(),
                        for_id: id,
                        after: after.clone(),
                    });
                    Some((before, after))
                }
                Ok(None) if o.cross_round => cross_round::run(func, id, &inner),
                Ok(None) => None,
                Err(e) => return Err((block, e)),
            };
            if let Some((before, after)) = around {
                let n = before.len();
                block.insts.splice(k..k, before);
                k += n;
                block.insts.splice(k + 1..k + 1, after);
            }
        }
        k += 1;
    }
    Ok((block, done))
}

/// What the kernel writes, for the staging rule (module docs).
struct Written {
    /// Tensors the kernel writes (stores, scatters, atomics), anywhere.
    anywhere: HashSet<u32>,
    /// The kernel calls `grid_sync`.
    grid_sync: bool,
}

/// Tensors the kernel writes (stores, scatters, atomics), anywhere.
fn written_tensors(func: &Function) -> HashSet<u32> {
    let mut w = HashSet::new();
    crate::ir::visit_insts(func, vec![&func.body], |op| match op {
        Op::Store { tensor, .. } | Op::Scatter { tensor, .. } | Op::AtomicAdd { tensor, .. } => {
            w.insert(*tensor);
        }
        Op::GridSync { counter } => {
            w.insert(*counter);
        }
        _ => {}
    });
    w
}

/// The `mma.sync` instruction kind that computes `dot(a, b, acc)` with `precision` on the
/// tensor cores, or `None` when it stays on CUDA cores (see the module docs).
pub fn mma_kind(
    func: &Function,
    a: ValueId,
    b: ValueId,
    acc: ValueId,
    precision: InputPrecision,
) -> Option<MmaKind> {
    let (ta, tb, tc) = (func.value_type(a), func.value_type(b), func.value_type(acc));
    if ta.dtype() != tb.dtype() || tc.dtype() != DType::F32 {
        return None;
    }
    match ta.dtype() {
        DType::F16 | DType::BF16 => Some(MmaKind::F16),
        DType::F32 if precision.is_tf32() => Some(MmaKind::Tf32),
        _ => None,
    }
}

/// Whether `dot(a, b, acc)` with `precision` goes to the tensor cores (see the module
/// docs): operands of a tensor-core kind and tile shapes that hold whole instructions.
pub fn mma_dot(
    func: &Function,
    a: ValueId,
    b: ValueId,
    acc: ValueId,
    precision: InputPrecision,
    num_warps: u32,
) -> bool {
    let Some(kind) = mma_kind(func, a, b, acc, precision) else {
        return false;
    };
    let (Some(sa), Some(sb)) = (func.value_type(a).shape(), func.value_type(b).shape()) else {
        return false;
    };
    let (sa, sb) = (sa.dims(), sb.dims());
    if sa.len() != 2 || sb.len() != 2 {
        return false;
    }
    let (m, k, n) = (sa[0], sa[1], sb[1]);
    let grid = crate::back::ptx::mma_layout::warp_grid(m, n, num_warps);
    crate::back::ptx::mma_layout::mma_shape_ok(m, n, k, grid, kind)
}

/// The instructions to put before and after a pipelined loop.
type Around = (Vec<InstId>, Vec<InstId>);

/// One load to stage.
struct Staged {
    /// The instruction that becomes the slot read: the load, or the reshape that drops
    /// its leading unit extents.
    load: InstId,
    /// The load itself when `load` is such a reshape (it is removed from the body).
    squeezed_load: Option<InstId>,
    tensor: u32,
    index: Vec<ValueId>,
    padding: Scalar,
    eviction: crate::ir::Eviction,
    dtype: DType,
    shape: Vec<u32>,
    name: String,
    span: Span,
    /// A dimension whose tile index depends on the induction variable.
    moving: Option<usize>,
}

/// Rewrites the `for` `id` (see the module docs). Returns the instructions to put before
/// and after it in its block, or `None` when it has nothing to stage.
fn pipeline_loop(
    func: &mut Function,
    id: InstId,
    written: &Written,
    o: &PipelineOptions,
) -> Result<Option<Around>, Diagnostics> {
    let Op::For {
        lower,
        upper,
        step,
        body,
        ..
    } = func.insts[id].op.clone()
    else {
        return Ok(None);
    };
    let Some(&iv) = body.args.first() else {
        return Ok(None);
    };
    // In a kernel with `grid_sync`, a tensor the kernel writes may still be staged where
    // this loop neither writes it nor synchronizes: the fetches then move ahead only past
    // this loop's own iterations, and what the block or the grid wrote before is ordered
    // before them by the `barrier()` or `grid_sync` the language requires for reading it
    // back (both fence the async proxy in such a kernel; module docs).
    let written_here = if written.grid_sync {
        let mut w = HashSet::new();
        let mut syncs = false;
        crate::ir::visit_insts(func, vec![&body], |op| match op {
            Op::Store { tensor, .. }
            | Op::Scatter { tensor, .. }
            | Op::AtomicAdd { tensor, .. } => {
                w.insert(*tensor);
            }
            Op::GridSync { .. } | Op::Barrier => syncs = true,
            _ => {}
        });
        if syncs {
            written.anywhere.clone()
        } else {
            w
        }
    } else {
        written.anywhere.clone()
    };
    let written = &written_here;
    // Where each value of the body's top level is defined.
    let mut def: HashMap<ValueId, InstId> = HashMap::new();
    for &i in &body.insts {
        for &r in &func.insts[i].results {
            def.insert(r, i);
        }
    }
    let body_values: HashSet<ValueId> = {
        let mut s: HashSet<ValueId> = body.args.iter().copied().collect();
        let mut all = Vec::new();
        collect_defs(func, &body, &mut all);
        s.extend(all);
        s
    };
    // The loads the body's tensor-core dots read.
    let mut staged: Vec<Staged> = Vec::new();
    let mut seen = HashSet::new();
    let mut dot_span = None;
    for &i in &body.insts {
        let Op::Dot {
            a,
            b,
            acc,
            precision,
        } = func.insts[i].op
        else {
            continue;
        };
        if !mma_dot(func, a, b, acc, precision, o.num_warps) {
            continue;
        }
        dot_span.get_or_insert(func.insts[i].span);
        for x in [a, b] {
            let x = match def.get(&x).map(|&d| &func.insts[d].op) {
                Some(Op::Permute(v, p)) if p.as_slice() == [1, 0] => *v,
                _ => x,
            };
            // A tile of a rank-3+ tensor whose leading extents are 1, reshaped to its
            // last two dimensions (`load(k, [bh, j, 0], [1, BN, D]).reshape([BN, D])`):
            // the reshape becomes the slot read, the load goes away.
            let (x, squeezed) = match def.get(&x).map(|&d| (d, &func.insts[d].op)) {
                Some((r, Op::Reshape(v))) if squeezes_leading(func, *v, x) => (*v, Some(r)),
                _ => (x, None),
            };
            if squeezed.is_some() && use_count(func, &body, x) != 1 {
                continue;
            }
            let Some(&l) = def.get(&x) else { continue };
            let Op::Load {
                tensor,
                index,
                padding,
                eviction,
            } = &func.insts[l].op
            else {
                continue;
            };
            if written.contains(tensor) || !seen.insert(l) {
                continue;
            }
            if !index
                .iter()
                .all(|&v| computable(func, v, iv, &def, &body_values))
            {
                continue;
            }
            let ty = func
                .value_type(squeezed.map_or(x, |r| func.insts[r].results[0]))
                .clone();
            staged.push(Staged {
                load: squeezed.unwrap_or(l),
                squeezed_load: squeezed.map(|_| l),
                tensor: *tensor,
                index: index.clone(),
                padding: *padding,
                eviction: *eviction,
                dtype: ty.dtype(),
                shape: crate::ir::shape_of(&ty).to_vec(),
                name: func
                    .params
                    .get(*tensor as usize)
                    .map(|p| p.name.clone())
                    .unwrap_or_else(|| format!("tile{}", staged.len())),
                span: func.insts[l].span,
                moving: index.iter().position(|&v| depends_on(func, v, iv, &def)),
            });
        }
    }
    if staged.is_empty() {
        return Ok(None);
    }
    // The user's scratch buffers live for the whole kernel: what is left is the budget.
    let scratch: u64 = func
        .scratch
        .iter()
        .filter(|b| !b.shared)
        .map(|b| {
            let n: u64 = b
                .slot_shape
                .iter()
                .map(|&d| d.max(1).next_power_of_two() as u64)
                .product();
            n * b.dtype.size_bytes() as u64 * b.slots as u64
        })
        .sum();
    let budget = PipelineOptions {
        max_shared_bytes: (o.max_shared_bytes as u64).saturating_sub(scratch) as u32,
        full_shared_bytes: o.max_shared_bytes,
        ..*o
    };
    // A dot that wgmma computes in place keeps one product in flight when the ring has
    // 4 or more slots (2 fetched ahead); with 3 it would fetch only 1 ahead, which
    // measured slower than no lag (H100, 4096³: 324 µs against 210), so 3 slots keep
    // the plain distance. Its default depth is 4, lowered to fit.
    let wgmma_in_place = o.wgmma && in_place_wgmma_dot(func, &body, o.num_warps);
    let default = if wgmma_in_place {
        WGMMA_DEFAULT_STAGES
    } else {
        DEFAULT_STAGES
    };
    let stages = choose_stages(
        &staged,
        &budget,
        default,
        dot_span.unwrap_or(func.insts[id].span),
    )?;
    let Some(s_count) = stages else {
        return Ok(None);
    };
    let lag = if wgmma_in_place && s_count >= 4 { 1 } else { 0 };
    Ok(Some(rewrite(
        func, id, iv, lower, upper, step, &staged, s_count, lag, &def,
    )))
}

/// Whether the loop body `body` has exactly one tensor-core `dot`, of a shape that wgmma
/// computes, whose accumulator is a carried value read by nothing else and whose result
/// is read only by the body's `yield`: then its product may still be running when the
/// next iteration starts (the back end keeps one wgmma group in flight), and the
/// accumulator is touched by nothing in between.
fn in_place_wgmma_dot(func: &Function, body: &Block, num_warps: u32) -> bool {
    let mut uses: HashMap<ValueId, usize> = HashMap::new();
    let mut all = Vec::new();
    collect_insts(func, body, &mut all);
    for &i in &all {
        for v in crate::ir::operands(&func.insts[i].op) {
            *uses.entry(v).or_default() += 1;
        }
    }
    let dots: Vec<InstId> = body
        .insts
        .iter()
        .copied()
        .filter(|&i| match func.insts[i].op {
            Op::Dot {
                a,
                b,
                acc,
                precision,
            } => mma_dot(func, a, b, acc, precision, num_warps),
            _ => false,
        })
        .collect();
    let [d] = dots.as_slice() else {
        return false;
    };
    let Op::Dot {
        a,
        b,
        acc,
        precision,
    } = func.insts[*d].op
    else {
        return false;
    };
    // wgmma takes f16/bf16 operands only here: a TF32 dot runs on `mma.sync`.
    if mma_kind(func, a, b, acc, precision) != Some(MmaKind::F16) {
        return false;
    }
    let Some(&res) = func.insts[*d].results.first() else {
        return false;
    };
    let (Some(sa), Some(sc)) = (
        func.value_type(a).shape().map(|s| s.dims().to_vec()),
        func.value_type(res).shape().map(|s| s.dims().to_vec()),
    ) else {
        return false;
    };
    let (Some(&k), [m, n]) = (sa.get(1), sc.as_slice()) else {
        return false;
    };
    let yielded = body
        .insts
        .last()
        .is_some_and(|&y| matches!(&func.insts[y].op, Op::Yield(vs) if vs.contains(&res)));
    crate::back::ptx::mma_layout::wgmma_grid(*m, *n, k, num_warps).is_some()
        && body.args.contains(&acc)
        && uses.get(&acc) == Some(&1)
        && uses.get(&res) == Some(&1)
        && yielded
}

/// Every instruction of `block` and its regions.
fn collect_insts(func: &Function, block: &Block, out: &mut Vec<InstId>) {
    for &i in &block.insts {
        out.push(i);
        match &func.insts[i].op {
            Op::For { body, .. } => collect_insts(func, body, out),
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                collect_insts(func, then_body, out);
                collect_insts(func, else_body, out);
            }
            _ => {}
        }
    }
}

/// Every value defined in `block` and its regions.
pub(super) fn collect_defs(func: &Function, block: &Block, out: &mut Vec<ValueId>) {
    for &i in &block.insts {
        out.extend(func.insts[i].results.iter().copied());
        for r in crate::ir::regions(&func.insts[i].op) {
            out.extend(r.args.iter().copied());
            collect_defs(func, r, out);
        }
    }
}

/// Whether `to = reshape(from)` only drops leading extents of 1 from a tile of rank 3 or
/// more, keeping its last two dimensions.
fn squeezes_leading(func: &Function, from: ValueId, to: ValueId) -> bool {
    let (f, t) = (func.value_type(from), func.value_type(to));
    let (Some(f), Some(t)) = (f.shape(), t.shape()) else {
        return false;
    };
    let (f, t) = (f.dims(), t.dims());
    f.len() >= 3
        && t.len() == 2
        && f[f.len() - 2..] == *t
        && f[..f.len() - 2].iter().all(|&d| d == 1)
}

/// How many operands in `block` (a loop body: what it defines is read nowhere else)
/// read `v`.
fn use_count(func: &Function, block: &Block, v: ValueId) -> usize {
    let mut n = 0;
    let mut all = Vec::new();
    collect_insts(func, block, &mut all);
    for i in all {
        n += crate::ir::operands(&func.insts[i].op)
            .iter()
            .filter(|&&o| o == v)
            .count();
    }
    n
}

/// Whether `v` can be recomputed for another iteration at the top of the body: the
/// induction variable, a value from outside the loop, or a constant / element-wise /
/// shape op of the body's top level over such values.
pub(super) fn computable(
    func: &Function,
    v: ValueId,
    iv: ValueId,
    def: &HashMap<ValueId, InstId>,
    body_values: &HashSet<ValueId>,
) -> bool {
    if v == iv || !body_values.contains(&v) {
        return true;
    }
    let Some(&i) = def.get(&v) else {
        return false;
    };
    let op = &func.insts[i].op;
    let p = props(op);
    matches!(
        p.class,
        OpClass::Constant | OpClass::Elementwise | OpClass::Shape | OpClass::Query
    ) && p.is_pure()
        && crate::ir::operands(op)
            .into_iter()
            .all(|o| computable(func, o, iv, def, body_values))
}

/// Whether `v` is computed (in the body) from the induction variable.
fn depends_on(func: &Function, v: ValueId, iv: ValueId, def: &HashMap<ValueId, InstId>) -> bool {
    if v == iv {
        return true;
    }
    def.get(&v).is_some_and(|&i| {
        crate::ir::operands(&func.insts[i].op)
            .into_iter()
            .any(|o| depends_on(func, o, iv, def))
    })
}

/// The stage count: the user's (an error when its buffers do not fit), or the default
/// lowered until they do (`None` when not even one stage fits: nothing is staged).
fn choose_stages(
    staged: &[Staged],
    o: &PipelineOptions,
    default: u32,
    span: Span,
) -> Result<Option<u32>, Diagnostics> {
    let per_stage: u64 = staged
        .iter()
        .map(|s| {
            let n: u64 = s
                .shape
                .iter()
                .map(|&d| d.max(1).next_power_of_two() as u64)
                .product();
            n * s.dtype.size_bytes() as u64
        })
        .sum();
    let fits = |s: u32| per_stage * s as u64 <= o.max_shared_bytes as u64;
    match o.num_stages {
        Some(s) if fits(s) => Ok(Some(s)),
        Some(s) => {
            let best = (1..s).rev().find(|&k| fits(k));
            let tiles: Vec<String> = staged
                .iter()
                .map(|t| {
                    let n: u64 = t
                        .shape
                        .iter()
                        .map(|&d| d.max(1).next_power_of_two() as u64)
                        .product();
                    format!(
                        "the tile of `{}` {} bytes",
                        t.name,
                        n * t.dtype.size_bytes() as u64
                    )
                })
                .collect();
            let help = match best {
                Some(b) => format!("help: use {b} stages (`--stages {b}`), or smaller tiles"),
                None => "help: use smaller tiles: not even one stage fits".to_string(),
            };
            Err(Diagnostics::single(
                Diagnostic::error(
                    ErrorCode::TargetLimit,
                    span,
                    format!(
                        "{s} pipeline stages need {} bytes of shared memory for the tiles this `dot` reads ({} per stage: {}); {} allows {} per block{}",
                        per_stage * s as u64,
                        per_stage,
                        tiles.join(", "),
                        o.target_name,
                        o.max_shared_bytes,
                        if o.max_shared_bytes < o.full_shared_bytes {
                            format!(" beside the kernel's scratch buffers ({} of {})", o.full_shared_bytes - o.max_shared_bytes, o.full_shared_bytes)
                        } else {
                            String::new()
                        }
                    ),
                )
                .with_note(help),
            ))
        }
        None => Ok((1..=default).rev().find(|&k| fits(k))),
    }
}

/// Builds the pipelined form (module docs).
#[allow(clippy::too_many_arguments)]
fn rewrite(
    func: &mut Function,
    for_id: InstId,
    iv: ValueId,
    lower: ValueId,
    upper: ValueId,
    step: ValueId,
    staged: &[Staged],
    stages: u32,
    lag: u32,
    def: &HashMap<ValueId, InstId>,
) -> (Vec<InstId>, Vec<InstId>) {
    let span = func.insts[for_id].span;
    let i32t = ValueType::Scalar(DType::I32);
    let boolt = ValueType::Scalar(DType::Bool);
    let bufs: Vec<u32> = staged
        .iter()
        .map(|s| {
            func.scratch.push(ScratchBuf {
                name: format!("stage_{}", s.name),
                dtype: s.dtype,
                slots: stages,
                slot_shape: s.shape.clone(),
                span: s.span,
                shared: true,
                lag,
            });
            (func.scratch.len() - 1) as u32
        })
        .collect();
    let fetches_per_iter = staged.len() as u32;
    let mut b = Builder { func };
    let konst = |b: &mut Builder, blk: &mut Block, v: i64| {
        b.inst(
            blk,
            Op::Const(Scalar::Int(v, DType::I32)),
            vec![i32t.clone()],
            span,
        )[0]
    };
    // Fetches iteration `it` (an i32 value) of every staged load into `slot`.
    let fetch = |b: &mut Builder, blk: &mut Block, it: ValueId, slot: ValueId| {
        let in_range = b.inst(
            blk,
            Op::Compare(CmpOp::Lt, it, upper),
            vec![boolt.clone()],
            span,
        )[0];
        for (s, &buf) in staged.iter().zip(&bufs) {
            let mut memo = HashMap::new();
            let mut index: Vec<ValueId> = s
                .index
                .iter()
                .map(|&v| clone_chain(b, blk, v, iv, it, def, &mut memo))
                .collect();
            // Past the loop's end the tile index of a dimension that moves with the loop
            // (so the others stay loop-invariant) becomes -1: out of bounds, zeros.
            let d = s.moving.unwrap_or(0);
            if let Some(slot) = index.get_mut(d) {
                let minus1 = konst(b, blk, -1);
                *slot = b.inst(
                    blk,
                    Op::Select(in_range, *slot, minus1),
                    vec![i32t.clone()],
                    span,
                )[0];
            }
            b.inst(
                blk,
                Op::ScratchFetch {
                    buf,
                    slot,
                    tensor: s.tensor,
                    index,
                    padding: s.padding,
                    eviction: s.eviction,
                },
                vec![],
                span,
            );
        }
    };
    // Iteration `it0 + k * step`.
    let iter_at = |b: &mut Builder, blk: &mut Block, it0: ValueId, k: i64| {
        if k == 0 {
            return it0;
        }
        let kk = konst(b, blk, k);
        let off = b.inst(
            blk,
            Op::Binary(BinaryOp::Mul, step, kk),
            vec![i32t.clone()],
            span,
        )[0];
        b.inst(
            blk,
            Op::Binary(BinaryOp::Add, it0, off),
            vec![i32t.clone()],
            span,
        )[0]
    };

    let mut before = Block::default();
    let mut top = Block::default();
    let slot_arg;
    if stages == 1 {
        let zero = konst(&mut b, &mut top, 0);
        fetch(&mut b, &mut top, iv, zero);
        b.inst(&mut top, Op::ScratchWait { pending: 0 }, vec![], span);
        slot_arg = zero;
    } else {
        // The fetch distance: iterations fetched ahead, D = S - 1 - lag.
        let ahead = stages - 1 - lag;
        for s in 0..ahead {
            let it = iter_at(&mut b, &mut before, lower, s as i64);
            let slot = konst(&mut b, &mut before, s as i64);
            fetch(&mut b, &mut before, it, slot);
        }
        let init = konst(&mut b, &mut before, 0);
        let arg = b.new_value(i32t.clone(), Some("stage".into()));
        slot_arg = arg;
        b.inst(
            &mut top,
            Op::ScratchWait {
                pending: (ahead - 1) * fetches_per_iter,
            },
            vec![],
            span,
        );
        let it = iter_at(&mut b, &mut top, iv, ahead as i64);
        // The slot read 1 + lag iterations ago: (slot + D) mod S.
        let zero = konst(&mut b, &mut top, 0);
        let one = konst(&mut b, &mut top, 1);
        let d = konst(&mut b, &mut top, ahead as i64);
        let sum = b.inst(
            &mut top,
            Op::Binary(BinaryOp::Add, arg, d),
            vec![i32t.clone()],
            span,
        )[0];
        let s_k = konst(&mut b, &mut top, stages as i64);
        let over = b.inst(
            &mut top,
            Op::Compare(CmpOp::Ge, sum, s_k),
            vec![boolt.clone()],
            span,
        )[0];
        let wrapped = b.inst(
            &mut top,
            Op::Binary(BinaryOp::Sub, sum, s_k),
            vec![i32t.clone()],
            span,
        )[0];
        let ws = b.inst(
            &mut top,
            Op::Select(over, wrapped, sum),
            vec![i32t.clone()],
            span,
        )[0];
        fetch(&mut b, &mut top, it, ws);
        // The carried slot: init, argument, next value and (unused) result.
        let inc = b.inst(
            &mut top,
            Op::Binary(BinaryOp::Add, arg, one),
            vec![i32t.clone()],
            span,
        )[0];
        let sc = s_k;
        let wrap = b.inst(
            &mut top,
            Op::Compare(CmpOp::Eq, inc, sc),
            vec![boolt.clone()],
            span,
        )[0];
        let next = b.inst(
            &mut top,
            Op::Select(wrap, zero, inc),
            vec![i32t.clone()],
            span,
        )[0];
        let result = b.new_value(i32t.clone(), Some("stage".into()));
        let func = &mut *b.func;
        func.insts[for_id].results.push(result);
        if let Op::For { inits, body, .. } = &mut func.insts[for_id].op {
            inits.push(init);
            body.args.push(arg);
            // The yield is the body's last instruction.
            if let Some(&y) = body.insts.last() {
                if let Op::Yield(vs) = &mut func.insts[y].op {
                    vs.push(next);
                }
            }
        }
    }
    // The loads become reads of the slot.
    let func = &mut *b.func;
    for (s, &buf) in staged.iter().zip(&bufs) {
        func.insts[s.load].op = Op::ScratchLoad {
            buf,
            slot: slot_arg,
        };
    }
    let squeezed: HashSet<InstId> = staged.iter().filter_map(|s| s.squeezed_load).collect();
    if let Op::For { body, .. } = &mut func.insts[for_id].op {
        body.insts.retain(|i| !squeezed.contains(i));
        let mut insts = top.insts;
        insts.append(&mut body.insts);
        body.insts = insts;
    }
    let mut after = Block::default();
    let mut b = Builder { func };
    b.inst(&mut after, Op::ScratchWait { pending: 0 }, vec![], span);
    (before.insts, after.insts)
}

/// `v` recomputed with the induction variable `iv` replaced by `it` (a value available at
/// the insertion point): values from outside the body are used as they are; the body's
/// constant / element-wise / shape ops over `iv` are cloned into `blk`.
pub(super) fn clone_chain(
    b: &mut Builder,
    blk: &mut Block,
    v: ValueId,
    iv: ValueId,
    it: ValueId,
    def: &HashMap<ValueId, InstId>,
    memo: &mut HashMap<ValueId, ValueId>,
) -> ValueId {
    if v == iv {
        return it;
    }
    if let Some(&m) = memo.get(&v) {
        return m;
    }
    let Some(&i) = def.get(&v) else {
        return v;
    };
    let mut op = b.func.insts[i].op.clone();
    let span = b.func.insts[i].span;
    let mut ops = Vec::new();
    crate::ir::for_each_operand(&op, |&o| ops.push(o));
    let new_ops: Vec<ValueId> = ops
        .into_iter()
        .map(|o| clone_chain(b, blk, o, iv, it, def, memo))
        .collect();
    let mut k = 0;
    crate::ir::for_each_operand_mut(&mut op, |slot| {
        *slot = new_ops[k];
        k += 1;
    });
    let tys: Vec<ValueType> = b.func.insts[i]
        .results
        .iter()
        .map(|&r| b.func.value_type(r).clone())
        .collect();
    let r = b.inst(blk, op, tys, span)[0];
    memo.insert(v, r);
    r
}
