//! The checker: resolves names and generics, evaluates constants, checks dtypes and
//! shapes (numpy broadcasting) and lowers the AST of one kernel to tile IR.
//!
//! Assumes: an AST from either front end (spans inside the source text); nothing else
//! about it (any AST is accepted without panicking).
//! Guarantees: on `Ok`, IR that satisfies every invariant in `ir/mod.rs` (broadcasting
//! and literal dtypes made explicit, regions end with one `Yield` matching their
//! results); on `Err`, every independent error found, each located. Never panics: a
//! failed expression becomes [`Ev::Poison`], which silences follow-on errors.
//!
//! Files, by responsibility:
//! - `mod.rs`: the entry point, kernel selection, the warp heuristic, IR emission;
//! - `spec.rs`: specialization (generics from `-D` values or defaults), parameters;
//! - `scope.rs`: bindings, scopes, "did you mean" suggestions;
//! - `consteval.rs`: compile-time constants and checked folding, typed constants;
//! - `types.rs`: dtype rules (literal adaptation, unification, casts), kind checks;
//! - `shapes.rs`: broadcasting, tile-shape rules, shape builtins and reductions;
//! - `scan.rs`: `cumsum` and the other scans;
//! - `expr.rs`: expressions and operators;
//! - `builtins.rs`: the builtin table, argument matching, value builtins;
//! - `math.rs`: element-wise math (`exp` ... `erf`, `min`/`max`, `maximum`, `where`,
//!   `pow` and `**`, `fma`, `fdiv`, `cdiv`);
//! - `memory.rs`: `load`/`store`/`gather`/`scatter`/`atomic_add`/`dot`;
//! - `stmt.rs`: statements, SSA for `let mut`, loops and ifs;
//! - `functions.rs`: helper functions (`fn`), inlined at each call;
//! - `tests.rs` (valid programs), `tests_errors.rs` (one or more per error code),
//!   `tests_robust.rs` (deep and random ASTs), `tests_values.rs` (constants and the
//!   value builtins: typed constants, float generics, `dtype`, `item`, `**`, ...).

mod builtins;
mod consteval;
mod expr;
mod functions;
mod math;
mod memory;
mod scan;
mod scope;
mod scratch;
mod shapes;
mod spec;
mod stmt;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_functions;
#[cfg(test)]
mod tests_grid_sync;
#[cfg(test)]
mod tests_robust;
#[cfg(test)]
mod tests_scan;
#[cfg(test)]
mod tests_values;
mod types;
mod uniform;

pub(crate) use consteval::{scalar_const, wrap_int};
pub(crate) use scope::{binding_span, Binding};

use crate::abi::Specialization;
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::front::ast;
use crate::ir::{self, Block, Function, InstId, Op, ValueId};
use crate::pipeline::CompileOptions;
use crate::span::Span;
use crate::types::ValueType;
use std::collections::{HashMap, HashSet};

/// The value of an expression during checking.
#[derive(Clone, Debug)]
pub(crate) enum Ev {
    /// A typed IR value.
    Value(ValueId),
    /// An untyped integer constant (literal or compile-time `int`); adapts to context.
    /// Kept within `consteval::INT_MIN..=consteval::INT_MAX` (i64 and u64 bit patterns).
    Int(i128),
    /// An untyped float constant; adapts to float context.
    Float(f64),
    /// A constant bool.
    Bool(bool),
    /// A dtype used as an argument (`zeros([4], f32)`).
    DType(crate::types::DType),
    /// A tensor parameter (index into `Function::params`).
    Tensor(u32),
    /// A scratch buffer (index into `Function::scratch`).
    Scratch(u32),
    /// `[a, b, c]`
    List(Vec<(Ev, Span)>),
    /// The "result" of `store`/`scatter`: no value.
    Unit,
    /// The result of an erroneous expression: reported once, silent afterwards.
    Poison,
}

pub(crate) struct Checker<'a> {
    pub func: Function,
    pub errors: Vec<Diagnostic>,
    /// Innermost last; `scopes[0]` holds generics and parameters.
    pub scopes: Vec<HashMap<String, Binding>>,
    /// The blocks being filled, innermost last.
    pub blocks: Vec<Block>,
    pub opts: &'a CompileOptions,
    /// Largest tile seen (elements), for the warp heuristic.
    pub max_tile: u64,
    /// Generics and parameters whose declaration was rejected: uses are not reported.
    pub poisoned: HashSet<String>,
    /// Current nesting of expressions and blocks being checked (bounded by
    /// [`MAX_NESTING`], so that no AST can overflow the stack).
    pub depth: u32,
    /// The nesting limit was hit (reported once).
    pub too_deep: bool,
    /// The size and span of the kernel's first `cluster_gather` (all must agree).
    pub cluster: Option<(u32, Span)>,
    /// Typed constants: every scalar `Const` the checker emitted (a constant cast to a
    /// dtype, a float generic, `lowest(T)`, a folded operation), with its value.
    /// Operations on them fold (`consteval.rs`), and `pad` / `other` accept them.
    pub typed_consts: HashMap<ValueId, crate::types::Scalar>,
    /// The module's helper functions (`functions.rs`).
    pub functions: Vec<ast::FnDef>,
    /// The functions being inlined, outermost first (recursion is an error).
    pub fn_stack: Vec<String>,
}

/// The deepest nesting of expressions and statement blocks the checker accepts. The
/// `.kg` parser already stops at 256 levels; this bounds ASTs built any other way.
pub const MAX_NESTING: u32 = 512;

/// Checks one kernel of `module` (chosen by `opts.kernel`, else the first) under the
/// compile-time values in `opts`, and lowers it to IR. Reports every independent error.
pub fn lower_kernel(
    module: &ast::Module,
    opts: &CompileOptions,
) -> Result<(ir::Function, Specialization), Diagnostics> {
    let kernel = match &opts.kernel {
        Some(name) => module.kernels.iter().find(|k| &k.name.name == name),
        None => module.kernels.first(),
    };
    let Some(kernel) = kernel else {
        let names: Vec<&str> = module
            .kernels
            .iter()
            .map(|k| k.name.name.as_str())
            .collect();
        let msg = match &opts.kernel {
            Some(n) => format!("no kernel named `{n}` in this file"),
            None => "this file defines no kernel".to_string(),
        };
        let mut d = Diagnostic::unlocated(ErrorCode::NoSuchKernel, msg);
        if !names.is_empty() {
            d = d.with_note(format!("kernels in this file: {}", names.join(", ")));
        }
        return Err(Diagnostics::single(d));
    };
    let mut c = Checker {
        func: Function::new(kernel.name.name.clone(), kernel.name.name.clone()),
        errors: Vec::new(),
        scopes: vec![HashMap::new()],
        blocks: vec![Block::default()],
        opts,
        max_tile: 1,
        poisoned: HashSet::new(),
        depth: 0,
        too_deep: false,
        cluster: None,
        typed_consts: HashMap::new(),
        functions: module.functions.clone(),
        fn_stack: Vec::new(),
    };
    c.check_functions();
    let consts = c.specialize(kernel);
    let tensor_align = c.params(kernel);
    // Only a kernel whose signature checked is lowered: body errors caused by a bad
    // signature would be noise.
    if c.errors.is_empty() {
        c.scopes.push(HashMap::new());
        c.lower_block_stmts(&kernel.body);
        c.scopes.pop();
        if c.errors.is_empty() {
            if let Some(body) = c.blocks.last() {
                let errs = uniform::grid_sync_errors(&c.func, body);
                c.errors.extend(errs);
            }
        }
    }
    let num_warps = match opts.num_warps {
        Some(w) if w == 0 || w > 32 || !w.is_power_of_two() => {
            c.push(Diagnostic::unlocated(
                ErrorCode::BadSpecialization,
                format!("--warps {w}: the warp count must be a power of two from 1 to 32"),
            ));
            1
        }
        Some(w) => w,
        None => match c.blocks.last().map(|b| mma_acc_elems(&c.func, b)) {
            Some(acc) if acc > 0 => {
                let chained = c.blocks.last().map_or(0, |b| chained_mma_warps(&c.func, b));
                mma_warps(acc).max(chained)
            }
            _ => default_warps(c.max_tile),
        },
    };
    if let Some(n) = opts.num_stages.filter(|&n| n == 0 || n > MAX_STAGES) {
        c.push(Diagnostic::unlocated(
            ErrorCode::BadSpecialization,
            format!("--stages {n}: the pipeline depth must be from 1 to {MAX_STAGES}"),
        ));
    }
    if opts.min_blocks_per_sm == Some(0) {
        c.push(Diagnostic::unlocated(
            ErrorCode::BadSpecialization,
            "--min-blocks-per-sm 0: the bound must be at least 1 block".to_string(),
        ));
    }
    if !c.errors.is_empty() {
        // A function called twice reports an error in its body once.
        let mut seen = HashSet::new();
        c.errors.retain(|d| {
            let at = d.labels.first().map(|l| l.span);
            seen.insert((d.code, at, d.message.clone()))
        });
        return Err(Diagnostics(c.errors));
    }
    let spec = Specialization {
        kernel: kernel.name.name.clone(),
        consts,
        num_warps,
        min_blocks_per_sm: opts.min_blocks_per_sm,
        num_stages: opts.num_stages,
        tensor_align,
        no_tma: opts.no_tma,
        ws: opts.ws,
        tma_store: opts.tma_store,
        multicast: opts.multicast,
        pingpong: opts.pingpong,
    };
    c.func.name = spec.entry_name();
    c.func.body = c.blocks.pop().unwrap_or_default();
    Ok((c.func, spec))
}

/// The deepest software pipeline `--stages` may ask for.
pub const MAX_STAGES: u32 = 8;

/// The largest accumulator of a `dot` of the tensor-core kind (f16/bf16 operands, or f32
/// operands with a TF32 `input_precision`, and an f32 accumulator) in `block` and its
/// regions, in elements, counted twice for TF32 (its 32-bit operand fragments take twice
/// the registers and shared memory of 16-bit ones, so it gets twice the warps: a 64 x 64
/// tile on 2 warps took all 255 registers, on 4 warps about 150); 0 when there is none.
fn mma_acc_elems(func: &Function, block: &crate::ir::Block) -> u64 {
    let mut best = 0u64;
    crate::ir::visit_insts(func, vec![block], |op| {
        if let crate::ir::Op::Dot {
            a, acc, precision, ..
        } = op
        {
            let weight = match func.value_type(*a).dtype() {
                crate::types::DType::F16 | crate::types::DType::BF16 => 1,
                crate::types::DType::F32 if precision.is_tf32() => 2,
                _ => 0,
            };
            let ty = func.value_type(*acc);
            if weight > 0 && ty.dtype() == crate::types::DType::F32 {
                let n = crate::ir::shape_of(ty)
                    .iter()
                    .map(|&d| d as u64)
                    .product::<u64>();
                best = best.max(n * weight);
            }
        }
    });
    best
}

/// Warps for a tensor-core kernel: one per 2048 accumulator elements (64 f32 registers
/// of accumulator per thread), 1 to 8 (a 128 x 128 tile: 8 warps, each a 64 x 32 part).
pub(crate) fn mma_warps(acc_elems: u64) -> u32 {
    let w = (acc_elems / 2048).clamp(1, 8) as u32;
    if w.is_power_of_two() {
        w
    } else {
        w.next_power_of_two() / 2
    }
}

/// Warps for a loop of chained tensor-core products (attention: `S = Q·Kᵀ`, then
/// `P·V` from `S`): their accumulators are live together, so [`mma_warps`] of their sum,
/// but no more than keeps 16 rows of the smallest product per warp (the back end puts
/// every warp of a chain along M: `back::ptx::dot_chains`). 0 without a chain.
fn chained_mma_warps(func: &Function, block: &crate::ir::Block) -> u32 {
    let defs = crate::ir::chains::definitions_in(func, block);
    let mut best = 0;
    let mut blocks = vec![block];
    while let Some(b) = blocks.pop() {
        let mut dots: Vec<(crate::ir::InstId, u64, u32)> = Vec::new();
        for &i in &b.insts {
            for r in crate::ir::regions(&func.insts[i].op) {
                blocks.push(r);
            }
            if let crate::ir::Op::Dot { a, acc, .. } = func.insts[i].op {
                let ty = func.value_type(acc);
                let s = crate::ir::shape_of(ty);
                let tc = matches!(
                    func.value_type(a).dtype(),
                    crate::types::DType::F16 | crate::types::DType::BF16
                ) && ty.dtype() == crate::types::DType::F32;
                if tc && s.len() == 2 {
                    dots.push((i, s.iter().map(|&d| d as u64).product(), s[0]));
                }
            }
        }
        let ids: std::collections::HashSet<_> = dots.iter().map(|d| d.0).collect();
        let chained = dots.iter().any(|&(d, _, _)| match func.insts[d].op {
            crate::ir::Op::Dot { a, .. } => crate::ir::chains::producing_dots(func, &defs, a)
                .iter()
                .any(|p| ids.contains(p)),
            _ => false,
        });
        if chained {
            let total: u64 = dots.iter().map(|d| d.1).sum();
            let rows = dots.iter().map(|d| d.2).min().unwrap_or(16);
            let cap = (rows / 16).max(1);
            let cap = if cap.is_power_of_two() {
                cap
            } else {
                cap.next_power_of_two() / 2
            };
            best = best.max(mma_warps(total).min(cap));
        }
    }
    best
}

/// Warps from the largest tile: about 8 elements per thread (tile elements / 256),
/// rounded down to a power of two, 1 to 16 warps.
pub(crate) fn default_warps(max_tile: u64) -> u32 {
    let w = (max_tile / 256).clamp(1, 16) as u32;
    if w.is_power_of_two() {
        w
    } else {
        w.next_power_of_two() / 2
    }
}

impl Checker<'_> {
    /// Records an error at `span`; returns the poison value for the failed expression.
    pub(crate) fn error(&mut self, code: ErrorCode, span: Span, msg: impl Into<String>) -> Ev {
        self.errors.push(Diagnostic::error(code, span, msg));
        Ev::Poison
    }

    /// Records a prepared diagnostic; returns poison.
    pub(crate) fn push(&mut self, d: Diagnostic) -> Ev {
        self.errors.push(d);
        Ev::Poison
    }

    /// Runs `f` one nesting level deeper, or reports `Unsupported` at `span` if the
    /// nesting limit is reached.
    pub(crate) fn nested<T>(&mut self, span: Span, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        if self.depth >= MAX_NESTING {
            if !self.too_deep {
                self.too_deep = true;
                self.push(Diagnostic::error(
                    ErrorCode::Unsupported,
                    span,
                    format!("this nests more than {MAX_NESTING} levels deep"),
                ));
            }
            return None;
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        Some(r)
    }

    /// Appends an instruction to the current block; returns its results.
    pub(crate) fn emit(&mut self, op: Op, types: Vec<ValueType>, span: Span) -> Vec<ValueId> {
        for t in &types {
            if let ValueType::Tile(_, s) = t {
                self.max_tile = self.max_tile.max(s.num_elements());
            }
        }
        let results: Vec<ValueId> = types
            .into_iter()
            .map(|ty| self.func.values.append(ir::Value { ty, name: None }))
            .collect();
        if let (Op::Const(s), [r]) = (&op, results.as_slice()) {
            if matches!(self.ty(*r), ValueType::Scalar(_)) {
                self.typed_consts.insert(*r, *s);
            }
        }
        let id: InstId = self.func.insts.append(ir::Inst {
            op,
            results: results.clone(),
            span,
        });
        if let Some(b) = self.blocks.last_mut() {
            b.insts.push(id);
        }
        results
    }

    /// Emits a one-result instruction.
    pub(crate) fn emit1(&mut self, op: Op, ty: ValueType, span: Span) -> Ev {
        match self.emit(op, vec![ty], span).first() {
            Some(v) => Ev::Value(*v),
            None => Ev::Poison,
        }
    }

    /// Emits a one-result instruction and returns its value id.
    pub(crate) fn emit_v(&mut self, op: Op, ty: ValueType, span: Span) -> Option<ValueId> {
        self.emit(op, vec![ty], span).first().copied()
    }

    /// A fresh value that no instruction defines (a block argument).
    pub(crate) fn new_arg(&mut self, ty: ValueType, name: &str) -> ValueId {
        self.func.values.append(ir::Value {
            ty,
            name: Some(name.to_string()),
        })
    }

    /// The type of a value. Every id the checker holds comes from its own arena; a
    /// missing one (impossible) reads as a `bool` scalar rather than panicking.
    pub(crate) fn ty(&self, v: ValueId) -> ValueType {
        self.func
            .values
            .get(v)
            .map_or(ValueType::Scalar(crate::types::DType::Bool), |x| {
                x.ty.clone()
            })
    }

    /// Names a value after the source variable it is bound to (first name wins).
    pub(crate) fn name_value(&mut self, v: ValueId, name: &str) {
        if v.index() < self.func.values.len() && self.func.values[v].name.is_none() {
            self.func.values[v].name = Some(name.to_string());
        }
    }
}
