//! Global memory: tile `load`/`store` (vectorized) and per-element `gather`, `scatter`
//! and `atomic_add`.
//!
//! Assumes: the tile's layout is decided (loads: the result's; stores: the value's).
//! Guarantees:
//! - Addresses are 64-bit: `mul.wide.s32` of coordinate × stride (`.s32` params), one
//!   per-thread pointer per access plus constant register offsets (`[%rd+imm]`).
//! - A tile access uses vectors of `vec` elements where `vec` = min(the layout's
//!   per-thread contiguity, 16 B, `align_bytes`, the largest power of two dividing the
//!   tile's last extent); then every vector starts at a multiple of `vec` elements, and
//!   the tensor's contiguous extent is a multiple of `vec` (the `align_bytes` promise),
//!   so one predicate covers the vector. Non-contiguous tensors use scalars.
//! - Masks are predicates: `mov` the padding into the destination, then `@p ld`.
//!   Out-of-bounds (`setp.lt.u32` also rejects negative coordinates), padded slots of
//!   non-power-of-two tiles, masked-off elements and, for writes, every replica but one
//!   are predicated off.
//! - `atomic_add` uses `atom.global.add` (`red` when the result is unused). On a
//!   replicated layout (a tile smaller than the block's threads times the elements each
//!   holds) one copy adds, and when the old values are used that copy hands them to the
//!   others through shared memory (two barriers).
//! - A global access (tile or per element; not atomics) with an eviction policy other
//!   than the default carries
//!   `.L2::cache_hint` and the policy register, made once per policy in the prologue
//!   (`createpolicy.fractional.L2::evict_*`, fraction 1.0); the others are unchanged.

// Coordinates index several parallel per-dimension arrays at once.
#![allow(clippy::needless_range_loop)]

use super::pointwise_vec::PointwiseAccess;
use super::{class_of, unsupported, Ext, Lowerer, TensorRegs, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::{Blocked, Linear};
use crate::ir::{Eviction, Op, TensorParam, ValueId};
use crate::span::Span;
use crate::types::{DType, Scalar};
use std::collections::HashMap;

/// One vector access: the registers it covers, its address and predicate.
pub(super) struct Group {
    pub regs: Vec<usize>,
    pub addr: Reg,
    pub imm: i64,
    pub pred: Option<Reg>,
}

/// Per-access cache of the 64-bit extents that `i64` coordinates are checked against.
#[derive(Default)]
pub(super) struct CoordinateCache {
    ext64: HashMap<usize, Operand>,
}

/// The vector accesses of one tile access (`vec` elements each).
pub(super) struct Plan {
    pub vec: u32,
    pub groups: Vec<Group>,
}

/// The memory bit pattern of a scalar of dtype `dt`.
pub fn scalar_bits(s: Scalar, dt: DType) -> u64 {
    let v = match s {
        Scalar::Bool(b) => b as i64 as f64,
        Scalar::Int(i, _) => i as f64,
        Scalar::Float(f, _) => f,
    };
    let int = match s {
        Scalar::Int(i, _) => i,
        Scalar::Bool(b) => b as i64,
        Scalar::Float(f, _) => f as i64,
    };
    match dt {
        DType::Bool => (v != 0.0) as u64,
        DType::I32 | DType::U32 => int as u32 as u64,
        DType::I64 => int as u64,
        DType::F32 => (v as f32).to_bits() as u64,
        DType::F16 => half::f16::from_f64(v).to_bits() as u64,
        DType::BF16 => half::bf16::from_f64(v).to_bits() as u64,
    }
}

fn log2(n: u32) -> i64 {
    n.max(1).trailing_zeros() as i64
}

/// A tile load whose words are loaded but not yet unpacked into element registers.
pub struct DeferredLoad {
    pub(super) dt: DType,
    pub(super) vec: u32,
    /// (element register indices, loaded words) per vector access.
    pub(super) groups: Vec<(Vec<usize>, Vec<Reg>)>,
    pub(super) num_regs: usize,
    pub(super) padding: crate::types::Scalar,
}

impl Lowerer<'_> {
    fn ext_reg(&mut self, e: Ext) -> Operand {
        e.op()
    }

    /// Plans a tile access of `lin` over the `shape` tile at tile coordinates `index`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tile_access(
        &mut self,
        t: &TensorRegs,
        p: &TensorParam,
        lin: &Linear,
        shape: &[u32],
        index: &[ValueId],
        write: bool,
        span: Span,
    ) -> R<Plan> {
        let rank = shape.len();
        if rank == 0 || index.len() != rank || p.rank() != rank || t.dims.len() != rank {
            return Err(unsupported(
                span,
                "tile rank does not match the tensor rank",
            ));
        }
        let last = rank - 1;
        let es = p.dtype.size_bytes();
        let mut tc = Vec::with_capacity(rank);
        let mut th = Vec::with_capacity(rank);
        for d in 0..rank {
            let idx = self.scalar(index[d], span)?;
            let o = if shape[d] == 1 {
                idx
            } else {
                self.op1(
                    RegClass::B32,
                    "mul.lo.s32",
                    vec![idx.into(), Operand::Imm(shape[d] as i64)],
                )
            };
            let thr = self.thread_coord(lin, d);
            th.push(thr);
            tc.push(match thr {
                Some(x) => self.op1(RegClass::B32, "add.s32", vec![o.into(), x.into()]),
                None => o,
            });
        }
        let contiguous = p.contiguous;
        let vec = if contiguous {
            let by_tile = 1u32 << shape[last].trailing_zeros().min(4);
            lin.contiguity(last)
                .min(16 / es)
                .min((p.align_bytes / es).max(1))
                .min(by_tile)
                .max(1)
        } else {
            1
        };
        // Per-thread pointer.
        let mut sum: Option<Reg> = None;
        for d in 0..rank {
            let term = if contiguous && d == last {
                self.op1(RegClass::B64, "cvt.s64.s32", vec![tc[d].into()])
            } else {
                let s = self.ext_reg(t.strides[d]);
                self.op1(RegClass::B64, "mul.wide.s32", vec![tc[d].into(), s])
            };
            sum = Some(match sum {
                None => term,
                Some(a) => self.op1(RegClass::B64, "add.s64", vec![a.into(), term.into()]),
            });
        }
        let sum = sum.ok_or_else(|| unsupported(span, "empty access"))?;
        let bytes = if es > 1 {
            self.op1(
                RegClass::B64,
                "shl.b64",
                vec![sum.into(), Operand::Imm(log2(es))],
            )
        } else {
            sum
        };
        let tptr = self.op1(RegClass::B64, "add.s64", vec![t.base.into(), bytes.into()]);

        let replica = if write { self.replica0(lin) } else { None };
        let mut stride_bytes: HashMap<usize, Reg> = HashMap::new();
        let mut rowoff: HashMap<(usize, u32), Reg> = HashMap::new();
        let mut addr_cache: HashMap<Vec<u32>, Reg> = HashMap::new();
        let mut inb: HashMap<(usize, u32), Reg> = HashMap::new();
        let mut loc: HashMap<(usize, u32), Reg> = HashMap::new();
        let mut groups = Vec::new();
        for r in 0..lin.num_regs() {
            let c = lin.reg_coord(r);
            if c[last] & (vec - 1) != 0 {
                continue;
            }
            let mut members = Vec::with_capacity(vec as usize);
            for j in 0..vec {
                let mut cj = c.clone();
                cj[last] += j;
                members.push(lin.reg_index(&cj).ok_or_else(|| {
                    unsupported(span, "vector group outside the thread's registers")
                })?);
            }
            // Padded slots known at compile time.
            if (0..rank).any(|d| th[d].is_none() && c[d] >= shape[d]) {
                continue;
            }
            // Address.
            let key: Vec<u32> = (0..rank)
                .map(|d| if contiguous && d == last { 0 } else { c[d] })
                .collect();
            let addr = match addr_cache.get(&key) {
                Some(&a) => a,
                None => {
                    let mut a = tptr;
                    for d in 0..rank {
                        if key[d] == 0 {
                            continue;
                        }
                        let off = match rowoff.get(&(d, key[d])) {
                            Some(&o) => o,
                            None => {
                                let sb = match stride_bytes.get(&d) {
                                    Some(&s) => s,
                                    None => {
                                        let s = self.ext_reg(t.strides[d]);
                                        let sb = self.op1(
                                            RegClass::B64,
                                            "mul.wide.s32",
                                            vec![s, Operand::Imm(es as i64)],
                                        );
                                        stride_bytes.insert(d, sb);
                                        sb
                                    }
                                };
                                let o = self.op1(
                                    RegClass::B64,
                                    "mul.lo.s64",
                                    vec![sb.into(), Operand::Imm(key[d] as i64)],
                                );
                                rowoff.insert((d, key[d]), o);
                                o
                            }
                        };
                        a = self.op1(RegClass::B64, "add.s64", vec![a.into(), off.into()]);
                    }
                    addr_cache.insert(key, a);
                    a
                }
            };
            let imm = if contiguous { (c[last] * es) as i64 } else { 0 };
            // Predicate.
            let mut preds = Vec::new();
            for d in 0..rank {
                let k = c[d];
                let ib = match inb.get(&(d, k)) {
                    Some(&p) => p,
                    None => {
                        let coord = if k == 0 {
                            tc[d]
                        } else {
                            self.op1(
                                RegClass::B32,
                                "add.s32",
                                vec![tc[d].into(), Operand::Imm(k as i64)],
                            )
                        };
                        let e = self.ext_reg(t.dims[d]);
                        let p = self.op1(RegClass::Pred, "setp.lt.u32", vec![coord.into(), e]);
                        inb.insert((d, k), p);
                        p
                    }
                };
                preds.push(ib);
                if !shape[d].is_power_of_two() {
                    if let Some(x) = th[d] {
                        let lp = match loc.get(&(d, k)) {
                            Some(&p) => p,
                            None => {
                                let l = self.op1(
                                    RegClass::B32,
                                    "add.s32",
                                    vec![x.into(), Operand::Imm(k as i64)],
                                );
                                let p = self.op1(
                                    RegClass::Pred,
                                    "setp.lt.u32",
                                    vec![l.into(), Operand::Imm(shape[d] as i64)],
                                );
                                loc.insert((d, k), p);
                                p
                            }
                        };
                        preds.push(lp);
                    }
                }
            }
            preds.extend(replica);
            let pred = self.and_all(&preds);
            groups.push(Group {
                regs: members,
                addr,
                imm,
                pred,
            });
        }
        Ok(Plan { vec, groups })
    }

    /// The conjunction of predicates (`None` for none).
    pub fn and_all(&mut self, preds: &[Reg]) -> Option<Reg> {
        let mut acc: Option<Reg> = None;
        for &p in preds {
            acc = Some(match acc {
                None => p,
                Some(a) => self.op1(RegClass::Pred, "and.pred", vec![a.into(), p.into()]),
            });
        }
        acc
    }

    pub fn lower_load(&mut self, id: crate::ir::InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::Load {
            tensor,
            index,
            padding,
            eviction,
        } = &inst.op
        else {
            return Ok(());
        };
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "load without a result"))?;
        let lin = self.lin(res);
        let shape = self.shape(res);
        let load = self.issue_tile_load(*tensor, index, &lin, &shape, *padding, *eviction, span)?;
        let dt = load.dt;
        // Unpacking 16-bit words (to f32 registers) reads the loaded registers, which
        // waits for the load. When every use is in this block, it waits until the first
        // use instead, so a load issued early (the next row's tile in a software
        // pipeline) stays in flight across the code in between.
        if dt.size_bytes() < 4 && self.all_uses_in_current_block(res) {
            self.deferred.insert(res, load);
        } else {
            let regs = self.materialize(load, span)?;
            self.bind(res, regs);
        }
        Ok(())
    }

    /// Issues the loads of the `shape` tile (layout `lin`) of tensor `tensor` at tile
    /// coordinates `index`; the words are unpacked by `materialize`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue_tile_load(
        &mut self,
        tensor: u32,
        index: &[ValueId],
        lin: &Linear,
        shape: &[u32],
        padding: Scalar,
        eviction: Eviction,
        span: Span,
    ) -> R<DeferredLoad> {
        let (t, p) = self.tensor(tensor, span)?;
        let plan = self.tile_access(&t, &p, lin, shape, index, false, span)?;
        Ok(self.issue_plan_load(&plan, p.dtype, lin, padding, eviction))
    }

    /// Issues the loads of a planned tile access (`tile_access`) of a `dt` tensor into
    /// layout `lin`; the words are unpacked by `materialize`.
    pub(super) fn issue_plan_load(
        &mut self,
        plan: &Plan,
        dt: DType,
        lin: &Linear,
        padding: Scalar,
        eviction: Eviction,
    ) -> DeferredLoad {
        let pad_bits = scalar_bits(padding, dt);
        let policy = self.cache_policy(eviction);
        let mut groups = Vec::with_capacity(plan.groups.len());
        for g in &plan.groups {
            let access = VectorAccess {
                addr: g.addr,
                imm: g.imm,
                pred: g.pred,
                policy,
            };
            let words = self.load_vector(dt, plan.vec, &access, pad_bits);
            groups.push((g.regs.clone(), words));
        }
        DeferredLoad {
            dt,
            vec: plan.vec,
            groups,
            num_regs: lin.num_regs(),
            padding,
        }
    }

    /// The element registers of a load: unpacks its words, fills the slots no group
    /// covers with the padding.
    pub(super) fn materialize(&mut self, load: DeferredLoad, span: Span) -> R<Vec<Reg>> {
        let mut out: Vec<Option<Reg>> = vec![None; load.num_regs];
        for (members, words) in &load.groups {
            let elems = self.unpack(load.dt, load.vec, words);
            for (&r, e) in members.iter().zip(elems) {
                out[r] = Some(e);
            }
        }
        let mut regs = Vec::with_capacity(out.len());
        let mut pad_reg = None;
        for o in out {
            regs.push(match o {
                Some(r) => r,
                None => match pad_reg {
                    Some(r) => r,
                    None => {
                        let r = self.constant(load.padding, span)?;
                        pad_reg = Some(r);
                        r
                    }
                },
            });
        }
        Ok(regs)
    }

    /// Loads `vec` elements (one vector instruction); returns the loaded words (see
    /// `unpack`).
    pub(super) fn load_vector(
        &mut self,
        dt: DType,
        vec: u32,
        access: &VectorAccess,
        pad: u64,
    ) -> Vec<Reg> {
        let VectorAccess {
            addr,
            imm,
            pred,
            policy,
        } = *access;
        let es = dt.size_bytes();
        let (class, nwords, wbits) = match (es, vec) {
            (8, _) => (RegClass::B64, vec, 64),
            (4, _) => (class_of(dt), vec, 32),
            (2, 1) | (1, 1) | (1, 2) => (RegClass::B16, 1, 16),
            _ => (RegClass::B32, (vec * es) / 4, 32),
        };
        let words: Vec<Reg> = (0..nwords).map(|_| self.reg(class)).collect();
        if pred.is_some() {
            let per = (wbits / (es * 8)).max(1);
            let mut w: u64 = 0;
            for j in 0..per {
                w |= pad << (j * es * 8);
            }
            for &r in &words {
                let v = match r.class {
                    RegClass::F32 => Operand::F32(f32::from_bits(w as u32)),
                    RegClass::B32 => Operand::Imm(w as u32 as i32 as i64),
                    RegClass::B16 => Operand::Imm(w as u16 as i64),
                    _ => Operand::Imm(w as i64),
                };
                self.mov(r, v);
            }
        }
        let ty = match (es, vec) {
            (1, 1) => "u8".to_string(),
            (8, _) => "b64".into(),
            (_, _) if wbits == 16 => "b16".into(),
            _ => "b32".into(),
        };
        let v = match nwords {
            2 => ".v2",
            4 => ".v4",
            _ => "",
        };
        let dst = if nwords == 1 {
            Operand::Reg(words[0])
        } else {
            Operand::Vec(words.clone())
        };
        let mut operands = vec![dst, Operand::Mem(Addr::Reg(addr), imm)];
        let hint = cache_hint(policy, &mut operands);
        self.emit_if(
            pred.map(|p| (p, false)),
            format!("ld.global{hint}{v}.{ty}"),
            operands,
        );
        words
    }

    /// The L2 cache policy register for `eviction` (`None` for the default policy):
    /// `createpolicy.fractional` once per policy, in the prologue.
    pub(super) fn cache_policy(&mut self, eviction: Eviction) -> Option<Reg> {
        if eviction == Eviction::Normal {
            return None;
        }
        if let Some(&r) = self.policy_cache.get(&eviction) {
            return Some(r);
        }
        let r = self.in_prologue(|l| {
            l.op1(
                RegClass::B64,
                // The PTX priorities are spelled like the source names: `L2::evict_last`.
                &format!("createpolicy.fractional.L2::{}.b64", eviction.name()),
                vec![Operand::F32(1.0)],
            )
        });
        self.policy_cache.insert(eviction, r);
        Some(r)
    }

    pub(super) fn unpack(&mut self, dt: DType, vec: u32, words: &[Reg]) -> Vec<Reg> {
        match dt.size_bytes() {
            8 | 4 => words.to_vec(),
            2 => {
                if vec == 1 {
                    return vec![self.widen_half(words[0], dt)];
                }
                let mut out = Vec::new();
                for &w in words {
                    if dt == DType::BF16 {
                        out.push(self.op1(
                            RegClass::F32,
                            "shl.b32",
                            vec![w.into(), Operand::Imm(16)],
                        ));
                        out.push(self.op1(
                            RegClass::F32,
                            "and.b32",
                            vec![w.into(), Operand::Imm(-65536)],
                        ));
                    } else {
                        let (h0, h1) = (self.reg(RegClass::B16), self.reg(RegClass::B16));
                        self.emit("mov.b32", vec![Operand::Vec(vec![h0, h1]), w.into()]);
                        out.push(self.widen_half(h0, dt));
                        out.push(self.widen_half(h1, dt));
                    }
                    let pair = (out[out.len() - 2], out[out.len() - 1]);
                    self.packed_from.insert(pair, (w, dt));
                }
                out
            }
            _ => {
                let mut out = Vec::new();
                for &w in words {
                    let per = if w.class == RegClass::B16 {
                        vec.min(2)
                    } else {
                        4
                    };
                    for j in 0..per {
                        let (and, setp) = if w.class == RegClass::B16 {
                            ("and.b16", "setp.ne.u16")
                        } else {
                            ("and.b32", "setp.ne.u32")
                        };
                        let m = 0xffi64 << (8 * j);
                        let t = self.op1(w.class, and, vec![w.into(), Operand::Imm(m)]);
                        out.push(self.op1(RegClass::Pred, setp, vec![t.into(), Operand::Imm(0)]));
                    }
                }
                out
            }
        }
    }

    /// Packs element registers into the words stored by one vector store.
    pub(super) fn pack(&mut self, dt: DType, elems: &[Reg]) -> (Vec<Reg>, &'static str) {
        let vec = elems.len();
        match dt.size_bytes() {
            8 => (elems.to_vec(), "b64"),
            4 => (elems.to_vec(), "b32"),
            2 => {
                // Two elements unpacked from one word of this format are that word.
                if vec >= 2 && vec.is_multiple_of(2) {
                    let words: Option<Vec<Reg>> = elems
                        .chunks(2)
                        .map(|c| match self.packed_from.get(&(c[0], c[1])) {
                            Some(&(w, d)) if d == dt => Some(w),
                            _ => None,
                        })
                        .collect();
                    if let Some(words) = words {
                        return (words, "b32");
                    }
                }
                // Values rounded to `dt` from f32 are packed from their f32 source (same
                // bits).
                let elems: Vec<Reg> = elems
                    .iter()
                    .map(|e| match self.rounded_from.get(e) {
                        Some(&(s, d)) if d == dt => s,
                        _ => *e,
                    })
                    .collect();
                let one = if dt == DType::BF16 {
                    "cvt.rn.bf16.f32"
                } else {
                    "cvt.rn.f16.f32"
                };
                let two = if dt == DType::BF16 {
                    "cvt.rn.bf16x2.f32"
                } else {
                    "cvt.rn.f16x2.f32"
                };
                if vec == 1 {
                    return (
                        vec![self.op1(RegClass::B16, one, vec![elems[0].into()])],
                        "b16",
                    );
                }
                let words = elems
                    .chunks(2)
                    .map(|c| self.op1(RegClass::B32, two, vec![c[1].into(), c[0].into()]))
                    .collect();
                (words, "b32")
            }
            _ => {
                if vec == 1 {
                    let b = self.op1(
                        RegClass::B16,
                        "selp.u16",
                        vec![Operand::Imm(1), Operand::Imm(0), elems[0].into()],
                    );
                    return (vec![b], "u8");
                }
                if vec == 2 {
                    let a = self.op1(
                        RegClass::B16,
                        "selp.u16",
                        vec![Operand::Imm(1), Operand::Imm(0), elems[0].into()],
                    );
                    let b = self.op1(
                        RegClass::B16,
                        "selp.u16",
                        vec![Operand::Imm(256), Operand::Imm(0), elems[1].into()],
                    );
                    return (
                        vec![self.op1(RegClass::B16, "or.b16", vec![a.into(), b.into()])],
                        "b16",
                    );
                }
                let mut words = Vec::new();
                for c in elems.chunks(4) {
                    let mut acc: Option<Reg> = None;
                    for (j, &e) in c.iter().enumerate() {
                        let b = self.op1(
                            RegClass::B32,
                            "selp.b32",
                            vec![Operand::Imm(1 << (8 * j)), Operand::Imm(0), e.into()],
                        );
                        acc = Some(match acc {
                            None => b,
                            Some(a) => self.op1(RegClass::B32, "or.b32", vec![a.into(), b.into()]),
                        });
                    }
                    if let Some(a) = acc {
                        words.push(a);
                    }
                }
                (words, "b32")
            }
        }
    }

    pub fn lower_store(&mut self, id: crate::ir::InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::Store {
            tensor,
            index,
            value,
            eviction,
        } = &inst.op
        else {
            return Ok(());
        };
        if self.lower_tma_store(id)? {
            return Ok(());
        }
        let mut lin = self.lin(*value);
        let shape = self.shape(*value);
        let mut regs = self.regs(*value, span)?;
        let (t, p) = self.tensor(*tensor, span)?;
        // Coalesce: a value whose layout gives narrower vectors than the tensor allows
        // (a transposed tile, say) is first converted to the anchor layout.
        if let (Some(&last), true) = (shape.last(), p.contiguous) {
            let es = p.dtype.size_bytes();
            let want = (16 / es)
                .min((p.align_bytes / es).max(1))
                .min(1 << last.trailing_zeros().min(4));
            if !self.is_uniform(*value) && lin.contiguity(shape.len() - 1) < want {
                let anchor = self
                    .asg
                    .default_layout(&shape)
                    .linear(&shape, self.num_warps);
                if anchor.contiguity(shape.len() - 1) > lin.contiguity(shape.len() - 1) {
                    regs = self.operand_in(*value, &anchor, span)?;
                    lin = anchor;
                }
            }
        }
        let plan = self.tile_access(&t, &p, &lin, &shape, index, true, span)?;
        let policy = self.cache_policy(*eviction);
        let dt = p.dtype;
        if self.dtype(*value) != dt {
            return Err(unsupported(
                span,
                "stored value's dtype differs from the tensor's",
            ));
        }
        for g in &plan.groups {
            let elems: Vec<Reg> = g.regs.iter().map(|&r| regs[r]).collect();
            let (words, ty) = self.pack(dt, &elems);
            self.store_words(g.addr, g.imm, &words, ty, g.pred, policy);
        }
        Ok(())
    }

    /// `st.global` of `words` (one, or a `.v2` / `.v4` vector) at `addr + imm`.
    pub(super) fn store_words(
        &mut self,
        addr: Reg,
        imm: i64,
        words: &[Reg],
        ty: &str,
        pred: Option<Reg>,
        policy: Option<Reg>,
    ) {
        let v = match words.len() {
            2 => ".v2",
            4 => ".v4",
            _ => "",
        };
        let src = if words.len() == 1 {
            Operand::Reg(words[0])
        } else {
            Operand::Vec(words.to_vec())
        };
        let mut operands = vec![Operand::Mem(Addr::Reg(addr), imm), src];
        let hint = cache_hint(policy, &mut operands);
        self.emit_if(
            pred.map(|p| (p, false)),
            format!("st.global{hint}{v}.{ty}"),
            operands,
        );
    }

    /// `gather`, `scatter` and `atomic_add`: one predicated access per element.
    pub fn lower_pointwise_mem(&mut self, id: crate::ir::InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = inst.results.first().copied();
        let (tensor, offsets, value, mask, other, eviction) = match &inst.op {
            Op::Gather {
                tensor,
                offsets,
                mask,
                other,
                eviction,
            } => (*tensor, offsets, None, *mask, Some(*other), *eviction),
            Op::Scatter {
                tensor,
                offsets,
                value,
                mask,
                eviction,
            } => (*tensor, offsets, Some(*value), *mask, None, *eviction),
            Op::AtomicAdd {
                tensor,
                offsets,
                value,
                mask,
            } => (
                *tensor,
                offsets,
                Some(*value),
                *mask,
                None,
                Eviction::Normal,
            ),
            _ => return Ok(()),
        };
        let policy = self.cache_policy(eviction);
        let atomic = matches!(inst.op, Op::AtomicAdd { .. });
        let (t, p) = self.tensor(tensor, span)?;
        if offsets.len() != p.rank() {
            return Err(unsupported(
                span,
                "one offset per tensor dimension is needed",
            ));
        }
        // The layout of the access: the result's, else the first real tile operand's.
        let (lin, shape) = match res {
            Some(r) => (self.lin(r), self.shape(r)),
            None => {
                let mut cands: Vec<ValueId> = value.into_iter().collect();
                cands.extend(offsets.iter().copied());
                cands.extend(mask);
                let shape = cands
                    .iter()
                    .map(|&v| self.shape(v))
                    .max_by_key(|s| s.len())
                    .unwrap_or_default();
                let pick = cands
                    .iter()
                    .copied()
                    .find(|&v| self.shape(v) == shape && !self.asg.is_uniform_tile(v));
                match pick {
                    Some(v) => (self.lin(v), shape),
                    None if shape.is_empty() => (
                        crate::back::ptx::layout::Layout::Uniform.linear(&[], self.num_warps),
                        shape,
                    ),
                    None => (
                        Blocked::default_for(&shape, 1, self.num_warps).linear(&shape),
                        shape,
                    ),
                }
            }
        };
        let dt = p.dtype;
        let n = lin.num_regs();
        let mut offs = Vec::new();
        for &o in offsets {
            offs.push((self.operand_in(o, &lin, span)?, self.dtype(o)));
        }
        let mask_regs = match mask {
            Some(m) => Some(self.operand_in(m, &lin, span)?),
            None => None,
        };
        let vals = match value {
            Some(v) => {
                if self.dtype(v) != dt {
                    return Err(unsupported(span, "value dtype differs from the tensor's"));
                }
                Some(self.operand_in(v, &lin, span)?)
            }
            None => None,
        };
        if atomic && !matches!(dt, DType::F32 | DType::I32 | DType::U32) {
            return Err(unsupported(
                span,
                format!("atomic_add on {dt} (f32 and i32 only)"),
            ));
        }
        let write = value.is_some();
        let replica = if write { self.replica0(&lin) } else { None };
        let ths: Vec<Option<Reg>> = (0..shape.len())
            .map(|d| self.thread_coord(&lin, d))
            .collect();
        // An f32 `atomic_add` whose old values nobody reads is a reduction, which sm_90
        // does on 2 or 4 consecutive words at once (`red.global.add.v4.f32`).
        let reduce = atomic
            && dt == DType::F32
            && self.target.caps.vector_red
            && !res.is_some_and(|r| self.is_used(r));
        if !atomic || reduce {
            let (vec, mask_uniform) = self.run_width(&p, offsets, mask, &shape, &lin, 16);
            // A gather whose mask varies inside a vector stays element by element; a
            // scatter (or reduction) splits such vectors into element accesses
            // (`lower_pointwise_vectors`).
            if vec >= 2 && (value.is_some() || mask_uniform) {
                return self.lower_pointwise_vectors(PointwiseAccess {
                    id,
                    tensor: t,
                    dtype: dt,
                    lin,
                    shape,
                    offsets: offs,
                    mask: mask_regs,
                    mask_uniform,
                    values: vals,
                    other,
                    policy,
                    vec,
                    reduce,
                });
            }
        }
        let mut coords = CoordinateCache::default();
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            let c = lin.reg_coord(r);
            let padded_out = (0..shape.len()).any(|d| ths[d].is_none() && c[d] >= shape[d]);
            let (mut preds, elem) = self.element_offset(&t, &offs, r, &mut coords, span)?;
            preds.extend(self.within_extent(&shape, &ths, &c));
            if let Some(m) = &mask_regs {
                preds.push(m[r]);
            }
            preds.extend(replica);
            let pred = self.and_all(&preds).map(|p| (p, false));
            let addr = self.element_address(t.base, dt, elem);
            let mem = Operand::Mem(Addr::Reg(addr), 0);
            if let Some(other) = other {
                out.push(self.gather_one(
                    dt,
                    other,
                    if padded_out { None } else { Some(pred) },
                    mem,
                    policy,
                    span,
                )?);
            } else if let Some(vals) = &vals {
                let v = vals[r];
                if padded_out {
                    if atomic {
                        out.push(self.constant(Scalar::Int(0, dt), span)?);
                    }
                    continue;
                }
                if atomic {
                    let ty = match dt {
                        DType::F32 => "f32",
                        DType::I32 => "s32",
                        _ => "u32",
                    };
                    if res.is_some_and(|r| self.is_used(r)) {
                        let d = self.reg(class_of(dt));
                        let zero = if dt == DType::F32 {
                            Operand::F32(0.0)
                        } else {
                            Operand::Imm(0)
                        };
                        self.mov(d, zero);
                        self.emit_if(
                            pred,
                            format!("atom.global.add.{ty}"),
                            vec![d.into(), mem, v.into()],
                        );
                        out.push(d);
                    } else {
                        self.emit_if(pred, format!("red.global.add.{ty}"), vec![mem, v.into()]);
                        out.push(v);
                    }
                } else {
                    let (words, ty) = self.pack(dt, &[v]);
                    let mut operands = vec![mem, words[0].into()];
                    let hint = cache_hint(policy, &mut operands);
                    self.emit_if(pred, format!("st.global{hint}.{ty}"), operands);
                }
            }
        }
        if let Some(r) = res {
            // Atomics: only the first copy of a replicated tile added, so only its
            // threads hold the old values; hand them to every copy.
            if let (true, Some(first), true) = (atomic, replica, self.is_used(r)) {
                out = self.broadcast_from_copy(&out, &lin, first)?;
            }
            self.bind(r, out);
        }
        Ok(())
    }

    /// The element offset (`Σ coordinate × stride`, 64-bit) of register `r`'s element of
    /// a per-element access and its in-bounds predicates (one per dimension;
    /// `setp.lt.u32` / `.u64` also rejects negative coordinates).
    pub(super) fn element_offset(
        &mut self,
        t: &TensorRegs,
        offs: &[(Vec<Reg>, DType)],
        r: usize,
        cache: &mut CoordinateCache,
        span: Span,
    ) -> R<(Vec<Reg>, Reg)> {
        let mut preds: Vec<Reg> = Vec::new();
        let mut elem: Option<Reg> = None;
        for (d, (o, odt)) in offs.iter().enumerate() {
            let o = o[r];
            let (ib, term) = match odt {
                DType::I64 => {
                    let e = match cache.ext64.get(&d) {
                        Some(e) => e.clone(),
                        None => {
                            let e = match t.dims[d] {
                                Ext::Const(c) => Operand::Imm(c),
                                Ext::Reg(x) => self
                                    .op1(RegClass::B64, "cvt.s64.s32", vec![x.into()])
                                    .into(),
                            };
                            cache.ext64.insert(d, e.clone());
                            e
                        }
                    };
                    let ib = self.op1(RegClass::Pred, "setp.lt.u64", vec![o.into(), e]);
                    let s = match t.strides[d] {
                        Ext::Const(c) => Operand::Imm(c),
                        Ext::Reg(x) => self
                            .op1(RegClass::B64, "cvt.s64.s32", vec![x.into()])
                            .into(),
                    };
                    (ib, self.op1(RegClass::B64, "mul.lo.s64", vec![o.into(), s]))
                }
                DType::I32 | DType::U32 => {
                    let ib = self.op1(
                        RegClass::Pred,
                        "setp.lt.u32",
                        vec![o.into(), t.dims[d].op()],
                    );
                    (
                        ib,
                        self.op1(
                            RegClass::B64,
                            "mul.wide.s32",
                            vec![o.into(), t.strides[d].op()],
                        ),
                    )
                }
                _ => return Err(unsupported(span, format!("offsets of dtype {odt}"))),
            };
            preds.push(ib);
            elem = Some(match elem {
                None => term,
                Some(a) => self.op1(RegClass::B64, "add.s64", vec![a.into(), term.into()]),
            });
        }
        let elem = elem.ok_or_else(|| unsupported(span, "no offsets"))?;
        Ok((preds, elem))
    }

    /// For the element at tile coordinate `thread part + c` (`ths`: the thread parts),
    /// "inside the tile" predicates for the dims whose extent is not a power of two and
    /// that threads hold (their padded slots; register-only dims are decided at compile
    /// time by the caller).
    pub(super) fn within_extent(
        &mut self,
        shape: &[u32],
        ths: &[Option<Reg>],
        c: &[u32],
    ) -> Vec<Reg> {
        let mut preds = Vec::new();
        for d in 0..shape.len() {
            if let (false, Some(x)) = (shape[d].is_power_of_two(), ths[d]) {
                let l = self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![x.into(), Operand::Imm(c[d] as i64)],
                );
                preds.push(self.op1(
                    RegClass::Pred,
                    "setp.lt.u32",
                    vec![l.into(), Operand::Imm(shape[d] as i64)],
                ));
            }
        }
        preds
    }

    /// The address of element offset `elem` of a tensor of `dt` at `base`.
    pub(super) fn element_address(&mut self, base: Reg, dt: DType, elem: Reg) -> Reg {
        let es = dt.size_bytes();
        let bytes = if es > 1 {
            self.op1(
                RegClass::B64,
                "shl.b64",
                vec![elem.into(), Operand::Imm(log2(es))],
            )
        } else {
            elem
        };
        self.op1(RegClass::B64, "add.s64", vec![base.into(), bytes.into()])
    }

    /// One gathered element: `mov` of `other`, then a predicated scalar load.
    fn gather_one(
        &mut self,
        dt: DType,
        other: Scalar,
        pred: Option<Option<(Reg, bool)>>,
        mem: Operand,
        policy: Option<Reg>,
        span: Span,
    ) -> R<Reg> {
        let Some(pred) = pred else {
            return self.constant(other, span);
        };
        let mut operands = vec![mem];
        let hint = cache_hint(policy, &mut operands);
        let bits = scalar_bits(other, dt);
        Ok(match dt {
            DType::F32 | DType::I32 | DType::U32 | DType::I64 => {
                let d = self.reg(class_of(dt));
                let v = match d.class {
                    RegClass::F32 => Operand::F32(f32::from_bits(bits as u32)),
                    RegClass::B32 => Operand::Imm(bits as u32 as i32 as i64),
                    _ => Operand::Imm(bits as i64),
                };
                self.mov(d, v);
                let ty = if dt == DType::I64 { "b64" } else { "b32" };
                operands.insert(0, d.into());
                self.emit_if(pred, format!("ld.global{hint}.{ty}"), operands);
                d
            }
            DType::F16 | DType::BF16 | DType::Bool => {
                let h = self.reg(RegClass::B16);
                self.mov(h, Operand::Imm(bits as u16 as i64));
                let ty = if dt == DType::Bool { "u8" } else { "b16" };
                operands.insert(0, h.into());
                self.emit_if(pred, format!("ld.global{hint}.{ty}"), operands);
                if dt == DType::Bool {
                    self.op1(
                        RegClass::Pred,
                        "setp.ne.u16",
                        vec![h.into(), Operand::Imm(0)],
                    )
                } else {
                    self.widen_half(h, dt)
                }
            }
        })
    }
}

/// Where one vector load goes: address register plus immediate, guard, cache policy.
pub(super) struct VectorAccess {
    pub(super) addr: Reg,
    pub(super) imm: i64,
    pub(super) pred: Option<Reg>,
    pub(super) policy: Option<Reg>,
}

/// The `.L2::cache_hint` qualifier of a global access with a cache policy (appending the
/// policy register to its operands), or nothing.
pub(super) fn cache_hint(policy: Option<Reg>, operands: &mut Vec<Operand>) -> &'static str {
    match policy {
        Some(r) => {
            operands.push(Operand::Reg(r));
            ".L2::cache_hint"
        }
        None => "",
    }
}
