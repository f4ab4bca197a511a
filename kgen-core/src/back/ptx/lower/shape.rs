//! Data movement between layouts: layout conversions, `broadcast`, `expand_dims`,
//! `permute`, `reshape` (free register renaming when the layouts allow, else a round
//! trip through shared memory), and `dot`.
//!
//! Assumes: shared memory is used by one operation at a time (`smem_begin` places a
//! barrier before the writes, and one separates writes from reads).
//! Guarantees: a conversion is free exactly when `layout::free_remap` says so; the
//! shared-memory path writes the source at its padded row-major index and reads each
//! destination element from the index given by the weights (or by division for a
//! reshape that is not a bit relabeling), so any layout pair works. Consecutive
//! row-major elements that one thread holds move as one vector (at most 16 bytes, never
//! across a padded row); an identity conversion whose buffer would not fit beside the
//! shared memory alive at it goes through half the buffer twice.
//!
//! `dot` is the plain lowering: A and B are staged in shared memory as f32 (or i32),
//! and each thread runs a loop over k with one fma per accumulator element. Tensor
//! cores (`Capabilities::mma_sync`, `wgmma`) replace this in a later issue by giving
//! `dot` an MMA accumulator layout in `assign` and a new lowering here.

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::{self, row_major_strides, Linear};
use crate::ir::{Op, ValueId};
use crate::span::Span;
use crate::types::DType;

/// Padding of a tile's rows in shared memory: after every `2^row_bits` elements (a row
/// of the padded last dimension), `pad` more, so that rows that would start in the same
/// bank (rows of 128 bytes or more) start 16 bytes apart and a warp's accesses to eight
/// rows at one column spread over all banks.
#[derive(Clone, Copy, Debug)]
struct RowPad {
    row_bits: u32,
    pad: u64,
}

impl RowPad {
    fn for_rows(shape: &[u32], slot: u32) -> RowPad {
        let last = shape.last().copied().unwrap_or(1).max(1);
        let rows = shape.iter().product::<u32>().max(1) / last;
        let pad = if rows > 1 && last * slot >= 128 {
            (16 / slot).max(1) as u64
        } else {
            0
        };
        RowPad {
            row_bits: last.trailing_zeros(),
            pad,
        }
    }

    /// The padded position of row-major index `i`.
    fn index(&self, i: u64) -> u64 {
        i + (i >> self.row_bits) * self.pad
    }
}

/// Bytes per element of a tile passed through shared memory: 8 for i64, 2 for f16/bf16
/// (their values are exact in 16 bits: half the bytes and bank traffic of 32-bit
/// slots), 4 otherwise (bool as a word).
fn smem_slot_bytes(dt: DType) -> u32 {
    match dt {
        DType::I64 => 8,
        DType::F16 | DType::BF16 => 2,
        _ => 4,
    }
}

impl Lowerer<'_> {
    /// Moves `regs` (laid out as `src`) to the layout `dst` under the weight map.
    pub fn remap(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        dst: &Linear,
        weights: &[u64],
        dt: DType,
        span: Span,
    ) -> R<Vec<Reg>> {
        if let Some(map) = layout::free_remap(src, dst, weights) {
            return map
                .into_iter()
                .map(|s| {
                    regs.get(s)
                        .copied()
                        .ok_or_else(|| unsupported(span, "layout remap out of range"))
                })
                .collect();
        }
        self.comment("layout conversion through shared memory");
        let slot = smem_slot_bytes(dt);
        let pad = RowPad::for_rows(&src.shape, slot);
        // Vector accesses: a group of registers holding consecutive elements of the
        // padded row-major order moves with one `st.shared.v*` / `ld.shared.v*` (at most
        // 16 bytes, within a padded row, whose starts are 16-byte aligned).
        let cap = |k: u32| -> usize {
            let mut k = k.min((16 / slot).trailing_zeros());
            if pad.pad != 0 {
                k = k.min(pad.row_bits);
            }
            if super::class_of(dt) == RegClass::Pred {
                k = 0;
            }
            1 << k
        };
        let wvec = cap(layout::row_major_vector_bits(src));
        let rvec = cap(layout::weighted_vector_bits(dst, weights));
        let numel: u32 = src.shape.iter().product::<u32>().max(1);
        let bytes = pad.index(numel as u64) as u32 * slot;
        if self.smem.end_if_allocated(bytes, 16) > self.target.max_shared_bytes_per_block {
            if let Some(out) = self.remap_in_halves(regs, src, dst, weights, dt, span)? {
                return Ok(out);
            }
        }
        let base = self.smem_begin(bytes);
        self.smem_write_padded(regs, src, dt, base, slot, pad, wvec)?;
        self.smem_read_fence();
        // Read address: base + pad(sum(thread_d * w_d)) * slot.
        let mut t: Option<Reg> = None;
        for (d, &w) in weights.iter().enumerate().take(dst.rank()) {
            if w == 0 {
                continue;
            }
            if let Some(x) = self.thread_coord(dst, d) {
                let s = self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![x.into(), Operand::Imm(w as i64)],
                );
                t = Some(match t {
                    None => s,
                    Some(a) => self.op1(RegClass::B32, "add.s32", vec![a.into(), s.into()]),
                });
            }
        }
        let addr = match t {
            Some(t) => {
                let bytes = self.padded_bytes(t, pad, slot);
                self.op1(RegClass::B32, "add.s32", vec![base.into(), bytes.into()])
            }
            None => base,
        };
        let mut out = Vec::with_capacity(dst.num_regs());
        for r in (0..dst.num_regs()).step_by(rvec) {
            let c = dst.reg_coord(r);
            let off: u64 = c.iter().zip(weights).map(|(&a, &w)| a as u64 * w).sum();
            let off = (pad.index(off) * slot as u64) as i64;
            out.extend(self.smem_read_group(dt, addr, off, rvec));
        }
        self.smem_end();
        Ok(out)
    }

    /// A layout conversion whose buffer would not fit beside the shared memory alive
    /// now (a warp-specialized kernel's rings, alive across a persistent loop, beside its
    /// epilogue's tile) goes through half the buffer twice: the halves where a coordinate
    /// bit that both layouts hold in registers is 0, then 1 (each half may split
    /// again). `None` when the map is not the identity or no such bit exists.
    fn remap_in_halves(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        dst: &Linear,
        weights: &[u64],
        dt: DType,
        span: Span,
    ) -> R<Option<Vec<Reg>>> {
        if src.shape != dst.shape || weights != row_major_strides(&src.shape).as_slice() {
            return Ok(None);
        }
        // The common register bit highest in the row-major order (rows stay whole).
        let Some(&cb) = src
            .regs
            .iter()
            .filter(|cb| dst.regs.contains(cb))
            .max_by_key(|&&cb| Linear::linear_bit(&src.shape, cb))
        else {
            return Ok(None);
        };
        let (Some((s_half, js)), Some((d_half, jd))) =
            (src.split_reg_bit(cb), dst.split_reg_bit(cb))
        else {
            return Ok(None);
        };
        self.comment("layout conversion in two halves (shared memory is short)");
        let w = row_major_strides(&s_half.shape);
        let mut out: Vec<Option<Reg>> = vec![None; dst.num_regs()];
        for half in 0..2 {
            let part: Vec<Reg> = (0..src.num_regs())
                .filter(|r| r >> js & 1 == half)
                .map(|r| regs.get(r).copied())
                .collect::<Option<_>>()
                .ok_or_else(|| unsupported(span, "layout remap out of range"))?;
            let got = self.remap(&part, &s_half, &d_half, &w, dt, span)?;
            for (k, r) in (0..dst.num_regs())
                .filter(|r| r >> jd & 1 == half)
                .enumerate()
            {
                out[r] = got.get(k).copied();
            }
        }
        out.into_iter()
            .collect::<Option<Vec<Reg>>>()
            .map(Some)
            .ok_or_else(|| unsupported(span, "layout remap out of range"))
    }

    /// `pad.index(i) * slot` for a register `i`: `(i + (i >> row_bits) * pad) * slot`.
    fn padded_bytes(&mut self, i: Reg, pad: RowPad, slot: u32) -> Reg {
        let i = match pad.pad {
            0 => i,
            p => {
                let row = self.op1(
                    RegClass::B32,
                    "shr.u32",
                    vec![i.into(), Operand::Imm(pad.row_bits as i64)],
                );
                self.op1(
                    RegClass::B32,
                    "mad.lo.s32",
                    vec![row.into(), Operand::Imm(p as i64), i.into()],
                )
            }
        };
        self.op1(
            RegClass::B32,
            "mul.lo.s32",
            vec![i.into(), Operand::Imm(slot as i64)],
        )
    }

    /// Writes every register of a tile at its padded row-major index (`pad`), `slot`
    /// bytes per element, `vec` consecutive registers per store (see `remap`).
    #[allow(clippy::too_many_arguments)]
    fn smem_write_padded(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        dt: DType,
        base: Reg,
        slot: u32,
        pad: RowPad,
        vec: usize,
    ) -> R<()> {
        if pad.pad == 0 {
            return self.smem_write_at(regs, src, dt, base, 0, slot, vec);
        }
        // The thread part of the index, padded at run time; each register's constant
        // part padded here (their bits are disjoint, so the padding of the sum is the sum
        // of the paddings).
        let strides = row_major_strides(&src.shape);
        let mut t: Option<Reg> = None;
        for (d, &st) in strides.iter().enumerate() {
            if let Some(x) = self.thread_coord(src, d) {
                let m = self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![x.into(), Operand::Imm(st as i64)],
                );
                t = Some(match t {
                    None => m,
                    Some(a) => self.op1(RegClass::B32, "add.s32", vec![a.into(), m.into()]),
                });
            }
        }
        let addr = match t {
            Some(t) => {
                let bytes = self.padded_bytes(t, pad, slot);
                self.op1(RegClass::B32, "add.s32", vec![base.into(), bytes.into()])
            }
            None => base,
        };
        for (r, group) in regs.chunks(vec).enumerate() {
            let off = pad.index(Self::lin_offset(src, r * vec)) * slot as u64;
            self.smem_store_group(group, dt, addr, off as i64, slot);
        }
        Ok(())
    }

    /// Writes every register of a tile to shared memory at `offset_bytes` + its padded
    /// row-major index; returns the slot size and the buffer base. Starts with a barrier.
    fn smem_write(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        dt: DType,
        offset_bytes: u32,
    ) -> R<(u32, Reg)> {
        let slot = smem_slot_bytes(dt);
        let numel: u32 = src.shape.iter().product::<u32>().max(1);
        let base = self.smem_begin(offset_bytes + numel * slot);
        self.smem_write_at(regs, src, dt, base, offset_bytes, slot, 1)?;
        Ok((slot, base))
    }

    /// The write phase alone (no barrier), `slot` bytes per element (2 stores a half
    /// value's 16 bits; 4 and 8 its register), `vec` consecutive registers per store.
    #[allow(clippy::too_many_arguments)]
    fn smem_write_at(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        dt: DType,
        base: Reg,
        offset_bytes: u32,
        slot: u32,
        vec: usize,
    ) -> R<()> {
        let slot = slot as u64;
        let addr = self.smem_thread_base(src, base, slot);
        for (r, group) in regs.chunks(vec).enumerate() {
            let off = Self::lin_offset(src, r * vec) * slot + offset_bytes as u64;
            self.smem_store_group(group, dt, addr, off as i64, slot as u32);
        }
        Ok(())
    }

    /// Stores consecutive elements with one vector store (`group.len()` a power of two,
    /// at most 16 bytes, `off` aligned to them): half values packed two to a word (from
    /// the f32 values they were rounded from, see `pack`). A group of half values not
    /// all held widened in f32 registers is stored element by element.
    pub(super) fn smem_store_group(
        &mut self,
        group: &[Reg],
        dt: DType,
        addr: Reg,
        off: i64,
        slot: u32,
    ) {
        let n = group.len();
        if n == 1 || (slot == 2 && group.iter().any(|r| r.class != RegClass::F32)) {
            for (i, &v) in group.iter().enumerate() {
                self.smem_store_elem(v, dt, addr, off + (i as u32 * slot) as i64, slot);
            }
            return;
        }
        let words = if slot == 2 {
            self.pack(dt, group).0
        } else {
            group.to_vec()
        };
        let ty = if slot == 8 { "b64" } else { "b32" };
        let mem = Operand::Mem(Addr::Reg(addr), off);
        match words.len() {
            1 => self.emit(format!("st.shared.{ty}"), vec![mem, words[0].into()]),
            m => self.emit(
                format!("st.shared.v{m}.{ty}"),
                vec![mem, Operand::Vec(words)],
            ),
        }
    }

    /// Stores one element of a tile passing through shared memory: a half value's 16
    /// bits when `slot` is 2, a predicate as a word, else the register.
    fn smem_store_elem(&mut self, v: Reg, dt: DType, addr: Reg, off: i64, slot: u32) {
        let mem = Operand::Mem(Addr::Reg(addr), off);
        if slot == 2 && v.class == RegClass::F32 {
            // A half value (kept widened, exactly representable): its 16 bits.
            let h = self.op1(
                RegClass::B16,
                if dt == DType::BF16 {
                    "cvt.rn.bf16.f32"
                } else {
                    "cvt.rn.f16.f32"
                },
                vec![v.into()],
            );
            self.emit("st.shared.b16", vec![mem, h.into()]);
            return;
        }
        if v.class == RegClass::B16 {
            self.emit("st.shared.b16", vec![mem, v.into()]);
            return;
        }
        match v.class {
            RegClass::Pred => {
                let b = self.op1(
                    RegClass::B32,
                    "selp.b32",
                    vec![Operand::Imm(1), Operand::Imm(0), v.into()],
                );
                self.emit("st.shared.b32", vec![mem, b.into()]);
            }
            RegClass::B64 => self.emit("st.shared.b64", vec![mem, v.into()]),
            _ => self.emit("st.shared.b32", vec![mem, v.into()]),
        }
    }

    /// Every copy of a replicated tile takes the values of the copy where `first` holds
    /// (one copy per element, e.g. `replica0`): that copy writes each element to shared
    /// memory at its padded row-major index, and after a barrier every thread reads its
    /// elements back. For results that only one copy computed (`atomic_add`'s old
    /// values). 32-bit values.
    pub(super) fn broadcast_from_copy(
        &mut self,
        regs: &[Reg],
        lin: &Linear,
        first: Reg,
    ) -> R<Vec<Reg>> {
        self.comment("the adding copy's values to every copy of the tile");
        let slot = 4u64;
        let numel: u32 = lin.shape.iter().product::<u32>().max(1);
        let base = self.smem_begin(numel * slot as u32);
        let addr = self.smem_thread_base(lin, base, slot);
        for (r, &v) in regs.iter().enumerate() {
            let off = (Self::lin_offset(lin, r) * slot) as i64;
            self.emit_if(
                Some((first, false)),
                "st.shared.b32",
                vec![Operand::Mem(Addr::Reg(addr), off), v.into()],
            );
        }
        self.smem_read_fence();
        let out = (0..regs.len())
            .map(|r| {
                let off = (Self::lin_offset(lin, r) * slot) as i64;
                self.op1(
                    regs[r].class,
                    "ld.shared.b32",
                    vec![Operand::Mem(Addr::Reg(addr), off)],
                )
            })
            .collect();
        self.smem_end();
        Ok(out)
    }

    /// `base` + this thread's part of its elements' padded row-major offsets (bytes, at
    /// `slot` bytes per element); each register adds `lin_offset(r) * slot`.
    fn smem_thread_base(&mut self, lin: &Linear, base: Reg, slot: u64) -> Reg {
        let strides = row_major_strides(&lin.shape);
        let mut t: Option<Reg> = None;
        for (d, &s) in strides.iter().enumerate() {
            if let Some(x) = self.thread_coord(lin, d) {
                let m = self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![x.into(), Operand::Imm((s * slot) as i64)],
                );
                t = Some(match t {
                    None => m,
                    Some(a) => self.op1(RegClass::B32, "add.s32", vec![a.into(), m.into()]),
                });
            }
        }
        match t {
            Some(t) => self.op1(RegClass::B32, "add.s32", vec![base.into(), t.into()]),
            None => base,
        }
    }

    fn smem_read(&mut self, dt: DType, addr: Reg, off: i64) -> Reg {
        let mem = Operand::Mem(Addr::Reg(addr), off);
        if dt.is_half() {
            let h = self.op1(RegClass::B16, "ld.shared.b16", vec![mem]);
            return self.widen_half(h, dt);
        }
        match super::class_of(dt) {
            RegClass::Pred => {
                let b = self.op1(RegClass::B32, "ld.shared.b32", vec![mem]);
                self.op1(
                    RegClass::Pred,
                    "setp.ne.u32",
                    vec![b.into(), Operand::Imm(0)],
                )
            }
            RegClass::B64 => self.op1(RegClass::B64, "ld.shared.b64", vec![mem]),
            c => self.op1(c, "ld.shared.b32", vec![mem]),
        }
    }

    /// Reads `n` consecutive elements (a power of two, at most 16 bytes, `off` aligned
    /// to them) with one vector load; half values come two to a word and are unpacked
    /// (`unpack`, which remembers each pair's word for a store that packs them again).
    fn smem_read_group(&mut self, dt: DType, addr: Reg, off: i64, n: usize) -> Vec<Reg> {
        if n == 1 {
            return vec![self.smem_read(dt, addr, off)];
        }
        let slot = smem_slot_bytes(dt);
        let (class, ty, word_bytes) = match slot {
            8 => (RegClass::B64, "b64", 8),
            4 => (super::class_of(dt), "b32", 4),
            _ => (RegClass::B32, "b32", 4),
        };
        let words: Vec<Reg> = (0..n as u32 * slot / word_bytes)
            .map(|_| self.reg(class))
            .collect();
        let mem = Operand::Mem(Addr::Reg(addr), off);
        let dst = match words.len() {
            1 => Operand::Reg(words[0]),
            _ => Operand::Vec(words.clone()),
        };
        let v = match words.len() {
            1 => String::new(),
            m => format!(".v{m}"),
        };
        self.emit(format!("ld.shared{v}.{ty}"), vec![dst, mem]);
        if slot == 2 {
            self.unpack(dt, n as u32, &words)
        } else {
            words
        }
    }

    pub fn lower_shape_op(&mut self, id: crate::ir::InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "shape op without a result"))?;
        if let Op::Permute(v, perm) = &inst.op {
            if perm.as_slice() == [1, 0] && self.transpose_staged(*v, res) {
                return Ok(());
            }
        }
        let (v, weights) = match &inst.op {
            Op::Broadcast(v) => (
                *v,
                Some(layout::broadcast_weights(&self.shape(*v), &self.shape(res))),
            ),
            Op::ExpandDims(v, axis) => (
                *v,
                Some(layout::expand_dims_weights(&self.shape(*v), *axis as usize)),
            ),
            Op::Permute(v, perm) => (
                *v,
                Some(
                    layout::permute_weights(&self.shape(*v), perm)
                        .ok_or_else(|| unsupported(span, "bad permutation"))?,
                ),
            ),
            Op::Reshape(v) => (
                *v,
                layout::reshape_weights(&self.shape(*v), &self.shape(res)),
            ),
            _ => return Ok(()),
        };
        let dt = self.dtype(res);
        let dst = self.lin(res);
        let src_shape = self.shape(v);
        if src_shape.is_empty() || self.is_uniform(v) {
            // A scalar or uniform operand: every element is the same register.
            let r = self.scalar(v, span)?;
            self.bind(res, vec![r; dst.num_regs()]);
            self.mark_uniform(res);
            return Ok(());
        }
        let src = self.lin(v);
        let regs = self.regs(v, span)?;
        let out = match weights {
            Some(w) => self.remap(&regs, &src, &dst, &w, dt, span)?,
            None => {
                self.reshape_by_division(&regs, &src, &src_shape, &dst, &self.shape(res), dt)?
            }
        };
        self.bind(res, out);
        Ok(())
    }

    /// A reshape that mixes non-power-of-two extents: each destination element finds its
    /// row-major index (clamped for padded slots) and divides it back into source
    /// coordinates.
    fn reshape_by_division(
        &mut self,
        regs: &[Reg],
        src: &Linear,
        src_shape: &[u32],
        dst: &Linear,
        dst_shape: &[u32],
        dt: DType,
    ) -> R<Vec<Reg>> {
        self.comment("reshape through shared memory");
        let (slot, base) = self.smem_write(regs, src, dt, 0)?;
        self.smem_read_fence();
        let real_dst = row_major_strides(dst_shape);
        let real_src = row_major_strides(src_shape);
        let pad_src = row_major_strides(&src.shape);
        let numel: u64 = src_shape.iter().map(|&d| d as u64).product();
        let ths: Vec<Option<Reg>> = (0..dst.rank()).map(|d| self.thread_coord(dst, d)).collect();
        let mut out = Vec::with_capacity(dst.num_regs());
        for r in 0..dst.num_regs() {
            let c = dst.reg_coord(r);
            let konst: u64 = c.iter().zip(&real_dst).map(|(&a, &s)| a as u64 * s).sum();
            let mut l = self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(konst as i64)]);
            for (d, th) in ths.iter().enumerate() {
                if let Some(x) = *th {
                    l = self.op1(
                        RegClass::B32,
                        "mad.lo.s32",
                        vec![x.into(), Operand::Imm(real_dst[d] as i64), l.into()],
                    );
                }
            }
            l = self.op1(
                RegClass::B32,
                "min.u32",
                vec![l.into(), Operand::Imm(numel.saturating_sub(1) as i64)],
            );
            let mut idx = self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]);
            for e in 0..src_shape.len() {
                let q = self.op1(
                    RegClass::B32,
                    "div.u32",
                    vec![l.into(), Operand::Imm(real_src[e] as i64)],
                );
                let s = self.op1(
                    RegClass::B32,
                    "rem.u32",
                    vec![q.into(), Operand::Imm(src_shape[e] as i64)],
                );
                idx = self.op1(
                    RegClass::B32,
                    "mad.lo.s32",
                    vec![
                        s.into(),
                        Operand::Imm((pad_src[e] * slot as u64) as i64),
                        idx.into(),
                    ],
                );
            }
            let a = self.op1(RegClass::B32, "add.s32", vec![base.into(), idx.into()]);
            out.push(self.smem_read(dt, a, 0));
        }
        self.smem_end();
        Ok(out)
    }

    pub fn lower_dot(
        &mut self,
        id: crate::ir::InstId,
        a: ValueId,
        b: ValueId,
        acc: ValueId,
        precision: crate::ir::InputPrecision,
    ) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "dot without a result"))?;
        let (sa, sb, sr) = (self.shape(a), self.shape(b), self.shape(res));
        if precision.is_tf32() && self.dtype(a) != DType::F32 {
            return Err(unsupported(
                span,
                format!(
                    "a dot with input_precision {} of {} operands",
                    precision.name(),
                    self.dtype(a)
                ),
            ));
        }
        if sa.len() != 2
            || sb.len() != 2
            || sr.len() != 2
            || sa[1] != sb[0]
            || sa[0] != sr[0]
            || sb[1] != sr[1]
        {
            return Err(unsupported(
                span,
                "dot needs [M, K] x [K, N] + [M, N] tiles",
            ));
        }
        let (adt, bdt, rdt) = (self.dtype(a), self.dtype(b), self.dtype(res));
        let float = adt.is_float() && bdt.is_float() && rdt == DType::F32;
        let int = adt == DType::I32 && bdt == DType::I32 && rdt == DType::I32;
        if !float && !int {
            return Err(unsupported(
                span,
                format!("dot of {adt} x {bdt} into {rdt} (float inputs with an f32 accumulator, or i32)"),
            ));
        }
        let lin = self.lin(res);
        let acc_regs = self.operand_in(acc, &lin, span)?;
        let accs: Vec<Reg> = acc_regs.iter().map(|&r| self.copy(r)).collect();
        let (la, lb) = (self.lin(a), self.lin(b));
        let (ra, rb) = (self.regs(a, span)?, self.regs(b, span)?);
        let (pm, pk) = (la.shape[0], la.shape[1]);
        let pn = lb.shape[1];
        let a_bytes = pm * pk * 4;
        self.comment("dot: stage A and B in shared memory");
        let base = self.smem_begin(a_bytes + pk * pn * 4);
        // The FMA loop below reads 32-bit words: f32 values (halves widened), i32.
        self.smem_write_at(&ra, &la, adt, base, 0, 4, 1)?;
        self.smem_write_at(&rb, &lb, bdt, base, a_bytes, 4, 1)?;
        self.smem_read_fence();
        // Per-thread row of A and column of B.
        let tm = self.thread_coord(&lin, 0);
        let tn = self.thread_coord(&lin, 1);
        let aaddr = match tm {
            Some(t) => {
                let o = self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![t.into(), Operand::Imm((pk * 4) as i64)],
                );
                self.op1(RegClass::B32, "add.s32", vec![base.into(), o.into()])
            }
            None => self.copy(base),
        };
        let baddr = match tn {
            Some(t) => {
                let o = self.op1(RegClass::B32, "shl.b32", vec![t.into(), Operand::Imm(2)]);
                let x = self.op1(RegClass::B32, "add.s32", vec![base.into(), o.into()]);
                self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![x.into(), Operand::Imm(a_bytes as i64)],
                )
            }
            None => self.op1(
                RegClass::B32,
                "add.s32",
                vec![base.into(), Operand::Imm(a_bytes as i64)],
            ),
        };
        let (aaddr, baddr) = (self.copy(aaddr), self.copy(baddr));
        let mut ms: Vec<u32> = (0..lin.num_regs()).map(|r| lin.reg_coord(r)[0]).collect();
        ms.sort_unstable();
        ms.dedup();
        let mut ns: Vec<u32> = (0..lin.num_regs()).map(|r| lin.reg_coord(r)[1]).collect();
        ns.sort_unstable();
        ns.dedup();
        let k = self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]);
        let head = self.new_label();
        self.place_label(head);
        let class = if float { RegClass::F32 } else { RegClass::B32 };
        let av: Vec<Reg> = ms
            .iter()
            .map(|&m| {
                self.op1(
                    class,
                    "ld.shared.b32",
                    vec![Operand::Mem(Addr::Reg(aaddr), (m * pk * 4) as i64)],
                )
            })
            .collect();
        let bv: Vec<Reg> = ns
            .iter()
            .map(|&n| {
                self.op1(
                    class,
                    "ld.shared.b32",
                    vec![Operand::Mem(Addr::Reg(baddr), (n * 4) as i64)],
                )
            })
            .collect();
        // A TF32 dot rounds each operand element as the tensor cores' path does
        // (`cvt.rna.tf32.f32`; `tf32x3` also keeps the rounded remainder), so the products
        // are the interpreter's, whichever unit computes them.
        let x3 = precision == crate::ir::InputPrecision::Tf32x3;
        let split = |l: &mut Self, v: Vec<Reg>| -> (Vec<Reg>, Vec<Reg>) {
            if !precision.is_tf32() {
                return (v, Vec::new());
            }
            let hi: Vec<Reg> = v.iter().map(|&x| l.round_tf32(x)).collect();
            let lo = if x3 {
                v.iter()
                    .zip(&hi)
                    .map(|(&x, &h)| {
                        let d = l.op1(RegClass::F32, "sub.rn.f32", vec![x.into(), h.into()]);
                        l.round_tf32(d)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (hi, lo)
        };
        let (av, av_lo) = split(self, av);
        let (bv, bv_lo) = split(self, bv);
        for (r, &acc_r) in accs.iter().enumerate() {
            let c = lin.reg_coord(r);
            let ai = ms
                .binary_search(&c[0])
                .map_err(|_| unsupported(span, "dot layout"))?;
            let bi = ns
                .binary_search(&c[1])
                .map_err(|_| unsupported(span, "dot layout"))?;
            let opc = if float { "fma.rn.f32" } else { "mad.lo.s32" };
            if let (Some(&al), Some(&bl)) = (av_lo.get(ai), bv_lo.get(bi)) {
                // The small products first, as the interpreter and the tensor cores.
                self.emit(
                    opc,
                    vec![acc_r.into(), al.into(), bv[bi].into(), acc_r.into()],
                );
                self.emit(
                    opc,
                    vec![acc_r.into(), av[ai].into(), bl.into(), acc_r.into()],
                );
            }
            self.emit(
                opc,
                vec![acc_r.into(), av[ai].into(), bv[bi].into(), acc_r.into()],
            );
        }
        self.emit("add.s32", vec![aaddr.into(), aaddr.into(), Operand::Imm(4)]);
        self.emit(
            "add.s32",
            vec![baddr.into(), baddr.into(), Operand::Imm((pn * 4) as i64)],
        );
        self.emit("add.s32", vec![k.into(), k.into(), Operand::Imm(1)]);
        let p = self.op1(
            RegClass::Pred,
            "setp.lt.s32",
            vec![k.into(), Operand::Imm(sa[1] as i64)],
        );
        self.emit_if(Some((p, false)), "bra.uni", vec![Operand::Label(head)]);
        self.smem_end();
        self.bind(res, accs);
        Ok(())
    }
}
