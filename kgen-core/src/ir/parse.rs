//! Reading the IR's text form (`ir/display.rs`, what `kgen compile --emit ir` prints and
//! the IR snapshots hold) back into a [`Function`], so a pass can be tested alone: IR
//! text in, the pass, IR text out (Cranelift's filetests; `passes/tests_text.rs`).
//!
//! Assumes: text in the printer's form (the grammar is `ir/text.pest`): values `%n`
//! defined before use, with their types at the definition; parameters `@name` and
//! buffers `#n` declared in the header.
//! Guarantees: `parse(&f.to_string())` prints back to the same text for every function
//! the printer prints (spans are `Span::DUMMY`, value names are not kept: the text does
//! not hold them); any other input is an [`IrParseError`] with its line, never a
//! panic. The result is not validated: run `valid::validate` on it like on any IR.

use super::{
    BinaryOp, Block, CmpOp, Eviction, Function, InputPrecision, Op, Param, ParamKind, ReduceOp,
    ScanOp, ScratchBuf, TensorParam, UnaryOp, Value, ValueId,
};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType};
use pest::iterators::Pair;
use pest::Parser as _;
use pest_derive::Parser;
use std::collections::HashMap;

#[derive(Parser)]
#[grammar = "ir/text.pest"]
struct IrText;

/// Text that is not IR in the printer's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("IR text, line {line}: {message}")]
pub struct IrParseError {
    pub line: usize,
    pub message: String,
}

type R<T> = Result<T, IrParseError>;

fn err<T>(p: &Pair<'_, Rule>, message: impl Into<String>) -> R<T> {
    Err(IrParseError {
        line: p.as_span().start_pos().line_col().0,
        message: message.into(),
    })
}

/// Parses IR text into a function (module docs).
pub fn parse(text: &str) -> R<Function> {
    let mut pairs = IrText::parse(Rule::module, text).map_err(|e| IrParseError {
        line: match e.line_col {
            pest::error::LineColLocation::Pos((l, _))
            | pest::error::LineColLocation::Span((l, _), _) => l,
        },
        message: e.variant.message().to_string(),
    })?;
    let module = pairs.next().ok_or_else(|| IrParseError {
        line: 1,
        message: "empty input".into(),
    })?;
    let mut r = Reader {
        func: Function::new("", ""),
        values: HashMap::new(),
    };
    let mut body = Block::default();
    for p in module.into_inner() {
        match p.as_rule() {
            Rule::header => {
                let mut it = p.into_inner();
                r.func.name = it
                    .next()
                    .map(|x| x.as_str().to_string())
                    .unwrap_or_default();
                r.func.source_name = it
                    .next()
                    .map(|x| x.as_str().to_string())
                    .unwrap_or_default();
            }
            Rule::param_decl => r.param(p)?,
            Rule::scratch_decl => r.scratch(p)?,
            Rule::inst => r.inst(p, &mut body)?,
            _ => {}
        }
    }
    r.func.body = body;
    Ok(r.func)
}

struct Reader {
    func: Function,
    /// `%n` → the value it names.
    values: HashMap<String, ValueId>,
}

/// An operand of a generic op, in order.
#[derive(Debug)]
enum Item {
    Value(ValueId),
    Tensor(u32),
    Indexed(Target, Vec<ListItem>),
    List(Vec<ListItem>),
    Scalar(Scalar),
    Int(i64),
    Word(String),
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Tensor(u32),
    Buf(u32),
}

#[derive(Debug, Clone, Copy)]
enum ListItem {
    Value(ValueId),
    Int(i64),
}

fn dtype(p: &Pair<'_, Rule>) -> R<DType> {
    DType::from_name(p.as_str())
        .map_or_else(|| err(p, format!("unknown dtype `{}`", p.as_str())), Ok)
}

fn int<T: TryFrom<i64>>(p: &Pair<'_, Rule>) -> R<T> {
    p.as_str()
        .parse::<i64>()
        .ok()
        .and_then(|v| T::try_from(v).ok())
        .map_or_else(|| err(p, format!("`{}` is out of range", p.as_str())), Ok)
}

fn shape(p: Pair<'_, Rule>) -> R<Vec<u32>> {
    p.into_inner().map(|d| int::<u32>(&d)).collect()
}

fn scalar(p: &Pair<'_, Rule>) -> R<Scalar> {
    let s = p.as_str();
    match s {
        "true" => return Ok(Scalar::Bool(true)),
        "false" => return Ok(Scalar::Bool(false)),
        _ => {}
    }
    let Some((v, d)) = s.rsplit_once(':') else {
        return err(p, format!("`{s}` is not a constant"));
    };
    let Some(d) = DType::from_name(d) else {
        return err(p, format!("unknown dtype `{d}`"));
    };
    if d.is_float() {
        let x = match v {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            _ => match v.parse::<f64>() {
                Ok(x) => x,
                Err(_) => return err(p, format!("`{v}` is not a number")),
            },
        };
        Ok(Scalar::Float(x, d))
    } else if d == DType::Bool {
        Ok(Scalar::Bool(v == "true"))
    } else {
        match v.parse::<i64>() {
            Ok(x) => Ok(Scalar::Int(x, d)),
            Err(_) => err(p, format!("`{v}` is not an integer")),
        }
    }
}

fn value_type(p: Pair<'_, Rule>) -> R<ValueType> {
    match p.as_rule() {
        Rule::tile_ty => {
            let mut it = p.into_inner();
            let (Some(d), Some(s)) = (it.next(), it.next()) else {
                return Err(IrParseError {
                    line: 0,
                    message: "a tile type needs a dtype and a shape".into(),
                });
            };
            Ok(ValueType::Tile(dtype(&d)?, Shape(shape(s)?)))
        }
        _ => Ok(ValueType::Scalar(dtype(&p)?)),
    }
}

/// Looks `name` up among `all`'s lower-case `Debug` names.
fn by_debug_name<T: Copy + std::fmt::Debug>(all: &[T], name: &str) -> Option<T> {
    all.iter()
        .copied()
        .find(|x| format!("{x:?}").to_lowercase() == name)
}

const UNARY: &[UnaryOp] = &[
    UnaryOp::Neg,
    UnaryOp::Not,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Exp2,
    UnaryOp::Log,
    UnaryOp::Log2,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Erf,
];
const BINARY: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Min,
    BinaryOp::Max,
    BinaryOp::And,
    BinaryOp::Or,
    BinaryOp::Xor,
    BinaryOp::Shl,
    BinaryOp::Shr,
    BinaryOp::Pow,
    BinaryOp::FDiv,
];
const CMP: &[CmpOp] = &[
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];
const REDUCE: &[ReduceOp] = &[
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
];

impl Reader {
    fn param(&mut self, p: Pair<'_, Rule>) -> R<()> {
        let mut it = p.into_inner();
        let (Some(name), Some(ty)) = (it.next(), it.next()) else {
            return Ok(());
        };
        let kind = match ty.as_rule() {
            Rule::tensor_ty => {
                let mut t = TensorParam {
                    dtype: DType::F32,
                    dims: Vec::new(),
                    contiguous: false,
                    align_bytes: 16,
                };
                for x in ty.into_inner() {
                    match x.as_rule() {
                        Rule::dtype => t.dtype = dtype(&x)?,
                        Rule::dim if x.as_str() == "?" => t.dims.push(None),
                        Rule::dim => t.dims.push(Some(int::<u32>(&x)?)),
                        Rule::contiguous => t.contiguous = true,
                        Rule::int => t.align_bytes = int::<u32>(&x)?,
                        _ => {}
                    }
                }
                ParamKind::Tensor(t)
            }
            _ => ParamKind::Scalar(dtype(&ty)?),
        };
        self.func.params.push(Param {
            name: name.as_str().to_string(),
            kind,
        });
        Ok(())
    }

    fn scratch(&mut self, p: Pair<'_, Rule>) -> R<()> {
        let line = p.clone();
        let mut it = p.into_inner();
        let (Some(idx), Some(name), Some(kind), Some(slots), Some(dt), Some(shp)) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            return err(
                &line,
                "a buffer declaration is `#n name: shared|scratch S x tile<T, [..]>`",
            );
        };
        if int::<usize>(&idx)? != self.func.scratch.len() {
            return err(&idx, "buffers are declared in order from #0");
        }
        let lag = match it.next() {
            Some(l) => l.into_inner().next().map_or(Ok(0), |x| int::<u32>(&x))?,
            None => 0,
        };
        self.func.scratch.push(ScratchBuf {
            name: name.as_str().to_string(),
            dtype: dtype(&dt)?,
            slots: int::<u32>(&slots)?,
            slot_shape: shape(shp)?,
            span: Span::DUMMY,
            shared: kind.as_str() == "shared",
            lag,
        });
        Ok(())
    }

    fn define(&mut self, p: Pair<'_, Rule>) -> R<ValueId> {
        let mut it = p.into_inner();
        let (Some(v), Some(t)) = (it.next(), it.next()) else {
            return Err(IrParseError {
                line: 0,
                message: "a definition is `%n: type`".into(),
            });
        };
        if self.values.contains_key(v.as_str()) {
            return err(&v, format!("`{}` is defined twice", v.as_str()));
        }
        let ty = value_type(t)?;
        let id = self.func.values.append(Value { ty, name: None });
        self.values.insert(v.as_str().to_string(), id);
        Ok(id)
    }

    fn use_(&self, p: &Pair<'_, Rule>) -> R<ValueId> {
        self.values.get(p.as_str()).copied().map_or_else(
            || err(p, format!("`{}` is used before it is defined", p.as_str())),
            Ok,
        )
    }

    fn tensor(&self, p: &Pair<'_, Rule>) -> R<u32> {
        let name = p.as_str().trim_start_matches('@');
        self.func
            .params
            .iter()
            .position(|x| x.name == name)
            .map(|i| i as u32)
            .map_or_else(|| err(p, format!("no parameter `@{name}`")), Ok)
    }

    fn list(&self, p: Pair<'_, Rule>) -> R<Vec<ListItem>> {
        p.into_inner()
            .map(|x| match x.as_rule() {
                Rule::value => self.use_(&x).map(ListItem::Value),
                _ => int::<i64>(&x).map(ListItem::Int),
            })
            .collect()
    }

    fn region(&mut self, p: Pair<'_, Rule>) -> R<Block> {
        let mut b = Block::default();
        for x in p.into_inner() {
            match x.as_rule() {
                Rule::region_args => {
                    for d in x.into_inner() {
                        let v = self.define(d)?;
                        b.args.push(v);
                    }
                }
                Rule::inst => self.inst(x, &mut b)?,
                _ => {}
            }
        }
        Ok(b)
    }

    fn inst(&mut self, p: Pair<'_, Rule>, block: &mut Block) -> R<()> {
        let mut defs: Vec<Pair<'_, Rule>> = Vec::new();
        let mut op = None;
        for x in p.into_inner() {
            match x.as_rule() {
                Rule::defs => defs = x.into_inner().collect(),
                _ => op = Some(x),
            }
        }
        let Some(op) = op else {
            return Ok(());
        };
        // Operands (and regions) first: a region may not use this instruction's results.
        let op = self.op(op)?;
        let mut results = Vec::with_capacity(defs.len());
        for d in defs {
            results.push(self.define(d)?);
        }
        let id = self.func.insts.append(super::Inst {
            op,
            results,
            span: Span::DUMMY,
        });
        block.insts.push(id);
        Ok(())
    }

    fn op(&mut self, p: Pair<'_, Rule>) -> R<Op> {
        match p.as_rule() {
            Rule::for_op => {
                let line = p.clone();
                let mut it = p.into_inner();
                let (Some(lo), Some(hi), Some(st), Some(inits), Some(body)) =
                    (it.next(), it.next(), it.next(), it.next(), it.next())
                else {
                    return err(&line, "`for %lo..%hi step %s iter(..) { .. }`");
                };
                let inits = inits
                    .into_inner()
                    .map(|v| self.use_(&v))
                    .collect::<R<Vec<_>>>()?;
                Ok(Op::For {
                    lower: self.use_(&lo)?,
                    upper: self.use_(&hi)?,
                    step: self.use_(&st)?,
                    inits,
                    body: self.region(body)?,
                })
            }
            Rule::if_op => {
                let line = p.clone();
                let mut it = p.into_inner();
                let (Some(c), Some(t), Some(e)) = (it.next(), it.next(), it.next()) else {
                    return err(&line, "`if %c { .. } else { .. }`");
                };
                let cond = self.use_(&c)?;
                Ok(Op::If {
                    cond,
                    then_body: self.region(t)?,
                    else_body: self.region(e)?,
                })
            }
            _ => self.generic(p),
        }
    }

    fn generic(&mut self, p: Pair<'_, Rule>) -> R<Op> {
        let line = p.clone();
        let mut it = p.into_inner();
        let Some(m) = it.next() else {
            return err(&line, "an instruction needs a mnemonic");
        };
        let mut items = Vec::new();
        for x in it {
            items.push(match x.as_rule() {
                Rule::value => Item::Value(self.use_(&x)?),
                Rule::tensor_ref => Item::Tensor(self.tensor(&x)?),
                Rule::indexed => {
                    let mut parts = x.into_inner();
                    let (Some(t), Some(l)) = (parts.next(), parts.next()) else {
                        return err(&line, "an indexed operand is `@t[..]` or `#n[..]`");
                    };
                    let target = match t.as_rule() {
                        Rule::buf_ref => match t.into_inner().next() {
                            Some(n) => Target::Buf(int::<u32>(&n)?),
                            None => return err(&line, "a buffer is `#n`"),
                        },
                        _ => Target::Tensor(self.tensor(&t)?),
                    };
                    Item::Indexed(target, self.list(l)?)
                }
                Rule::list => Item::List(self.list(x)?),
                Rule::scalar => Item::Scalar(scalar(&x)?),
                Rule::int => Item::Int(int::<i64>(&x)?),
                _ => Item::Word(x.as_str().to_string()),
            });
        }
        build(m.as_str(), items)
            .map_or_else(|why| err(&line, format!("`{}`: {why}", m.as_str())), Ok)
    }
}

/// The op a generic instruction spells (its operands in printed order).
fn build(m: &str, items: Vec<Item>) -> Result<Op, String> {
    let mut vals = Vec::new();
    let mut ints = Vec::new();
    let mut scalars = Vec::new();
    let mut words = Vec::new();
    let mut indexed = Vec::new();
    let mut lists = Vec::new();
    let mut tensors = Vec::new();
    // A value right after `mask` is the mask.
    let mut mask = None;
    let mut after_mask = false;
    for it in items {
        match it {
            Item::Value(v) if after_mask => {
                mask = Some(v);
                after_mask = false;
            }
            Item::Value(v) => vals.push(v),
            Item::Int(i) => ints.push(i),
            Item::Scalar(s) => scalars.push(s),
            Item::Word(w) => {
                after_mask = w == "mask";
                words.push(w);
            }
            Item::Indexed(t, l) => indexed.push((t, l)),
            Item::List(l) => lists.push(l),
            Item::Tensor(t) => tensors.push(t),
        }
    }
    let v = |i: usize| vals.get(i).copied().ok_or("too few operands");
    let n = |i: usize| ints.get(i).copied().ok_or("a number is missing");
    let u8_ = |i: usize| n(i).and_then(|x| u8::try_from(x).map_err(|_| "out of range"));
    let u32_ = |i: usize| n(i).and_then(|x| u32::try_from(x).map_err(|_| "out of range"));
    let tensor = |i: usize| tensors.get(i).copied().ok_or("a parameter is missing");
    let eviction = || {
        words
            .iter()
            .find_map(|w| Eviction::from_name(w))
            .unwrap_or(Eviction::Normal)
    };
    let has = |w: &str| words.iter().any(|x| x == w);
    let index_values = |l: &[ListItem]| -> Result<Vec<ValueId>, &'static str> {
        l.iter()
            .map(|x| match x {
                ListItem::Value(v) => Ok(*v),
                ListItem::Int(_) => Err("an index is a value"),
            })
            .collect()
    };
    // The indexed operand `k` as a tensor access, or as a buffer slot.
    let tensor_at = |k: usize| -> Result<(u32, Vec<ValueId>), &'static str> {
        match indexed.get(k) {
            Some((Target::Tensor(t), l)) => Ok((*t, index_values(l)?)),
            _ => Err("a tensor access `@t[..]` is missing"),
        }
    };
    let buf_at = |k: usize| -> Result<(u32, ValueId), &'static str> {
        match indexed.get(k) {
            Some((Target::Buf(b), l)) => match index_values(l)?.as_slice() {
                [s] => Ok((*b, *s)),
                _ => Err("a slot is one value"),
            },
            _ => Err("a buffer slot `#n[..]` is missing"),
        }
    };
    let scalar0 = || scalars.first().copied().ok_or("a constant is missing");
    if let Some(name) = m.strip_prefix("cmp.") {
        let op = by_debug_name(CMP, name).ok_or("unknown comparison")?;
        return Ok(Op::Compare(op, v(0)?, v(1)?));
    }
    if let Some(name) = m.strip_prefix("reduce.") {
        let op = by_debug_name(REDUCE, name).ok_or("unknown reduction")?;
        return Ok(Op::Reduce {
            op,
            value: v(0)?,
            axis: u8_(0)?,
        });
    }
    if let Some(name) = m.strip_prefix("scan.") {
        let op = ScanOp::from_name(name).ok_or("unknown scan")?;
        return Ok(Op::Scan {
            op,
            value: v(0)?,
            axis: u8_(0)?,
            reverse: has("reverse"),
            exclusive: has("exclusive"),
        });
    }
    if let Some(op) = by_debug_name(UNARY, m) {
        return Ok(Op::Unary(op, v(0)?));
    }
    if let Some(op) = by_debug_name(BINARY, m) {
        return Ok(Op::Binary(op, v(0)?, v(1)?));
    }
    Ok(match m {
        "const" => Op::Const(scalar0()?),
        "bid" => Op::ProgramId(u8_(0)?),
        "num_bids" => Op::NumPrograms(u8_(0)?),
        "cluster_rank" => Op::ClusterRank(u32_(0)?),
        "param" => Op::ScalarParam(tensor(0)?),
        "shape" => Op::TensorDim {
            tensor: tensor(0)?,
            dim: u8_(0)?,
        },
        "stride" => Op::TensorStride {
            tensor: tensor(0)?,
            dim: u8_(0)?,
        },
        "arange" => Op::Arange {
            start: n(0)?,
            end: n(1)?,
        },
        "splat" => Op::Splat(v(0)?),
        "broadcast" => Op::Broadcast(v(0)?),
        "reshape" => Op::Reshape(v(0)?),
        "expand_dims" => Op::ExpandDims(v(0)?, u8_(0)?),
        "permute" => {
            let perm = lists
                .first()
                .ok_or("a permutation `[..]` is missing")?
                .iter()
                .map(|x| match x {
                    ListItem::Int(i) => u8::try_from(*i).map_err(|_| "out of range"),
                    ListItem::Value(_) => Err("a permutation holds numbers"),
                })
                .collect::<Result<Vec<u8>, _>>()?;
            Op::Permute(v(0)?, perm)
        }
        "select" => Op::Select(v(0)?, v(1)?, v(2)?),
        "fma" => Op::Fma(v(0)?, v(1)?, v(2)?),
        "cast" => Op::Cast(v(0)?),
        "scratch_load" => {
            let (buf, slot) = buf_at(0)?;
            Op::ScratchLoad { buf, slot }
        }
        "scratch_store" => {
            let (buf, slot) = buf_at(0)?;
            Op::ScratchStore {
                buf,
                slot,
                value: v(0)?,
            }
        }
        "scratch_fetch" => {
            let (buf, slot) = buf_at(0)?;
            let (tensor, index) = tensor_at(1)?;
            Op::ScratchFetch {
                buf,
                slot,
                tensor,
                index,
                padding: scalar0()?,
                eviction: eviction(),
            }
        }
        "scratch_gather" => {
            let (buf, slot) = buf_at(0)?;
            let (tensor, offsets) = tensor_at(1)?;
            Op::ScratchGather {
                buf,
                slot,
                tensor,
                offsets,
                mask,
                other: scalar0()?,
                eviction: eviction(),
            }
        }
        "scratch_wait" => Op::ScratchWait { pending: u32_(0)? },
        "gdc_wait" => Op::GridDependency(super::GridDependency::Wait),
        "gdc_launch_dependents" => Op::GridDependency(super::GridDependency::LaunchDependents),
        "barrier" => Op::Barrier,
        "grid_sync" => {
            let (counter, index) = tensor_at(0)?;
            if !index.is_empty() {
                return Err("grid_sync takes its counter as `@t[]`".into());
            }
            Op::GridSync { counter }
        }
        "cluster_gather" => Op::ClusterGather {
            value: v(0)?,
            size: u32_(0)?,
        },
        "load" => {
            let (tensor, index) = tensor_at(0)?;
            Op::Load {
                tensor,
                index,
                padding: scalar0()?,
                eviction: eviction(),
            }
        }
        "store" => {
            let (tensor, index) = tensor_at(0)?;
            Op::Store {
                tensor,
                index,
                value: v(0)?,
                eviction: eviction(),
            }
        }
        "gather" => {
            let (tensor, offsets) = tensor_at(0)?;
            Op::Gather {
                tensor,
                offsets,
                mask,
                other: scalar0()?,
                eviction: eviction(),
            }
        }
        "scatter" => {
            let (tensor, offsets) = tensor_at(0)?;
            Op::Scatter {
                tensor,
                offsets,
                value: v(0)?,
                mask,
                eviction: eviction(),
            }
        }
        "atomic_add" => {
            let (tensor, offsets) = tensor_at(0)?;
            Op::AtomicAdd {
                tensor,
                offsets,
                value: v(0)?,
                mask,
            }
        }
        "dot" => {
            let precision = match words.iter().position(|w| w == "input_precision") {
                Some(i) => words
                    .get(i + 1)
                    .and_then(|w| InputPrecision::from_name(w))
                    .ok_or("unknown input precision")?,
                None => InputPrecision::Ieee,
            };
            Op::Dot {
                a: v(0)?,
                b: v(1)?,
                acc: v(2)?,
                precision,
            }
        }
        "yield" => Op::Yield(vals.clone()),
        _ => return Err("unknown instruction".into()),
    })
}
