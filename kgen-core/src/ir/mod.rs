//! The tile IR: one kernel as SSA values over scalars and tiles, with structured
//! control flow (`for` / `if` regions that yield values, like MLIR's `scf`).
//!
//! Invariants (checked by `valid::validate`, relied on by every later layer):
//! - Every value is defined exactly once, as a block argument or an instruction result,
//!   and every use is dominated by its definition (regions see their parents' values).
//! - Operand types are exact: the checker inserts `Splat`/`Broadcast`/`Cast` so that
//!   element-wise operands have identical types. No implicit broadcasting is left.
//! - `For` and `If` bodies end with exactly one `Yield` whose operand types equal the
//!   instruction's result types; `Yield` appears nowhere else.
//! - Tile shapes obey `types::MAX_TILE_RANK` and `types::MAX_TILE_ELEMENTS`.
//!
//! The text form (`Display` for [`Function`], in `ir::display`) is stable and is what
//! `kgen compile --emit ir` prints and what the IR snapshots hold.

pub mod arena;
pub mod chains;
pub mod display;
pub mod parse;
pub mod props;
pub mod uniform;

pub use arena::{Arena, Handle};
pub use props::{
    for_each_operand, for_each_operand_mut, operands, props, regions, Effects, OpClass, OpProps,
};

use crate::span::Span;
use crate::types::{DType, Scalar, ValueType};

pub type ValueId = Handle<Value>;
pub type InstId = Handle<Inst>;

/// One compiled kernel (one specialization).
#[derive(Clone, Debug)]
pub struct Function {
    /// The PTX entry name; it spells the specialization (`rmsnorm__T_bf16__BLOCK_1024`).
    pub name: String,
    /// The kernel's name in the source.
    pub source_name: String,
    pub params: Vec<Param>,
    /// Block-local scratch buffers (`scratch(...)`), indexed by `ScratchLoad::buf`.
    pub scratch: Vec<ScratchBuf>,
    pub values: Arena<Value>,
    pub insts: Arena<Inst>,
    pub body: Block,
}

/// A block-local scratch buffer: `slots` tiles of `dtype` and shape `slot_shape`, alive
/// for the whole kernel, private to the block (shared memory on the GPU). A slot that
/// the block has not stored reads as unspecified data. A store or load of a slot outside
/// `0..slots` is an error: the interpreter reports it, the GPU traps (the launch fails);
/// a fetch into one is allowed only when it copies nothing (see `ScratchFetch`).
#[derive(Clone, Debug, PartialEq)]
pub struct ScratchBuf {
    /// The variable it is bound to (for messages and the IR text), else "scratch".
    pub name: String,
    pub dtype: DType,
    pub slots: u32,
    pub slot_shape: Vec<u32>,
    /// The `scratch(...)` call.
    pub span: Span,
    /// A buffer the compiler made (`passes::pipeline`) to stage tiles for `dot`: its slots
    /// are shared by the block's threads (any thread may read any element), so the back
    /// end lays it out for `ldmatrix` (swizzled) and synchronizes the block between a
    /// fetch's completion and the reads. User buffers (`scratch(...)`) are thread-private:
    /// each thread reads back what it stored. The semantics of the scratch ops are the
    /// same for both.
    pub shared: bool,
    /// Slots of a shared ring that the pipeline keeps out of its fetch distance for a
    /// product still reading them (`passes::pipeline`: 1 when the back end may leave one
    /// `wgmma` group in flight across the loop's back edge; 0 otherwise).
    pub lag: u32,
}

/// A kernel parameter, in source order.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ParamKind {
    Scalar(DType),
    Tensor(TensorParam),
}

/// L2 eviction priority of the lines a tile load or store touches (Triton's
/// `eviction_policy`): a hint, never a change in results. `Last` keeps data that is
/// read again soon (a row re-read by a second pass) ahead of `Normal` and `First` lines;
/// `First` marks streams that are touched once (a gradient written and not re-read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Eviction {
    #[default]
    Normal,
    First,
    Last,
}

impl Eviction {
    /// The spelling in source (`eviction_policy = evict_last`).
    pub fn name(self) -> &'static str {
        match self {
            Eviction::Normal => "evict_normal",
            Eviction::First => "evict_first",
            Eviction::Last => "evict_last",
        }
    }

    /// The policy named `name` in source, if any.
    pub fn from_name(name: &str) -> Option<Eviction> {
        [Eviction::Normal, Eviction::First, Eviction::Last]
            .into_iter()
            .find(|e| e.name() == name)
    }
}

/// How `dot` multiplies float operands (Triton's `input_precision`). Products of f16 and
/// bf16 values are exact in f32 whatever this says (tensor cores); it matters for f32
/// operands only, and the checker refuses anything but `Ieee` for the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InputPrecision {
    /// Exact f32 products, each added with one rounding (`fma.rn.f32`).
    #[default]
    Ieee,
    /// Each operand element rounded to TF32 first (`round_tf32`: 10 explicit
    /// significand bits, to nearest with ties away from zero, PTX's
    /// `cvt.rna.tf32.f32`); the products of two TF32 values are exact in f32 and are
    /// summed in f32 (tensor cores: `mma.sync.m16n8k8.tf32`).
    Tf32,
    /// Three TF32 products per element pair, recovering about f32 accuracy: with
    /// `hi = round_tf32(x)` and `lo = round_tf32(x - hi)` (the difference is exact),
    /// `a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi` (the `a_lo·b_lo` term, about 2⁻²² of
    /// the product, is dropped), each summed in f32.
    Tf32x3,
}

impl InputPrecision {
    /// Every precision, in the order the diagnostics list them.
    pub const ALL: [InputPrecision; 3] = [
        InputPrecision::Ieee,
        InputPrecision::Tf32,
        InputPrecision::Tf32x3,
    ];

    /// The spelling in source (`input_precision = tf32`).
    pub fn name(self) -> &'static str {
        match self {
            InputPrecision::Ieee => "ieee",
            InputPrecision::Tf32 => "tf32",
            InputPrecision::Tf32x3 => "tf32x3",
        }
    }

    /// The precision named `name` in source, if any.
    pub fn from_name(name: &str) -> Option<InputPrecision> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether the operands go through TF32 (the tensor cores' f32 input format).
    pub fn is_tf32(self) -> bool {
        self != InputPrecision::Ieee
    }
}

/// A global-memory tensor: a base pointer, extents and strides (in elements).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorParam {
    pub dtype: DType,
    /// `Some(n)` where the extent is a compile-time constant; `None` for a runtime extent.
    pub dims: Vec<Option<u32>>,
    /// The last dimension has stride 1.
    pub contiguous: bool,
    /// Alignment assumed by the specialization, in bytes (1, 2, 4, 8 or 16): the base
    /// address, every stride but the contiguous one (times the element size) and the
    /// extent of the contiguous dimension (times the element size) are multiples of it.
    /// The runtime checks it before launch; the back end uses it for vector width.
    pub align_bytes: u32,
}

impl TensorParam {
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
}

/// An SSA value.
#[derive(Clone, Debug)]
pub struct Value {
    pub ty: ValueType,
    /// The source variable it came from, for readable IR and PTX comments.
    pub name: Option<String>,
}

/// A straight-line list of instructions with arguments (for loop bodies: the induction
/// variable, then the carried values).
#[derive(Clone, Debug, Default)]
pub struct Block {
    pub args: Vec<ValueId>,
    pub insts: Vec<InstId>,
}

#[derive(Clone, Debug)]
pub struct Inst {
    pub op: Op,
    pub results: Vec<ValueId>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// Arithmetic negation (wrapping for integers).
    Neg,
    /// Logical not for bool, bitwise not for integers.
    Not,
    Abs,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Sin,
    Cos,
    Floor,
    Ceil,
    /// The error function, floats only. The GPU evaluates a minimax polynomial in f32
    /// (within 2 ulp); the interpreter is exact (f64, rounded once).
    Erf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// Integers wrap around; floats round to nearest even in their dtype.
    Add,
    Sub,
    Mul,
    /// Integer division truncates toward zero. Every result is defined, the same on the
    /// GPU and in the interpreter: `x / 0` is all ones (-1 for i32 and i64, 4294967295
    /// for u32) and `MIN / -1` wraps to `MIN` (PTX leaves both to the machine: the PTX
    /// back end guards the division, `back/ptx/lower/int_div.rs`).
    Div,
    /// Integer remainder has the sign of the dividend; `x % 0` is `x` and `MIN % -1` is
    /// 0 (defined as for `Div`). Float `%` is `fmod`.
    Rem,
    /// Float min/max ignore a NaN operand (IEEE minNum/maxNum, PTX `min.f32`); both NaN
    /// gives NaN.
    Min,
    Max,
    /// Logical for bool, bitwise for integers.
    And,
    Or,
    Xor,
    /// Shifts by ≥ the bit width give 0 (or the sign fill for a signed `Shr`), matching
    /// PTX `shl`/`shr`.
    Shl,
    Shr,
    /// `pow(x, y)` for floats: C's `powf` (`pow(x, 0) = 1`; a negative base gives NaN
    /// unless `y` is an integer). Integer powers never reach the IR: the checker expands
    /// a constant integer exponent into multiplications.
    Pow,
    /// `fdiv(x, y)` for floats: `x / y` within 2 ulp (PTX `div.full.f32`, what Triton's
    /// `/` gives), not correctly rounded. The interpreter divides correctly rounded,
    /// which is within that bound.
    FDiv,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index (i32) of the first maximum along the axis, under `Max`'s NaN rule (NaN
    /// elements are skipped; an all-NaN line gives 0).
    ArgMax,
    /// Index (i32) of the first minimum along the axis.
    ArgMin,
}

/// The combine operation of a scan (`Op::Scan`): `cumsum` is `Add`, `cumprod` `Mul`,
/// `cummax` `Max`, `cummin` `Min`; `scan(x, axis, combine = and | or | xor)` the rest.
/// Every one is associative and commutative, so a scan may combine in any order (the
/// GPU combines in a tree; float `Add` and `Mul` then round differently from a
/// left-to-right loop, within the usual summation error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// Integers wrap; f16/bf16 accumulate in f32 and round each result once.
    Add,
    /// Integers wrap; f16/bf16 accumulate in f32 and round each result once.
    Mul,
    /// `BinaryOp::Max`'s rule: NaN elements are skipped (a prefix of NaNs only is NaN).
    Max,
    Min,
    /// Bitwise on integers, logical on bool.
    And,
    Or,
    Xor,
}

impl ScanOp {
    pub const ALL: [ScanOp; 7] = [
        ScanOp::Add,
        ScanOp::Mul,
        ScanOp::Max,
        ScanOp::Min,
        ScanOp::And,
        ScanOp::Or,
        ScanOp::Xor,
    ];

    /// The spelling in source (`combine = add`) and in the IR text (`scan.add`).
    pub fn name(self) -> &'static str {
        match self {
            ScanOp::Add => "add",
            ScanOp::Mul => "mul",
            ScanOp::Max => "max",
            ScanOp::Min => "min",
            ScanOp::And => "and",
            ScanOp::Or => "or",
            ScanOp::Xor => "xor",
        }
    }

    /// The op named `name` in source, if any.
    pub fn from_name(name: &str) -> Option<ScanOp> {
        ScanOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Whether the op applies to elements of `dtype`: `add`, `mul`, `max`, `min` to
    /// numbers, `and`, `or`, `xor` to integers and bool.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            ScanOp::Add | ScanOp::Mul | ScanOp::Max | ScanOp::Min => dtype != DType::Bool,
            ScanOp::And | ScanOp::Or | ScanOp::Xor => !dtype.is_float(),
        }
    }
}

/// The two halves of a programmatic dependent launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridDependency {
    /// Waits until the grid this one depends on has completed and its memory is
    /// visible: before the first read of what it wrote. When this grid was launched
    /// normally, the launch itself already waited and this does nothing.
    Wait,
    /// Lets the grid that depends on this one start launching (it still waits for
    /// this one's completion where it calls `Wait`).
    LaunchDependents,
}

/// The operations. Result types are on the result values; the comments give them.
/// "T" below is the result type of the instruction.
#[derive(Clone, Debug)]
pub enum Op {
    /// A constant scalar, or (for a tile result) a constant splat over the tile.
    Const(Scalar),
    /// `bid(axis)`: the block (program) id along axis 0..3. `i32` scalar.
    ProgramId(u8),
    /// `num_bids(axis)`: the grid size along the axis. `i32` scalar.
    NumPrograms(u8),
    /// `cluster_rank(size)` (sm_90a thread-block clusters): this block's rank in its
    /// cluster of `size` consecutive blocks along grid axis 0 (`bid(0) % size`). `i32`
    /// scalar. Like `ClusterGather`, it makes the kernel run in clusters of `size` (one
    /// size per kernel), so a copy that every block of a cluster makes alike can be
    /// multicast (`ir::uniform`).
    ClusterRank(u32),
    /// The value of scalar parameter `param` (index into `Function::params`).
    ScalarParam(u32),
    /// Extent of dimension `dim` of tensor parameter `tensor`. `i32` scalar (a constant
    /// dimension folds to `Const` during checking).
    TensorDim {
        tensor: u32,
        dim: u8,
    },
    /// Stride (elements) of dimension `dim` of tensor parameter `tensor`. `i32` scalar.
    TensorStride {
        tensor: u32,
        dim: u8,
    },
    /// `arange(start, end)`: the 1-D `i32` tile `[start, start+1, ..., end-1]`.
    Arange {
        start: i64,
        end: i64,
    },
    /// A scalar repeated over the result tile.
    Splat(ValueId),
    /// A tile whose size-1 dimensions are repeated to the result shape (same rank).
    Broadcast(ValueId),
    /// Same elements in row-major order, new shape (same element count).
    Reshape(ValueId),
    /// A size-1 dimension inserted at `axis`.
    ExpandDims(ValueId, u8),
    /// Dimensions permuted: result dim `i` is operand dim `perm[i]`.
    Permute(ValueId, Vec<u8>),
    Unary(UnaryOp, ValueId),
    Binary(BinaryOp, ValueId, ValueId),
    /// Result is `bool` of the operands' shape.
    Compare(CmpOp, ValueId, ValueId),
    /// `where(cond, a, b)`: cond is `bool` of the same shape (or a scalar).
    Select(ValueId, ValueId, ValueId),
    /// `a * b + c` with one rounding (floats).
    Fma(ValueId, ValueId, ValueId),
    /// Conversion to the result dtype. Float→narrower float rounds to nearest even;
    /// float→int truncates toward zero and saturates (NaN → 0); int→int wraps;
    /// `bool`→number gives 0/1; number→`bool` is `!= 0`.
    Cast(ValueId),
    /// Reduction along `axis`; the axis is removed (a 1-D tile reduces to a scalar).
    /// Sum of f16/bf16 accumulates in f32 and rounds once at the end.
    Reduce {
        op: ReduceOp,
        value: ValueId,
        axis: u8,
    },
    /// `cumsum(value, axis)` and the other scans: the result (the operand's type) holds
    /// at position `i` along `axis` the combination by `op` of the operand's elements
    /// `0..=i` along that axis (`reverse`: `i..n`). `exclusive` leaves element `i`
    /// itself out and starts from the op's start value instead: 0 for `Add`, 1 for
    /// `Mul`, -inf / +inf for float `Max` / `Min` (the lowest / highest value for
    /// integers), all ones (true) for `And`, 0 (false) for `Or` and `Xor`. See
    /// [`ScanOp`] for the arithmetic (dtypes, rounding, NaN).
    Scan {
        op: ScanOp,
        value: ValueId,
        axis: u8,
        reverse: bool,
        exclusive: bool,
    },
    /// cuTile-style tile load. `index[d]` is an `i32` scalar tile coordinate; the tile
    /// covers elements `index[d]*shape[d] .. +shape[d]` (shape = result shape, same rank
    /// as the tensor). Elements outside the tensor read as `padding`.
    Load {
        tensor: u32,
        index: Vec<ValueId>,
        padding: Scalar,
        eviction: Eviction,
    },
    /// cuTile-style tile store, the inverse of `Load`: out-of-bounds elements are not
    /// written. No results.
    Store {
        tensor: u32,
        index: Vec<ValueId>,
        value: ValueId,
        eviction: Eviction,
    },
    /// Triton-style gather: `offsets[d]` are integer tiles (all of the result shape),
    /// one per tensor dimension, giving element coordinates. Elements where `mask` is
    /// false or any coordinate is out of bounds read as `other`.
    Gather {
        tensor: u32,
        offsets: Vec<ValueId>,
        mask: Option<ValueId>,
        other: Scalar,
        eviction: Eviction,
    },
    /// Triton-style scatter: writes `value` at the coordinates where `mask` holds and
    /// the coordinates are in bounds. No results.
    Scatter {
        tensor: u32,
        offsets: Vec<ValueId>,
        value: ValueId,
        mask: Option<ValueId>,
        eviction: Eviction,
    },
    /// `atomic_add`: adds `value` at the coordinates (where masked in and in bounds) and
    /// returns the previous values (unspecified where masked out). f32 and i32 only.
    AtomicAdd {
        tensor: u32,
        offsets: Vec<ValueId>,
        value: ValueId,
        mask: Option<ValueId>,
    },
    /// `cluster_gather(value, size)` (sm_90a thread-block clusters): `value` is a scalar
    /// (any dtype but `bool`); the result is the `[size]` tile whose element `r` is
    /// `value` as computed by the block of cluster rank `r` (`bid(0) % size`; clusters
    /// are `size` consecutive blocks along grid axis 0). Every block of a cluster must
    /// execute the same sequence of `ClusterGather`s (like a barrier); a kernel uses one
    /// `size` throughout, and its grid's axis 0 is a multiple of it.
    ClusterGather {
        value: ValueId,
        size: u32,
    },
    /// `scratch_store(buf, slot, value)`: writes the tile `value` (the buffer's dtype
    /// and slot shape) into slot `slot` (`i32` scalar) of scratch buffer `buf`. No
    /// results. Each thread keeps its own elements: a `ScratchLoad` of the slot returns
    /// them without any synchronization.
    ScratchStore {
        buf: u32,
        slot: ValueId,
        value: ValueId,
    },
    /// `scratch_load(buf, slot)`: the tile in slot `slot` of scratch buffer `buf`.
    ScratchLoad {
        buf: u32,
        slot: ValueId,
    },
    /// `scratch_fetch(buf, slot, tensor, index, pad)`: starts copying the tile of
    /// `tensor` at tile coordinates `index` (the slot's shape; out-of-bounds elements
    /// read `padding`) into slot `slot` of `buf`, asynchronously: the slot may be read
    /// or written only after a `ScratchWait` has completed the fetch. Every fetch is one
    /// group of the block's in-flight fetches. A fetch into a slot outside `0..slots`
    /// whose elements are all out of bounds (masked off, for a `ScratchGather`) copies
    /// nothing and still counts (the fetches past a row's end in a pipelined loop); one
    /// with any element to copy is an error, as a store there is. No results.
    ScratchFetch {
        buf: u32,
        slot: ValueId,
        tensor: u32,
        index: Vec<ValueId>,
        padding: Scalar,
        eviction: Eviction,
    },
    /// `scratch_gather(buf, slot, tensor, offsets, mask, other)`: starts copying
    /// `gather(tensor, offsets, mask, other)` (the offsets and mask have the slot's
    /// shape) into slot `slot` of `buf`, asynchronously: a `ScratchFetch` whose elements
    /// come from element coordinates instead of a tile; counted, waited for and
    /// restricted like one. No results.
    ScratchGather {
        buf: u32,
        slot: ValueId,
        tensor: u32,
        offsets: Vec<ValueId>,
        mask: Option<ValueId>,
        other: Scalar,
        eviction: Eviction,
    },
    /// `scratch_wait(pending)`: waits until at most the `pending` most recent
    /// `ScratchFetch`es (and `ScratchGather`s) of this block are still in flight. No
    /// results.
    ScratchWait {
        pending: u32,
    },
    /// Programmatic dependent launch (`gdc_wait()`, `gdc_launch_dependents()`; sm_90's
    /// `griddepcontrol`, nothing elsewhere and on the interpreter, whose launches run
    /// one after the other). No results.
    GridDependency(GridDependency),
    /// `grid_sync(counter)`: every thread of every block of the grid waits here until all
    /// have arrived, and every block's memory accesses before it are ordered before every
    /// block's accesses after it (global memory, through the generic and the async (TMA)
    /// proxies). `counter` is a tensor parameter (`i32`, one element) used as the
    /// barrier's arrival count; it must hold 0 or a value an earlier `grid_sync` left
    /// (each one flips its sign bit, nothing else), and two grids running at once must not
    /// share it. Every block must reach the same `GridSync`s the same number of times
    /// (the checker refuses one under control flow that may differ between blocks), and
    /// the kernel is launched cooperatively: all its blocks resident at once. No results.
    GridSync {
        counter: u32,
    },
    /// `barrier()`: every thread of the block waits here until all have arrived, and
    /// the block's memory accesses before it are ordered before those after it; on the
    /// GPU a thread arrives only with the data of the global loads it issued before it
    /// (since the last branch or barrier). Nothing on the interpreter, which runs a
    /// block's tiles whole. No results. Control flow in the language is uniform across a block, so every thread
    /// reaches the same barriers.
    Barrier,
    /// `dot(a, b, acc, input_precision = p)`: `a: [M, K]`, `b: [K, N]`, `acc: [M, N]`
    /// (f32 accumulator for float inputs). Result `acc + a @ b`, the products as
    /// `precision` says (not `Ieee` only for f32 operands).
    Dot {
        a: ValueId,
        b: ValueId,
        acc: ValueId,
        precision: InputPrecision,
    },
    /// A counted loop `for iv in lower..upper step step` (i32 scalars, step > 0 checked at
    /// compile time when constant). `body.args` = `[iv, carried...]`; the body yields
    /// the next carried values; the results are the final carried values.
    For {
        lower: ValueId,
        upper: ValueId,
        step: ValueId,
        inits: Vec<ValueId>,
        body: Block,
    },
    /// `if cond { then } else { else }` on a `bool` scalar; each region yields the
    /// results.
    If {
        cond: ValueId,
        then_body: Block,
        else_body: Block,
    },
    /// Ends a `For`/`If` region.
    Yield(Vec<ValueId>),
}

impl Function {
    pub fn value_type(&self, v: ValueId) -> &ValueType {
        &self.values[v].ty
    }

    pub fn tensor_param(&self, index: u32) -> Option<&TensorParam> {
        match self.params.get(index as usize).map(|p| &p.kind) {
            Some(ParamKind::Tensor(t)) => Some(t),
            _ => None,
        }
    }
}

/// Every instruction of `func`, in program order, a region's instructions right after the
/// instruction that holds it (a `For`'s body, an `If`'s then and else bodies).
pub fn program_order(func: &Function) -> Vec<InstId> {
    fn walk(func: &Function, block: &Block, out: &mut Vec<InstId>) {
        for &i in &block.insts {
            out.push(i);
            match func.insts.get(i).map(|inst| &inst.op) {
                Some(Op::For { body, .. }) => walk(func, body, out),
                Some(Op::If {
                    then_body,
                    else_body,
                    ..
                }) => {
                    walk(func, then_body, out);
                    walk(func, else_body, out);
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(func, &func.body, &mut out);
    out
}

/// Calls `f` on every instruction of `roots` and of the regions nested in them, each
/// once (safe on unvalidated IR: an instruction reached twice, as in a region that
/// contains itself, is visited once).
pub fn visit_insts<'f>(func: &'f Function, roots: Vec<&'f Block>, mut f: impl FnMut(&'f Op)) {
    let mut seen = std::collections::HashSet::new();
    let mut stack = roots;
    while let Some(b) = stack.pop() {
        for &i in &b.insts {
            if !seen.insert(i) {
                continue;
            }
            let Some(inst) = func.insts.get(i) else {
                continue;
            };
            f(&inst.op);
            match &inst.op {
                Op::For { body, .. } => stack.push(body),
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    stack.push(then_body);
                    stack.push(else_body);
                }
                _ => {}
            }
        }
    }
}

/// The cluster size of a `ClusterGather` or `ClusterRank` of `func` (searching regions
/// too; valid IR has one size), if any.
pub fn cluster_size(func: &Function) -> Option<u32> {
    let mut size = None;
    visit_insts(func, vec![&func.body], |op| {
        if let (None, Op::ClusterGather { size: s, .. } | Op::ClusterRank(s)) = (size, op) {
            size = Some(*s);
        }
    });
    size
}

/// Whether `func` (regions included) calls `grid_sync`: it must be launched cooperatively.
pub fn has_grid_sync(func: &Function) -> bool {
    let mut found = false;
    visit_insts(func, vec![&func.body], |op| {
        found |= matches!(op, Op::GridSync { .. });
    });
    found
}

/// Whether `func` exchanges values across a thread-block cluster.
pub fn uses_clusters(func: &Function) -> bool {
    cluster_size(func).is_some()
}

/// Helps layers that build IR: appends values and instructions.
pub struct Builder<'f> {
    pub func: &'f mut Function,
}

impl Builder<'_> {
    pub fn new_value(&mut self, ty: ValueType, name: Option<String>) -> ValueId {
        self.func.values.append(Value { ty, name })
    }

    /// Appends an instruction with fresh result values of the given types.
    pub fn inst(
        &mut self,
        block: &mut Block,
        op: Op,
        result_types: Vec<ValueType>,
        span: Span,
    ) -> Vec<ValueId> {
        let results: Vec<ValueId> = result_types
            .into_iter()
            .map(|ty| self.new_value(ty, None))
            .collect();
        let id = self.func.insts.append(Inst {
            op,
            results: results.clone(),
            span,
        });
        block.insts.push(id);
        results
    }
}

impl Function {
    pub fn new(name: impl Into<String>, source_name: impl Into<String>) -> Function {
        Function {
            name: name.into(),
            source_name: source_name.into(),
            params: Vec::new(),
            scratch: Vec::new(),
            values: Arena::new(),
            insts: Arena::new(),
            body: Block::default(),
        }
    }
}

/// The shape of a tile type, or an empty shape for scalars.
pub fn shape_of(ty: &ValueType) -> &[u32] {
    match ty {
        ValueType::Scalar(_) => &[],
        ValueType::Tile(_, s) => s.dims(),
    }
}

#[cfg(test)]
mod tests_parse;
