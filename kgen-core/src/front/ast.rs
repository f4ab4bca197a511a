//! The abstract syntax tree, with a [`Span`] on every node.
//!
//! Both front ends build this tree: the `.kg` parser (`front::parse`) and the
//! `#[kernel]` proc macro (`kgen-macros`, through `front::ast` directly). One checker
//! (`check`) turns it into tile IR, so the two front ends cannot drift apart.
//!
//! Method-call syntax (`x.sum(1)`, `t.shape(0)`) and the `.dtype` property are desugared
//! by the front ends into a [`ExprKind::Call`] whose first argument is the receiver
//! (`x.dtype` is `dtype(x)`); `method_syntax` records it only for diagnostics.

use crate::span::Span;

/// A parsed file: one or more kernels, and the helper functions they call.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    pub kernels: Vec<Kernel>,
    pub functions: Vec<FnDef>,
}

/// `fn name(a, b) { ...; return e; }`: a helper function, inlined at each call (the
/// checker checks its body once per call, with the call's arguments bound to the
/// parameters, so the parameters take the arguments' kinds, dtypes and shapes, and
/// compile-time arguments stay compile-time). Its body sees only its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FnDef {
    pub name: Ident,
    pub params: Vec<Ident>,
    pub body: Block,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// `kernel name<generics>(params) { body }`
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: Ident,
    pub generics: Vec<GenericParam>,
    pub params: Vec<Param>,
    pub body: Block,
    pub span: Span,
}

/// A compile-time parameter: `BLOCK: int = 1024`, `T: float = bf16`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenericParam {
    pub name: Ident,
    pub kind: GenericKind,
    pub kind_span: Span,
    /// A default value: an integer/bool constant expression, or a dtype name.
    pub default: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenericKind {
    /// A compile-time integer (`int`).
    Int,
    /// A compile-time boolean (`bool`).
    Bool,
    /// Any dtype (`dtype`).
    DType,
    /// A floating-point dtype: f16, bf16 or f32 (`float`).
    Float,
    /// A compile-time value of a float dtype (`EPS: f32 = 1e-5`; f16, bf16 or f32): a
    /// typed constant, rounded to the dtype.
    FloatValue(crate::types::DType),
}

/// A runtime parameter: `x: tensor<T, 2>` or `eps: f32`.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub ty: ParamType,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    /// A scalar passed by value. The dtype may name a generic (`T`).
    Scalar(Ident),
    Tensor(TensorType),
}

/// `tensor<T, 2>`, `tensor<T, [_, D]>`, `tensor<T, 2, contiguous>`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorType {
    /// The element dtype, a builtin name or a generic.
    pub elem: Ident,
    pub dims: TensorDims,
    /// The last dimension has stride 1 (checked at launch), so accesses along it can be
    /// vectorized.
    pub contiguous: bool,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TensorDims {
    /// Only the rank: every extent and stride is a runtime value.
    Rank(u32, Span),
    /// One entry per dimension: `_` (runtime) or a constant expression.
    List(Vec<DimSpec>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum DimSpec {
    Dynamic(Span),
    Const(Expr),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `let x = e;`, `let mut acc: f32 = 0.0;`
    Let {
        name: Ident,
        mutable: bool,
        /// An optional dtype annotation (scalars or tiles: only the dtype is given).
        ty: Option<Ident>,
        value: Expr,
        span: Span,
    },
    /// `let [a, b] = e;` (`let mut [a, b] = e;`): binds the values of a list, such as a
    /// function's `return [x, y];`, one name each.
    LetList {
        names: Vec<Ident>,
        mutable: bool,
        value: Expr,
        span: Span,
    },
    /// `x = e;` and compound forms (`x += e;` is stored as `x = x + e` with `op` set).
    Assign {
        target: Ident,
        op: Option<BinOp>,
        value: Expr,
        span: Span,
    },
    /// An expression evaluated for its effect: `store(y, [i], v);`
    Expr(Expr),
    /// `for i in start..end { }` or `for i in range(start, end, step) { }`
    For {
        var: Ident,
        start: Expr,
        end: Expr,
        step: Option<Expr>,
        body: Block,
        span: Span,
    },
    /// `if c { } else { }`; `else if` nests another `If` inside the else block.
    If {
        cond: Expr,
        then_block: Block,
        else_block: Option<Block>,
        span: Span,
    },
    /// `static_assert(cond, "message");`
    StaticAssert {
        cond: Expr,
        message: Option<String>,
        span: Span,
    },
    /// `return e;`: only as the last statement of a function's body (the checker says
    /// so anywhere else).
    Return { value: Expr, span: Span },
}

impl Stmt {
    pub fn span(&self) -> Span {
        match self {
            Stmt::Let { span, .. }
            | Stmt::LetList { span, .. }
            | Stmt::Assign { span, .. }
            | Stmt::For { span, .. }
            | Stmt::If { span, .. }
            | Stmt::StaticAssert { span, .. }
            | Stmt::Return { span, .. } => *span,
            Stmt::Expr(e) => e.span,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// An integer literal; its dtype comes from context (default i32).
    Int(i128),
    /// A float literal; its dtype comes from context (default f32).
    Float(f64),
    Bool(bool),
    /// A variable, parameter, generic, dtype name, or builtin constant (`inf`, `nan`).
    Name(Ident),
    Unary {
        op: UnOp,
        operand: Box<Expr>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// `f(a, b, name = c)`; also the desugared form of `a.f(b)`.
    Call {
        func: Ident,
        args: Vec<Arg>,
        method_syntax: bool,
    },
    /// `[a, b, c]`: index tuples and shapes.
    List(Vec<Expr>),
    /// `e as f32`
    Cast {
        expr: Box<Expr>,
        dtype: Ident,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// `Some` for keyword arguments: `pad = 0.0`.
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    /// `a ** b` (`.kg` only): binds tighter than every other operator, unary minus
    /// included (`-x ** 2` is `-(x ** 2)`), and groups to the right.
    Pow,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            And => "&&",
            Or => "||",
            BitAnd => "&",
            BitOr => "|",
            BitXor => "^",
            Shl => "<<",
            Shr => ">>",
            Pow => "**",
        }
    }
}
