//! Lowering of block-local scratch buffers (`scratch`, `scratch_store`, `scratch_load`).
//!
//! Assumes: the function's scratch buffers are fixed before lowering (`Function::scratch`)
//! and every access names a slot with an `i32` scalar (validated).
//!
//! Guarantees: the buffers sit at the start of the shared-memory array `kg_smem`, one
//! after another (16-byte aligned); the layout conversions' scratch follows them
//! (`Lowerer::smem_base` points past the buffers), so neither overwrites the other. A
//! slot holds the tile in its *anchor layout*, thread-private: thread `t` keeps its
//! registers, packed into 16-byte chunks, at `slot * slot_bytes + (c * threads + t) *
//! chunk_bytes` for chunk `c`. A store converts the value to the anchor layout first; a
//! load returns the anchor layout. So every thread reads back exactly the bytes it
//! wrote: no barrier is needed, and consecutive threads touch consecutive 16-byte
//! chunks (no bank conflicts). Slots outside `0..slots` are masked (`setp.lt.u32`, which
//! also rejects negative slots): stores are dropped, loads read 0.

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::Linear;
use crate::ir::{InstId, Op, ScratchBuf};
use crate::span::Span;
use crate::types::DType;

/// Where one scratch buffer lives and how its slots are laid out.
#[derive(Clone, Debug)]
pub struct ScratchPlacement {
    /// Byte offset of the buffer in `kg_smem`.
    pub offset: u32,
    /// Bytes per slot (every thread's registers of one tile).
    pub slot_bytes: u32,
    /// The slot tile's anchor layout.
    pub layout: Linear,
    /// Elements per 16-byte (or smaller) chunk.
    pub chunk: usize,
}

/// Places `bufs` one after another from offset 0; returns the placements and the total
/// bytes (a multiple of 16).
pub fn place(
    bufs: &[ScratchBuf],
    anchor: impl Fn(&[u32]) -> Linear,
    threads: u32,
) -> (Vec<ScratchPlacement>, u32) {
    let mut offset = 0u32;
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        let layout = anchor(&b.slot_shape);
        let es = b.dtype.size_bytes();
        let regs = layout.num_regs();
        let chunk = (16 / es.max(1) as usize).clamp(1, regs.max(1));
        let slot_bytes = (regs as u32) * threads * es;
        out.push(ScratchPlacement {
            offset,
            slot_bytes,
            layout,
            chunk,
        });
        let bytes = slot_bytes.saturating_mul(b.slots);
        offset = offset.saturating_add(bytes.div_ceil(16) * 16);
    }
    (out, offset)
}

impl Lowerer<'_> {
    /// This thread's address of chunk 0 of `slot`, less the buffer's offset in `kg_smem`
    /// (each access adds it, with the chunk's stride, as an immediate), and the
    /// predicate "slot in range".
    fn scratch_address(
        &mut self,
        buf: u32,
        slot: Reg,
        span: Span,
    ) -> R<(Reg, Reg, ScratchPlacement)> {
        let (placement, slots) = match (
            self.scratch.get(buf as usize).cloned(),
            self.func.scratch.get(buf as usize),
        ) {
            (Some(p), Some(b)) => (p, b.slots),
            _ => return Err(unsupported(span, "no such scratch buffer")),
        };
        let es = self.func.scratch[buf as usize].dtype.size_bytes();
        let chunk_bytes = placement.chunk as u32 * es;
        let base = self.scratch_base();
        let tid = self.tid();
        // Thread part: kg_smem + t * chunk_bytes (loop-invariant; one `mad` per access).
        let t_off = self.op1(
            RegClass::B32,
            "mad.lo.u32",
            vec![tid.into(), Operand::Imm(chunk_bytes as i64), base.into()],
        );
        let slot_addr = self.op1(
            RegClass::B32,
            "mad.lo.u32",
            vec![
                slot.into(),
                Operand::Imm(placement.slot_bytes as i64),
                t_off.into(),
            ],
        );
        let in_range = self.op1(
            RegClass::Pred,
            "setp.lt.u32",
            vec![slot.into(), Operand::Imm(slots as i64)],
        );
        Ok((slot_addr, in_range, placement))
    }

    /// `scratch_store(buf, slot, value)`.
    pub fn lower_scratch_store(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchStore { buf, slot, value } = inst.op else {
            return Ok(());
        };
        let dt = self.dtype(value);
        if dt == DType::Bool {
            return Err(unsupported(span, "scratch buffers of bool"));
        }
        let slot_reg = self.scalar(slot, span)?;
        let (addr, in_range, p) = self.scratch_address(buf, slot_reg, span)?;
        let regs = self.operand_in(value, &p.layout, span)?;
        let stride = self.threads() * (p.chunk as u32) * dt.size_bytes();
        for (c, elems) in regs.chunks(p.chunk).enumerate() {
            let (words, ty) = self.pack(dt, elems);
            let v = vector_suffix(words.len());
            let src = if words.len() == 1 {
                Operand::Reg(words[0])
            } else {
                Operand::Vec(words)
            };
            self.emit_if(
                Some((in_range, false)),
                format!("st.shared{v}.{ty}"),
                vec![
                    Operand::Mem(Addr::Reg(addr), p.offset as i64 + c as i64 * stride as i64),
                    src,
                ],
            );
        }
        Ok(())
    }

    /// `scratch_load(buf, slot)`.
    pub fn lower_scratch_load(&mut self, id: InstId) -> R<()> {
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
        let dt = self.dtype(res);
        if dt == DType::Bool {
            return Err(unsupported(span, "scratch buffers of bool"));
        }
        if self.scratch.get(buf as usize).map(|p| &p.layout) != Some(&self.lin(res)) {
            return Err(unsupported(
                span,
                "scratch_load result not in the slot's anchor layout",
            ));
        }
        let slot_reg = self.scalar(slot, span)?;
        let (addr, in_range, p) = self.scratch_address(buf, slot_reg, span)?;
        let es = dt.size_bytes();
        let regs = p.layout.num_regs();
        let stride = self.threads() * (p.chunk as u32) * es;
        let mut out = Vec::with_capacity(regs);
        for c in 0..regs.div_ceil(p.chunk) {
            let n = p.chunk.min(regs - c * p.chunk);
            let (class, nwords, ty) = match es {
                8 => (RegClass::B64, n, "b64"),
                4 => (super::class_of(dt), n, "b32"),
                _ if n == 1 => (RegClass::B16, 1, "b16"),
                _ => (RegClass::B32, n / 2, "b32"),
            };
            let words: Vec<Reg> = (0..nwords).map(|_| self.reg(class)).collect();
            for &w in &words {
                let zero = match w.class {
                    RegClass::F32 => Operand::F32(0.0),
                    _ => Operand::Imm(0),
                };
                self.mov(w, zero);
            }
            let dst = if nwords == 1 {
                Operand::Reg(words[0])
            } else {
                Operand::Vec(words.clone())
            };
            self.emit_if(
                Some((in_range, false)),
                format!("ld.shared{}.{ty}", vector_suffix(nwords)),
                vec![
                    dst,
                    Operand::Mem(Addr::Reg(addr), p.offset as i64 + c as i64 * stride as i64),
                ],
            );
            out.extend(self.unpack(dt, n as u32, &words));
        }
        self.bind(res, out);
        Ok(())
    }

    /// The start of the scratch buffers: `kg_smem` itself (computed once, in the
    /// prologue).
    pub(super) fn scratch_base(&mut self) -> Reg {
        self.prologue_symbol(|l| &mut l.scratch_base, super::SMEM)
    }
}

/// `.v2` / `.v4` for a vector of that many words, else nothing.
fn vector_suffix(words: usize) -> &'static str {
    match words {
        2 => ".v2",
        4 => ".v4",
        _ => "",
    }
}
