//! Reductions along one axis: in registers, then across lanes with
//! `shfl.sync.bfly.b32`, then across warps through shared memory.
//!
//! Assumes: the result's layout is the operand's with the axis dropped (`Slice`), which
//! `assign` guarantees; otherwise the result is converted afterwards.
//! Guarantees: every thread that holds an output element ends with the same bits for
//! it (butterflies and the cross-warp pass combine in the same order everywhere), so
//! a scalar result is uniform. Padded slots of a non-power-of-two axis are replaced by
//! the identity (NaN for float max/min, which IEEE maxNum/minNum ignore; index
//! `i32::MAX` for arg reductions). f16/bf16 sums accumulate in f32 and round once.
//! Arg reductions keep (value, index) pairs and pick the first extreme index, skipping
//! NaN (an all-NaN line gives its first index).

// Coordinates index several parallel per-dimension arrays at once.
#![allow(clippy::needless_range_loop)]

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Operand, Reg, RegClass};
use crate::back::ptx::layout::{identity_weights, row_major_strides};
use crate::ir::{ReduceOp, ValueId};
use crate::span::Span;
use crate::types::DType;

#[derive(Clone, Copy)]
struct Acc {
    v: Reg,
    i: Option<Reg>,
}

/// A reduction after its in-register and cross-lane steps: one accumulator per output
/// register, still to be combined across the warps in `wbits` (none: already complete).
struct Partial {
    op: ReduceOp,
    dt: DType,
    arg: bool,
    res: ValueId,
    span: Span,
    /// Warp bits of the reduced axis.
    wbits: Vec<u32>,
    out_lin: crate::back::ptx::layout::Linear,
    accs: Vec<Acc>,
}

impl Partial {
    fn slot_bytes(&self) -> u32 {
        if self.dt == DType::I64 {
            8
        } else {
            4
        }
    }

    /// (bytes of one region of values, bytes in all: twice that for arg reductions);
    /// (0, 0) with no cross-warp step.
    fn smem_bytes(&self) -> (u32, u32) {
        if self.wbits.is_empty() {
            return (0, 0);
        }
        let nslots = 1u32 << self.wbits.len();
        let out_numel: u32 = self.out_lin.shape.iter().product::<u32>().max(1);
        let region = nslots * out_numel * self.slot_bytes();
        (region, if self.arg { region * 2 } else { region })
    }
}

impl Lowerer<'_> {
    fn identity(&mut self, op: ReduceOp, dt: DType, span: Span) -> R<Operand> {
        use DType::*;
        Ok(match (op, dt) {
            (ReduceOp::Sum, F32 | F16 | BF16) => Operand::F32(0.0),
            (ReduceOp::Sum, _) => Operand::Imm(0),
            (_, F32 | F16 | BF16) => Operand::F32(f32::NAN),
            (ReduceOp::Max | ReduceOp::ArgMax, I32) => Operand::Imm(i32::MIN as i64),
            (ReduceOp::Max | ReduceOp::ArgMax, U32) => Operand::Imm(0),
            (ReduceOp::Max | ReduceOp::ArgMax, I64) => Operand::Imm(i64::MIN),
            (ReduceOp::Min | ReduceOp::ArgMin, I32) => Operand::Imm(i32::MAX as i64),
            (ReduceOp::Min | ReduceOp::ArgMin, U32) => Operand::Imm(u32::MAX as i32 as i64),
            (ReduceOp::Min | ReduceOp::ArgMin, I64) => Operand::Imm(i64::MAX),
            _ => return Err(unsupported(span, format!("reduction of {dt}"))),
        })
    }

    fn combine(&mut self, op: ReduceOp, dt: DType, a: Acc, b: Acc) -> Acc {
        let float = dt.is_float();
        let class = a.v.class;
        let ty = if float {
            "f32".to_string()
        } else {
            super::arith::int_ty(dt).to_string()
        };
        match op {
            ReduceOp::Sum => {
                let opc = if float {
                    "add.rn.f32".to_string()
                } else {
                    format!("add.{ty}")
                };
                Acc {
                    v: self.op1(class, &opc, vec![a.v.into(), b.v.into()]),
                    i: None,
                }
            }
            ReduceOp::Max | ReduceOp::Min => {
                let m = if op == ReduceOp::Max { "max" } else { "min" };
                Acc {
                    v: self.op1(class, &format!("{m}.{ty}"), vec![a.v.into(), b.v.into()]),
                    i: None,
                }
            }
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let (Some(ai), Some(bi)) = (a.i, b.i) else {
                    return a;
                };
                let cmp = if op == ReduceOp::ArgMax { "gt" } else { "lt" };
                let p = RegClass::Pred;
                // take b when b is strictly better, or equal with a smaller index.
                let better = self.op1(p, &format!("setp.{cmp}.{ty}"), vec![b.v.into(), a.v.into()]);
                let eq = self.op1(p, &format!("setp.eq.{ty}"), vec![b.v.into(), a.v.into()]);
                let lower = self.op1(p, "setp.lt.s32", vec![bi.into(), ai.into()]);
                let tie = self.op1(p, "and.pred", vec![eq.into(), lower.into()]);
                let mut take = self.op1(p, "or.pred", vec![better.into(), tie.into()]);
                if float {
                    // NaN never wins over a number; between two NaNs the lower index does.
                    let an = self.op1(p, "setp.nan.f32", vec![a.v.into(), a.v.into()]);
                    let bn = self.op1(p, "setp.nan.f32", vec![b.v.into(), b.v.into()]);
                    let bnum = self.op1(p, "not.pred", vec![bn.into()]);
                    let over_nan = self.op1(p, "and.pred", vec![an.into(), bnum.into()]);
                    let both = self.op1(p, "and.pred", vec![an.into(), bn.into()]);
                    let both_lower = self.op1(p, "and.pred", vec![both.into(), lower.into()]);
                    let t1 = self.op1(p, "or.pred", vec![take.into(), over_nan.into()]);
                    take = self.op1(p, "or.pred", vec![t1.into(), both_lower.into()]);
                }
                let v = self.select(take, b.v, a.v);
                let i = self.select(take, bi, ai);
                Acc { v, i: Some(i) }
            }
        }
    }

    /// `r` of the lane whose id differs from this one's in `mask` (two shuffles for a
    /// 64-bit register).
    pub(super) fn shfl(&mut self, r: Reg, mask: u32) -> Reg {
        let args = |d: Reg, s: Reg| {
            vec![
                d.into(),
                s.into(),
                Operand::Imm(mask as i64),
                Operand::Imm(0x1f),
                Operand::Imm(-1),
            ]
        };
        if r.class == RegClass::B64 {
            let (lo, hi) = (self.reg(RegClass::B32), self.reg(RegClass::B32));
            self.emit("mov.b64", vec![Operand::Vec(vec![lo, hi]), r.into()]);
            let (lo2, hi2) = (self.reg(RegClass::B32), self.reg(RegClass::B32));
            self.emit("shfl.sync.bfly.b32", args(lo2, lo));
            self.emit("shfl.sync.bfly.b32", args(hi2, hi));
            return self.op1(RegClass::B64, "mov.b64", vec![Operand::Vec(vec![lo2, hi2])]);
        }
        let d = self.reg(r.class);
        self.emit("shfl.sync.bfly.b32", args(d, r));
        d
    }

    /// Lowers one reduction (a batch of one).
    pub fn lower_reduce(
        &mut self,
        id: crate::ir::InstId,
        op: ReduceOp,
        value: ValueId,
        axis: usize,
    ) -> R<()> {
        let part = self.reduce_partial(id, op, value, axis)?;
        self.reduce_finish(vec![part])
    }

    /// Lowers several reductions whose operands are all computed: each reduces in
    /// registers and across lanes on its own, then all of them exchange their cross-warp
    /// partials through one shared-memory round trip (one barrier pair for the batch).
    /// Each result is bit-identical to lowering that reduction alone.
    pub fn lower_reduce_batch(&mut self, reductions: &[super::BatchedReduction]) -> R<()> {
        let mut parts = Vec::with_capacity(reductions.len());
        for &(id, op, value, axis) in reductions {
            parts.push(self.reduce_partial(id, op, value, axis)?);
        }
        self.reduce_finish(parts)
    }

    /// Steps 1 and 2 of a reduction: in registers, then across lanes.
    fn reduce_partial(
        &mut self,
        id: crate::ir::InstId,
        op: ReduceOp,
        value: ValueId,
        axis: usize,
    ) -> R<Partial> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "reduce without a result"))?;
        let dt = self.dtype(value);
        if dt == DType::Bool {
            return Err(unsupported(span, "reduction of bool (cast to i32 first)"));
        }
        let shape = self.shape(value);
        if axis >= shape.len() {
            return Err(unsupported(span, "reduction axis out of range"));
        }
        let src = self.lin(value);
        let vals = self.regs(value, span)?;
        let out_lin = src.drop_dim(axis);
        let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
        let ident = self.identity(op, dt, span)?;
        let extent = shape[axis];
        let th_axis = self.thread_coord(&src, axis);
        let axis_regs: Vec<usize> = src
            .regs
            .iter()
            .enumerate()
            .filter(|(_, cb)| cb.0 as usize == axis)
            .map(|(j, _)| j)
            .collect();
        // 1. In registers.
        let mut accs = Vec::with_capacity(out_lin.num_regs());
        for o in 0..out_lin.num_regs() {
            let mut oc = out_lin.reg_coord(o);
            oc.insert(axis, 0);
            let base = src
                .reg_index(&oc)
                .ok_or_else(|| unsupported(span, "reduction layout mismatch"))?;
            let mut acc: Option<Acc> = None;
            for k in 0..(1usize << axis_regs.len()) {
                let mut r = base;
                for (j, &bit) in axis_regs.iter().enumerate() {
                    if k >> j & 1 == 1 {
                        r |= 1 << bit;
                    }
                }
                let kc = src.reg_coord(r)[axis];
                if th_axis.is_none() && kc >= extent {
                    continue;
                }
                let mut v = vals[r];
                let mut idx = None;
                if arg {
                    idx = Some(match th_axis {
                        Some(t) => self.op1(
                            RegClass::B32,
                            "add.s32",
                            vec![t.into(), Operand::Imm(kc as i64)],
                        ),
                        None => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(kc as i64)]),
                    });
                }
                if let (Some(t), false) = (th_axis, extent.is_power_of_two()) {
                    let l = self.op1(
                        RegClass::B32,
                        "add.s32",
                        vec![t.into(), Operand::Imm(kc as i64)],
                    );
                    let ok = self.op1(
                        RegClass::Pred,
                        "setp.lt.u32",
                        vec![l.into(), Operand::Imm(extent as i64)],
                    );
                    let id_reg = self.reg(v.class);
                    self.mov(id_reg, ident.clone());
                    v = self.select(ok, v, id_reg);
                    if let Some(i) = idx {
                        let big = self.op1(
                            RegClass::B32,
                            "mov.b32",
                            vec![Operand::Imm(i32::MAX as i64)],
                        );
                        idx = Some(self.select(ok, i, big));
                    }
                }
                let cur = Acc { v, i: idx };
                acc = Some(match acc {
                    None => cur,
                    Some(a) => self.combine(op, dt, a, cur),
                });
            }
            let acc = match acc {
                Some(a) => a,
                None => {
                    let v = self.reg(super::class_of(dt));
                    self.mov(v, ident.clone());
                    let i = if arg {
                        Some(self.op1(
                            RegClass::B32,
                            "mov.b32",
                            vec![Operand::Imm(i32::MAX as i64)],
                        ))
                    } else {
                        None
                    };
                    Acc { v, i }
                }
            };
            accs.push(acc);
        }
        // 2. Across lanes.
        for h in src.lane_bits_of(axis) {
            for a in accs.iter_mut() {
                let v = self.shfl(a.v, 1 << h);
                let i = a.i.map(|i| self.shfl(i, 1 << h));
                *a = self.combine(op, dt, *a, Acc { v, i });
            }
        }
        Ok(Partial {
            op,
            dt,
            arg,
            res,
            span,
            wbits: src.warp_bits_of(axis),
            out_lin,
            accs,
        })
    }

    /// Steps 3 and 4 of a batch of reductions: the cross-warp exchange of every part that
    /// needs one, through one shared-memory buffer (each part in its own region), then
    /// the results.
    fn reduce_finish(&mut self, mut parts: Vec<Partial>) -> R<()> {
        // 3. Across warps, through shared memory.
        let mut regions = Vec::with_capacity(parts.len());
        let mut total = 0u32;
        for part in &parts {
            let (region, bytes) = part.smem_bytes();
            regions.push((total, region));
            total += bytes;
        }
        if total > 0 {
            let base = self.smem_begin(total);
            let mut reads = Vec::with_capacity(parts.len());
            for (part, &(offset, region)) in parts.iter().zip(&regions) {
                if part.wbits.is_empty() {
                    reads.push(None);
                    continue;
                }
                reads.push(Some(
                    self.reduce_store_partials(part, base, offset, region)?,
                ));
            }
            self.smem_read_fence();
            for ((part, &(offset, region)), raddr) in parts.iter_mut().zip(&regions).zip(reads) {
                if let Some(raddr) = raddr {
                    self.reduce_load_partials(part, raddr, offset, region);
                }
            }
            self.smem_end();
        }
        // 4. Results.
        for part in parts {
            self.reduce_results(part)?;
        }
        Ok(())
    }
    /// Stores part's cross-warp partials at byte `offset` of the buffer at `base`
    /// (`region` bytes of values, then as many of indices for arg reductions); returns
    /// the address its reads start from.
    fn reduce_store_partials(
        &mut self,
        part: &Partial,
        base: Reg,
        offset: u32,
        region: u32,
    ) -> R<Reg> {
        let out_lin = &part.out_lin;
        let out_numel: u32 = out_lin.shape.iter().product::<u32>().max(1);
        let slot_bytes = part.slot_bytes();
        let pairs: Vec<(u32, u32)> = part
            .wbits
            .iter()
            .enumerate()
            .map(|(j, &w)| (5 + w, j as u32))
            .collect();
        let slot = self.tid_bits(&pairs);
        // Thread part of the output's linear index.
        let strides = row_major_strides(&out_lin.shape);
        let mut tlin: Option<Reg> = None;
        for d in 0..out_lin.rank() {
            if let Some(t) = self.thread_coord(out_lin, d) {
                let s = self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![t.into(), Operand::Imm(strides[d] as i64)],
                );
                tlin = Some(match tlin {
                    None => s,
                    Some(a) => self.op1(RegClass::B32, "add.s32", vec![a.into(), s.into()]),
                });
            }
        }
        let shift = slot_bytes.trailing_zeros() as i64;
        // Write address: base + ((slot * out_numel) + tlin) * slot_bytes (+ offset).
        let mut w = match slot {
            Some(s) => self.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![s.into(), Operand::Imm(out_numel as i64)],
            ),
            None => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]),
        };
        if let Some(t) = tlin {
            w = self.op1(RegClass::B32, "add.s32", vec![w.into(), t.into()]);
        }
        let wb = self.op1(
            RegClass::B32,
            "shl.b32",
            vec![w.into(), Operand::Imm(shift)],
        );
        let waddr = self.op1(RegClass::B32, "add.s32", vec![base.into(), wb.into()]);
        let raddr = match tlin {
            Some(t) => {
                let tb = self.op1(
                    RegClass::B32,
                    "shl.b32",
                    vec![t.into(), Operand::Imm(shift)],
                );
                self.op1(RegClass::B32, "add.s32", vec![base.into(), tb.into()])
            }
            None => base,
        };
        let st = if slot_bytes == 8 {
            "st.shared.b64"
        } else {
            "st.shared.b32"
        };
        for (o, a) in part.accs.iter().enumerate() {
            let off = (Self::lin_offset(out_lin, o) * slot_bytes as u64 + offset as u64) as i64;
            self.emit(
                st,
                vec![
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(waddr), off),
                    a.v.into(),
                ],
            );
            if let Some(i) = a.i {
                self.emit(
                    "st.shared.b32",
                    vec![
                        Operand::Mem(crate::back::ptx::isa::Addr::Reg(waddr), off + region as i64),
                        i.into(),
                    ],
                );
            }
        }
        Ok(raddr)
    }

    /// Reads back and combines every warp's partials of `part` (after the barrier).
    fn reduce_load_partials(&mut self, part: &mut Partial, raddr: Reg, offset: u32, region: u32) {
        let out_numel: u32 = part.out_lin.shape.iter().product::<u32>().max(1);
        let slot_bytes = part.slot_bytes();
        let nslots = 1u32 << part.wbits.len();
        let ld = if slot_bytes == 8 {
            "ld.shared.b64"
        } else {
            "ld.shared.b32"
        };
        let (op, dt, arg) = (part.op, part.dt, part.arg);
        for o in 0..part.accs.len() {
            let off =
                (Self::lin_offset(&part.out_lin, o) * slot_bytes as u64 + offset as u64) as i64;
            let class = part.accs[o].v.class;
            let mut acc: Option<Acc> = None;
            for s in 0..nslots {
                let so = off + (s * out_numel * slot_bytes) as i64;
                let v = self.reg(class);
                self.emit(
                    ld,
                    vec![
                        v.into(),
                        Operand::Mem(crate::back::ptx::isa::Addr::Reg(raddr), so),
                    ],
                );
                let i = if arg {
                    let i = self.reg(RegClass::B32);
                    self.emit(
                        "ld.shared.b32",
                        vec![
                            i.into(),
                            Operand::Mem(
                                crate::back::ptx::isa::Addr::Reg(raddr),
                                so + region as i64,
                            ),
                        ],
                    );
                    Some(i)
                } else {
                    None
                };
                let cur = Acc { v, i };
                acc = Some(match acc {
                    None => cur,
                    Some(x) => self.combine(op, dt, x, cur),
                });
            }
            if let Some(x) = acc {
                part.accs[o] = x;
            }
        }
    }

    /// Step 4: the results, rounded for half sums and in the result's layout.
    fn reduce_results(&mut self, part: Partial) -> R<()> {
        let Partial {
            op,
            dt,
            arg,
            res,
            span,
            out_lin,
            accs,
            ..
        } = part;
        let mut out: Vec<Reg> = accs
            .iter()
            .map(|a| if arg { a.i.unwrap_or(a.v) } else { a.v })
            .collect();
        if op == ReduceOp::Sum && dt.is_half() {
            out = out.into_iter().map(|r| self.round_to(r, dt)).collect();
        }
        let want = self.lin(res);
        if want != out_lin {
            let w = identity_weights(&self.shape(res));
            let rdt = self.dtype(res);
            out = self.remap(&out, &out_lin, &want, &w, rdt, span)?;
        }
        self.bind(res, out);
        Ok(())
    }

    /// The row-major (padded) linear index of register `r`'s constant part.
    pub fn lin_offset(lin: &crate::back::ptx::layout::Linear, r: usize) -> u64 {
        let c = lin.reg_coord(r);
        let s = row_major_strides(&lin.shape);
        c.iter().zip(&s).map(|(&a, &b)| a as u64 * b).sum()
    }
}
