//! IR validation: checks every invariant listed in `ir/mod.rs` and returns facts the back
//! end uses ([`ModuleInfo`]). A back end takes a `&ModuleInfo`, so unvalidated IR cannot
//! be printed.
//!
//! Assumes: nothing (any `Function`, even one built by hand or by a buggy pass).
//! Guarantees on `Ok`: SSA (one definition per value, every use dominated by its
//! definition, regions see their ancestors' values), exact operand types for every op
//! (see `types_of`), tile shapes within limits, `Yield` exactly at the end of each
//! `For`/`If` region with the region's result types. An `Err` is a compiler bug and
//! carries `ErrorCode::InvalidIr` with the span of the offending instruction.

mod rules;

use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::{Block, Function, InstId, Op, ValueId};
use crate::span::Span;
use std::collections::HashSet;

/// Facts about a validated function.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleInfo {
    /// Per parameter (in order): (read, written) for tensors; (false, false) for scalars.
    pub tensor_access: Vec<(bool, bool)>,
    /// 1 + the largest grid axis read by `bid`/`num_bids` (0 when none).
    pub grid_rank: u8,
    /// The largest tile (in elements) of any value.
    pub max_tile_elements: u64,
    /// The function uses atomics.
    pub uses_atomics: bool,
    /// The cluster size of the kernel's `cluster_gather`s (`None`: it has none).
    pub cluster_size: Option<u32>,
    /// Number of instructions reachable from the body.
    pub num_insts: usize,
}

/// Validates `func`. Reports every broken invariant found (not only the first).
pub fn validate(func: &Function) -> Result<ModuleInfo, Diagnostics> {
    let mut v = Validator {
        func,
        defined: HashSet::new(),
        scopes: vec![Vec::new()],
        errors: Vec::new(),
        info: ModuleInfo {
            tensor_access: vec![(false, false); func.params.len()],
            ..ModuleInfo::default()
        },
    };
    for (id, val) in func.values.iter() {
        if let crate::types::ValueType::Tile(_, shape) = &val.ty {
            if let Err(msg) = rules::check_tile_shape(shape) {
                v.error(Span::DUMMY, format!("value #{}: {msg}", id.index()));
            }
            v.info.max_tile_elements = v.info.max_tile_elements.max(shape.num_elements());
        }
    }
    v.block(&func.body, None);
    if v.errors.is_empty() {
        Ok(v.info)
    } else {
        Err(Diagnostics(v.errors))
    }
}

struct Validator<'a> {
    func: &'a Function,
    /// Every value defined so far anywhere (to catch double definitions).
    defined: HashSet<ValueId>,
    /// Values visible in each open region, innermost last.
    scopes: Vec<Vec<ValueId>>,
    errors: Vec<Diagnostic>,
    info: ModuleInfo,
}

/// What a region must end with: the types its `Yield` must produce.
type YieldTypes = Vec<crate::types::ValueType>;

impl Validator<'_> {
    fn error(&mut self, span: Span, msg: impl Into<String>) {
        let msg = msg.into();
        self.errors.push(
            Diagnostic::error(
                ErrorCode::InvalidIr,
                span,
                format!("internal compiler error: invalid IR: {msg}"),
            )
            .with_note("this is a bug in kgen; please report it with the kernel source"),
        );
    }

    fn visible(&self, v: ValueId) -> bool {
        self.scopes.iter().any(|s| s.contains(&v))
    }

    fn define(&mut self, v: ValueId, span: Span) {
        if self.func.values.get(v).is_none() {
            self.error(
                span,
                format!("value #{} is not in the value arena", v.index()),
            );
            return;
        }
        if !self.defined.insert(v) {
            self.error(span, format!("value #{} is defined twice", v.index()));
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.push(v);
        }
    }

    /// Checks a region. `yields`: `Some(types)` for For/If bodies (must end in a Yield
    /// of these types), `None` for the kernel body (must contain no Yield).
    fn block(&mut self, block: &Block, yields: Option<&YieldTypes>) {
        for (i, &id) in block.insts.iter().enumerate() {
            let last = i + 1 == block.insts.len();
            self.inst(id, last, yields);
        }
        if yields.is_some()
            && !block
                .insts
                .last()
                .and_then(|id| self.func.insts.get(*id))
                .is_some_and(|inst| matches!(inst.op, Op::Yield(_)))
        {
            self.error(Span::DUMMY, "region does not end with `yield`");
        }
    }

    fn inst(&mut self, id: InstId, last: bool, yields: Option<&YieldTypes>) {
        let func = self.func;
        let Some(inst) = func.insts.get(id) else {
            self.error(
                Span::DUMMY,
                format!("instruction #{} does not exist", id.index()),
            );
            return;
        };
        self.info.num_insts += 1;
        let span = inst.span;
        for operand in crate::ir::operands(&inst.op) {
            if !self.visible(operand) {
                self.error(
                    span,
                    format!("operand #{} is used before its definition", operand.index()),
                );
                return;
            }
        }
        self.record_facts(&inst.op);
        match &inst.op {
            Op::Yield(vals) => {
                let Some(expected) = yields.filter(|_| last) else {
                    self.error(span, "`yield` outside the end of a for/if region");
                    return;
                };
                let got: Vec<_> = vals.iter().map(|v| func.values[*v].ty.clone()).collect();
                if &got != expected {
                    self.error(
                        span,
                        format!("yield types {got:?} differ from {expected:?}"),
                    );
                }
            }
            Op::For { inits, body, .. } => {
                let result_types: YieldTypes = inst
                    .results
                    .iter()
                    .filter_map(|r| func.values.get(*r))
                    .map(|v| v.ty.clone())
                    .collect();
                self.region(body, &result_types, span, |v, args| {
                    let init_types: Vec<_> =
                        inits.iter().map(|i| v.func.values[*i].ty.clone()).collect();
                    let arg_types: Vec<_> = args
                        .iter()
                        .filter_map(|a| v.func.values.get(*a))
                        .map(|x| x.ty.clone())
                        .collect();
                    if arg_types.first()
                        != Some(&crate::types::ValueType::Scalar(crate::types::DType::I32))
                    {
                        return Err(
                            "loop body's first argument must be the i32 induction variable".into(),
                        );
                    }
                    if arg_types[1..] != init_types[..] || init_types != result_types {
                        return Err(
                            "loop-carried types differ between inits, body arguments and results"
                                .into(),
                        );
                    }
                    Ok(())
                });
            }
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                let result_types: YieldTypes = inst
                    .results
                    .iter()
                    .filter_map(|r| func.values.get(*r))
                    .map(|v| v.ty.clone())
                    .collect();
                for body in [then_body, else_body] {
                    self.region(body, &result_types, span, |_, args| {
                        if args.is_empty() {
                            Ok(())
                        } else {
                            Err("if regions take no arguments".into())
                        }
                    });
                }
            }
            _ => {}
        }
        if let Err(msg) = rules::check_types(func, &inst.op, &inst.results) {
            self.error(span, msg);
        }
        for &r in &inst.results {
            self.define(r, span);
        }
    }

    fn region(
        &mut self,
        body: &Block,
        result_types: &YieldTypes,
        span: Span,
        check_args: impl FnOnce(&Self, &[ValueId]) -> Result<(), String>,
    ) {
        if let Err(msg) = check_args(self, &body.args) {
            self.error(span, msg);
        }
        self.scopes.push(Vec::new());
        for &a in &body.args {
            self.define(a, span);
        }
        self.block(body, Some(result_types));
        self.scopes.pop();
    }

    fn record_facts(&mut self, op: &Op) {
        let mut mark = |t: &u32, read: bool, write: bool| {
            if let Some(acc) = self.info.tensor_access.get_mut(*t as usize) {
                acc.0 |= read;
                acc.1 |= write;
            }
        };
        match op {
            Op::Load { tensor, .. }
            | Op::Gather { tensor, .. }
            | Op::ScratchFetch { tensor, .. }
            | Op::ScratchGather { tensor, .. } => mark(tensor, true, false),
            Op::Store { tensor, .. } | Op::Scatter { tensor, .. } => mark(tensor, false, true),
            Op::AtomicAdd { tensor, .. } => {
                mark(tensor, true, true);
                self.info.uses_atomics = true;
            }
            Op::GridSync { counter } => {
                mark(counter, true, true);
                self.info.uses_atomics = true;
            }
            Op::ProgramId(a) | Op::NumPrograms(a) => {
                self.info.grid_rank = self.info.grid_rank.max(a.saturating_add(1));
            }
            Op::ClusterGather { size, .. } | Op::ClusterRank(size) => {
                match self.info.cluster_size {
                    Some(c) if c != *size => self.error(
                        Span::DUMMY,
                        format!("cluster sizes differ within the kernel: {c} and {size}"),
                    ),
                    _ => self.info.cluster_size = Some(*size),
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
