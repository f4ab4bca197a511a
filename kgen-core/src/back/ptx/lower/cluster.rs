//! Lowering of `cluster_gather` (sm_90a thread-block clusters, distributed shared memory).
//!
//! Assumes: the kernel's `ClusterGather`s all have one size C (validated), the entry is
//! declared with `.reqnctapercluster C, 1, 1`, and every block of a cluster executes the
//! same sequence of them (the language's contract, as for a barrier).
//!
//! Guarantees: each block's scalar goes to its own slot of the `kg_cluster` shared array
//! (thread 0 writes it), and every thread reads the slots of ranks 0..C that its layout
//! holds through `mapa` + `ld.shared::cluster`. One cluster barrier phase orders the
//! writes before the reads (`barrier.cluster.arrive` has release, `.wait` acquire
//! semantics). The barrier that orders the reads before the next exchange's writes (and
//! before any block exits, which would free its shared memory while others read it) is
//! split: its `arrive` follows the reads and its `wait` comes just before the next
//! exchange's writes or the kernel's `ret`, so it overlaps whatever runs in between. To
//! keep arrive and wait alternating on every path, the body starts with an `arrive`.
//! Gathers whose operands are ready share one exchange (one slot each).

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::ir::{InstId, Op};

/// The name of the shared array holding this block's exchanged values.
pub const CLUSTER_SLOTS: &str = "kg_cluster";
/// Bytes per slot (room for an `i64`).
pub const SLOT_BYTES: u32 = 8;
/// How many instructions after a `cluster_gather` are searched for others to batch.
const CLUSTER_BATCH_WINDOW: usize = 16;

impl Lowerer<'_> {
    /// When `insts[0]` is a `cluster_gather`: it and the gathers among the next
    /// [`CLUSTER_BATCH_WINDOW`] instructions (stopping at control flow) whose operands
    /// are already computed. Empty otherwise.
    pub(super) fn cluster_batch(&self, insts: &[InstId]) -> Vec<InstId> {
        let func = self.func;
        let Some(&first) = insts.first() else {
            return Vec::new();
        };
        if !matches!(func.insts[first].op, Op::ClusterGather { .. }) {
            return Vec::new();
        }
        let mut batch = vec![first];
        for &j in insts.iter().skip(1).take(CLUSTER_BATCH_WINDOW) {
            match &func.insts[j].op {
                Op::For { .. } | Op::If { .. } | Op::Yield(_) => break,
                Op::ClusterGather { value, .. } if self.is_computed(*value) => batch.push(j),
                _ => {}
            }
        }
        batch
    }

    /// The start of the body of a kernel with clusters: the first `arrive` of the
    /// split barrier that each exchange (and the final `ret`) waits on.
    pub(super) fn cluster_prologue(&mut self) {
        self.emit("barrier.cluster.arrive", vec![]);
    }

    /// Before `ret`: every block of the cluster has finished reading this block's slots.
    /// With multicast rings, a full barrier: the other block's last releases of this
    /// block's slots (warp specialization) have landed before either block exits.
    pub(super) fn cluster_epilogue(&mut self) {
        self.emit("barrier.cluster.wait", vec![]);
        if !self.tma.multicast.is_empty() {
            self.emit("barrier.cluster.arrive", vec![]);
            self.emit("barrier.cluster.wait", vec![]);
        }
    }

    /// Lowers `batch` (`ClusterGather` instructions) as one exchange.
    pub(super) fn lower_cluster_gathers(&mut self, batch: &[InstId]) -> R<()> {
        let func = self.func;
        let span = func.insts[batch[0]].span;
        if !self.target.caps.clusters {
            return Err(unsupported(
                span,
                format!(
                    "`cluster_gather` needs thread-block clusters (sm_90a); {} has none",
                    self.target.arch
                ),
            ));
        }
        let mut items = Vec::with_capacity(batch.len());
        for &id in batch {
            let inst = &func.insts[id];
            let Op::ClusterGather { value, .. } = inst.op else {
                return Err(unsupported(inst.span, "not a cluster_gather"));
            };
            let res = *inst
                .results
                .first()
                .ok_or_else(|| unsupported(inst.span, "cluster_gather without a result"))?;
            let v = self.scalar(value, inst.span)?;
            items.push((res, v));
        }
        self.cluster_slots = self.cluster_slots.max(items.len() as u32);

        // The previous exchange's readers are done with our slots.
        self.emit("barrier.cluster.wait", vec![]);
        let base = self.cluster_base();
        let writer = self.thread0();
        for (j, &(_, v)) in items.iter().enumerate() {
            let st = format!("st.shared.{}", slot_type(v.class));
            self.emit_if(
                Some((writer, false)),
                st,
                vec![
                    Operand::Mem(Addr::Reg(base), (j as u32 * SLOT_BYTES) as i64),
                    v.into(),
                ],
            );
        }
        self.emit("barrier.cluster.arrive", vec![]);
        self.emit("barrier.cluster.wait", vec![]);

        // In every warp, lane r < C reads rank r's slots (one remote load per slot and
        // lane: a remote load per element and thread was measured far slower), then
        // each thread takes the elements its layout holds from those lanes by shuffle.
        let (remote, reader) = self.cluster_lane_slot(batch)?;
        let mut loaded = Vec::with_capacity(items.len());
        for (j, &(_, v)) in items.iter().enumerate() {
            let d = self.reg(v.class);
            // Lanes >= C keep a defined value (they are never shuffled from).
            self.mov(d, zero_of(v.class));
            self.emit_if(
                Some((reader, false)),
                format!("ld.shared::cluster.{}", slot_type(v.class)),
                vec![
                    d.into(),
                    Operand::Mem(Addr::Reg(remote), j as i64 * SLOT_BYTES as i64),
                ],
            );
            loaded.push(d);
        }
        let mut src_lanes: std::collections::HashMap<(Option<Reg>, i64), Operand> =
            std::collections::HashMap::new();
        for (&(res, _), &d) in items.iter().zip(&loaded) {
            let lin = self.lin(res);
            let t = self.thread_coord(&lin, 0);
            let mut regs = Vec::with_capacity(lin.num_regs());
            for r in 0..lin.num_regs() {
                let k = lin.reg_coord(r).first().copied().unwrap_or(0) as i64;
                let src = match src_lanes.get(&(t, k)) {
                    Some(s) => s.clone(),
                    None => {
                        let s = match t {
                            Some(t) if k == 0 => Operand::Reg(t),
                            Some(t) => Operand::Reg(self.op1(
                                RegClass::B32,
                                "add.u32",
                                vec![t.into(), Operand::Imm(k)],
                            )),
                            None => Operand::Imm(k),
                        };
                        src_lanes.insert((t, k), s.clone());
                        s
                    }
                };
                regs.push(self.shuffle_idx(d, src));
            }
            self.bind(res, regs);
        }
        // Releases our reads; the next exchange (or `ret`) waits for everyone's.
        self.emit("barrier.cluster.arrive", vec![]);
        Ok(())
    }

    /// The address of this block's slots (`.shared` window, 32-bit).
    fn cluster_base(&mut self) -> Reg {
        self.prologue_symbol(|l| &mut l.cluster_base, CLUSTER_SLOTS)
    }

    /// The remote address of slot 0 of rank `lane & (C - 1)` and a predicate true in
    /// lanes below C (computed once, in the prologue).
    fn cluster_lane_slot(&mut self, batch: &[InstId]) -> R<(Reg, Reg)> {
        if let Some(r) = self.cluster_lane {
            return Ok(r);
        }
        let span = self.func.insts[batch[0]].span;
        let Op::ClusterGather { size, .. } = self.func.insts[batch[0]].op else {
            return Err(unsupported(span, "not a cluster_gather"));
        };
        let base = self.cluster_base();
        let tid = self.tid();
        let r = self.in_prologue(|l| {
            let lane = l.op1(RegClass::B32, "and.b32", vec![tid.into(), Operand::Imm(31)]);
            let rank = l.op1(
                RegClass::B32,
                "and.b32",
                vec![lane.into(), Operand::Imm(size as i64 - 1)],
            );
            let remote = l.op1(
                RegClass::B32,
                "mapa.shared::cluster.u32",
                vec![base.into(), rank.into()],
            );
            let reader = l.op1(
                RegClass::Pred,
                "setp.lt.u32",
                vec![lane.into(), Operand::Imm(size as i64)],
            );
            (remote, reader)
        });
        self.cluster_lane = Some(r);
        Ok(r)
    }

    /// `v` of lane `src` (all lanes take part).
    pub(super) fn shuffle_idx(&mut self, v: Reg, src: Operand) -> Reg {
        if v.class == RegClass::B64 {
            let (lo, hi) = (self.reg(RegClass::B32), self.reg(RegClass::B32));
            self.emit("mov.b64", vec![Operand::Vec(vec![lo, hi]), v.into()]);
            let lo2 = self.shuffle_idx(lo, src.clone());
            let hi2 = self.shuffle_idx(hi, src);
            let d = self.reg(RegClass::B64);
            self.emit("mov.b64", vec![d.into(), Operand::Vec(vec![lo2, hi2])]);
            return d;
        }
        self.op1(
            v.class,
            "shfl.sync.idx.b32",
            vec![v.into(), src, Operand::Imm(31), Operand::Imm(-1)],
        )
    }

    /// A predicate true in thread 0 only (computed once, in the prologue).
    fn thread0(&mut self) -> Reg {
        if let Some(p) = self.cluster_writer {
            return p;
        }
        let tid = self.tid();
        let p = self.in_prologue(|l| {
            l.op1(
                RegClass::Pred,
                "setp.eq.u32",
                vec![tid.into(), Operand::Imm(0)],
            )
        });
        self.cluster_writer = Some(p);
        p
    }
}

/// Zero in a register of `class`.
fn zero_of(class: RegClass) -> Operand {
    match class {
        RegClass::F32 => Operand::F32(0.0),
        RegClass::F64 => Operand::F64(0.0),
        _ => Operand::Imm(0),
    }
}

/// The `st`/`ld` type of a slot holding a register of `class`.
fn slot_type(class: RegClass) -> &'static str {
    match class {
        RegClass::F32 => "f32",
        RegClass::B64 | RegClass::F64 => "b64",
        RegClass::B16 => "b16",
        RegClass::B32 | RegClass::Pred => "b32",
    }
}
