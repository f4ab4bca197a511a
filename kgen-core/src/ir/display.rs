//! The IR's stable text form: what `kgen compile --emit ir` prints and what IR snapshots
//! hold.
//!
//! Values are renumbered in order of definition while printing (`%0, %1, ...`), so the
//! text does not depend on arena indices: passes that rebuild or drop values do not
//! churn snapshots. Parameters print by name (`@x`).
//!
//! ```text
//! kernel vec_add__T_f32__BLOCK_1024__w4 (vec_add)
//!   @x: tensor<f32, [?], contiguous, align 16>
//!   @n: i32
//! {
//!   %0: i32 = bid 0
//!   %1: tile<f32, [1024]> = load @x[%0] pad 0.0:f32
//!   store @out[%0], %1
//! }
//! ```

use super::{Block, Function, Op, ParamKind, ValueId};
use std::collections::HashMap;
use std::fmt::{self, Write};

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut p = Printer {
            func: self,
            names: HashMap::new(),
            out: String::new(),
        };
        p.function().map_err(|_| fmt::Error)?;
        f.write_str(&p.out)
    }
}

struct Printer<'a> {
    func: &'a Function,
    names: HashMap<ValueId, usize>,
    out: String,
}

impl Printer<'_> {
    fn function(&mut self) -> fmt::Result {
        let func = self.func;
        writeln!(self.out, "kernel {} ({})", func.name, func.source_name)?;
        for p in &func.params {
            match &p.kind {
                ParamKind::Scalar(d) => writeln!(self.out, "  @{}: {d}", p.name)?,
                ParamKind::Tensor(t) => {
                    let dims: Vec<String> = t
                        .dims
                        .iter()
                        .map(|d| d.map_or("?".to_string(), |n| n.to_string()))
                        .collect();
                    writeln!(
                        self.out,
                        "  @{}: tensor<{}, [{}]{}, align {}>",
                        p.name,
                        t.dtype,
                        dims.join(", "),
                        if t.contiguous { ", contiguous" } else { "" },
                        t.align_bytes
                    )?;
                }
            }
        }
        for (i, b) in func.scratch.iter().enumerate() {
            let shape: Vec<String> = b.slot_shape.iter().map(|d| d.to_string()).collect();
            writeln!(
                self.out,
                "  #{i} {}: {} {} x tile<{}, [{}]>{}",
                b.name,
                if b.shared { "shared" } else { "scratch" },
                b.slots,
                b.dtype,
                shape.join(", "),
                if b.lag > 0 {
                    format!(" (lag {})", b.lag)
                } else {
                    String::new()
                }
            )?;
        }
        writeln!(self.out, "{{")?;
        self.block_body(&func.body, 1)?;
        writeln!(self.out, "}}")
    }

    fn define(&mut self, v: ValueId) -> String {
        let n = self.names.len();
        let n = *self.names.entry(v).or_insert(n);
        format!("%{n}")
    }

    fn use_(&self, v: ValueId) -> String {
        match self.names.get(&v) {
            Some(n) => format!("%{n}"),
            // A use before its definition: invalid IR, printed visibly rather than hidden.
            None => format!("%<undef #{}>", v.index()),
        }
    }

    fn typed_def(&mut self, v: ValueId) -> String {
        let name = self.define(v);
        match self.func.values.get(v) {
            Some(val) => format!("{name}: {}", val.ty),
            None => format!("{name}: <missing>"),
        }
    }

    fn list(&self, vs: &[ValueId]) -> String {
        vs.iter()
            .map(|v| self.use_(*v))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn tensor(&self, index: u32) -> String {
        match self.func.params.get(index as usize) {
            Some(p) => format!("@{}", p.name),
            None => format!("@<param {index}>"),
        }
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn block_body(&mut self, block: &Block, depth: usize) -> fmt::Result {
        for &id in &block.insts {
            let Some(inst) = self.func.insts.get(id) else {
                self.indent(depth);
                writeln!(self.out, "<missing instruction #{}>", id.index())?;
                continue;
            };
            self.indent(depth);
            // Operands are named before results are defined, so `%n` numbering follows
            // definition order.
            let text = self.op_text(&inst.op, depth)?;
            if !inst.results.is_empty() {
                let defs: Vec<String> = inst.results.iter().map(|r| self.typed_def(*r)).collect();
                write!(self.out, "{} = ", defs.join(", "))?;
            }
            self.out.push_str(&text);
            self.out.push('\n');
        }
        Ok(())
    }

    fn region(&mut self, block: &Block, depth: usize) -> Result<String, fmt::Error> {
        // Print the region into a side buffer so it can follow the instruction's head.
        let saved = std::mem::take(&mut self.out);
        let args: Vec<String> = block.args.iter().map(|a| self.typed_def(*a)).collect();
        let mut head = String::from("{\n");
        if !args.is_empty() {
            for _ in 0..depth + 1 {
                head.push_str("  ");
            }
            writeln!(head, "^({}):", args.join(", "))?;
        }
        self.block_body(block, depth + 1)?;
        let body = std::mem::replace(&mut self.out, saved);
        let mut s = head;
        s.push_str(&body);
        for _ in 0..depth {
            s.push_str("  ");
        }
        s.push('}');
        Ok(s)
    }

    fn op_text(&mut self, op: &Op, depth: usize) -> Result<String, fmt::Error> {
        let u = |p: &Self, v: &ValueId| p.use_(*v);
        Ok(match op {
            Op::Const(c) => format!("const {c}"),
            Op::ProgramId(a) => format!("bid {a}"),
            Op::ClusterRank(size) => format!("cluster_rank size {size}"),
            Op::NumPrograms(a) => format!("num_bids {a}"),
            Op::ScalarParam(i) => format!("param {}", self.tensor(*i)),
            Op::TensorDim { tensor, dim } => format!("shape {}, {dim}", self.tensor(*tensor)),
            Op::TensorStride { tensor, dim } => {
                format!("stride {}, {dim}", self.tensor(*tensor))
            }
            Op::Arange { start, end } => format!("arange {start}, {end}"),
            Op::Splat(v) => format!("splat {}", u(self, v)),
            Op::Broadcast(v) => format!("broadcast {}", u(self, v)),
            Op::Reshape(v) => format!("reshape {}", u(self, v)),
            Op::ExpandDims(v, a) => format!("expand_dims {}, {a}", u(self, v)),
            Op::Permute(v, perm) => format!("permute {}, {perm:?}", u(self, v)),
            Op::Unary(o, v) => format!("{} {}", format!("{o:?}").to_lowercase(), u(self, v)),
            Op::Binary(o, a, b) => format!(
                "{} {}, {}",
                format!("{o:?}").to_lowercase(),
                u(self, a),
                u(self, b)
            ),
            Op::Compare(o, a, b) => format!(
                "cmp.{} {}, {}",
                format!("{o:?}").to_lowercase(),
                u(self, a),
                u(self, b)
            ),
            Op::Select(c, a, b) => format!("select {}, {}, {}", u(self, c), u(self, a), u(self, b)),
            Op::Fma(a, b, c) => format!("fma {}, {}, {}", u(self, a), u(self, b), u(self, c)),
            Op::Cast(v) => format!("cast {}", u(self, v)),
            Op::Reduce { op, value, axis } => format!(
                "reduce.{} {}, axis {axis}",
                format!("{op:?}").to_lowercase(),
                u(self, value)
            ),
            Op::Scan {
                op,
                value,
                axis,
                reverse,
                exclusive,
            } => format!(
                "scan.{} {}, axis {axis}{}{}",
                op.name(),
                u(self, value),
                if *reverse { ", reverse" } else { "" },
                if *exclusive { ", exclusive" } else { "" }
            ),
            Op::ScratchLoad { buf, slot } => {
                format!("scratch_load #{buf}[{}]", u(self, slot))
            }
            Op::ScratchFetch {
                buf,
                slot,
                tensor,
                index,
                padding,
                eviction,
            } => format!(
                "scratch_fetch #{buf}[{}], {}[{}] pad {padding}{}",
                u(self, slot),
                self.tensor(*tensor),
                self.list(index),
                eviction_suffix(*eviction)
            ),
            Op::ScratchGather {
                buf,
                slot,
                tensor,
                offsets,
                mask,
                other,
                eviction,
            } => format!(
                "scratch_gather #{buf}[{}], {}[{}]{} other {other}{}",
                u(self, slot),
                self.tensor(*tensor),
                self.list(offsets),
                mask.map_or(String::new(), |m| format!(" mask {}", self.use_(m))),
                eviction_suffix(*eviction)
            ),
            Op::ScratchWait { pending } => format!("scratch_wait {pending}"),
            Op::GridDependency(crate::ir::GridDependency::Wait) => "gdc_wait".into(),
            Op::Barrier => "barrier".into(),
            Op::GridSync { counter } => format!("grid_sync {}[]", self.tensor(*counter)),
            Op::GridDependency(crate::ir::GridDependency::LaunchDependents) => {
                "gdc_launch_dependents".into()
            }
            Op::ScratchStore { buf, slot, value } => {
                format!(
                    "scratch_store #{buf}[{}], {}",
                    u(self, slot),
                    u(self, value)
                )
            }
            Op::ClusterGather { value, size } => {
                format!("cluster_gather {}, size {size}", u(self, value))
            }
            Op::Load {
                tensor,
                index,
                padding,
                eviction,
            } => format!(
                "load {}[{}] pad {padding}{}",
                self.tensor(*tensor),
                self.list(index),
                eviction_suffix(*eviction)
            ),
            Op::Store {
                tensor,
                index,
                value,
                eviction,
            } => format!(
                "store {}[{}], {}{}",
                self.tensor(*tensor),
                self.list(index),
                u(self, value),
                eviction_suffix(*eviction)
            ),
            Op::Gather {
                tensor,
                offsets,
                mask,
                other,
                eviction,
            } => format!(
                "gather {}[{}]{} other {other}{}",
                self.tensor(*tensor),
                self.list(offsets),
                mask.map_or(String::new(), |m| format!(" mask {}", self.use_(m))),
                eviction_suffix(*eviction)
            ),
            Op::Scatter {
                tensor,
                offsets,
                value,
                mask,
                eviction,
            } => format!(
                "scatter {}[{}], {}{}{}",
                self.tensor(*tensor),
                self.list(offsets),
                u(self, value),
                mask.map_or(String::new(), |m| format!(" mask {}", self.use_(m))),
                eviction_suffix(*eviction)
            ),
            Op::AtomicAdd {
                tensor,
                offsets,
                value,
                mask,
            } => format!(
                "atomic_add {}[{}], {}{}",
                self.tensor(*tensor),
                self.list(offsets),
                u(self, value),
                mask.map_or(String::new(), |m| format!(" mask {}", self.use_(m)))
            ),
            Op::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                let p = if precision.is_tf32() {
                    format!(" input_precision {}", precision.name())
                } else {
                    String::new()
                };
                format!("dot {}, {}, {}{p}", u(self, a), u(self, b), u(self, acc))
            }
            Op::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let head = format!(
                    "for {}..{} step {} iter({}) ",
                    u(self, lower),
                    u(self, upper),
                    u(self, step),
                    self.list(inits)
                );
                head + &self.region(body, depth)?
            }
            Op::If {
                cond,
                then_body,
                else_body,
            } => {
                let head = format!("if {} ", u(self, cond));
                let t = self.region(then_body, depth)?;
                let e = self.region(else_body, depth)?;
                format!("{head}{t} else {e}")
            }
            Op::Yield(vs) => format!("yield {}", self.list(vs)),
        })
    }
}

/// ` evict_last` for a load or store with a non-default eviction policy, else nothing.
fn eviction_suffix(e: super::Eviction) -> String {
    if e == super::Eviction::Normal {
        String::new()
    } else {
        format!(" {}", e.name())
    }
}
