//! `dot` on tensor cores: `mma.sync.aligned.m16n8k16` (f16/bf16 operands, f32
//! accumulators), on sm_80 and sm_90a; `mma.sync.aligned.m16n8k8` with tf32 operands for
//! f32 operands with a TF32 `input_precision` (their fragments: `mma_tf32.rs`).
//!
//! Assumes: `assign` gave the result an `Mma` accumulator layout over a warp grid
//! `[wm, wn]` whose parts hold whole instructions (`passes::pipeline::mma_dot`); an
//! operand is either a [`StagedView`] (a tile in a swizzled shared buffer, possibly
//! transposed) or a register value of the operand's dtype.
//! Guarantees: the result is `acc + a @ b` with f32 accumulation, in the accumulator
//! layout. The K dimension is walked in steps of 16; per step each warp loads its A
//! fragments (one `ldmatrix.x4` per 16 rows) and B fragments (one `.x4` per 16 columns,
//! `.x2` for a lone 8) from a staged operand, or packs them (`cvt.rn.{bf16,f16}x2.f32`,
//! exact: the values are already of that dtype) from a register operand converted to its
//! `mma_layout` operand layout, then issues the step's grid of `mma.sync`. `.trans` is
//! used where the staged tile's contiguous dimension is not K (a row-major B, or a
//! transposed A), so no operand is ever copied to change its orientation. Lane addresses
//! are loop-invariant registers made once in the prologue (per operand and 16-byte column
//! group); rows that differ by multiples of 8 are immediate offsets (the swizzle depends
//! only on a row's position within 8).
//!
//! A TF32 `dot` walks K in steps of 8 with the same structure (the double-buffered
//! fragments, the deferred copies); its fragments are 32-bit elements rounded by
//! `cvt.rna.tf32.f32`, and for `tf32x3` each product is three instructions
//! (`a_lo·b_hi`, `a_hi·b_lo`, `a_hi·b_hi`, chained through the accumulator).

use super::staged::StagedView;
use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::{Layout, Linear};
use crate::back::ptx::mma_layout::{MmaKind, MmaLayout, MmaOperand};
use crate::back::ptx::swizzle::SharedTile;
use crate::ir::{InputPrecision, Op, ValueId};
use crate::span::Span;
use crate::types::DType;

/// Where one operand's fragments come from.
pub(super) enum Source {
    Staged(StagedView),
    /// Registers in the operand's `mma_layout` layout (wide f32 values).
    Regs(Vec<Reg>, Linear),
}

/// The per-lane row and column-chunk parts of an `ldmatrix` address, as `%tid.x` bit
/// fields: `(tid bit, coordinate bit)` pairs for the storage row and for the 16-byte
/// chunk index.
struct LanePattern {
    row: Vec<(u32, u32)>,
    chunk: Vec<(u32, u32)>,
    trans: bool,
}

/// One k-step's operand fragments: per m-tile four A registers, per n-tile two B
/// registers, and for `tf32x3` the low parts of both (else empty).
#[derive(Clone)]
pub(super) struct Fragments {
    pub a: Vec<[Reg; 4]>,
    pub b: Vec<[Reg; 2]>,
    pub a_lo: Vec<[Reg; 4]>,
    pub b_lo: Vec<[Reg; 2]>,
}

/// What a `dot` on `mma.sync` is made of: the instruction kind, the operand type in its
/// opcode, and the input precision (`tf32x3`: three products per instruction).
#[derive(Clone, Copy)]
pub(super) struct MmaPlan {
    pub kind: MmaKind,
    pub ty: &'static str,
    pub precision: InputPrecision,
}

/// The shape of a `dot` on `mma.sync`: its plan, the instructions per warp per k-step
/// (`mt` x `nt`), the k-steps, and the thread-id bits of a warp's M and N origin.
pub(super) struct MmaGeometry {
    pub plan: MmaPlan,
    pub mt: u32,
    pub nt: u32,
    pub steps: u32,
    pub m_warp: Vec<(u32, u32)>,
    pub n_warp: Vec<(u32, u32)>,
}

impl Fragments {
    /// Every register, in a fixed order (A, B, then the low parts).
    pub(super) fn regs(&self) -> Vec<Reg> {
        let mut v: Vec<Reg> = self.a.iter().flatten().copied().collect();
        v.extend(self.b.iter().flatten().copied());
        v.extend(self.a_lo.iter().flatten().copied());
        v.extend(self.b_lo.iter().flatten().copied());
        v
    }
}

impl Lowerer<'_> {
    /// The geometry of `dot` instruction `id` (whose result has an `Mma` layout).
    pub(super) fn mma_geometry(&self, id: crate::ir::InstId) -> R<MmaGeometry> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::Dot { a, precision, .. } = &inst.op else {
            return Err(unsupported(span, "internal: not a dot"));
        };
        let (a, precision) = (*a, *precision);
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "dot without a result"))?;
        let Layout::Mma(layout) = self.asg.layout(res) else {
            return Err(unsupported(span, "internal: a dot without an MMA layout"));
        };
        let dt = self.dtype(a);
        let plan = match (dt, precision.is_tf32()) {
            (DType::BF16, false) => MmaPlan {
                kind: MmaKind::F16,
                ty: "bf16",
                precision,
            },
            (DType::F16, false) => MmaPlan {
                kind: MmaKind::F16,
                ty: "f16",
                precision,
            },
            (DType::F32, true) => MmaPlan {
                kind: MmaKind::Tf32,
                ty: "tf32",
                precision,
            },
            _ => {
                return Err(unsupported(
                    span,
                    format!(
                        "mma.sync needs f16 or bf16 operands, or f32 ones with a TF32 \
                         input_precision (here {dt}, {})",
                        precision.name()
                    ),
                ))
            }
        };
        let lin_c = self.lin(res);
        let (mp, np) = (lin_c.shape[0], lin_c.shape[1]);
        let kp = self
            .shape(a)
            .get(1)
            .map(|&k| k.max(1).next_power_of_two())
            .unwrap_or(16);
        let (wm, wn) = (layout.warps_m, layout.warps_n);
        let (mw, nw) = (mp / wm, np / wn);
        let (mt, nt, steps) = (mw / 16, nw / 8, kp / plan.kind.k());
        if mt == 0 || nt == 0 || steps == 0 {
            return Err(unsupported(
                span,
                "a tensor-core dot smaller than one instruction",
            ));
        }
        // Warp-origin bits (tid bits 5.. that own M or N coordinate bits).
        let warp_bits = |dim: u8| -> Vec<(u32, u32)> {
            lin_c
                .warps
                .iter()
                .enumerate()
                .filter_map(|(w, cb)| match cb {
                    Some((d, bit)) if *d == dim => Some((5 + w as u32, *bit as u32)),
                    _ => None,
                })
                .collect()
        };
        Ok(MmaGeometry {
            plan,
            mt,
            nt,
            steps,
            m_warp: warp_bits(0),
            n_warp: warp_bits(1),
        })
    }

    pub(super) fn lower_mma(
        &mut self,
        id: crate::ir::InstId,
        a: ValueId,
        b: ValueId,
        acc: ValueId,
        precision: InputPrecision,
        layout: MmaLayout,
    ) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "dot without a result"))?;
        let g = self.mma_geometry(id)?;
        let (plan, mt, nt, steps) = (g.plan, g.mt, g.nt, g.steps);
        let ty = plan.ty;
        self.tf32_addrs.clear();
        let lin_c = self.lin(res);
        let (op_a, op_b) = plan.kind.operands();
        let src_a = self.mma_source(a, layout, op_a, span)?;
        let src_b = self.mma_source(b, layout, op_b, span)?;
        let mut cur: Vec<Reg> = self.operand_in(acc, &lin_c, span)?;
        let c_index = |mi: u32, ni: u32, i: u32| -> R<usize> {
            lin_c
                .reg_index(&[mi * 16 + 8 * (i >> 1), ni * 8 + (i & 1)])
                .ok_or_else(|| unsupported(span, "accumulator layout"))
        };
        let shape = if plan.kind == MmaKind::Tf32 {
            "m16n8k8"
        } else {
            "m16n8k16"
        };
        // A rotated loop (`mma_rotate.rs`): k-step 0's fragments were loaded before the
        // barrier that ends the previous iteration (or before the loop).
        let rotated = self
            .rotation
            .as_ref()
            .filter(|r| r.plan.dot == id)
            .map(|r| (r.plan.clone(), r.carried.clone()));
        self.comment(format!(
            "dot: mma.sync {shape} {ty}{}, {mt}x{nt} instructions per warp per k-step, {steps} k-steps{}",
            if precision == InputPrecision::Tf32x3 {
                " (x3)"
            } else {
                ""
            },
            if rotated.is_some() {
                ", k-step 0's fragments carried from the previous iteration"
            } else {
                ""
            }
        ));
        let opcode = format!("mma.sync.aligned.{shape}.row.col.f32.{ty}.{ty}.f32");
        // Fragments of k-step s + 1 are loaded before k-step s's mma are issued (two sets
        // of fragment registers), so the ldmatrix latency hides behind the tensor cores.
        // Not for tf32x3: its fragments are twice as many registers once split, and its
        // three products per fragment pair hide the loads' latency themselves (with the
        // prefetch a 128 x 64 tile on 4 warps spilled).
        let prefetch = precision != InputPrecision::Tf32x3;
        let mut frags = rotated.as_ref().map(|(_, f)| f.clone());
        if rotated.is_some() {
            // The iteration's copies go first: their addresses then die before the
            // products, where the carried fragments are live (spread among the k-steps
            // instead, 128 x 128 x 32 on 4 warps spilled 8 bytes on sm_80).
            self.drain_copies();
        }
        for s in 0..steps {
            let fr = match frags.take() {
                Some(f) => f,
                None => self.mma_fragments(&src_a, &src_b, s, &g, span)?,
            };
            if s + 1 < steps && prefetch {
                frags = Some(self.mma_fragments(&src_a, &src_b, s + 1, &g, span)?);
            }
            if let (true, Some((rp, _))) = (s + 1 == steps, &rotated) {
                // Every copy of this iteration is committed before the wait, which then
                // counts as the next iteration's head would.
                self.drain_copies();
                self.rotation_wait(rp.pending, span)?;
                let next = self.rotation_fragments(rp, rp.next_slot, span)?;
                if let Some(r) = self.rotation.as_mut() {
                    r.next = Some(next);
                }
            }
            // TF32 fragments are loaded as they are stored and rounded here, after the
            // next k-step's loads: those stay unrounded across this step's products.
            let fr = match plan.kind {
                MmaKind::Tf32 => self.tf32_round_fragments(fr, plan),
                MmaKind::F16 => fr,
            };
            let mut next = cur.clone();
            for mi in 0..mt {
                for ni in 0..nt {
                    let idx: Vec<usize> = (0..4).map(|i| c_index(mi, ni, i)).collect::<R<_>>()?;
                    let mut c: Vec<Reg> = idx.iter().map(|&k| cur[k]).collect();
                    let (mi, ni) = (mi as usize, ni as usize);
                    let (af, bf) = (fr.a[mi], fr.b[ni]);
                    // tf32x3: the two small products first, then the large one.
                    let mut products = Vec::with_capacity(3);
                    if let (Some(al), Some(bl)) = (fr.a_lo.get(mi), fr.b_lo.get(ni)) {
                        products.push((*al, bf));
                        products.push((af, *bl));
                    }
                    products.push((af, bf));
                    for (pa, pb) in products {
                        let d: Vec<Reg> = (0..4).map(|_| self.reg(RegClass::F32)).collect();
                        self.emit(
                            opcode.clone(),
                            vec![
                                Operand::Vec(d.clone()),
                                Operand::Vec(pa.to_vec()),
                                Operand::Vec(pb.to_vec()),
                                Operand::Vec(c),
                            ],
                        );
                        c = d;
                    }
                    for (&k, &r) in idx.iter().zip(&c) {
                        next[k] = r;
                    }
                }
            }
            cur = next;
            // The ring-buffer copies queued by the fetches before this dot, spread over
            // its k-steps so they issue among the tensor-core instructions.
            let left = self.deferred_copies.len();
            let remaining_steps = (steps - s) as usize;
            self.drain_some_copies(left.div_ceil(remaining_steps));
        }
        self.bind(res, cur);
        Ok(())
    }

    /// The A fragments (per m-tile) and B fragments (per n-tile) of k-step `s`.
    pub(super) fn mma_fragments(
        &mut self,
        src_a: &Source,
        src_b: &Source,
        s: u32,
        g: &MmaGeometry,
        span: Span,
    ) -> R<Fragments> {
        let (plan, mt, nt, m_warp, n_warp) = (g.plan, g.mt, g.nt, &g.m_warp, &g.n_warp);
        if plan.kind == MmaKind::Tf32 {
            return self.tf32_fragments(src_a, src_b, s, mt, nt, m_warp, n_warp, plan, span);
        }
        let ty = plan.ty;
        let afr: Vec<[Reg; 4]> = (0..mt)
            .map(|mi| self.a_fragment(src_a, mi, s, m_warp, ty, span))
            .collect::<R<_>>()?;
        let mut bfr: Vec<[Reg; 2]> = Vec::with_capacity(nt as usize);
        let mut ni = 0;
        while ni < nt {
            let pair = nt - ni >= 2;
            let got = self.b_fragments(src_b, ni, s, pair, n_warp, ty, span)?;
            bfr.extend(got);
            ni += if pair { 2 } else { 1 };
        }
        Ok(Fragments {
            a: afr,
            b: bfr,
            a_lo: Vec::new(),
            b_lo: Vec::new(),
        })
    }

    pub(super) fn mma_source(
        &mut self,
        v: ValueId,
        layout: MmaLayout,
        operand: MmaOperand,
        span: Span,
    ) -> R<Source> {
        if let Some(view) = self.staged_vals.get(&v).copied() {
            return Ok(Source::Staged(view));
        }
        let lin = MmaLayout { operand, ..layout }.linear(&self.shape(v));
        // `x as bf16` of an f32 tile (attention's `p as T`): the fragments pack x's f32
        // registers with `cvt.rn.bf16x2.f32` directly, which rounds each element once as
        // the cast does, instead of rounding, widening and packing again (the cast is
        // then dead unless something else reads it).
        // On wgmma targets (sm_90a, where it was measured): on sm_80 the dK/dV kernel at
        // D = 128 sits at 255 registers, and this tipped some of its specializations into
        // a 4-byte spill.
        let src = if self.target.caps.wgmma {
            self.narrowed_f32(v).unwrap_or(v)
        } else {
            v
        };
        let regs = self.operand_in(src, &lin, span)?;
        Ok(Source::Regs(regs, lin))
    }

    /// The f32 tile `v` is a 16-bit cast of (same shape), if it is one.
    fn narrowed_f32(&self, v: ValueId) -> Option<ValueId> {
        if !matches!(self.dtype(v), DType::F16 | DType::BF16) {
            return None;
        }
        let func = self.func;
        let inst = crate::ir::program_order(func)
            .into_iter()
            .map(|i| &func.insts[i])
            .find(|inst| inst.results.first() == Some(&v))?;
        match &inst.op {
            crate::ir::Op::Cast(x)
                if self.dtype(*x) == DType::F32 && self.shape(*x) == self.shape(v) =>
            {
                Some(*x)
            }
            _ => None,
        }
    }

    /// The four packed registers of A for m-tile `mi` at k-step `s` (for a staged,
    /// untransposed operand: one `ldmatrix.x4` of rows `mi * 16..` and 16-byte chunks
    /// `2s, 2s + 1`, which `mma_tf32.rs` reads for 32-bit elements too).
    pub(super) fn a_fragment(
        &mut self,
        src: &Source,
        mi: u32,
        s: u32,
        m_warp: &[(u32, u32)],
        ty: &str,
        span: Span,
    ) -> R<[Reg; 4]> {
        match src {
            Source::Staged(v) => {
                // Matrix j = lane >> 3: rows + 8 * (j & 1), k chunk + (j >> 1).
                let trans = v.transposed;
                let lanes = if !trans {
                    // Storage [M, K]: rows m (lane bits 0-2, bit 3 -> row bit 3, warp m
                    // bits), chunk k (lane bit 4).
                    let mut row = vec![(0, 0), (1, 1), (2, 2), (3, 3)];
                    row.extend_from_slice(m_warp);
                    LanePattern {
                        row,
                        chunk: vec![(4, 0)],
                        trans: false,
                    }
                } else {
                    // Storage [K, M]: rows k (lane bits 0-2, bit 4 -> row bit 3), chunk m
                    // (lane bit 3, warp m bits / 8).
                    let mut chunk = vec![(3, 0)];
                    chunk.extend(m_warp.iter().map(|&(h, b)| (h, b - 3)));
                    LanePattern {
                        row: vec![(0, 0), (1, 1), (2, 2), (4, 3)],
                        chunk,
                        trans: true,
                    }
                };
                let (row_c, chunk_c) = if !trans {
                    (mi * 16, 2 * s)
                } else {
                    (s * 16, 2 * mi)
                };
                let r = self.ldmatrix(v, &lanes, row_c, chunk_c, 4)?;
                Ok([r[0], r[1], r[2], r[3]])
            }
            Source::Regs(regs, lin) => {
                let mut out = [Reg {
                    class: RegClass::B32,
                    n: 0,
                }; 4];
                for (q, (mo, ko)) in [(0, 0), (8, 0), (0, 8), (8, 8)].into_iter().enumerate() {
                    let (m, k) = (mi * 16 + mo, s * 16 + ko);
                    out[q] = self.pack_pair(regs, lin, [m, k], [m, k + 1], ty, span)?;
                }
                Ok(out)
            }
        }
    }

    /// The B registers (two per n-tile) of n-tiles `ni` (and `ni + 1` when `pair`) at
    /// k-step `s` (for a staged, transposed operand: `ldmatrix` of rows `ni * 8..` and
    /// chunks `2s, 2s + 1`, which `mma_tf32.rs` reads for 32-bit elements too).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn b_fragments(
        &mut self,
        src: &Source,
        ni: u32,
        s: u32,
        pair: bool,
        n_warp: &[(u32, u32)],
        ty: &str,
        span: Span,
    ) -> R<Vec<[Reg; 2]>> {
        match src {
            Source::Staged(v) => {
                // Matrix j: k + 8 * (j & 1), n + 8 * (j >> 1).
                let trans = !v.transposed;
                let lanes = if trans {
                    // Storage [K, N]: rows k (lane bits 0-2, bit 3 -> row bit 3), chunk n
                    // (lane bit 4, warp n bits / 8).
                    let mut chunk = vec![(4, 0)];
                    chunk.extend(n_warp.iter().map(|&(h, b)| (h, b - 3)));
                    LanePattern {
                        row: vec![(0, 0), (1, 1), (2, 2), (3, 3)],
                        chunk,
                        trans: true,
                    }
                } else {
                    // Storage [N, K]: rows n (lane bits 0-2, bit 4 -> row bit 3, warp n
                    // bits), chunk k (lane bit 3).
                    let mut row = vec![(0, 0), (1, 1), (2, 2), (4, 3)];
                    row.extend_from_slice(n_warp);
                    LanePattern {
                        row,
                        chunk: vec![(3, 0)],
                        trans: false,
                    }
                };
                let (row_c, chunk_c) = if trans { (s * 16, ni) } else { (ni * 8, 2 * s) };
                let count = if pair { 4 } else { 2 };
                let r = self.ldmatrix(v, &lanes, row_c, chunk_c, count)?;
                Ok(if pair {
                    vec![[r[0], r[1]], [r[2], r[3]]]
                } else {
                    vec![[r[0], r[1]]]
                })
            }
            Source::Regs(regs, lin) => {
                let tiles = if pair { 2 } else { 1 };
                let mut out = Vec::with_capacity(tiles);
                for t in 0..tiles as u32 {
                    let n = (ni + t) * 8;
                    let k0 = s * 16;
                    let lo = self.pack_pair(regs, lin, [k0, n], [k0 + 1, n], ty, span)?;
                    let hi = self.pack_pair(regs, lin, [k0 + 8, n], [k0 + 9, n], ty, span)?;
                    out.push([lo, hi]);
                }
                Ok(out)
            }
        }
    }

    /// `cvt.rn.{ty}x2.f32` of the elements at register coordinates `lo` and `hi` (the low
    /// half is the first element of the pair).
    fn pack_pair(
        &mut self,
        regs: &[Reg],
        lin: &Linear,
        lo: [u32; 2],
        hi: [u32; 2],
        ty: &str,
        span: Span,
    ) -> R<Reg> {
        let get = |c: [u32; 2]| -> R<Reg> {
            lin.reg_index(&c)
                .and_then(|k| regs.get(k).copied())
                .ok_or_else(|| unsupported(span, "mma operand layout"))
        };
        let (l, h) = (get(lo)?, get(hi)?);
        // A pair unpacked from one word of this format (a loop-carried packed tile,
        // `control.rs`) is that word.
        let dt = if ty == "bf16" {
            DType::BF16
        } else {
            DType::F16
        };
        if let Some(&(w, d)) = self.packed_from.get(&(l, h)) {
            if d == dt {
                return Ok(w);
            }
        }
        Ok(self.op1(
            RegClass::B32,
            &format!("cvt.rn.{ty}x2.f32"),
            vec![h.into(), l.into()],
        ))
    }

    /// `ldmatrix.x{count}` of a staged view: lane address `slot + offset(row, chunk)` with
    /// the lane pattern's runtime parts plus `row_c` (a multiple of 8) and `chunk_c`.
    fn ldmatrix(
        &mut self,
        v: &StagedView,
        lanes: &LanePattern,
        row_c: u32,
        chunk_c: u32,
        count: u32,
    ) -> R<Vec<Reg>> {
        let tile = v.tile;
        let off = self.lane_offset(&tile, lanes, chunk_c);
        let span_bytes = tile.atom_cols() * tile.elem_bytes;
        let imm = (row_c * span_bytes) as i64;
        let addr = self.op1(RegClass::B32, "add.s32", vec![v.base.into(), off.into()]);
        let d: Vec<Reg> = (0..count).map(|_| self.reg(RegClass::B32)).collect();
        let trans = if lanes.trans { ".trans" } else { "" };
        self.emit(
            format!("ldmatrix.sync.aligned.m8n8.x{count}{trans}.shared.b16"),
            vec![Operand::Vec(d.clone()), Operand::Mem(Addr::Reg(addr), imm)],
        );
        Ok(d)
    }

    /// The prologue register holding a lane's swizzled offset (row part and chunk part
    /// from its tid bits, plus `chunk_c` chunks), cached per pattern.
    fn lane_offset(&mut self, tile: &SharedTile, lanes: &LanePattern, chunk_c: u32) -> Reg {
        let key = (*tile, lanes.row.clone(), lanes.chunk.clone(), chunk_c);
        if let Some(&r) = self.lane_offsets.get(&key) {
            return r;
        }
        let row = self.tid_bits(&lanes.row);
        let chunk = self.tid_bits(&lanes.chunk);
        let ce = tile.chunk_elems();
        let tile = *tile;
        let r = self.in_prologue(|l| {
            let row = match row {
                Some(r) => r,
                None => l.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]),
            };
            let col = match chunk {
                Some(c) => {
                    let c = if chunk_c > 0 {
                        l.op1(
                            RegClass::B32,
                            "add.s32",
                            vec![c.into(), Operand::Imm(chunk_c as i64)],
                        )
                    } else {
                        c
                    };
                    l.op1(
                        RegClass::B32,
                        "mul.lo.s32",
                        vec![c.into(), Operand::Imm(ce as i64)],
                    )
                }
                None => l.op1(
                    RegClass::B32,
                    "mov.b32",
                    vec![Operand::Imm((chunk_c * ce) as i64)],
                ),
            };
            l.swizzled_offset(&tile, row, col)
        });
        self.lane_offsets.insert(key, r);
        r
    }
}
