//! Element-wise lowering: constants, `arange`, unary/binary math, comparisons, `where`,
//! `fma` and casts, one register at a time.
//!
//! Assumes: operands have the result's layout after `operand_in`. Guarantees: the
//! semantics of `ir::UnaryOp` / `BinaryOp` / `Cast`: float `+ - * /` with explicit `.rn`
//! (never contracted into fma), f16/bf16 computed in f32 and rounded after each
//! operation, no `.ftz` on arithmetic; transcendentals use the approximate hardware
//! instructions (`ex2.approx.ftz.f32` with a multiply by log2(e) for `exp`, `exp2` and
//! `sigmoid`: results below 2^-126 are 0, which saves ptxas's three-instruction subnormal
//! fix-up around every `ex2`; `lg2.approx.f32`, `tanh.approx.f32`, `rsqrt.approx.f32`,
//! `sin/cos.approx.f32`); `erf` is two minimax polynomials (`fma.rn.f32`) and one
//! `ex2.approx` (within 2 ulp); `sqrt.rn.f32`; float→int `cvt.rzi` (saturating, NaN → 0);
//! int→int wraps.

use super::{class_of, unsupported, Lowerer, R};
use crate::back::ptx::isa::{Operand, Reg, RegClass};
use crate::ir::{BinaryOp, CmpOp, Op, UnaryOp, ValueId};
use crate::span::Span;
use crate::types::{DType, Scalar};
use std::collections::HashMap;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN_2: f32 = std::f32::consts::LN_2;

/// `erf(x)` for `|x| < ERF_SPLIT` is `x + x * P(x^2)`, where `P` (these coefficients,
/// lowest degree first) is a minimax fit to `erf(x)/x - 1` over `[0, 1]` in relative
/// error (1.2e-9). `tools/erf_fit.py` derives both tables and checks their f32 evaluation
/// (1.07 ulp at worst with an exact `exp2`; `ex2.approx` adds below 1 ulp).
pub(crate) const ERF_SMALL: [f32; 7] = [
    0.12837917,
    -0.37612626,
    0.112835854,
    -0.026853818,
    0.005188338,
    -0.00080102764,
    7.8541125e-05,
];
/// For `ERF_SPLIT <= |x| <= ERF_CLAMP`, `erfc(|x|) = 2^Q(|x|)`, where `Q` (these
/// coefficients, lowest degree first) is a minimax fit to `log2(erfc(a))` over
/// `[1, 3.92]` in absolute error (6.5e-9); beyond 3.92, `1 - erfc` rounds to 1 in f32.
pub(crate) const ERF_LARGE: [f32; 10] = [
    0.00053879124,
    -1.6309378,
    -0.91082555,
    -0.15960427,
    0.038670138,
    -0.0071154535,
    0.0009334677,
    -7.962822e-05,
    3.7231525e-06,
    -6.0920634e-08,
];
/// Where the two `erf` polynomials meet.
pub(crate) const ERF_SPLIT: f32 = 1.0;
/// `|x|` is clamped here before the second polynomial (which leaves its fitted range
/// only where the result is 1 anyway).
pub(crate) const ERF_CLAMP: f32 = 4.0;

/// The PTX integer type suffix for `dt`.
pub fn int_ty(dt: DType) -> &'static str {
    match dt {
        DType::I32 => "s32",
        DType::U32 => "u32",
        DType::I64 => "s64",
        _ => "b32",
    }
}

impl Lowerer<'_> {
    /// A register holding the constant (its dtype's representation).
    pub fn constant(&mut self, s: Scalar, span: Span) -> R<Reg> {
        Ok(match s {
            Scalar::Bool(b) => self.op1(RegClass::Pred, "mov.pred", vec![Operand::Imm(b as i64)]),
            Scalar::Int(v, dt) => match dt {
                DType::I64 => self.op1(RegClass::B64, "mov.b64", vec![Operand::Imm(v)]),
                DType::I32 | DType::U32 => self.op1(
                    RegClass::B32,
                    "mov.b32",
                    vec![Operand::Imm(v as i32 as i64)],
                ),
                DType::Bool => self.op1(
                    RegClass::Pred,
                    "mov.pred",
                    vec![Operand::Imm((v != 0) as i64)],
                ),
                _ => self.op1(RegClass::F32, "mov.f32", vec![Operand::F32(v as f32)]),
            },
            Scalar::Float(v, dt) => {
                if !dt.is_float() {
                    return Err(unsupported(span, format!("float constant of dtype {dt}")));
                }
                self.op1(RegClass::F32, "mov.f32", vec![Operand::F32(v as f32)])
            }
        })
    }

    pub fn lower_arange(&mut self, res: Option<ValueId>, start: i64, span: Span) -> R<()> {
        let v = res.ok_or_else(|| unsupported(span, "arange without a result"))?;
        let lin = self.lin(v);
        let regs = self.arange_regs(&lin, start);
        self.bind(v, regs);
        Ok(())
    }

    /// The registers of `arange(start, ..)` laid out as `lin` (rank 1).
    pub(super) fn arange_regs(
        &mut self,
        lin: &crate::back::ptx::layout::Linear,
        start: i64,
    ) -> Vec<Reg> {
        let t = self.thread_coord(lin, 0);
        let mut regs = Vec::new();
        for r in 0..lin.num_regs() {
            let k = lin.reg_coord(r).first().copied().unwrap_or(0) as i64 + start;
            let k = k as i32 as i64;
            regs.push(match t {
                Some(t) => self.op1(RegClass::B32, "add.s32", vec![t.into(), Operand::Imm(k)]),
                None => self.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(k)]),
            });
        }
        regs
    }

    pub fn lower_elementwise(&mut self, id: crate::ir::InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "element-wise op without a result"))?;
        let lin = self.lin(res);
        let rdt = self.dtype(res);
        let operands = crate::ir::operands(&inst.op);
        let mut ins = Vec::new();
        for &o in &operands {
            ins.push(self.operand_in(o, &lin, span)?);
        }
        let dts: Vec<DType> = operands.iter().map(|&o| self.dtype(o)).collect();
        if !crate::ir::shape_of(func.value_type(res)).is_empty()
            && operands.iter().all(|&o| self.is_uniform(o))
        {
            self.mark_uniform(res);
        }
        let mut memo: HashMap<Vec<Reg>, Reg> = HashMap::new();
        let mut out = Vec::with_capacity(lin.num_regs());
        for r in 0..lin.num_regs() {
            let args: Vec<Reg> = ins.iter().map(|v| v[r]).collect();
            if let Some(&d) = memo.get(&args) {
                out.push(d);
                continue;
            }
            let d = match &inst.op {
                Op::Unary(op, _) => self.unary(*op, rdt, args[0], span)?,
                Op::Binary(op @ (BinaryOp::Div | BinaryOp::Rem), _, b) if rdt.is_int() => {
                    let divisor = self.known_int(*b);
                    self.int_div_rem(*op, rdt, args[0], args[1], divisor)
                }
                Op::Binary(op, _, _) => self.binary(*op, rdt, args[0], args[1], span)?,
                Op::Compare(op, _, _) => self.compare(*op, dts[0], args[0], args[1], span)?,
                Op::Select(..) => self.select(args[0], args[1], args[2]),
                Op::Fma(..) => self.fma(rdt, args[0], args[1], args[2], span)?,
                Op::Cast(_) => self.cast(args[0], dts[0], rdt, span)?,
                _ => return Err(unsupported(span, "not an element-wise op")),
            };
            memo.insert(args, d);
            out.push(d);
        }
        self.bind(res, out);
        Ok(())
    }

    /// Rounds a widened f32 value to f16/bf16 (identity for other dtypes).
    pub fn round_to(&mut self, x: Reg, dt: DType) -> Reg {
        let opcode = match dt {
            DType::F16 => "cvt.rn.f16.f32",
            DType::BF16 => "cvt.rn.bf16.f32",
            _ => return x,
        };
        let h = self.op1(RegClass::B16, opcode, vec![x.into()]);
        let widened = self.widen_half(h, dt);
        // When `x` was already rounded to this format, the f32 value it was rounded from
        // (rounding again changes nothing); from another format, `x` itself.
        let source = match self.rounded_from.get(&x) {
            Some(&(s, d)) if d == dt => s,
            _ => x,
        };
        self.rounded_from.insert(widened, (source, dt));
        self.halves.insert(widened, h);
        widened
    }

    fn f(&mut self, opcode: &str, ops: Vec<Operand>) -> Reg {
        self.op1(RegClass::F32, opcode, ops)
    }

    pub fn unary(&mut self, op: UnaryOp, dt: DType, a: Reg, span: Span) -> R<Reg> {
        let class = class_of(dt);
        if class == RegClass::Pred {
            return match op {
                UnaryOp::Not => Ok(self.op1(RegClass::Pred, "not.pred", vec![a.into()])),
                _ => Err(unsupported(span, format!("{op:?} on bool"))),
            };
        }
        if dt.is_int() {
            let w = if dt == DType::I64 { "64" } else { "32" };
            return Ok(match op {
                UnaryOp::Neg => self.op1(class, &format!("neg.s{w}"), vec![a.into()]),
                UnaryOp::Not => self.op1(class, &format!("not.b{w}"), vec![a.into()]),
                UnaryOp::Abs if dt == DType::U32 => a,
                UnaryOp::Abs => self.op1(class, &format!("abs.s{w}"), vec![a.into()]),
                UnaryOp::Floor | UnaryOp::Ceil => a,
                _ => return Err(unsupported(span, format!("{op:?} on integer dtype {dt}"))),
            });
        }
        let x: Operand = a.into();
        let r = match op {
            UnaryOp::Neg => return Ok(self.f("neg.f32", vec![x])),
            UnaryOp::Abs => return Ok(self.f("abs.f32", vec![x])),
            UnaryOp::Floor => return Ok(self.f("cvt.rmi.f32.f32", vec![x])),
            UnaryOp::Ceil => return Ok(self.f("cvt.rpi.f32.f32", vec![x])),
            UnaryOp::Not => return Err(unsupported(span, "`!` on a float")),
            UnaryOp::Exp => {
                let t = self.f("mul.rn.f32", vec![x, Operand::F32(LOG2_E)]);
                self.f("ex2.approx.ftz.f32", vec![t.into()])
            }
            UnaryOp::Exp2 => self.f("ex2.approx.ftz.f32", vec![x]),
            UnaryOp::Log => {
                let t = self.f("lg2.approx.f32", vec![x]);
                self.f("mul.rn.f32", vec![t.into(), Operand::F32(LN_2)])
            }
            UnaryOp::Log2 => self.f("lg2.approx.f32", vec![x]),
            UnaryOp::Sqrt => self.f("sqrt.rn.f32", vec![x]),
            UnaryOp::Rsqrt => self.f("rsqrt.approx.f32", vec![x]),
            UnaryOp::Tanh => self.f("tanh.approx.f32", vec![x]),
            UnaryOp::Sigmoid => {
                let t = self.f("mul.rn.f32", vec![x, Operand::F32(-LOG2_E)]);
                let e = self.f("ex2.approx.ftz.f32", vec![t.into()]);
                let d = self.f("add.rn.f32", vec![e.into(), Operand::F32(1.0)]);
                self.f("rcp.approx.ftz.f32", vec![d.into()])
            }
            UnaryOp::Sin => self.f("sin.approx.f32", vec![x]),
            UnaryOp::Cos => self.f("cos.approx.f32", vec![x]),
            UnaryOp::Erf => self.erf(a),
        };
        Ok(self.round_to(r, dt))
    }

    pub fn binary(&mut self, op: BinaryOp, dt: DType, a: Reg, b: Reg, span: Span) -> R<Reg> {
        let class = class_of(dt);
        let (x, y): (Operand, Operand) = (a.into(), b.into());
        if class == RegClass::Pred {
            let opc = match op {
                BinaryOp::And | BinaryOp::Min => "and.pred",
                BinaryOp::Or | BinaryOp::Max => "or.pred",
                BinaryOp::Xor => "xor.pred",
                _ => return Err(unsupported(span, format!("{op:?} on bool"))),
            };
            return Ok(self.op1(class, opc, vec![x, y]));
        }
        if dt.is_int() {
            let t = int_ty(dt);
            let w = if dt == DType::I64 { 64 } else { 32 };
            let opc = match op {
                BinaryOp::Add => format!("add.{t}"),
                BinaryOp::Sub => format!("sub.{t}"),
                BinaryOp::Mul => format!("mul.lo.{t}"),
                BinaryOp::Div => format!("div.{t}"),
                BinaryOp::Rem => format!("rem.{t}"),
                BinaryOp::Min => format!("min.{t}"),
                BinaryOp::Max => format!("max.{t}"),
                BinaryOp::And => format!("and.b{w}"),
                BinaryOp::Or => format!("or.b{w}"),
                BinaryOp::Xor => format!("xor.b{w}"),
                BinaryOp::Shl | BinaryOp::Shr => {
                    let amount = if w == 64 {
                        let c = self.op1(RegClass::B64, "min.u64", vec![y, Operand::Imm(64)]);
                        self.op1(RegClass::B32, "cvt.u32.u64", vec![c.into()])
                    } else {
                        b
                    };
                    let opc = if op == BinaryOp::Shl {
                        format!("shl.b{w}")
                    } else if dt.is_signed_int() {
                        format!("shr.s{w}")
                    } else {
                        format!("shr.u{w}")
                    };
                    return Ok(self.op1(class, &opc, vec![x, amount.into()]));
                }
                BinaryOp::Pow => return Err(unsupported(span, "pow on integers")),
                BinaryOp::FDiv => return Err(unsupported(span, "fdiv on integers")),
            };
            return Ok(self.op1(class, &opc, vec![x, y]));
        }
        let r = match op {
            BinaryOp::Add => self.f("add.rn.f32", vec![x, y]),
            BinaryOp::Sub => self.f("sub.rn.f32", vec![x, y]),
            BinaryOp::Mul => self.f("mul.rn.f32", vec![x, y]),
            BinaryOp::Div => self.f("div.rn.f32", vec![x, y]),
            BinaryOp::FDiv => self.f("div.full.f32", vec![x, y]),
            BinaryOp::Min => return Ok(self.f("min.f32", vec![x, y])),
            BinaryOp::Max => return Ok(self.f("max.f32", vec![x, y])),
            BinaryOp::Rem => self.fmod(a, b),
            BinaryOp::Pow => self.pow(a, b),
            _ => return Err(unsupported(span, format!("{op:?} on float dtype {dt}"))),
        };
        Ok(self.round_to(r, dt))
    }

    /// `fmod(a, b)`: `a - trunc(a / b) * b` in one fma, corrected by `b` when the rounded
    /// quotient overshoots (the sign of the remainder then differs from `a`'s).
    fn fmod(&mut self, a: Reg, b: Reg) -> Reg {
        let q = self.f("div.rn.f32", vec![a.into(), b.into()]);
        let q = self.f("cvt.rzi.f32.f32", vec![q.into()]);
        let nq = self.f("neg.f32", vec![q.into()]);
        let r = self.f("fma.rn.f32", vec![nq.into(), b.into(), a.into()]);
        // Overshoot: r != 0 and sign(r) != sign(a) → r += copysign(|b|, a).
        let prod = self.f("mul.rn.f32", vec![r.into(), a.into()]);
        let bad = self.op1(
            RegClass::Pred,
            "setp.lt.f32",
            vec![prod.into(), Operand::F32(0.0)],
        );
        let ab = self.f("abs.f32", vec![b.into()]);
        let sb = self.f("copysign.f32", vec![a.into(), ab.into()]);
        let fixed = self.f("add.rn.f32", vec![r.into(), sb.into()]);
        self.f("selp.f32", vec![fixed.into(), r.into(), bad.into()])
    }

    /// `pow(a, b)` = `2^(b * log2|a|)` with the sign and special cases of C `powf`:
    /// `b == 0` → 1; negative `a` → NaN unless `b` is an integer (odd `b` flips the sign).
    fn pow(&mut self, a: Reg, b: Reg) -> Reg {
        let aa = self.f("abs.f32", vec![a.into()]);
        let l = self.f("lg2.approx.f32", vec![aa.into()]);
        let t = self.f("mul.rn.f32", vec![b.into(), l.into()]);
        let m = self.f("ex2.approx.f32", vec![t.into()]);
        // Integer-ness and oddness of b.
        let bi = self.f("cvt.rzi.f32.f32", vec![b.into()]);
        let is_int = self.op1(RegClass::Pred, "setp.eq.f32", vec![bi.into(), b.into()]);
        let half = self.f("mul.rn.f32", vec![b.into(), Operand::F32(0.5)]);
        let hi = self.f("cvt.rzi.f32.f32", vec![half.into()]);
        let even = self.op1(RegClass::Pred, "setp.eq.f32", vec![hi.into(), half.into()]);
        let neg_a = self.op1(
            RegClass::Pred,
            "setp.lt.f32",
            vec![a.into(), Operand::F32(0.0)],
        );
        let nm = self.f("neg.f32", vec![m.into()]);
        let odd_neg = self.op1(
            RegClass::Pred,
            "and.pred",
            vec![neg_a.into(), is_int.into()],
        );
        // flip = neg_a && is_int && !even
        let not_even = self.op1(RegClass::Pred, "not.pred", vec![even.into()]);
        let flip2 = self.op1(
            RegClass::Pred,
            "and.pred",
            vec![odd_neg.into(), not_even.into()],
        );
        let s = self.f("selp.f32", vec![nm.into(), m.into(), flip2.into()]);
        let not_int = self.op1(RegClass::Pred, "not.pred", vec![is_int.into()]);
        let nan_case = self.op1(
            RegClass::Pred,
            "and.pred",
            vec![neg_a.into(), not_int.into()],
        );
        let s = self.f(
            "selp.f32",
            vec![Operand::F32(f32::NAN), s.into(), nan_case.into()],
        );
        let b0 = self.op1(
            RegClass::Pred,
            "setp.eq.f32",
            vec![b.into(), Operand::F32(0.0)],
        );
        self.f("selp.f32", vec![Operand::F32(1.0), s.into(), b0.into()])
    }

    /// Horner's scheme with `fma.rn.f32`: `c[0] + x * (c[1] + x * (...))`.
    fn horner(&mut self, coeffs: &[f32], x: Reg) -> Reg {
        let Some((&top, rest)) = coeffs.split_last() else {
            return self.f("mov.f32", vec![Operand::F32(0.0)]);
        };
        let mut acc = self.f("mov.f32", vec![Operand::F32(top)]);
        for &c in rest.iter().rev() {
            acc = self.f("fma.rn.f32", vec![acc.into(), x.into(), Operand::F32(c)]);
        }
        acc
    }

    /// `erf(x)` in f32, branch-free (within 2 ulp, the hardware's `ex2.approx` included):
    /// `x + x * P(x^2)` below [`ERF_SPLIT`] (and for NaN, which the unordered compare sends
    /// there), else `copysign(1 - 2^Q(min(|x|, ERF_CLAMP)), x)`.
    fn erf(&mut self, x: Reg) -> Reg {
        let a = self.f("abs.f32", vec![x.into()]);
        let small = self.op1(
            RegClass::Pred,
            "setp.ltu.f32",
            vec![a.into(), Operand::F32(ERF_SPLIT)],
        );
        let s = self.f("mul.rn.f32", vec![x.into(), x.into()]);
        let p = self.horner(&ERF_SMALL, s);
        let near = self.f("fma.rn.f32", vec![x.into(), p.into(), x.into()]);
        let ac = self.f("min.f32", vec![a.into(), Operand::F32(ERF_CLAMP)]);
        let q = self.horner(&ERF_LARGE, ac);
        let erfc = self.f("ex2.approx.ftz.f32", vec![q.into()]);
        let one_minus = self.f("sub.rn.f32", vec![Operand::F32(1.0), erfc.into()]);
        let far = self.f("copysign.f32", vec![x.into(), one_minus.into()]);
        self.f("selp.f32", vec![near.into(), far.into(), small.into()])
    }

    /// A comparison; `dt` is the operands' dtype. NaN compares unequal (`setp.neu`).
    pub fn compare(&mut self, op: CmpOp, dt: DType, a: Reg, b: Reg, span: Span) -> R<Reg> {
        let (x, y): (Operand, Operand) = (a.into(), b.into());
        let p = RegClass::Pred;
        if dt == DType::Bool {
            let r = match op {
                CmpOp::Eq => {
                    let t = self.op1(p, "xor.pred", vec![x, y]);
                    self.op1(p, "not.pred", vec![t.into()])
                }
                CmpOp::Ne => self.op1(p, "xor.pred", vec![x, y]),
                CmpOp::Lt | CmpOp::Ge => {
                    // a < b  ==  !a && b ; a >= b == !(a < b)
                    let na = self.op1(p, "not.pred", vec![x]);
                    let lt = self.op1(p, "and.pred", vec![na.into(), y]);
                    if op == CmpOp::Lt {
                        lt
                    } else {
                        self.op1(p, "not.pred", vec![lt.into()])
                    }
                }
                CmpOp::Gt | CmpOp::Le => {
                    let nb = self.op1(p, "not.pred", vec![y]);
                    let gt = self.op1(p, "and.pred", vec![x, nb.into()]);
                    if op == CmpOp::Gt {
                        gt
                    } else {
                        self.op1(p, "not.pred", vec![gt.into()])
                    }
                }
            };
            return Ok(r);
        }
        let c = match op {
            CmpOp::Eq => "eq",
            CmpOp::Ne if dt.is_float() => "neu",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        };
        let t = if dt.is_float() {
            "f32"
        } else if dt.is_int() {
            int_ty(dt)
        } else {
            return Err(unsupported(span, format!("comparison of {dt}")));
        };
        Ok(self.op1(p, &format!("setp.{c}.{t}"), vec![x, y]))
    }

    pub fn select(&mut self, c: Reg, a: Reg, b: Reg) -> Reg {
        match a.class {
            RegClass::Pred => {
                let t = self.op1(RegClass::Pred, "and.pred", vec![c.into(), a.into()]);
                let nc = self.op1(RegClass::Pred, "not.pred", vec![c.into()]);
                let u = self.op1(RegClass::Pred, "and.pred", vec![nc.into(), b.into()]);
                self.op1(RegClass::Pred, "or.pred", vec![t.into(), u.into()])
            }
            RegClass::B64 => self.op1(a.class, "selp.b64", vec![a.into(), b.into(), c.into()]),
            RegClass::F32 => self.op1(a.class, "selp.f32", vec![a.into(), b.into(), c.into()]),
            RegClass::B16 => self.op1(a.class, "selp.b16", vec![a.into(), b.into(), c.into()]),
            _ => self.op1(a.class, "selp.b32", vec![a.into(), b.into(), c.into()]),
        }
    }

    pub fn fma(&mut self, dt: DType, a: Reg, b: Reg, c: Reg, span: Span) -> R<Reg> {
        let ops = vec![a.into(), b.into(), c.into()];
        Ok(match dt {
            DType::F32 | DType::F16 | DType::BF16 => {
                let r = self.f("fma.rn.f32", ops);
                self.round_to(r, dt)
            }
            DType::I32 | DType::U32 => self.op1(RegClass::B32, "mad.lo.s32", ops),
            DType::I64 => self.op1(RegClass::B64, "mad.lo.s64", ops),
            DType::Bool => return Err(unsupported(span, "fma on bool")),
        })
    }

    pub fn cast(&mut self, a: Reg, from: DType, to: DType, span: Span) -> R<Reg> {
        use DType::*;
        if from == to {
            return Ok(a);
        }
        Ok(match (from, to) {
            (Bool, I64) => self.op1(
                RegClass::B64,
                "selp.b64",
                vec![Operand::Imm(1), Operand::Imm(0), a.into()],
            ),
            (Bool, I32 | U32) => self.op1(
                RegClass::B32,
                "selp.b32",
                vec![Operand::Imm(1), Operand::Imm(0), a.into()],
            ),
            (Bool, _) => self.f(
                "selp.f32",
                vec![Operand::F32(1.0), Operand::F32(0.0), a.into()],
            ),
            (I32 | U32 | I64, Bool) => {
                let t = int_ty(from);
                self.op1(
                    RegClass::Pred,
                    &format!("setp.ne.{t}"),
                    vec![a.into(), Operand::Imm(0)],
                )
            }
            (_, Bool) => self.op1(
                RegClass::Pred,
                "setp.neu.f32",
                vec![a.into(), Operand::F32(0.0)],
            ),
            (F32 | F16 | BF16, I32 | U32 | I64) => {
                let t = match to {
                    I32 => "s32",
                    U32 => "u32",
                    _ => "s64",
                };
                // NaN → 0 (the hardware gives i64::MIN for NaN → s64).
                let r = self.op1(class_of(to), &format!("cvt.rzi.{t}.f32"), vec![a.into()]);
                let nan = self.op1(RegClass::Pred, "setp.nan.f32", vec![a.into(), a.into()]);
                let zero = self.reg(r.class);
                self.mov(zero, Operand::Imm(0));
                self.select(nan, zero, r)
            }
            (I32 | U32 | I64, F32 | F16 | BF16) => {
                let t = match from {
                    I32 => "s32",
                    U32 => "u32",
                    _ => "s64",
                };
                let f = self.f(&format!("cvt.rn.f32.{t}"), vec![a.into()]);
                self.round_to(f, to)
            }
            (F16 | BF16, F32) => a,
            (F32 | F16 | BF16, F16 | BF16) => self.round_to(a, to),
            (I32, U32) | (U32, I32) => a,
            (I32, I64) => self.op1(RegClass::B64, "cvt.s64.s32", vec![a.into()]),
            (U32, I64) => self.op1(RegClass::B64, "cvt.u64.u32", vec![a.into()]),
            (I64, I32 | U32) => self.op1(RegClass::B32, "cvt.u32.u64", vec![a.into()]),
            _ => return Err(unsupported(span, format!("cast from {from} to {to}"))),
        })
    }
}
