//! Lowering: tile IR with layouts → the PTX instruction model (`isa`).
//!
//! Assumes: validated IR; `assign` gave every value a layout. Guarantees: every PTX
//! choice (vector width, `mul.wide`, rounding modes, no `.ftz`, predicates) is made here;
//! unsupported input comes back as `ErrorCode::Unsupported` with the instruction's span,
//! never a panic.
//!
//! Value representation: a value is one register per register slot of its layout
//! (`Linear::num_regs`; one for scalars). `bool` lives in predicates, 32-bit integers in
//! `%r`, `i64` in `%rd`, and `f32`, `f16`, `bf16` all in `%f`: half values are kept
//! widened to f32 and rounded to their dtype after every operation, which is what the
//! interpreter computes. Scalars are computed redundantly by every thread.
//!
//! Code that depends only on the thread id or on kernel parameters (thread coordinates,
//! replica predicates, tensor pointers) goes to a prologue, so it is available in every
//! region.

pub(crate) mod arith;
mod cluster;
mod control;
mod grid_sync;
mod int_div;
mod memory;
mod mma;
mod mma_rotate;
mod mma_tf32;
mod pointwise_vec;
mod reduce;
mod scan;
mod scratch;
mod shape;
pub mod staged;
mod tma;
mod tma_store;
mod turns;
mod wgmma;
mod ws;
pub use ws::{fetched_once, CONSUMER_REGS, PRODUCER_THREADS};

use super::assign::Assignment;
use super::isa::{Addr, Family, Inst, Operand, Reg, RegClass, Space, Stmt};
use super::layout::Linear;
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::{Block, Function, InstId, Op, ReduceOp, ValueId};
use crate::span::Span;
use crate::target::Target;
use crate::types::DType;
use std::collections::HashMap;

pub type R<T> = Result<T, Diagnostics>;

pub use cluster::{CLUSTER_SLOTS, SLOT_BYTES};

/// The name of the one shared-memory buffer.
pub const SMEM: &str = "kg_smem";
/// A reduction of a batch: its instruction, op, operand and axis.
pub type BatchedReduction = (InstId, ReduceOp, ValueId, usize);

/// How many instructions after a cross-warp reduction are searched for others to batch
/// with it (a bound on how early a later reduction runs, and so on its live range).
const REDUCE_BATCH_WINDOW: usize = 16;

pub fn unsupported(span: Span, msg: impl Into<String>) -> Diagnostics {
    Diagnostics::single(Diagnostic::error(ErrorCode::Unsupported, span, msg))
}

/// The register class holding a value of `dt`.
pub fn class_of(dt: DType) -> RegClass {
    match dt {
        DType::Bool => RegClass::Pred,
        DType::I32 | DType::U32 => RegClass::B32,
        DType::I64 => RegClass::B64,
        DType::F16 | DType::BF16 | DType::F32 => RegClass::F32,
    }
}

/// A tensor dimension's extent or stride: known, or a parameter loaded into a register.
#[derive(Clone, Copy, Debug)]
pub enum Ext {
    Const(i64),
    Reg(Reg),
}

impl Ext {
    pub fn op(self) -> Operand {
        match self {
            Ext::Const(c) => Operand::Imm(c),
            Ext::Reg(r) => Operand::Reg(r),
        }
    }
}

/// A tensor parameter as the body sees it.
#[derive(Clone, Debug)]
pub struct TensorRegs {
    pub base: Reg,
    pub dims: Vec<Ext>,
    pub strides: Vec<Ext>,
}

/// How each PTX parameter is read (built by the ABI code in `back::ptx`).
pub enum ParamLoad {
    Tensor {
        ptr: String,
        dims: Vec<Result<String, u32>>,
        strides: Vec<Option<String>>,
    },
    Scalar {
        name: String,
        dtype: DType,
    },
}

/// What lowering produces besides the instructions.
pub struct Lowered {
    pub body: Vec<Stmt>,
    pub reg_counts: [u32; 6],
    pub smem_bytes: u32,
    /// The alignment `kg_smem` must be declared with.
    pub smem_align: u32,
    /// The shared-memory buffers alive when the peak was reached (for diagnostics).
    pub smem_at_peak: Vec<crate::back::ptx::smem::Placed>,
    /// Bytes of `smem_bytes` taken by the scratch buffers, and per buffer its bytes per
    /// slot.
    pub scratch_bytes: u32,
    pub scratch_slot_bytes: Vec<u32>,
    /// Slots of the `kg_cluster` array (0: the kernel exchanges nothing across a cluster).
    pub cluster_slots: u32,
    /// Threads added for a warp-specialized producer (`lower/ws.rs`); 0 without.
    pub producer_threads: u32,
    /// Loops whose two consumer warpgroups take turns (`lower/turns.rs`).
    pub turn_loops: u32,
}

pub struct Lowerer<'a> {
    pub func: &'a Function,
    pub asg: &'a Assignment,
    pub target: &'a Target,
    pub num_warps: u32,
    reg_counts: [u32; 6],
    labels: u32,
    prologue: Vec<Stmt>,
    body: Vec<Stmt>,
    in_prologue: bool,
    vals: HashMap<ValueId, Vec<Reg>>,
    /// Loads of 16-bit data whose unpacking (to f32 registers) waits for the first use:
    /// see `memory::DeferredLoad`.
    deferred: HashMap<ValueId, memory::DeferredLoad>,
    /// Per open block (innermost last): its `scratch_fetch`es (see `scratch::PendingFetch`).
    fetch_scopes: Vec<scratch::FetchScope>,
    /// Converted copies of values, one map per open region.
    conv_cache: Vec<HashMap<(ValueId, Linear), Vec<Reg>>>,
    /// For an f16/bf16 value held widened in an f32 register after rounding (`round_to`):
    /// the f32 register it was rounded from, and the format. A store packs that one
    /// directly (rounding twice to the same format is rounding once), so `x as bf16`
    /// stored is one `cvt.rn.bf16x2.f32` per two elements instead of round, widen and
    /// pack. Sound because a value's register is never redefined while the value is in
    /// scope (SSA values; block parameters are rewritten only by the yield that ends
    /// their body).
    rounded_from: HashMap<Reg, (Reg, DType)>,
    /// For two f16/bf16 elements unpacked from one 32-bit word (`unpack`): that word and
    /// the format. A store packs such a pair as the word itself (sound as `rounded_from`).
    packed_from: HashMap<(Reg, Reg), (Reg, DType)>,
    /// For an f16/bf16 value held widened after rounding (`round_to`): its 16-bit bits.
    /// A loop-carried packed tile packs two such halves with one `mov.b32` at the back
    /// edge (`control.rs`; sound as `rounded_from`).
    halves: HashMap<Reg, Reg>,
    tid: Option<Reg>,
    bits_cache: HashMap<Vec<(u32, u32)>, Reg>,
    replica_cache: HashMap<u32, Reg>,
    /// Registers holding `kg_smem + offset`, computed once in the prologue.
    smem_addrs: HashMap<u32, Reg>,
    /// The shared-memory allocator (`smem.rs`) and the synchronization tracker
    /// (`sync.rs`): every cross-thread use of shared memory allocates through the first
    /// and asks the second whether a barrier must come first.
    pub smem: crate::back::ptx::smem::Allocator,
    pub sync: crate::back::ptx::sync::Tracker,
    /// The temporary of the shared-memory use in progress (`smem_begin` .. `smem_end`).
    smem_temp: Option<crate::back::ptx::smem::BufId>,
    /// The compiler's shared buffers (`staged.rs`): when each lives, where it is now,
    /// the staged values a `dot` reads from them, and the cached `ldmatrix` lane offsets.
    shared_life: staged::Lifetimes,
    shared_bufs: HashMap<u32, crate::back::ptx::smem::BufId>,
    staged_vals: HashMap<ValueId, staged::StagedView>,
    /// The `cp.async` copies (and commits) of ring-buffer fetches not yet emitted: they
    /// write a slot no instruction before the next wait reads, so they are issued among
    /// the next tensor-core `dot`'s instructions (`mma.rs`) instead of in front of them,
    /// and at the latest before anything that is not pure arithmetic (`drain_copies`).
    deferred_copies: Vec<Stmt>,
    /// The `for` loop being lowered with its first fragments carried (`mma_rotate.rs`).
    rotation: Option<mma_rotate::Rotation>,
    /// The kernel's TMA fetches (`back::ptx::tma`, `lower/tma.rs`): the plan, the live
    /// rings' mbarriers, thread 0's predicate and the tensor maps' addresses.
    tma: crate::back::ptx::tma::TmaPlan,
    tma_rings: HashMap<u32, tma::TmaRing>,
    tma_leader: Option<Reg>,
    /// Multicast fetches (`lower/tma.rs`): this block's cluster rank and the `.b16`
    /// mask of both blocks, made once.
    tma_multicast: Option<(Reg, Reg)>,
    tmap_addrs: HashMap<usize, Reg>,
    /// Per TMA ring, the slot register of its last read (what a dot releases).
    tma_last_slot: HashMap<u32, Reg>,
    /// Warp specialization (`lower/ws.rs`): allowed for this kernel, the part being
    /// lowered, the split once made, and lane 0's predicate.
    ws_allowed: bool,
    ws: ws::WsMode,
    ws_split: Option<ws::WsSplit>,
    ws_lane0: Option<Reg>,
    /// The consumers' block barrier after the split, and the kernel's named-barrier
    /// allocator (ping-pong's turns take theirs from it too).
    ws_barrier: Option<crate::back::ptx::sync::Barrier>,
    named: crate::back::ptx::sync::NamedBarriers,
    /// With warp specialization: the buffers filled once, outside every loop
    /// ([`ws::fetched_once`]).
    ws_once: std::collections::HashSet<u32>,
    /// With warp specialization: which `dot` releases which buffer
    /// ([`ws::last_readers`]).
    ws_last_readers: std::collections::HashSet<(InstId, u32)>,
    /// A `wgmma` group may still be running (`lower/wgmma.rs`, with a lag): the loop
    /// being lowered waits for it at its exit.
    wgmma_in_flight: bool,
    /// Ping-pong of two consumer warpgroups (`lower/turns.rs`).
    turns: turns::Turns,
    #[allow(clippy::type_complexity)]
    lane_offsets: HashMap<
        (
            crate::back::ptx::swizzle::SharedTile,
            Vec<(u32, u32)>,
            Vec<(u32, u32)>,
            u32,
        ),
        Reg,
    >,
    /// The prologue registers of a lane's element offset in a staged tile (`mma_tf32.rs`),
    /// per (tile, row bit fields, column bit fields).
    #[allow(clippy::type_complexity)]
    element_offsets: HashMap<
        (
            crate::back::ptx::swizzle::SharedTile,
            Vec<(u32, u32)>,
            Vec<(u32, u32)>,
        ),
        Reg,
    >,
    /// The element addresses one TF32 `dot` has made (slot base, lane offset, XORed
    /// constant): cleared per `dot`, whose code is straight-line.
    tf32_addrs: HashMap<(Reg, Reg, u32), Reg>,
    /// Where the scratch buffers live (`scratch.rs`), their total bytes at the start of
    /// `kg_smem`, and the register holding `kg_smem`.
    scratch: Vec<scratch::ScratchPlacement>,
    scratch_bytes: u32,
    scratch_base: Option<Reg>,
    /// L2 cache-policy registers (`createpolicy`), one per eviction policy in use.
    policy_cache: HashMap<crate::ir::Eviction, Reg>,
    zero16: Option<Reg>,
    cluster_slots: u32,
    cluster_base: Option<Reg>,
    cluster_lane: Option<(Reg, Reg)>,
    cluster_writer: Option<Reg>,
    tensors: Vec<Option<TensorRegs>>,
    scalars: Vec<Option<Reg>>,
    uses: HashMap<ValueId, usize>,
    /// Per open block (innermost last): uses by its own instructions, not nested ones.
    block_uses: Vec<HashMap<ValueId, usize>>,
    uniform: std::collections::HashSet<ValueId>,
    /// Values known to hold one integer constant in every element (`int_div.rs`).
    known_ints: HashMap<ValueId, i64>,
    /// `arange` results and their starts: recomputed in a consumer's layout instead of
    /// converted (Triton's rematerialization, for the index tiles masks are made of).
    aranges: HashMap<ValueId, i64>,
}

impl<'a> Lowerer<'a> {
    pub fn new(func: &'a Function, asg: &'a Assignment, target: &'a Target) -> Lowerer<'a> {
        let mut uses = HashMap::new();
        count_uses(func, &mut uses);
        let threads = asg.num_warps * 32;
        let mut smem = crate::back::ptx::smem::Allocator::new();
        let (scratch, scratch_bytes) = scratch::place(
            &func.scratch,
            |shape| asg.default_layout(shape).linear(shape, asg.num_warps),
            threads,
            &mut smem,
        );
        Lowerer {
            func,
            asg,
            target,
            num_warps: asg.num_warps,
            reg_counts: [0; 6],
            labels: 0,
            prologue: Vec::new(),
            body: Vec::new(),
            in_prologue: false,
            vals: HashMap::new(),
            deferred: HashMap::new(),
            fetch_scopes: Vec::new(),
            conv_cache: vec![HashMap::new()],
            rounded_from: HashMap::new(),
            packed_from: HashMap::new(),
            halves: HashMap::new(),
            tid: None,
            bits_cache: HashMap::new(),
            replica_cache: HashMap::new(),
            smem_addrs: HashMap::new(),
            smem,
            sync: crate::back::ptx::sync::Tracker::new(),
            smem_temp: None,
            shared_life: staged::lifetimes(func, &asg.staged, &Default::default()),
            shared_bufs: HashMap::new(),
            staged_vals: HashMap::new(),
            deferred_copies: Vec::new(),
            rotation: None,
            tma: Default::default(),
            tma_rings: HashMap::new(),
            tma_leader: None,
            tma_multicast: None,
            tmap_addrs: HashMap::new(),
            tma_last_slot: HashMap::new(),
            ws_allowed: false,
            ws: ws::WsMode::Off,
            ws_split: None,
            ws_lane0: None,
            ws_barrier: None,
            named: Default::default(),
            ws_once: Default::default(),
            ws_last_readers: Default::default(),
            wgmma_in_flight: false,
            turns: Default::default(),
            lane_offsets: HashMap::new(),
            element_offsets: HashMap::new(),
            tf32_addrs: HashMap::new(),
            scratch,
            scratch_bytes,
            scratch_base: None,
            policy_cache: HashMap::new(),
            zero16: None,
            cluster_slots: 0,
            cluster_base: None,
            cluster_lane: None,
            cluster_writer: None,
            tensors: Vec::new(),
            scalars: Vec::new(),
            uses,
            block_uses: Vec::new(),
            uniform: std::collections::HashSet::new(),
            known_ints: HashMap::new(),
            aranges: crate::ir::program_order(func)
                .into_iter()
                .filter_map(
                    |i| match (&func.insts[i].op, func.insts[i].results.first()) {
                        (Op::Arange { start, .. }, Some(&r)) => Some((r, *start)),
                        _ => None,
                    },
                )
                .collect(),
        }
    }

    /// Fetches into the buffers `plan` names are TMA copies (`lower/tma.rs`).
    pub fn with_tma(mut self, plan: crate::back::ptx::tma::TmaPlan, specialize: bool) -> Self {
        // Clusters only for multicast rings (no `cluster_gather` exchange).
        let gathers = crate::ir::uses_clusters(self.func) && plan.multicast.is_empty();
        self.ws_allowed = specialize && !plan.is_empty() && self.has_wgmma_dot() && !gathers;
        if self.ws_allowed {
            self.ws_once = ws::fetched_once(self.func);
            self.ws_last_readers = ws::last_readers(self.func);
            // Every refilled ring must be released by a product that reads it, and read
            // only as staged tiles (a read into registers would release nothing).
            self.ws_allowed = plan.by_buf.keys().all(|&buf| {
                self.ws_once.contains(&buf)
                    || (self.ws_last_readers.iter().any(|&(_, b)| b == buf)
                        && ws::read_only_staged(self.func, &self.asg.staged, buf))
            });
        }
        if self.ws_allowed {
            // The rings live across a persistent loop: the producer fills the next
            // tile's stages while the consumers finish this one.
            let rings = plan.by_buf.keys().copied().collect();
            self.shared_life = staged::lifetimes(self.func, &self.asg.staged, &rings);
        }
        self.tma = plan;
        self
    }

    /// Lowers the whole function; `params` says how each source parameter is read.
    pub fn run(mut self, params: &[ParamLoad]) -> R<Lowered> {
        self.in_prologue = true;
        self.load_params(params)?;
        self.in_prologue = false;
        let func = self.func;
        let clustered = crate::ir::uses_clusters(func);
        if clustered {
            self.cluster_prologue();
        }
        let y = self.block(&func.body)?;
        if !y.is_empty() {
            return Err(unsupported(Span::DUMMY, "yield at kernel level"));
        }
        if clustered {
            self.cluster_epilogue();
        }
        self.emit("ret", vec![]);
        let mut body = std::mem::take(&mut self.prologue);
        body.push(Stmt::Comment("body".into()));
        body.append(&mut self.body);
        Ok(Lowered {
            body,
            reg_counts: self.reg_counts,
            smem_bytes: self.smem.peak(),
            smem_align: self.smem.max_align(),
            smem_at_peak: self.smem.at_peak(),
            scratch_bytes: self.scratch_bytes,
            scratch_slot_bytes: self.scratch.iter().map(|p| p.slot_bytes).collect(),
            cluster_slots: self.cluster_slots,
            producer_threads: if self.ws_split.is_some() {
                ws::PRODUCER_THREADS
            } else {
                0
            },
            turn_loops: self.turns.loops,
        })
    }

    // ---- emission helpers ------------------------------------------------------------

    pub fn reg(&mut self, class: RegClass) -> Reg {
        let c = &mut self.reg_counts[class.index()];
        *c += 1;
        Reg { class, n: *c }
    }

    /// Appends a statement to the code being lowered (the prologue or the body).
    pub(super) fn push_stmt(&mut self, s: Stmt) {
        self.push(s)
    }

    fn push(&mut self, s: Stmt) {
        if self.in_prologue {
            self.prologue.push(s)
        } else {
            self.body.push(s)
        }
    }

    pub fn emit(&mut self, opcode: impl Into<String>, operands: Vec<Operand>) {
        self.emit_if(None, opcode, operands)
    }

    pub fn emit_if(
        &mut self,
        guard: Option<(Reg, bool)>,
        opcode: impl Into<String>,
        operands: Vec<Operand>,
    ) {
        self.push(Stmt::Inst(Inst::new(guard, opcode.into(), operands)))
    }

    /// `opcode d, operands...` into a fresh register of `class`.
    pub fn op1(&mut self, class: RegClass, opcode: &str, mut operands: Vec<Operand>) -> Reg {
        let d = self.reg(class);
        operands.insert(0, d.into());
        self.emit(opcode, operands);
        d
    }

    pub fn comment(&mut self, c: impl Into<String>) {
        self.push(Stmt::Comment(c.into()))
    }

    pub fn new_label(&mut self) -> u32 {
        self.labels += 1;
        self.labels
    }

    pub fn place_label(&mut self, l: u32) {
        self.push(Stmt::Label(l))
    }

    /// Runs `f` with emission redirected to the prologue.
    pub fn in_prologue<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let saved = self.in_prologue;
        self.in_prologue = true;
        let r = f(self);
        self.in_prologue = saved;
        r
    }

    pub fn mov(&mut self, d: Reg, s: Operand) {
        let ty = match d.class {
            RegClass::Pred => "mov.pred",
            RegClass::B16 => "mov.b16",
            RegClass::B32 => "mov.b32",
            RegClass::B64 => "mov.b64",
            RegClass::F32 => "mov.f32",
            RegClass::F64 => "mov.f64",
        };
        self.emit(ty, vec![d.into(), s]);
    }

    /// A fresh register of the same class holding a copy of `s`.
    pub fn copy(&mut self, s: Reg) -> Reg {
        let d = self.reg(s.class);
        self.mov(d, s.into());
        d
    }

    // ---- thread-dependent values (prologue) ------------------------------------------

    /// A register holding `sym` (`mov.u32` in the prologue), made once and kept in the
    /// field `cached` selects.
    pub(super) fn prologue_symbol(
        &mut self,
        cached: fn(&mut Self) -> &mut Option<Reg>,
        sym: &str,
    ) -> Reg {
        if let Some(r) = *cached(self) {
            return r;
        }
        let r =
            self.in_prologue(|l| l.op1(RegClass::B32, "mov.u32", vec![Operand::Sym(sym.into())]));
        *cached(self) = Some(r);
        r
    }

    pub fn tid(&mut self) -> Reg {
        self.prologue_symbol(|l| &mut l.tid, "%tid.x")
    }

    /// `sum(((tid >> h) & 1) << b)` over the `(h, b)` pairs; `None` for no pairs.
    pub fn tid_bits(&mut self, pairs: &[(u32, u32)]) -> Option<Reg> {
        if pairs.is_empty() {
            return None;
        }
        let mut pairs = pairs.to_vec();
        pairs.sort();
        if let Some(&r) = self.bits_cache.get(&pairs) {
            return Some(r);
        }
        let tid = self.tid();
        let r = self.in_prologue(|l| {
            // Runs of consecutive tid bits that land on consecutive coordinate bits.
            let mut runs: Vec<(u32, u32, u32)> = Vec::new();
            for &(h, b) in &pairs {
                match runs.last_mut() {
                    Some((h0, b0, len)) if *h0 + *len == h && *b0 + *len == b => *len += 1,
                    _ => runs.push((h, b, 1)),
                }
            }
            let mut acc: Option<Reg> = None;
            for (h, b, len) in runs {
                let mut t = l.op1(
                    RegClass::B32,
                    "bfe.u32",
                    vec![tid.into(), Operand::Imm(h as i64), Operand::Imm(len as i64)],
                );
                if b > 0 {
                    t = l.op1(
                        RegClass::B32,
                        "shl.b32",
                        vec![t.into(), Operand::Imm(b as i64)],
                    );
                }
                acc = Some(match acc {
                    None => t,
                    Some(a) => l.op1(RegClass::B32, "or.b32", vec![a.into(), t.into()]),
                });
            }
            acc
        });
        if let Some(r) = r {
            self.bits_cache.insert(pairs, r);
        }
        r
    }

    /// The thread part of the coordinate along `dim` (`None` when it is always 0).
    pub fn thread_coord(&mut self, lin: &Linear, dim: usize) -> Option<Reg> {
        let bits = lin.thread_bits(dim);
        self.tid_bits(&bits)
    }

    /// A predicate true in the one replica that writes (`None`: no replicas).
    pub fn replica0(&mut self, lin: &Linear) -> Option<Reg> {
        let threads = 32 * self.num_warps;
        let mask = lin.replica_mask() & (threads - 1);
        if mask == 0 {
            return None;
        }
        if let Some(&p) = self.replica_cache.get(&mask) {
            return Some(p);
        }
        let tid = self.tid();
        let p = self.in_prologue(|l| {
            let t = l.op1(
                RegClass::B32,
                "and.b32",
                vec![tid.into(), Operand::Imm(mask as i64)],
            );
            l.op1(
                RegClass::Pred,
                "setp.eq.u32",
                vec![t.into(), Operand::Imm(0)],
            )
        });
        self.replica_cache.insert(mask, p);
        Some(p)
    }

    /// A register holding `kg_smem + offset` (the 32-bit `.shared` window address),
    /// computed once in the prologue.
    pub fn smem_at(&mut self, offset: u32) -> Reg {
        if let Some(&r) = self.smem_addrs.get(&offset) {
            return r;
        }
        let base = self.scratch_base();
        let r = if offset == 0 {
            base
        } else {
            self.in_prologue(|l| {
                l.op1(
                    RegClass::B32,
                    "add.u32",
                    vec![base.into(), Operand::Imm(offset as i64)],
                )
            })
        };
        self.smem_addrs.insert(offset, r);
        r
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.num_warps * 32
    }

    /// Starts a use of shared memory through which threads exchange values: ends the
    /// previous use (`smem_end`), allocates a temporary of `bytes`, and emits a block
    /// barrier first when the tracker says a thread may still read or write those bytes
    /// (`sync.rs`). Returns the temporary's address.
    pub fn smem_begin(&mut self, bytes: u32) -> Reg {
        self.smem_end();
        let id = self.smem.alloc("exchange", bytes, 16);
        self.smem_temp = Some(id);
        let range = self.smem.range(id);
        if self.sync.before_write(range) {
            self.emit_bar_sync();
        }
        self.smem_at(self.smem.offset(id))
    }

    /// Between the writes and the reads of the use in progress: the block barrier that
    /// makes the writes visible, when the tracker says it is needed.
    pub fn smem_read_fence(&mut self) {
        if let Some(id) = self.smem_temp {
            let range = self.smem.range(id);
            if self.sync.before_read(range) {
                self.emit_bar_sync();
            }
        }
    }

    /// Ends the use in progress: its bytes may be reused (after whatever barrier the
    /// tracker asks for then).
    pub fn smem_end(&mut self) {
        if let Some(id) = self.smem_temp.take() {
            self.smem.free(id);
        }
    }

    /// A block barrier (`bar.sync 0`, or the consumers' barrier after a split), reported
    /// to the tracker.
    pub fn emit_cta_barrier(&mut self) {
        self.emit_bar_sync();
        self.sync.barrier();
    }

    /// The `bar.sync 0` instruction alone, where the tracker asked for it (it has already
    /// recorded the barrier).
    pub(super) fn emit_bar_sync(&mut self) {
        let ops = self
            .block_barrier_entity()
            .sync_operands()
            .into_iter()
            .map(Operand::Imm)
            .collect();
        self.emit("bar.sync", ops);
    }

    /// The barrier that synchronizes the threads running this code: the CTA's, or after a
    /// warp-specialization split the consumers' named barrier (`lower/ws.rs`; id 1, the
    /// first [`NamedBarriers`](crate::back::ptx::sync::NamedBarriers) hands out).
    fn block_barrier_entity(&self) -> crate::back::ptx::sync::Barrier {
        match (self.ws, self.ws_barrier) {
            (ws::WsMode::Consumer, Some(b)) => b,
            _ => crate::back::ptx::sync::Barrier::Cta,
        }
    }

    /// The kernel's `barrier()`: a block barrier that each thread reaches only once the
    /// global loads it issued since the last branch target or barrier have returned.
    /// `bar.sync` alone does not wait for them (ptxas moves their uses past it), so the
    /// barrier is a `bar.red.or.pred` over a predicate read from one destination register
    /// of each such load; with no such load it is a `bar.sync`.
    fn block_barrier(&mut self) {
        let mut loaded: Vec<Reg> = Vec::new();
        for stmt in self.body.iter().rev() {
            let inst = match stmt {
                Stmt::Label(_) => break,
                Stmt::Comment(_) => continue,
                Stmt::Inst(inst) => inst,
            };
            match inst.opcode.family {
                Family::Bar | Family::BarRed | Family::BarrierCluster => break,
                Family::Ld(Space::Global) => loaded.extend(inst.defs.first().copied()),
                _ => {}
            }
        }
        let mut any: Option<Reg> = None;
        for r in loaded.into_iter().rev() {
            let p = match r.class {
                RegClass::Pred => r,
                RegClass::B16 => self.op1(
                    RegClass::Pred,
                    "setp.ne.b16",
                    vec![r.into(), Operand::Imm(0)],
                ),
                RegClass::B32 | RegClass::F32 => self.op1(
                    RegClass::Pred,
                    "setp.ne.b32",
                    vec![r.into(), Operand::Imm(0)],
                ),
                RegClass::B64 | RegClass::F64 => self.op1(
                    RegClass::Pred,
                    "setp.ne.b64",
                    vec![r.into(), Operand::Imm(0)],
                ),
            };
            any = Some(match any {
                None => p,
                Some(a) => self.op1(RegClass::Pred, "or.pred", vec![a.into(), p.into()]),
            });
        }
        match any {
            Some(p) => {
                let d = self.reg(RegClass::Pred);
                let mut ops: Vec<Operand> = vec![d.into()];
                ops.extend(
                    self.block_barrier_entity()
                        .sync_operands()
                        .into_iter()
                        .map(Operand::Imm),
                );
                ops.push(p.into());
                self.emit("bar.red.or.pred", ops);
                self.sync.barrier();
            }
            None => self.emit_cta_barrier(),
        }
    }

    /// A b16 register holding 0 (for widening bf16 with `mov.b32 %f, {0, h}`).
    pub fn zero16(&mut self) -> Reg {
        if let Some(r) = self.zero16 {
            return r;
        }
        let r = self.in_prologue(|l| l.op1(RegClass::B16, "mov.b16", vec![Operand::Imm(0)]));
        self.zero16 = Some(r);
        r
    }

    // ---- parameters ------------------------------------------------------------------

    fn load_params(&mut self, params: &[ParamLoad]) -> R<()> {
        for p in params {
            match p {
                ParamLoad::Tensor { ptr, dims, strides } => {
                    let raw = self.op1(RegClass::B64, "ld.param.u64", vec![mem_sym(ptr)]);
                    let base = self.op1(RegClass::B64, "cvta.to.global.u64", vec![raw.into()]);
                    let dims = dims
                        .iter()
                        .map(|d| match d {
                            Ok(name) => Ext::Reg(self.op1(
                                RegClass::B32,
                                "ld.param.s32",
                                vec![mem_sym(name)],
                            )),
                            Err(c) => Ext::Const(*c as i64),
                        })
                        .collect();
                    let strides = strides
                        .iter()
                        .map(|s| match s {
                            Some(name) => Ext::Reg(self.op1(
                                RegClass::B32,
                                "ld.param.s32",
                                vec![mem_sym(name)],
                            )),
                            None => Ext::Const(1),
                        })
                        .collect();
                    self.tensors.push(Some(TensorRegs {
                        base,
                        dims,
                        strides,
                    }));
                    self.scalars.push(None);
                }
                ParamLoad::Scalar { name, dtype } => {
                    let r = match dtype {
                        DType::Bool => {
                            let t = self.op1(RegClass::B32, "ld.param.u32", vec![mem_sym(name)]);
                            self.op1(
                                RegClass::Pred,
                                "setp.ne.u32",
                                vec![t.into(), Operand::Imm(0)],
                            )
                        }
                        DType::I32 => self.op1(RegClass::B32, "ld.param.s32", vec![mem_sym(name)]),
                        DType::U32 => self.op1(RegClass::B32, "ld.param.u32", vec![mem_sym(name)]),
                        DType::I64 => self.op1(RegClass::B64, "ld.param.s64", vec![mem_sym(name)]),
                        DType::F32 => self.op1(RegClass::F32, "ld.param.f32", vec![mem_sym(name)]),
                        DType::F16 | DType::BF16 => {
                            let h = self.op1(RegClass::B16, "ld.param.b16", vec![mem_sym(name)]);
                            self.widen_half(h, *dtype)
                        }
                    };
                    self.tensors.push(None);
                    self.scalars.push(Some(r));
                }
            }
        }
        Ok(())
    }

    pub fn tensor(&self, index: u32, span: Span) -> R<(TensorRegs, crate::ir::TensorParam)> {
        let t = self.tensors.get(index as usize).cloned().flatten();
        let p = self.func.tensor_param(index).cloned();
        match (t, p) {
            (Some(t), Some(p)) => Ok((t, p)),
            _ => Err(unsupported(
                span,
                format!("parameter {index} is not a tensor"),
            )),
        }
    }

    /// f16/bf16 bits in a b16 register → the widened f32 value.
    pub fn widen_half(&mut self, h: Reg, dt: DType) -> Reg {
        if dt == DType::BF16 {
            let z = self.zero16();
            self.op1(RegClass::F32, "mov.b32", vec![Operand::Vec(vec![z, h])])
        } else {
            self.op1(RegClass::F32, "cvt.f32.f16", vec![h.into()])
        }
    }

    // ---- values ----------------------------------------------------------------------

    pub fn lin(&self, v: ValueId) -> Linear {
        self.asg.linear(self.func, v)
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.func.value_type(v).dtype()
    }

    pub fn shape(&self, v: ValueId) -> Vec<u32> {
        crate::ir::shape_of(self.func.value_type(v)).to_vec()
    }

    pub fn bind(&mut self, v: ValueId, regs: Vec<Reg>) {
        self.vals.insert(v, regs);
    }

    /// The registers of `v` (a deferred 16-bit load is unpacked here, at its first use).
    pub fn regs(&mut self, v: ValueId, span: Span) -> R<Vec<Reg>> {
        if let Some(d) = self.deferred.remove(&v) {
            let regs = self.materialize(d, span)?;
            self.vals.insert(v, regs);
        }
        self.vals
            .get(&v)
            .cloned()
            .ok_or_else(|| unsupported(span, "value used before it is defined"))
    }

    /// Whether `v` has been lowered (its registers exist or are one unpack away).
    pub fn is_computed(&self, v: ValueId) -> bool {
        self.vals.contains_key(&v) || self.deferred.contains_key(&v)
    }

    /// The scalar register of `v`.
    pub fn scalar(&mut self, v: ValueId, span: Span) -> R<Reg> {
        self.regs(v, span)?
            .first()
            .copied()
            .ok_or_else(|| unsupported(span, "empty value"))
    }

    /// `v`'s registers laid out as `dst` (same shape), converting when needed.
    pub fn operand_in(&mut self, v: ValueId, dst: &Linear, span: Span) -> R<Vec<Reg>> {
        let regs = self.regs(v, span)?;
        let n = dst.num_regs();
        if self.is_uniform(v) {
            return Ok(vec![regs[0]; n]);
        }
        let src = self.lin(v);
        if &src == dst {
            return Ok(regs);
        }
        let key = (v, dst.clone());
        for level in self.conv_cache.iter().rev() {
            if let Some(r) = level.get(&key) {
                return Ok(r.clone());
            }
        }
        let shape = self.shape(v);
        let out = match self.aranges.get(&v) {
            // An index tile is cheaper to make again than to move.
            Some(&start) if dst.rank() == 1 => self.arange_regs(dst, start),
            _ => {
                let w = super::layout::identity_weights(&shape);
                self.remap(&regs, &src, dst, &w, self.dtype(v), span)?
            }
        };
        if let Some(top) = self.conv_cache.last_mut() {
            top.insert(key, out.clone());
        }
        Ok(out)
    }

    /// True for scalars and for tiles known to hold one value everywhere (constants,
    /// splats and what is computed from them only); such a tile is free in any layout.
    /// (A tile with one register per thread is *not* uniform: threads differ.)
    pub fn is_uniform(&self, v: ValueId) -> bool {
        crate::ir::shape_of(self.func.value_type(v)).is_empty() || self.uniform.contains(&v)
    }

    pub fn mark_uniform(&mut self, v: ValueId) {
        self.uniform.insert(v);
    }

    pub fn is_used(&self, v: ValueId) -> bool {
        self.uses.get(&v).copied().unwrap_or(0) > 0
    }

    // ---- dispatch --------------------------------------------------------------------

    fn inst(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = inst.results.first().copied();
        if let Some(r) = res {
            self.note_known_int(&inst.op, r);
        }
        match &inst.op {
            Op::For { .. } => self.lower_for(id),
            Op::If { .. } => self.lower_if(id),
            Op::Yield(_) => Err(unsupported(span, "yield outside a region end")),
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                let axis = ["x", "y", "z"]
                    .get(*a as usize)
                    .ok_or_else(|| unsupported(span, "grid axis must be 0, 1 or 2"))?;
                let sreg = if matches!(inst.op, Op::ProgramId(_)) {
                    "ctaid"
                } else {
                    "nctaid"
                };
                let r = self.op1(
                    RegClass::B32,
                    "mov.u32",
                    vec![Operand::Sym(format!("%{sreg}.{axis}"))],
                );
                self.bind_res(res, vec![r], span)
            }
            Op::ClusterRank(_) => {
                if !self.target.caps.clusters {
                    return Err(unsupported(
                        span,
                        format!(
                            "`cluster_rank` needs thread-block clusters (sm_90a); {} has none",
                            self.target.arch
                        ),
                    ));
                }
                let r = self.op1(
                    RegClass::B32,
                    "mov.u32",
                    vec![Operand::Sym("%cluster_ctarank".into())],
                );
                self.bind_res(res, vec![r], span)
            }
            Op::ScalarParam(p) => {
                let r = self
                    .scalars
                    .get(*p as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(|| unsupported(span, "not a scalar parameter"))?;
                self.bind_res(res, vec![r], span)
            }
            Op::TensorDim { tensor, dim } | Op::TensorStride { tensor, dim } => {
                let (t, _) = self.tensor(*tensor, span)?;
                let list = if matches!(inst.op, Op::TensorDim { .. }) {
                    &t.dims
                } else {
                    &t.strides
                };
                let e = *list
                    .get(*dim as usize)
                    .ok_or_else(|| unsupported(span, "tensor dimension out of range"))?;
                let r = match e {
                    Ext::Reg(r) => r,
                    Ext::Const(c) => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(c)]),
                };
                self.bind_res(res, vec![r], span)
            }
            Op::Const(s) => {
                let r = self.constant(*s, span)?;
                let n = res.map(|v| self.lin(v).num_regs()).unwrap_or(1);
                if let Some(v) = res {
                    self.mark_uniform(v);
                }
                self.bind_res(res, vec![r; n], span)
            }
            Op::Splat(v) => {
                let r = self.scalar(*v, span)?;
                let n = res.map(|v| self.lin(v).num_regs()).unwrap_or(1);
                if let Some(v) = res {
                    self.mark_uniform(v);
                }
                self.bind_res(res, vec![r; n], span)
            }
            Op::Arange { start, .. } => self.lower_arange(res, *start, span),
            Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Select(..)
            | Op::Fma(..)
            | Op::Cast(_) => self.lower_elementwise(id),
            Op::Reduce { op, value, axis } => self.lower_reduce(id, *op, *value, *axis as usize),
            Op::Scan { .. } => self.lower_scan(id),
            Op::Broadcast(_) | Op::Reshape(_) | Op::ExpandDims(..) | Op::Permute(..) => {
                self.lower_shape_op(id)
            }
            Op::Load { .. } => self.lower_load(id),
            Op::Store { .. } => self.lower_store(id),
            Op::Gather { .. } | Op::Scatter { .. } | Op::AtomicAdd { .. } => {
                self.lower_pointwise_mem(id)
            }
            Op::Dot {
                a,
                b,
                acc,
                precision,
            } => match res.map(|r| self.asg.layout(r)) {
                Some(crate::back::ptx::layout::Layout::Mma(m)) => {
                    let plan = res
                        .filter(|_| !precision.is_tf32())
                        .and_then(|r| self.wgmma_plan(*a, *b, r, m));
                    match plan {
                        Some(plan) => {
                            self.turns_before_dot(id, span)?;
                            self.lower_wgmma(id, *a, *acc, m, plan)?;
                            self.turns_after_dot(id, span)
                        }
                        None => self.lower_mma(id, *a, *b, *acc, *precision, m),
                    }
                }
                _ => self.lower_dot(id, *a, *b, *acc, *precision),
            },
            Op::ClusterGather { .. } => self.lower_cluster_gathers(&[id]),
            Op::ScratchLoad { buf, .. } if self.is_shared(*buf) => self.lower_shared_load(id),
            Op::ScratchFetch { buf, .. } if self.is_shared(*buf) => self.lower_shared_fetch(id),
            Op::ScratchStore { buf, .. } | Op::ScratchGather { buf, .. }
                if self.is_shared(*buf) =>
            {
                Err(unsupported(
                    span,
                    "a store or gather into a staged shared buffer",
                ))
            }
            Op::ScratchStore { .. } => self.lower_scratch_store(id),
            Op::ScratchLoad { .. } => self.lower_scratch_load(id),
            Op::ScratchFetch { .. } => self.lower_scratch_fetch(id),
            Op::ScratchGather { .. } => self.lower_scratch_gather(id),
            Op::ScratchWait { .. } => self.lower_scratch_wait(id),
            Op::GridDependency(d) => {
                // sm_80 has no programmatic dependent launch: its launches are ordered.
                if self.target.caps.grid_dependency {
                    let op = match d {
                        crate::ir::GridDependency::Wait => "griddepcontrol.wait",
                        crate::ir::GridDependency::LaunchDependents => {
                            "griddepcontrol.launch_dependents"
                        }
                    };
                    self.emit(op, vec![]);
                }
                Ok(())
            }
            Op::Barrier => {
                self.block_barrier();
                // In a `grid_sync` kernel a staged (TMA) fetch may read a tensor the
                // block wrote before the barrier (`passes/pipeline.rs`).
                if self.target.caps.tma && crate::ir::has_grid_sync(self.func) {
                    self.emit("fence.proxy.async.global", vec![]);
                }
                Ok(())
            }
            Op::GridSync { counter } => self.lower_grid_sync(*counter, inst.span),
        }
    }

    /// Whether scratch buffer `buf` is one of the compiler's shared (staged) buffers.
    pub fn is_shared(&self, buf: u32) -> bool {
        self.func
            .scratch
            .get(buf as usize)
            .is_some_and(|b| b.shared)
    }

    pub fn bind_res(&mut self, res: Option<ValueId>, regs: Vec<Reg>, span: Span) -> R<()> {
        let v = res.ok_or_else(|| unsupported(span, "instruction without a result"))?;
        self.bind(v, regs);
        Ok(())
    }
}

pub fn mem_sym(name: &str) -> Operand {
    Operand::Mem(Addr::Sym(name.to_string()), 0)
}

fn count_uses(func: &Function, uses: &mut HashMap<ValueId, usize>) {
    for i in crate::ir::program_order(func) {
        for v in crate::ir::operands(&func.insts[i].op) {
            *uses.entry(v).or_insert(0) += 1;
        }
    }
}
