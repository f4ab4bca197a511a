//! A typed model of the PTX we emit: registers with classes, operands, predicated
//! instructions, labels and comments. Lowering builds these; `writer` is the only
//! code that turns them into text.
//!
//! Guarantees: register names are `%<class><n>` with per-class numbering from 1 in
//! order of allocation, labels are `$L<n>`, so the output is deterministic.

/// Register classes and their PTX declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// `.pred %p`
    Pred,
    /// `.b16 %rs`
    B16,
    /// `.b32 %r`
    B32,
    /// `.b64 %rd`
    B64,
    /// `.f32 %f`
    F32,
    /// `.f64 %fd`
    F64,
}

impl RegClass {
    pub const ALL: [RegClass; 6] = [
        RegClass::Pred,
        RegClass::B16,
        RegClass::B32,
        RegClass::B64,
        RegClass::F32,
        RegClass::F64,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%rs",
            RegClass::B32 => "%r",
            RegClass::B64 => "%rd",
            RegClass::F32 => "%f",
            RegClass::F64 => "%fd",
        }
    }

    pub fn decl_type(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::B64 => ".b64",
            RegClass::F32 => ".f32",
            RegClass::F64 => ".f64",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A virtual register (ptxas allocates the physical ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg {
    pub class: RegClass,
    pub n: u32,
}

/// An operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Reg(Reg),
    /// An integer immediate.
    Imm(i64),
    /// An f32 immediate, printed `0fXXXXXXXX`.
    F32(f32),
    /// An f64 immediate, printed `0dXXXXXXXXXXXXXXXX`.
    F64(f64),
    /// A vector `{%r1, %r2, ...}` (vector loads/stores, `mov` packing).
    Vec(Vec<Reg>),
    /// A memory reference `[base+offset]`.
    Mem(Addr, i64),
    /// A label (branch target).
    Label(u32),
    /// A named symbol: a special register (`%tid.x`) or a parameter/variable name.
    Sym(String),
}

/// The base of a memory reference.
#[derive(Clone, Debug, PartialEq)]
pub enum Addr {
    Reg(Reg),
    Sym(String),
}

impl From<Reg> for Operand {
    fn from(r: Reg) -> Operand {
        Operand::Reg(r)
    }
}

/// One instruction: `@{!}pred opcode operands;`. The opcode carries every modifier
/// (`ld.global.v4.b32`, `cvt.rn.f16.f32`): lowering decides them.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub guard: Option<(Reg, bool)>,
    pub opcode: String,
    pub operands: Vec<Operand>,
}

/// A line of the kernel body.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    Inst(Inst),
    Label(u32),
    Comment(String),
}

/// A `.shared` buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedDecl {
    pub name: String,
    pub align: u32,
    pub bytes: u32,
    /// `.extern .shared ... []`: the size is given at launch (dynamic shared memory).
    pub dynamic: bool,
}

/// One `.param` of the entry.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamDecl {
    pub name: String,
    pub ty: &'static str,
}

/// A whole PTX module with one entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    pub version: (u32, u32),
    pub target: &'static str,
    pub entry: String,
    pub params: Vec<ParamDecl>,
    pub max_ntid: u32,
    /// `.maxnreg`: the registers per thread ptxas may use (kgen's budget for the block
    /// size and `.minnctapersm`).
    pub max_nreg: u32,
    /// `.minnctapersm`: blocks per SM the register allocation must allow.
    pub min_ctas_per_sm: Option<u32>,
    /// Highest register number used per class (index = `RegClass::index`).
    pub reg_counts: [u32; 6],
    pub shared: Option<SharedDecl>,
    /// `(C, slots)`: the entry forms clusters of C blocks (`.reqnctapercluster C, 1, 1`)
    /// and declares `slots` 8-byte slots of `kg_cluster` for `cluster_gather`.
    pub cluster: Option<(u32, u32)>,
    pub body: Vec<Stmt>,
    /// Comment lines printed before the entry.
    pub header_comments: Vec<String>,
}
