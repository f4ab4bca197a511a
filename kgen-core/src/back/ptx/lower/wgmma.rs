//! `dot` on Hopper's warpgroup tensor cores: `wgmma.mma_async.m64nNk16` (f16/bf16
//! operands, f32 accumulators), sm_90a only.
//!
//! Assumes: `assign` gave the result the `Mma` layout of `mma_layout::wgmma_grid` (warps
//! `[W, 1]`, W a multiple of 4, 16 rows per warp: that layout *is* wgmma's `D` fragment
//! per warpgroup); both operands are [`StagedView`]s of swizzled shared tiles (the
//! pipeline's ring slots), which wgmma reads itself through matrix descriptors; the
//! staged tiles' writes are complete and visible (the pipeline's `scratch_wait` and the
//! block barrier the tracker places before the slot's first read, plus the
//! `fence.proxy.async` that `lower_scratch_wait` adds for kernels with such a dot:
//! `cp.async` and `st.shared` write through the generic proxy, wgmma reads through the
//! async one).
//! Guarantees: the result is `acc + a @ b` with f32 accumulation, in the accumulator
//! layout. The product stays in flight after the lowering returns: `wgmma_waits` places
//! its `wgmma.wait_group` before the first instruction that reads its result or writes
//! its operands' registers, and before the next barrier (so the slot may be refilled
//! after it).
//! Per k-step of 16 each warpgroup issues one `m64nN` instruction whose descriptors
//! address its 64 rows of A and all of B (`descriptor`); the accumulator registers are
//! updated in place (copied first when the accumulator value has other uses). The
//! deferred ring-buffer copies are issued after the instructions, while they run.
//! `None` from [`Lowerer::wgmma_plan`] (a view without a swizzle, a tile of another
//! shape) leaves the product to `mma.sync`.

use super::staged::StagedView;
use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Operand, Reg, RegClass};
use crate::back::ptx::mma_layout::{MmaLayout, MmaOperand};
use crate::back::ptx::swizzle::{SharedTile, Swizzle};
use crate::ir::{InstId, ValueId};
use crate::types::DType;

/// How a staged operand lies in shared memory, as wgmma names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    /// K is the contiguous (column) dimension of the storage: rows are M (A) or N (B).
    K,
    /// M (A) or N (B) is the contiguous dimension: rows are K.
    Mn,
}

/// A shared-memory matrix descriptor's fields, before encoding (PTX ISA, "Matrix
/// Descriptor Format"; `../shared/REFERENCES.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Byte offset of the operand's first element from the slot's base (a 16-byte
    /// multiple, unswizzled: the rows it starts at are multiples of 8).
    pub start: u32,
    /// Leading-dimension byte offset: K-major swizzled layouts do not use it (the ISA
    /// says "assumed 1", encoded 1); MN-major: from one swizzle atom to the next along
    /// M or N.
    pub lbo: u32,
    /// Stride-dimension byte offset: from one group of 8 rows (K-major: of M or N; MN-major:
    /// of K) to the next.
    pub sbo: u32,
    pub swizzle: Swizzle,
}

impl Descriptor {
    /// The operand of a tile in layout `tile` (storage order: rows × contiguous columns)
    /// whose `Major` dimension is the contiguous one, starting at M/N coordinate `mn0` and
    /// K coordinate `k0`. `None` for layouts wgmma cannot read: unswizzled tiles (its
    /// unswizzled mode wants 8 × 16-byte core matrices, not rows), elements other than
    /// 16-bit, or origins off the 8-row / atom grid.
    pub fn of(tile: &SharedTile, major: Major, mn0: u32, k0: u32) -> Option<Descriptor> {
        let sw = tile.swizzle.bytes();
        if tile.swizzle == Swizzle::None || tile.elem_bytes != 2 || tile.rows < 8 {
            return None;
        }
        let (r0, c0) = match major {
            Major::K => (mn0, k0),
            Major::Mn => (k0, mn0),
        };
        // Rows on the 8-row grid and columns on 16-byte chunks: the offset is the
        // unswizzled one (the XOR reads row bits 0-2 only).
        if !r0.is_multiple_of(8)
            || !(c0 * tile.elem_bytes).is_multiple_of(16)
            || r0 >= tile.rows
            || c0 >= tile.cols
        {
            return None;
        }
        let start = tile.offset(r0, c0);
        let (lbo, sbo) = match major {
            // One k-step (16 elements, 32 bytes) lies inside an atom's row.
            Major::K => (16, 8 * sw),
            Major::Mn => (tile.atom_bytes(), 8 * sw),
        };
        Some(Descriptor {
            start,
            lbo,
            sbo,
            swizzle: tile.swizzle,
        })
    }

    /// The 64-bit encoding with `address` (a shared-window byte address, 16-byte
    /// aligned) as the start: bits 0-13 address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4,
    /// 49-51 base offset (0: atoms start 1024-byte aligned), 62-63 the swizzle mode.
    pub fn encode(&self, address: u32) -> u64 {
        let f = |x: u32| ((x >> 4) & 0x3fff) as u64;
        f(address) | f(self.lbo) << 16 | f(self.sbo) << 32 | self.swizzle.descriptor_code() << 62
    }
}

/// What one wgmma `dot` needs, decided before anything is emitted.
pub(super) struct Plan {
    /// A in shared memory, or `None`: A in registers (wgmma's register-sourced form,
    /// attention's `P·V`).
    a: Option<StagedView>,
    b: StagedView,
    major_a: Major,
    major_b: Major,
    /// Instruction N (the padded tile's columns).
    n: u32,
    steps: u32,
    ty: &'static str,
    /// The pipeline left a slot for this product to keep reading across the loop's
    /// back edge (`ScratchBuf::lag`).
    lag: bool,
}

impl Lowerer<'_> {
    /// Whether some `dot` of the kernel has wgmma's accumulator layout (so its staged
    /// tiles need `fence.proxy.async` once written).
    pub(super) fn has_wgmma_dot(&self) -> bool {
        if !self.target.caps.wgmma {
            return false;
        }
        let func = self.func;
        crate::ir::program_order(func).into_iter().any(|i| {
            let inst = &func.insts[i];
            let (crate::ir::Op::Dot { a, .. }, Some(&r)) = (&inst.op, inst.results.first()) else {
                return false;
            };
            let crate::back::ptx::layout::Layout::Mma(m) = self.asg.layout(r) else {
                return false;
            };
            if !matches!(self.dtype(*a), DType::F16 | DType::BF16) {
                return false; // a TF32 dot: mma.sync
            }
            let lin = self.lin(r);
            let k = self.shape(*a).get(1).copied().unwrap_or(0);
            crate::back::ptx::mma_layout::wgmma_grid(
                lin.shape[0],
                lin.shape[1],
                k,
                m.warps_m * m.warps_n,
            ) == Some([m.warps_m, m.warps_n])
        })
    }

    /// The wgmma plan for `dot(a, b, acc)` with accumulator layout `layout`, or `None`
    /// when `mma.sync` must do it (see the module docs).
    pub(super) fn wgmma_plan(
        &mut self,
        a: ValueId,
        b: ValueId,
        res: ValueId,
        layout: MmaLayout,
    ) -> Option<Plan> {
        if !self.target.caps.wgmma {
            return None;
        }
        let ty = match self.dtype(a) {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            _ => return None,
        };
        let lin_c = self.lin(res);
        let (mp, np) = (lin_c.shape[0], lin_c.shape[1]);
        let kp = self.shape(a).get(1)?.max(&1).next_power_of_two();
        let warps = layout.warps_m * layout.warps_n;
        if crate::back::ptx::mma_layout::wgmma_grid(mp, np, kp, warps)
            != Some([layout.warps_m, layout.warps_n])
        {
            return None;
        }
        // A from registers: each warp's 16 rows in `mma.sync`'s A fragment, which is
        // wgmma's register fragment for A (PTX ISA, "Register Fragments and Shared Memory
        // Matrix Layouts": the m64nNk16 A fragment of a warp is m16n8k16's).
        let va = self.staged_vals.get(&a).copied();
        let vb = self.staged_vals.get(&b).copied()?;
        // A is [M, K]: stored [M, K] (K-major) unless it is a transposed view.
        let major_a = match va {
            Some(v) if v.transposed => Major::Mn,
            _ => Major::K,
        };
        // B is [K, N]: stored [K, N] (N-major) unless it is a transposed view.
        let major_b = if vb.transposed { Major::K } else { Major::Mn };
        let steps = kp / 16;
        // Every descriptor this product will build must exist.
        for s in 0..steps {
            if let Some(va) = &va {
                for g in 0..layout.warps_m / 4 {
                    Descriptor::of(&va.tile, major_a, 64 * g, 16 * s)?;
                }
            }
            Descriptor::of(&vb.tile, major_b, 0, 16 * s)?;
        }
        // The tiles must hold the whole instruction: 64 rows of A per warpgroup, N of B.
        let a_mn = va.map_or(mp, |va| storage_extent(&va.tile, major_a));
        let b_mn = storage_extent(&vb.tile, major_b);
        if a_mn < mp || b_mn < np {
            return None;
        }
        let bufs: Vec<u32> = va.iter().map(|v| v.buf).chain([vb.buf]).collect();
        let lag = va.is_some()
            && bufs.iter().all(|&buf| {
                self.func
                    .scratch
                    .get(buf as usize)
                    .is_some_and(|s| s.lag >= 1)
            });
        Some(Plan {
            lag,
            a: va,
            b: vb,
            major_a,
            major_b,
            n: np,
            steps,
            ty,
        })
    }

    /// Lowers `dot` `id` by `plan` (module docs).
    pub(super) fn lower_wgmma(
        &mut self,
        id: InstId,
        a: ValueId,
        acc: ValueId,
        layout: MmaLayout,
        plan: Plan,
    ) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "dot without a result"))?;
        let lin_c = self.lin(res);
        // A zero accumulator (`dot(a, b, zeros(..))`: attention's scores) is not
        // materialized: the first k-step runs with scale-d false (D = A·B), which reads
        // nothing from D's registers.
        let from_zero = self.is_zero_tile(acc);
        let mut cur: Vec<Reg> = if from_zero {
            (0..lin_c.num_regs())
                .map(|_| self.reg(RegClass::F32))
                .collect()
        } else {
            self.operand_in(acc, &lin_c, span)?
        };
        // In place only when nothing else reads the accumulator's registers.
        let distinct = cur.iter().collect::<std::collections::HashSet<_>>().len() == cur.len();
        let in_place = from_zero || (distinct && self.uses.get(&acc).copied().unwrap_or(0) == 1);
        if !in_place {
            cur = cur.iter().map(|&r| self.copy(r)).collect();
        }
        // One group left in flight: only when nothing but the next iteration's wgmma
        // touches the accumulator (the pipeline checked the IR; the registers must be
        // the carried ones, updated in place).
        let keep_one = plan.lag && in_place && self.uses.get(&res).copied().unwrap_or(0) == 1;
        // wgmma's d index i: row 8 * (i / 2 % 2), column 8 * (i / 4) + i % 2 (plus the
        // lane's and the warp's parts, which the layout shares with the instruction).
        let n = plan.n;
        let d: Vec<Reg> = (0..n / 2)
            .map(|i| {
                lin_c
                    .reg_index(&[8 * ((i >> 1) & 1), 8 * (i >> 2) + (i & 1)])
                    .and_then(|k| cur.get(k).copied())
                    .ok_or_else(|| unsupported(span, "wgmma accumulator layout"))
            })
            .collect::<R<_>>()?;
        if d.len() != cur.len() {
            return Err(unsupported(span, "wgmma accumulator layout"));
        }
        // A's source: a descriptor per k-step, or this warp's packed fragments, all made
        // before the fence (wgmma reads its register operands asynchronously: nothing
        // may write them between the fence and the wait).
        let (ty, steps) = (plan.ty, plan.steps);
        let a_regs: Option<Vec<[Reg; 4]>> = match plan.a {
            Some(_) => None,
            None => {
                let src = self.mma_source(a, layout, MmaOperand::A, span)?;
                Some(
                    (0..steps)
                        .map(|s| self.a_fragment(&src, 0, s, &[], ty, span))
                        .collect::<R<_>>()?,
                )
            }
        };
        let desc_a = match &plan.a {
            Some(va) => Some(self.descriptor_base(va, plan.major_a, true)?),
            None => None,
        };
        let desc_b = self.descriptor_base(&plan.b, plan.major_b, false)?;
        let scale_d = self.in_prologue(|l| {
            l.op1(
                RegClass::Pred,
                "setp.ne.b32",
                vec![Operand::Imm(1), Operand::Imm(0)],
            )
        });
        let scale_first = if from_zero {
            self.in_prologue(|l| {
                l.op1(
                    RegClass::Pred,
                    "setp.ne.b32",
                    vec![Operand::Imm(0), Operand::Imm(0)],
                )
            })
        } else {
            scale_d
        };
        self.comment(format!(
            "dot: wgmma.mma_async m64n{n}k16 {ty}, one per warpgroup per k-step, {steps} k-steps{}",
            if a_regs.is_some() {
                ", A from registers"
            } else {
                ""
            }
        ));
        let trans_a = (plan.major_a == Major::Mn) as i64;
        let trans_b = (plan.major_b == Major::Mn) as i64;
        // The descriptors first too: only wgmma instructions between fence and commit.
        let mut steps_ab = Vec::with_capacity(steps as usize);
        for s in 0..steps {
            let sa = match (&plan.a, desc_a) {
                (Some(va), Some(base)) => Some(self.step_descriptor(va, plan.major_a, base, s)?),
                _ => None,
            };
            let sb = self.step_descriptor(&plan.b, plan.major_b, desc_b, s)?;
            steps_ab.push((sa, sb));
        }
        self.emit("wgmma.fence.sync.aligned", vec![]);
        for (s, (sa, sb)) in steps_ab.into_iter().enumerate() {
            let mut operands = vec![Operand::Vec(d.clone())];
            match (sa, &a_regs) {
                (Some(sa), _) => operands.push(sa.into()),
                (None, Some(fr)) => operands.push(Operand::Vec(fr[s].to_vec())),
                (None, None) => return Err(unsupported(span, "wgmma without an A operand")),
            }
            let scale = if s == 0 { scale_first } else { scale_d };
            operands.extend([sb.into(), scale.into(), Operand::Imm(1), Operand::Imm(1)]);
            // The register form has no transpose for A.
            if a_regs.is_none() {
                operands.push(Operand::Imm(trans_a));
            }
            operands.push(Operand::Imm(trans_b));
            self.emit(
                format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty}"),
                operands,
            );
        }
        self.emit("wgmma.commit_group.sync.aligned", vec![]);
        // The next stages' copies go out while the tensor cores work.
        self.drain_copies();
        // With a lag, this waits for the previous iteration's group (its slot is the one
        // the next iteration refills, after its barrier) and releases this one to the
        // enclosing loop, which waits for the last group at its exit (`lower_for`).
        // Otherwise the group runs until its result is first needed: `wgmma_waits`
        // places its wait.
        if keep_one {
            self.emit("wgmma.wait_group.sync.aligned", vec![Operand::Imm(1)]);
            self.wgmma_in_flight = true;
        }
        // Warp specialization: the producer may refill what is read completely.
        let bufs: Vec<u32> = plan.a.iter().map(|v| v.buf).chain([plan.b.buf]).collect();
        self.ws_release(id, &bufs, keep_one, span)?;
        self.bind(res, cur);
        Ok(())
    }

    /// The descriptor of k-step 0 for this thread's warpgroup (`a`: A's rows start at
    /// 64 × the warpgroup index; B is whole for every warpgroup), as a 64-bit register.
    fn descriptor_base(&mut self, v: &StagedView, major: Major, a: bool) -> R<Reg> {
        let tile = v.tile;
        let d0 = Descriptor::of(&tile, major, 0, 0)
            .ok_or_else(|| unsupported(crate::span::Span::default(), "wgmma descriptor"))?;
        let mut addr = v.base;
        if a {
            // Warpgroup g's 64 rows start g × (offset of row/column 64) in: linear in g,
            // since those origins are on the 8-row grid and whole atoms.
            let step = Descriptor::of(&tile, major, 64, 0)
                .map(|d| d.start)
                .unwrap_or(0);
            if step > 0 {
                let tid = self.tid();
                let off = self.in_prologue(|l| {
                    let g = l.op1(RegClass::B32, "shr.u32", vec![tid.into(), Operand::Imm(7)]);
                    l.op1(
                        RegClass::B32,
                        "mul.lo.s32",
                        vec![g.into(), Operand::Imm(step as i64)],
                    )
                });
                addr = self.op1(RegClass::B32, "add.s32", vec![addr.into(), off.into()]);
            }
        }
        // (address >> 4) & 0x3fff, widened, or'ed with the constant fields.
        let field = self.op1(
            RegClass::B32,
            "bfe.u32",
            vec![addr.into(), Operand::Imm(4), Operand::Imm(14)],
        );
        let wide = self.op1(RegClass::B64, "cvt.u64.u32", vec![field.into()]);
        let constant = d0.encode(0) as i64;
        Ok(self.op1(
            RegClass::B64,
            "or.b64",
            vec![wide.into(), Operand::Imm(constant)],
        ))
    }

    /// Descriptor `base` advanced to k-step `s` (its start field: no carry out of the 14
    /// bits, shared addresses stay below 256 KB).
    fn step_descriptor(&mut self, v: &StagedView, major: Major, base: Reg, s: u32) -> R<Reg> {
        let d = Descriptor::of(&v.tile, major, 0, 16 * s)
            .ok_or_else(|| unsupported(crate::span::Span::default(), "wgmma descriptor"))?;
        if d.start == 0 {
            return Ok(base);
        }
        Ok(self.op1(
            RegClass::B64,
            "add.s64",
            vec![base.into(), Operand::Imm((d.start >> 4) as i64)],
        ))
    }
}

impl Lowerer<'_> {
    /// Whether `v` is a tile constant of 0 (`zeros(..)`, `full(.., 0.0)`).
    fn is_zero_tile(&self, v: ValueId) -> bool {
        if crate::ir::shape_of(self.func.value_type(v)).is_empty() {
            return false;
        }
        crate::ir::program_order(self.func).into_iter().any(|i| {
            let inst = &self.func.insts[i];
            inst.results.first() == Some(&v)
                && matches!(&inst.op, crate::ir::Op::Const(c) if c.to_f64() == 0.0)
        })
    }
}

/// The M or N extent a staged tile holds (its storage rows for K-major, its columns for
/// MN-major).
fn storage_extent(tile: &SharedTile, major: Major) -> u32 {
    match major {
        Major::K => tile.rows,
        Major::Mn => tile.cols,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(rows: u32, cols: u32) -> SharedTile {
        SharedTile::new(rows, cols, 2)
    }

    /// The canonical layouts of the PTX ISA ("Shared Memory Matrix Layout", in units of
    /// elements, T = 8 for 16-bit): K-major 128B swizzle `((8,m),(T,2k)):((8T,SBO),(1,T))`
    /// and MN-major `((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))`, before the swizzle. For every
    /// element an instruction reads, the canonical formula with the descriptor's LBO and
    /// SBO gives the same unswizzled address as the tile's own layout.
    fn canonical(d: &Descriptor, major: Major, mn: u32, k: u32) -> u32 {
        let sw = d.swizzle.bytes();
        let t = sw / 2; // elements per swizzle row
        match major {
            // Row mn: 8-row groups at SBO, rows of `sw` bytes; k inside the row.
            Major::K => d.start + (mn / 8) * d.sbo + (mn % 8) * sw + 2 * k,
            // Column mn: atoms of t elements at LBO; k rows of `sw` bytes, 8-row groups at
            // SBO.
            Major::Mn => d.start + (mn / t) * d.lbo + 2 * (mn % t) + (k / 8) * d.sbo + (k % 8) * sw,
        }
    }

    /// `SharedTile::offset` without its swizzle (the XOR is the same function of the
    /// address on both sides: the descriptor's mode and the tile's swizzle agree).
    fn natural(tile: &SharedTile, r: u32, c: u32) -> u32 {
        let ac = tile.atom_cols();
        (c / ac) * tile.atom_bytes() + r * ac * 2 + (c % ac) * 2
    }

    #[test]
    fn descriptors_address_what_the_tile_layout_stores() {
        for (rows, cols) in [
            (64, 64),
            (128, 64),
            (64, 128),
            (64, 256),
            (32, 128),
            (128, 32),
            (64, 16),
        ] {
            for major in [Major::K, Major::Mn] {
                let t = tile(rows, cols);
                let (mn_ext, k_ext) = match major {
                    Major::K => (rows, cols),
                    Major::Mn => (cols, rows),
                };
                // One instruction: 64 (A) or up to 256 (B) along M/N, 16 along K.
                for k0 in (0..k_ext).step_by(16) {
                    for mn0 in (0..mn_ext).step_by(64) {
                        let Some(d) = Descriptor::of(&t, major, mn0, k0) else {
                            assert_eq!(t.swizzle, Swizzle::None, "{rows}x{cols} {major:?}");
                            continue;
                        };
                        for mn in 0..(mn_ext - mn0).min(64) {
                            for k in 0..16.min(k_ext - k0) {
                                let (r, c) = match major {
                                    Major::K => (mn0 + mn, k0 + k),
                                    Major::Mn => (k0 + k, mn0 + mn),
                                };
                                assert_eq!(
                                    canonical(&d, major, mn, k),
                                    natural(&t, r, c),
                                    "{rows}x{cols} {major:?} origin ({mn0},{k0}) element ({mn},{k})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn encoding_places_the_fields() {
        let d = Descriptor {
            start: 0,
            lbo: 16,
            sbo: 1024,
            swizzle: Swizzle::B128,
        };
        let e = d.encode(0x1_2340);
        assert_eq!(e & 0x3fff, 0x1234);
        assert_eq!((e >> 16) & 0x3fff, 1);
        assert_eq!((e >> 32) & 0x3fff, 64);
        assert_eq!((e >> 49) & 0x7, 0);
        assert_eq!(e >> 62, 1);
        let d = Descriptor {
            swizzle: Swizzle::B32,
            ..d
        };
        assert_eq!(d.encode(0) >> 62, 3);
        // Unswizzled tiles are refused, not encoded wrongly.
        let t = SharedTile {
            swizzle: Swizzle::None,
            ..tile(64, 64)
        };
        assert_eq!(Descriptor::of(&t, Major::K, 0, 0), None);
    }
}
