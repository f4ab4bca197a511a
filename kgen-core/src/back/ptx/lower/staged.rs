//! Lowering of the compiler's shared scratch buffers (`ScratchBuf::shared`, made by
//! `passes::pipeline` to stage the tiles a tensor-core `dot` reads).
//!
//! Assumes: every access to such a buffer is a `scratch_fetch`, `scratch_wait` or
//! `scratch_load` written by the pipeline pass (rank-2 slots, slots in range); a value
//! that `assign` lists as *staged* (`Assignment::staged`) is read only by `dot`s, through
//! at most a `transpose`.
//!
//! Guarantees:
//! - A buffer is allocated (`smem.rs`) before the first instruction of its lifetime and
//!   freed after the last: the innermost block holding every access to it (and every use
//!   of its staged values), from the first such instruction to the last one, extended to
//!   the `scratch_wait(0)` that drains its copies. Slots are laid out by
//!   `swizzle::SharedTile` (the widest XOR swizzle the rows allow), one after another,
//!   each aligned to the swizzle's atom.
//! - A fetch copies the tile in 16-byte chunks (`cp.async.cg`, or `.ca` of 8 or 4 bytes
//!   where the tensor's alignment allows no more; element by element with `ld.global` +
//!   `st.shared` where it allows no vector, or the tensor is not `contiguous`); chunks
//!   outside the tensor or the tile's real extent are zero-filled by the copy's source
//!   size, so a product never reads padding. Consecutive threads copy consecutive chunks
//!   of a row (coalesced). A thread's chunks' coordinates are loop-invariant (prologue)
//!   up to 8 chunks a thread; beyond that (narrow copies of a large tile) only the first
//!   chunk's are, and each later one steps a pass of rows from the one before, so the
//!   registers held across the loop do not grow with the chunk count. Every fetch ends
//!   with one `cp.async.commit_group`, and the groups are committed in the order of the
//!   fetches (the waits count them), deferred or not.
//! - Every cross-thread access is declared to `sync::Tracker` (a fetch as an
//!   asynchronous write, `scratch_wait` completing them, a load as a read), which places
//!   the block barriers.
//! - A staged `scratch_load` emits no load: it binds a [`StagedView`] (buffer, slot
//!   address) that `mma.rs` reads with `ldmatrix`; any other `scratch_load` of such a
//!   buffer reads its elements into the value's layout with `ld.shared`.

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::swizzle::SharedTile;
use crate::ir::{Block, Function, InstId, Op, ValueId};
use crate::span::Span;
use crate::types::DType;
use std::collections::{HashMap, HashSet};

/// A tile that stays in a shared buffer until a `dot` reads it.
#[derive(Clone, Copy, Debug)]
pub struct StagedView {
    pub buf: u32,
    /// `kg_smem` address of the slot.
    pub base: Reg,
    pub tile: SharedTile,
    /// The value is the slot's tile transposed (`transpose(scratch_load(..))`): its
    /// dim 0 is the storage's columns.
    pub transposed: bool,
}

/// When each shared buffer is allocated and freed (instruction ids of the blocks that
/// hold its lifetime).
#[derive(Default)]
pub struct Lifetimes {
    pub alloc_before: HashMap<InstId, Vec<u32>>,
    pub free_after: HashMap<InstId, Vec<u32>>,
}

/// The slot layout of shared buffer `buf`.
pub fn buffer_tile(func: &Function, buf: u32) -> Option<SharedTile> {
    let b = func.scratch.get(buf as usize)?;
    let (r, c) = match b.slot_shape.as_slice() {
        [r, c] => (*r, *c),
        _ => return None,
    };
    Some(SharedTile::new(
        r.max(1).next_power_of_two(),
        c.max(1).next_power_of_two(),
        b.dtype.size_bytes(),
    ))
}

/// Bytes of one slot of `tile`, rounded up to the atom alignment so every slot starts on
/// one.
pub fn slot_bytes(tile: &SharedTile) -> u32 {
    tile.bytes().div_ceil(tile.align()) * tile.align()
}

/// The lifetimes of every shared buffer of `func` (module docs). `staged` are the values
/// read straight from shared memory by `dot`s, whose uses extend their buffer's life.
/// Buffers in `top_level` live in the kernel's top-level block even when every access
/// is inside one loop (a warp-specialized ring stays alive across a persistent loop's
/// iterations: `lower/ws.rs`).
pub fn lifetimes(
    func: &Function,
    staged: &HashSet<ValueId>,
    top_level: &HashSet<u32>,
) -> Lifetimes {
    let shared: Vec<u32> = (0..func.scratch.len() as u32)
        .filter(|&b| func.scratch[b as usize].shared)
        .collect();
    let mut out = Lifetimes::default();
    if shared.is_empty() {
        return out;
    }
    // Staged value -> its buffer (through transposes too).
    let mut staged_buf: HashMap<ValueId, u32> = HashMap::new();
    for i in crate::ir::program_order(func) {
        let inst = &func.insts[i];
        match &inst.op {
            Op::ScratchLoad { buf, .. } => {
                for &r in &inst.results {
                    if staged.contains(&r) {
                        staged_buf.insert(r, *buf);
                    }
                }
            }
            Op::Permute(v, _) => {
                if let Some(&b) = staged_buf.get(v) {
                    for &r in &inst.results {
                        if staged.contains(&r) {
                            staged_buf.insert(r, b);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for b in shared {
        let descend = !top_level.contains(&b);
        place_lifetime(func, &func.body, b, &staged_buf, descend, &mut out);
    }
    out
}

/// Whether instruction `i` (or its regions) touches buffer `b` or uses a value staged in it.
fn touches(func: &Function, i: InstId, b: u32, staged_buf: &HashMap<ValueId, u32>) -> bool {
    let op = &func.insts[i].op;
    let direct = match op {
        Op::ScratchFetch { buf, .. }
        | Op::ScratchGather { buf, .. }
        | Op::ScratchLoad { buf, .. }
        | Op::ScratchStore { buf, .. } => *buf == b,
        _ => false,
    };
    if direct
        || crate::ir::operands(op)
            .iter()
            .any(|v| staged_buf.get(v) == Some(&b))
    {
        return true;
    }
    crate::ir::regions(op)
        .iter()
        .any(|r| r.insts.iter().any(|&j| touches(func, j, b, staged_buf)))
}

fn place_lifetime(
    func: &Function,
    block: &Block,
    b: u32,
    staged_buf: &HashMap<ValueId, u32>,
    descend: bool,
    out: &mut Lifetimes,
) {
    let at: Vec<usize> = (0..block.insts.len())
        .filter(|&k| touches(func, block.insts[k], b, staged_buf))
        .collect();
    let (Some(&first), Some(&last)) = (at.first(), at.last()) else {
        return;
    };
    if first == last && descend {
        let inner = crate::ir::regions(&func.insts[block.insts[first]].op);
        let holders: Vec<&&Block> = inner
            .iter()
            .filter(|r| r.insts.iter().any(|&j| touches(func, j, b, staged_buf)))
            .collect();
        if let [only] = holders.as_slice() {
            return place_lifetime(func, only, b, staged_buf, descend, out);
        }
    }
    // Extend to the `scratch_wait(0)` that drains the buffer's copies.
    let mut end = last;
    if let Some(k) = (last + 1..block.insts.len()).find(|&k| {
        matches!(
            func.insts[block.insts[k]].op,
            Op::ScratchWait { pending: 0 }
        )
    }) {
        end = k;
    }
    out.alloc_before
        .entry(block.insts[first])
        .or_default()
        .push(b);
    out.free_after.entry(block.insts[end]).or_default().push(b);
}

impl Lowerer<'_> {
    /// Allocates the shared buffers whose lifetime starts at `i`.
    pub(super) fn shared_alloc_before(&mut self, i: InstId) {
        if self.ws == super::ws::WsMode::Producer {
            return;
        }
        let Some(bufs) = self.shared_life.alloc_before.get(&i).cloned() else {
            return;
        };
        for b in bufs {
            self.alloc_shared_buf(b);
        }
    }

    /// Allocates shared buffer `b` (and a TMA ring's mbarriers).
    pub(super) fn alloc_shared_buf(&mut self, b: u32) {
        let Some(tile) = buffer_tile(self.func, b) else {
            return;
        };
        let slots = self.func.scratch[b as usize].slots;
        let name = self.func.scratch[b as usize].name.clone();
        let id = self
            .smem
            .alloc(name, slot_bytes(&tile).saturating_mul(slots), tile.align());
        self.shared_bufs.insert(b, id);
        if self.is_tma_buf(b) {
            self.tma_alloc(b);
        }
    }

    /// Frees the shared buffers whose lifetime ends at `i`.
    pub(super) fn shared_free_after(&mut self, i: InstId) {
        if self.ws == super::ws::WsMode::Producer {
            return;
        }
        let Some(bufs) = self.shared_life.free_after.get(&i).cloned() else {
            return;
        };
        for b in bufs {
            self.tma_free(b);
            if let Some(id) = self.shared_bufs.remove(&b) {
                self.smem.free(id);
            }
        }
    }

    /// The slot's address (`kg_smem` window) and byte range of the whole buffer.
    pub(super) fn shared_slot(
        &mut self,
        buf: u32,
        slot: ValueId,
        span: Span,
    ) -> R<(Reg, SharedTile, std::ops::Range<u32>)> {
        let tile = buffer_tile(self.func, buf)
            .ok_or_else(|| unsupported(span, "a staged buffer holds 2-D tiles"))?;
        let id = *self
            .shared_bufs
            .get(&buf)
            .ok_or_else(|| unsupported(span, "a staged buffer used outside its lifetime"))?;
        let base = self.smem_at(self.smem.offset(id));
        let range = self.smem.range(id);
        let s = self.scalar(slot, span)?;
        let addr = self.op1(
            RegClass::B32,
            "mad.lo.s32",
            vec![
                s.into(),
                Operand::Imm(slot_bytes(&tile) as i64),
                base.into(),
            ],
        );
        Ok((addr, tile, range))
    }

    /// `scratch_fetch` into a shared buffer (module docs).
    pub(super) fn lower_shared_fetch(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchFetch {
            buf,
            slot,
            tensor,
            ref index,
            padding,
            eviction,
        } = inst.op
        else {
            return Ok(());
        };
        if self.is_tma_buf(buf) {
            return self.lower_tma_fetch(id);
        }
        let (slot_addr, tile, range) = self.shared_slot(buf, slot, span)?;
        let real = func.scratch[buf as usize].slot_shape.clone();
        let (t, tp) = self.tensor(tensor, span)?;
        // A rank-N tensor's tile with leading extents of 1: its leading indices only
        // move the tile's origin (`passes::pipeline` squeezes them away).
        if tp.rank() < 2 || index.len() != tp.rank() || real.len() != 2 {
            return Err(unsupported(span, "a staged fetch of a 2-D tile"));
        }
        let nl = tp.rank() - 2;
        let dt = tp.dtype;
        let es = dt.size_bytes();
        let vec_bytes = if tp.contiguous {
            tp.align_bytes.min(16)
        } else {
            es
        };
        let async_copy = vec_bytes >= 4 && self.target.caps.cp_async;
        if async_copy {
            if self.sync.before_async_write(range) {
                self.emit_bar_sync();
            }
        } else if self.sync.before_write(range) {
            self.emit_bar_sync();
        }
        let policy = self.cache_policy(eviction);
        let pad_bits = super::memory::scalar_bits(padding, dt);
        // A ring of two or more slots: the pipeline never reads the slot it fetches into
        // before the next wait, so the copies may be issued later, among the next dot's
        // instructions (`Lowerer::deferred_copies`).
        let defer = async_copy && func.scratch[buf as usize].slots >= 2;
        let ve = vec_bytes / es; // elements per copy
        let per_row = tile.cols / ve;
        let chunks = tile.rows * per_row;
        let threads = self.threads();
        // Once per fetch (uniform): the tile's origin, its address, whether it starts
        // inside the tensor (a negative tile index, as the pipeline's past-the-end
        // fetches use, reads nothing), and the columns left in its rows.
        let mut origin = Vec::with_capacity(2);
        for d in 0..2 {
            let idx = self.scalar(index[nl + d], span)?;
            origin.push(self.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![idx.into(), Operand::Imm(real[d] as i64)],
            ));
        }
        let stride_of = |d: usize| t.strides.get(d).copied().map(|e| e.op());
        let stride0 = stride_of(nl).unwrap_or(Operand::Imm(0));
        let stride1 = if tp.contiguous {
            Operand::Imm(1)
        } else {
            stride_of(nl + 1).unwrap_or(Operand::Imm(1))
        };
        let off0 = self.op1(
            RegClass::B64,
            "mul.wide.s32",
            vec![origin[0].into(), stride0.clone()],
        );
        let off1 = self.op1(
            RegClass::B64,
            "mul.wide.s32",
            vec![origin[1].into(), stride1.clone()],
        );
        let mut off = self.op1(RegClass::B64, "add.s64", vec![off0.into(), off1.into()]);
        let neg0 = self.op1(
            RegClass::Pred,
            "setp.lt.s32",
            vec![origin[0].into(), Operand::Imm(0)],
        );
        let neg1 = self.op1(
            RegClass::Pred,
            "setp.lt.s32",
            vec![origin[1].into(), Operand::Imm(0)],
        );
        let mut neg = self.op1(RegClass::Pred, "or.pred", vec![neg0.into(), neg1.into()]);
        // Leading dimensions: the index is the element (extent 1); one outside the
        // tensor (unsigned: a negative one too) makes the whole tile zeros.
        for (d, &ix) in index.iter().enumerate().take(nl) {
            let idx = self.scalar(ix, span)?;
            let o = self.op1(
                RegClass::B64,
                "mul.wide.s32",
                vec![idx.into(), stride_of(d).unwrap_or(Operand::Imm(0))],
            );
            off = self.op1(RegClass::B64, "add.s64", vec![off.into(), o.into()]);
            let out = self.op1(
                RegClass::Pred,
                "setp.ge.u32",
                vec![idx.into(), t.dims[d].op()],
            );
            neg = self.op1(RegClass::Pred, "or.pred", vec![neg.into(), out.into()]);
        }
        let tile_ptr = self.element_address(t.base, dt, off);
        let left = self.op1(
            RegClass::B32,
            "sub.s32",
            vec![t.dims[nl + 1].op(), origin[1].into()],
        );
        let left = self.op1(
            RegClass::B32,
            "min.s32",
            vec![left.into(), Operand::Imm(real[1] as i64)],
        );
        let left = self.op1(
            RegClass::B32,
            "selp.b32",
            vec![Operand::Imm(0), left.into(), neg.into()],
        );
        // In bytes where the copy counts bytes.
        let left = if async_copy {
            self.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![left.into(), Operand::Imm(es as i64)],
            )
        } else {
            left
        };
        let tid = self.tid();
        // Every chunk is all in or all out when the tile's columns are whole chunks (the
        // tensor's rows are, by the alignment contract): a predicate then says "zeros"
        // (`ignore-src`) instead of a source size computed per chunk.
        let whole_chunks = async_copy && real[1].is_multiple_of(ve);
        // When the block's threads cover whole rows, eight at a time, a thread's chunks
        // are rows apart by a multiple of 8: the same swizzle, so its later chunks' slot
        // offsets are immediates from its first.
        let rows_per_pass = threads / per_row.max(1);
        let same_col = threads.is_multiple_of(per_row.max(1)) && rows_per_pass.is_multiple_of(8);
        let span_bytes = tile.atom_cols() * es;
        let mut first_soff: Option<Reg> = None;
        // Whole chunks in the same column for all of a thread's copies: per fetch, the
        // rows left (the tensor's past the origin, at most the tile's real rows; ≤ 0 when
        // the origin is past the end) and whether the thread's column is outside (a
        // negative origin leaves no columns, `left` = 0); per chunk, one compare then
        // says "zeros" (the other predicates become dead code).
        // On wgmma targets, and elsewhere in kernels of one `dot` (a GEMM's loop: 183 →
        // 171 SASS instructions per iteration of the sm_80 128 x 128 x 32 GEMM); not in
        // sm_80's chains of products, where the dK/dV kernel at D = 128 sits at 255
        // registers and some specializations spilled 4 bytes with it.
        let mut fast: Option<(Reg, Reg)> = None;
        let one_compare = same_col && (self.target.caps.wgmma || self.single_dot_kernel());
        // More than 8 chunks a thread (rows aligned to less than 16 bytes: 4-byte,
        // 8-byte or element copies of a large tile) would hold a 64-bit offset, a row and
        // predicates per chunk across the loop: 64 element chunks took the 128 x 256
        // update tile to 744 bytes of spills. With the thread's chunks in one column,
        // chunk k's row is the first's plus k passes and its address the previous one's
        // plus a pass of rows, so only the first chunk's coordinates are loop-invariant.
        let per_thread = chunks.div_ceil(threads);
        let incremental = threads.is_multiple_of(per_row.max(1)) && per_thread > 8;
        let pass_bytes = incremental.then(|| {
            self.in_prologue(|l| match &stride0 {
                // A constant row stride (a tensor of constant extents): a constant step.
                Operand::Imm(v) => l.op1(
                    RegClass::B64,
                    "mov.b64",
                    vec![Operand::Imm(v * rows_per_pass as i64 * es as i64)],
                ),
                _ => {
                    let rows = l.op1(
                        RegClass::B64,
                        "mul.wide.s32",
                        vec![stride0.clone(), Operand::Imm(rows_per_pass as i64)],
                    );
                    l.op1(
                        RegClass::B64,
                        "shl.b64",
                        vec![rows.into(), Operand::Imm(es.trailing_zeros() as i64)],
                    )
                }
            })
        });
        // The previous chunk's address, row, column, column in copy units and in-tile
        // predicate, incremental mode.
        let mut prev: Option<(Reg, Reg, Reg, Reg, Option<Reg>)> = None;
        for k in 0..per_thread {
            // Chunk q = tid + k * threads: row q / per_row, column chunk q % per_row; its
            // row, column, swizzled slot offset and offset in the tensor from the tile's
            // origin are loop-invariant (prologue).
            let (q, active) = self.in_prologue(|l| {
                let q = l.op1(
                    RegClass::B32,
                    "add.u32",
                    vec![tid.into(), Operand::Imm((k * threads) as i64)],
                );
                let active =
                    (chunks % threads != 0 && k + 1 == chunks.div_ceil(threads)).then(|| {
                        l.op1(
                            RegClass::Pred,
                            "setp.lt.u32",
                            vec![q.into(), Operand::Imm(chunks as i64)],
                        )
                    });
                (q, active)
            });
            if let (Some((paddr, prow, col, col_units, _)), Some(step)) = (prev, pass_bytes) {
                // Chunk k: k passes of rows below the first, same column.
                let row = self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![prow.into(), Operand::Imm(rows_per_pass as i64)],
                );
                let gaddr = self.op1(RegClass::B64, "add.s64", vec![paddr.into(), step.into()]);
                let in_tile = (real[0] < tile.rows).then(|| {
                    self.op1(
                        RegClass::Pred,
                        "setp.lt.u32",
                        vec![row.into(), Operand::Imm(real[0] as i64)],
                    )
                });
                prev = Some((gaddr, row, col, col_units, in_tile));
            }
            let (row, col, soff) = match prev {
                // Rows a multiple of 8 apart share the swizzle: the slot offset is then
                // the first chunk's plus an immediate (below), else it is computed here.
                Some((_, row, col, _, _)) if same_col => (row, col, row),
                Some((_, row, col, _, _)) => (row, col, self.swizzled_offset(&tile, row, col)),
                None => self.chunk_coords(q, per_row, ve, &tile),
            };
            let (thr_off, col_units, row_in_tile) = match prev {
                // The incremental chunk's address is already absolute (`thr_off` unused).
                Some((_, _, _, cu, it)) => (row, cu, it),
                None => self.in_prologue(|l| {
                    let r = l.op1(
                        RegClass::B64,
                        "mul.wide.s32",
                        vec![row.into(), stride0.clone()],
                    );
                    let c = l.op1(
                        RegClass::B64,
                        "mul.wide.s32",
                        vec![col.into(), stride1.clone()],
                    );
                    let e = l.op1(RegClass::B64, "add.s64", vec![r.into(), c.into()]);
                    let bytes = l.op1(
                        RegClass::B64,
                        "shl.b64",
                        vec![e.into(), Operand::Imm(es.trailing_zeros() as i64)],
                    );
                    let units = if async_copy {
                        l.op1(
                            RegClass::B32,
                            "mul.lo.s32",
                            vec![col.into(), Operand::Imm(es as i64)],
                        )
                    } else {
                        col
                    };
                    let in_tile = (real[0] < tile.rows).then(|| {
                        l.op1(
                            RegClass::Pred,
                            "setp.lt.u32",
                            vec![row.into(), Operand::Imm(real[0] as i64)],
                        )
                    });
                    (bytes, units, in_tile)
                }),
            };
            // The row is inside the tensor (unsigned: a negative row is not) and the tile.
            let grow = self.op1(RegClass::B32, "add.s32", vec![origin[0].into(), row.into()]);
            let ok = self.op1(
                RegClass::Pred,
                "setp.lt.u32",
                vec![grow.into(), t.dims[nl].op()],
            );
            let ok = match row_in_tile {
                Some(p) => self.op1(RegClass::Pred, "and.pred", vec![ok.into(), p.into()]),
                None => ok,
            };
            let gaddr = match prev {
                Some((a, ..)) => a,
                None => self.op1(
                    RegClass::B64,
                    "add.s64",
                    vec![tile_ptr.into(), thr_off.into()],
                ),
            };
            if incremental && prev.is_none() {
                prev = Some((gaddr, row, col, col_units, row_in_tile));
            }
            let (saddr, simm) = match first_soff {
                Some(base) if same_col => (base, (k * rows_per_pass * span_bytes) as i64),
                _ => {
                    let a = self.op1(
                        RegClass::B32,
                        "add.s32",
                        vec![slot_addr.into(), soff.into()],
                    );
                    if same_col {
                        first_soff = Some(a);
                    }
                    (a, 0)
                }
            };
            if whole_chunks {
                // In bounds (row and chunk) or zeros, without reading.
                let zeros = if one_compare {
                    let (rows_lim, col_out) = match fast {
                        Some(f) => f,
                        None => {
                            let rl = self.op1(
                                RegClass::B32,
                                "sub.s32",
                                vec![t.dims[nl].op(), origin[0].into()],
                            );
                            let rl = self.op1(
                                RegClass::B32,
                                "min.s32",
                                vec![rl.into(), Operand::Imm(real[0] as i64)],
                            );
                            let co = self.op1(
                                RegClass::Pred,
                                "setp.ge.s32",
                                vec![col_units.into(), left.into()],
                            );
                            fast = Some((rl, co));
                            (rl, co)
                        }
                    };
                    self.op1(
                        RegClass::Pred,
                        "setp.ge.or.s32",
                        vec![row.into(), rows_lim.into(), col_out.into()],
                    )
                } else {
                    let inside = self.op1(
                        RegClass::Pred,
                        "setp.lt.s32",
                        vec![col_units.into(), left.into()],
                    );
                    let inside =
                        self.op1(RegClass::Pred, "and.pred", vec![inside.into(), ok.into()]);
                    self.op1(RegClass::Pred, "not.pred", vec![inside.into()])
                };
                let level = if vec_bytes == 16 { "cg" } else { "ca" };
                let mut operands = vec![
                    Operand::Mem(Addr::Reg(saddr), simm),
                    Operand::Mem(Addr::Reg(gaddr), 0),
                    Operand::Imm(vec_bytes as i64),
                    zeros.into(),
                ];
                let hint = super::memory::cache_hint(policy, &mut operands);
                let copy = crate::back::ptx::isa::Inst::new(
                    active.map(|p| (p, false)),
                    format!("cp.async.{level}.shared.global{hint}"),
                    operands,
                );
                if defer {
                    self.deferred_copies
                        .push(crate::back::ptx::isa::Stmt::Inst(copy));
                } else {
                    self.push_stmt(crate::back::ptx::isa::Stmt::Inst(copy));
                }
                continue;
            }
            // What of the chunk is inside: clamp(left - col, 0, vec) (bytes or elements).
            let unit = if async_copy { vec_bytes } else { ve };
            let n = self.op1(
                RegClass::B32,
                "sub.s32",
                vec![left.into(), col_units.into()],
            );
            let n = self.op1(
                RegClass::B32,
                "min.s32",
                vec![n.into(), Operand::Imm(unit as i64)],
            );
            let n = self.op1(RegClass::B32, "max.s32", vec![n.into(), Operand::Imm(0)]);
            let n = self.op1(
                RegClass::B32,
                "selp.b32",
                vec![n.into(), Operand::Imm(0), ok.into()],
            );
            let saddr = if simm != 0 {
                self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![saddr.into(), Operand::Imm(simm)],
                )
            } else {
                saddr
            };
            if async_copy {
                // A source size below the copy's zero-fills the rest; 0 reads nothing.
                let level = if vec_bytes == 16 { "cg" } else { "ca" };
                let mut operands = vec![
                    Operand::Mem(Addr::Reg(saddr), 0),
                    Operand::Mem(Addr::Reg(gaddr), 0),
                    Operand::Imm(vec_bytes as i64),
                    n.into(),
                ];
                let hint = super::memory::cache_hint(policy, &mut operands);
                let copy = crate::back::ptx::isa::Inst::new(
                    active.map(|p| (p, false)),
                    format!("cp.async.{level}.shared.global{hint}"),
                    operands,
                );
                if defer {
                    self.deferred_copies
                        .push(crate::back::ptx::isa::Stmt::Inst(copy));
                } else {
                    self.push_stmt(crate::back::ptx::isa::Stmt::Inst(copy));
                }
            } else {
                // Element by element: the element or the padding (zero for slots past the
                // tile's real extent is the padding too: a product must not read them).
                self.fetch_elements(dt, gaddr, saddr, n, active, ve, pad_bits, &tp);
            }
        }
        self.count_fetch();
        let commit = crate::back::ptx::isa::Inst::new(None, "cp.async.commit_group", vec![]);
        // Commit groups must be committed in fetch order: the pipeline's `scratch_wait`
        // counts them. A fetch that is not deferred (element-wise stores, complete when
        // issued) still queues its (empty) group behind the deferred fetches before it.
        if defer || !self.deferred_copies.is_empty() {
            self.deferred_copies
                .push(crate::back::ptx::isa::Stmt::Inst(commit));
        } else {
            self.push_stmt(crate::back::ptx::isa::Stmt::Inst(commit));
        }
        Ok(())
    }

    /// A chunk's row, first column and swizzled byte offset in the slot, for chunk
    /// number `q` (a register): loop-invariant, computed once in the prologue.
    fn chunk_coords(
        &mut self,
        q: Reg,
        per_row: u32,
        ve: u32,
        tile: &SharedTile,
    ) -> (Reg, Reg, Reg) {
        let tile = *tile;
        self.in_prologue(|l| {
            let sh = per_row.trailing_zeros() as i64;
            let row = l.op1(RegClass::B32, "shr.u32", vec![q.into(), Operand::Imm(sh)]);
            let cidx = l.op1(
                RegClass::B32,
                "and.b32",
                vec![q.into(), Operand::Imm((per_row - 1) as i64)],
            );
            let col = l.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![cidx.into(), Operand::Imm(ve as i64)],
            );
            let off = l.swizzled_offset(&tile, row, col);
            (row, col, off)
        })
    }

    /// `tile.offset(row, col)` for registers (see `swizzle.rs`): the atom, the natural
    /// offset inside it, and the XOR of its 16-byte chunk bits with its 128-byte line bits.
    pub(super) fn swizzled_offset(&mut self, tile: &SharedTile, row: Reg, col: Reg) -> Reg {
        let ac = tile.atom_cols();
        let es = tile.elem_bytes;
        let span = ac * es;
        // natural = row * span + (col % ac) * es
        let cin = self.op1(
            RegClass::B32,
            "and.b32",
            vec![col.into(), Operand::Imm((ac - 1) as i64)],
        );
        let cb = self.op1(
            RegClass::B32,
            "mul.lo.s32",
            vec![cin.into(), Operand::Imm(es as i64)],
        );
        let natural = self.op1(
            RegClass::B32,
            "mad.lo.s32",
            vec![row.into(), Operand::Imm(span as i64), cb.into()],
        );
        let mask = tile.swizzle.mask();
        let inner = if mask == 0 {
            natural
        } else {
            let line = self.op1(
                RegClass::B32,
                "shr.u32",
                vec![natural.into(), Operand::Imm(7)],
            );
            let m = self.op1(
                RegClass::B32,
                "and.b32",
                vec![line.into(), Operand::Imm(mask as i64)],
            );
            let x = self.op1(RegClass::B32, "shl.b32", vec![m.into(), Operand::Imm(4)]);
            self.op1(RegClass::B32, "xor.b32", vec![natural.into(), x.into()])
        };
        if ac >= tile.cols {
            return inner;
        }
        let atom = self.op1(
            RegClass::B32,
            "shr.u32",
            vec![col.into(), Operand::Imm(ac.trailing_zeros() as i64)],
        );
        self.op1(
            RegClass::B32,
            "mad.lo.s32",
            vec![
                atom.into(),
                Operand::Imm(tile.atom_bytes() as i64),
                inner.into(),
            ],
        )
    }

    /// The element-by-element fallback of a fetch: `n` valid elements from `gaddr` (the
    /// rest of the `ve` padding), stored at `saddr`.
    #[allow(clippy::too_many_arguments)]
    fn fetch_elements(
        &mut self,
        dt: DType,
        gaddr: Reg,
        saddr: Reg,
        n: Reg,
        active: Option<Reg>,
        ve: u32,
        pad_bits: u64,
        tp: &crate::ir::TensorParam,
    ) {
        let es = dt.size_bytes();
        let (class, ty) = match es {
            8 => (RegClass::B64, "b64"),
            4 => (RegClass::B32, "b32"),
            _ => (RegClass::B16, "b16"),
        };
        // Non-contiguous tensors have ve == 1: the element's address is gaddr itself.
        let _ = tp;
        for e in 0..ve {
            let w = self.reg(class);
            self.mov(w, Operand::Imm(pad_bits as i64));
            let ok = self.op1(
                RegClass::Pred,
                "setp.gt.s32",
                vec![n.into(), Operand::Imm(e as i64)],
            );
            let ok = match active {
                Some(a) => self.op1(RegClass::Pred, "and.pred", vec![ok.into(), a.into()]),
                None => ok,
            };
            self.emit_if(
                Some((ok, false)),
                format!("ld.global.{ty}"),
                vec![w.into(), Operand::Mem(Addr::Reg(gaddr), (e * es) as i64)],
            );
            self.emit_if(
                active.map(|a| (a, false)),
                format!("st.shared.{ty}"),
                vec![Operand::Mem(Addr::Reg(saddr), (e * es) as i64), w.into()],
            );
        }
    }

    /// `scratch_load` of a shared buffer: a [`StagedView`] for a staged value, else the
    /// elements read into the value's layout.
    pub(super) fn lower_shared_load(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchLoad { buf, slot } = inst.op else {
            return Ok(());
        };
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "scratch_load without a result"))?;
        let (addr, tile, range) = self.shared_slot(buf, slot, span)?;
        if self.is_tma_buf(buf) {
            let s = self.scalar(slot, span)?;
            self.tma_wait_slot(buf, s);
        }
        if self.ws == super::ws::WsMode::Consumer {
            // Visible through the slot's `full` phase; released through its `empty` one.
            self.sync.note_read(range);
        } else if self.sync.before_read(range) {
            self.emit_bar_sync();
        }
        if self.asg.staged.contains(&res) {
            self.staged_vals.insert(
                res,
                StagedView {
                    buf,
                    base: addr,
                    tile,
                    transposed: false,
                },
            );
            return Ok(());
        }
        // Generic read: each register's element at its swizzled offset.
        let dt = self.dtype(res);
        let lin = self.lin(res);
        let es = dt.size_bytes();
        let (ty, wide) = match es {
            2 => ("b16", true),
            4 => ("b32", false),
            _ => return Err(unsupported(span, "a staged tile of 8-byte elements")),
        };
        let tr = self.thread_coord(&lin, 0);
        let tc = self.thread_coord(&lin, 1);
        let mut out = Vec::with_capacity(lin.num_regs());
        for r in 0..lin.num_regs() {
            let c = lin.reg_coord(r);
            let row = match tr {
                Some(t) => self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![t.into(), Operand::Imm(c[0] as i64)],
                ),
                None => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(c[0] as i64)]),
            };
            let col = match tc {
                Some(t) => self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![t.into(), Operand::Imm(c[1] as i64)],
                ),
                None => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(c[1] as i64)]),
            };
            let off = self.swizzled_offset(&tile, row, col);
            let a = self.op1(RegClass::B32, "add.s32", vec![addr.into(), off.into()]);
            let v = if wide {
                let h = self.op1(
                    RegClass::B16,
                    &format!("ld.shared.{ty}"),
                    vec![Operand::Mem(Addr::Reg(a), 0)],
                );
                self.widen_half(h, dt)
            } else {
                self.op1(
                    super::class_of(dt),
                    &format!("ld.shared.{ty}"),
                    vec![Operand::Mem(Addr::Reg(a), 0)],
                )
            };
            out.push(v);
        }
        self.bind(res, out);
        Ok(())
    }

    /// A transpose of a staged value stays staged (the other orientation).
    pub(super) fn transpose_staged(&mut self, src: ValueId, res: ValueId) -> bool {
        let Some(v) = self.staged_vals.get(&src).copied() else {
            return false;
        };
        self.staged_vals.insert(
            res,
            StagedView {
                transposed: !v.transposed,
                ..v
            },
        );
        true
    }
}
