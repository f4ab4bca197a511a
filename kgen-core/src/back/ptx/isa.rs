//! A typed model of the PTX we emit: registers with classes, operands, predicated
//! instructions, labels and comments. Lowering builds these; `writer` is the only
//! code that turns them into text.
//!
//! Each instruction has an opcode *type* ([`Family`]: its effects and its operand roles)
//! and explicit [`Inst::defs`] / [`Inst::uses`] register lists, filled when it is built.
//! Passes over the lowered body (dead code, the data-dependent barrier, any later
//! scheduling) read those, never the opcode text, which only the printer reads.
//!
//! Guarantees: register names are `%<class><n>` with per-class numbering from 1 in
//! order of allocation, labels are `$L<n>`, so the output is deterministic; an opcode
//! the family table does not know is `Family::Unknown`, which has every effect (never
//! removed or moved), and a test checks that no bundled kernel emits one.

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
    /// A tensor-map reference with its coordinates, innermost first: `[%rd1, {%r1,
    /// %r2}]` (`cp.async.bulk.tensor`).
    TensorCoords(Reg, Vec<Reg>),
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

/// A state space of a memory instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    Global,
    Shared,
    /// `shared::cluster` (distributed shared memory, sm_90).
    SharedCluster,
    Param,
    Local,
    Const,
    /// No space named: a generic address.
    Generic,
}

impl Space {
    fn parse(segment: Option<&str>) -> Space {
        match segment {
            Some("global") => Space::Global,
            Some("shared") | Some("shared::cta") => Space::Shared,
            Some("shared::cluster") => Space::SharedCluster,
            Some("param") => Space::Param,
            Some("local") => Space::Local,
            Some("const") => Space::Const,
            _ => Space::Generic,
        }
    }
}

/// The instruction families kgen emits: the opcode's *type*. The modifiers (`.rn.f32`,
/// `.v4.b32`) are printer text; every question a pass asks (is it pure, does it touch
/// memory, does it synchronize, which operands does it define) is answered by the
/// family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    // Pure: the only effect is the definition.
    Mov,
    Cvt,
    Cvta,
    Add,
    Sub,
    Mul,
    Mad,
    Fma,
    Div,
    Rem,
    Neg,
    Abs,
    Min,
    Max,
    And,
    Or,
    Xor,
    Not,
    Shl,
    Shr,
    Selp,
    Setp,
    Ex2,
    Lg2,
    Rsqrt,
    Sqrt,
    Rcp,
    Tanh,
    Sin,
    Cos,
    Copysign,
    Bfe,
    Bfi,
    Prmt,
    Popc,
    Clz,
    Brev,
    Lop3,
    /// `mapa`: the address of a peer block's shared variable.
    Mapa,
    /// `createpolicy`: an L2 cache-policy value.
    Createpolicy,
    /// `mma.sync`: the `{d}` vector defined, `{a} {b} {c}` read (registers only).
    Mma,
    /// `wgmma.mma_async`: the `{d}` accumulator vector read *and* written (in place,
    /// asynchronously until a `wgmma.wait_group`), the descriptors and the scale
    /// predicate read; reads shared memory.
    Wgmma,
    /// `wgmma.fence`: orders register accesses before the next `wgmma.mma_async`.
    WgmmaFence,
    /// `wgmma.commit_group`: the `wgmma.mma_async` instructions issued since the last
    /// commit form one group.
    WgmmaCommit,
    /// `wgmma.wait_group N` (operand 0: N): every group but the newest N has completed.
    WgmmaWait,
    // Memory.
    Ld(Space),
    St(Space),
    Atom(Space),
    Red(Space),
    /// `cp.async` (global → shared, asynchronous).
    CpAsync,
    /// `cp.async.bulk.tensor` (TMA: a tile global → shared, completing on an mbarrier).
    CpAsyncBulk,
    /// `mbarrier.init` / `.arrive.expect_tx` / `.inval`: a shared-memory barrier object
    /// set up, armed for a copy, or torn down.
    Mbarrier,
    /// `mbarrier.arrive` (without `expect_tx`): this thread's arrival, which may let
    /// another thread reuse what the barrier guards (a warp-specialized consumer's
    /// release of a pipeline slot).
    MbarrierArrive,
    /// `mbarrier.try_wait` / `.test_wait`: defines its predicate (the phase completed);
    /// reads the barrier only.
    MbarrierWait,
    CpAsyncCommit,
    CpAsyncWait,
    /// `ldmatrix` (shared → registers).
    Ldmatrix,
    /// `stmatrix` (registers → shared).
    Stmatrix,
    // Exchange and synchronization.
    Shfl,
    /// `bar.sync` / `bar.arrive` (CTA or named barriers).
    Bar,
    /// `bar.red`: a barrier that also reduces a predicate (defines its result).
    BarRed,
    /// A *turn*: `bar.sync` / `bar.arrive` on a named barrier that two consumer
    /// warpgroups pass back and forth to order when each issues its products (ping-pong,
    /// `back/ptx/pingpong.rs`). It orders no memory access and guards no shared buffer,
    /// so asynchronous products run on across it (`wgmma_waits.rs`). Never parsed from
    /// text (the same opcode is a [`Family::Bar`]): built by [`Inst::turn`].
    WarpTurn,
    /// `barrier.cluster.arrive` / `.wait`.
    BarrierCluster,
    Fence,
    Griddepcontrol,
    /// `setmaxnreg.{inc,dec}`: a warpgroup's register budget changes.
    Setmaxnreg,
    /// `pmevent`: a performance-monitor trigger, used as a *scheduling fence*: ptxas
    /// moves no instruction across it (`wgmma_waits.rs` pins a deferred
    /// `wgmma.wait_group` with one). No effect on memory or registers.
    Pmevent,
    // Control.
    Bra,
    Ret,
    Trap,
    /// An opcode this table does not know: treated as having every effect.
    Unknown,
}

/// What an instruction does besides defining its `defs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Effects {
    pub reads_memory: bool,
    pub writes_memory: bool,
    /// Synchronizes with other threads, or completes asynchronous work.
    pub syncs: bool,
    /// Transfers control (or may trap).
    pub control: bool,
}

impl Effects {
    pub const NONE: Effects = Effects {
        reads_memory: false,
        writes_memory: false,
        syncs: false,
        control: false,
    };
    pub const ALL: Effects = Effects {
        reads_memory: true,
        writes_memory: true,
        syncs: true,
        control: true,
    };

    /// No effect but the definition: removable when nothing reads it.
    pub fn is_pure(self) -> bool {
        self == Effects::NONE
    }
}

/// Which operands an instruction defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Roles {
    /// The first operand (a register or a vector of them) is defined; every other
    /// register operand, and any address register, is read.
    DefFirst,
    /// Every register operand is read; nothing is defined.
    AllUses,
    /// The first operand is read and written (an in-place accumulator); every other
    /// register operand is read.
    DefUseFirst,
}

impl Family {
    /// The family of an opcode's text (`ld.global.v4.b32` → `Ld(Global)`).
    pub fn of(text: &str) -> Family {
        let mut parts = text.split('.');
        let head = parts.next().unwrap_or("");
        let second = parts.next();
        match head {
            "mov" => Family::Mov,
            "cvt" => Family::Cvt,
            "cvta" => Family::Cvta,
            "add" => Family::Add,
            "sub" => Family::Sub,
            "mul" => Family::Mul,
            "mad" => Family::Mad,
            "fma" => Family::Fma,
            "div" => Family::Div,
            "rem" => Family::Rem,
            "neg" => Family::Neg,
            "abs" => Family::Abs,
            "min" => Family::Min,
            "max" => Family::Max,
            "and" => Family::And,
            "or" => Family::Or,
            "xor" => Family::Xor,
            "not" => Family::Not,
            "shl" => Family::Shl,
            "shr" => Family::Shr,
            "selp" => Family::Selp,
            "setp" => Family::Setp,
            "ex2" => Family::Ex2,
            "lg2" => Family::Lg2,
            "rsqrt" => Family::Rsqrt,
            "sqrt" => Family::Sqrt,
            "rcp" => Family::Rcp,
            "tanh" => Family::Tanh,
            "sin" => Family::Sin,
            "cos" => Family::Cos,
            "copysign" => Family::Copysign,
            "bfe" => Family::Bfe,
            "bfi" => Family::Bfi,
            "prmt" => Family::Prmt,
            "popc" => Family::Popc,
            "clz" => Family::Clz,
            "brev" => Family::Brev,
            "lop3" => Family::Lop3,
            "mapa" => Family::Mapa,
            "createpolicy" => Family::Createpolicy,
            "mma" => Family::Mma,
            "wgmma" => match second {
                Some("mma_async") => Family::Wgmma,
                Some("fence") => Family::WgmmaFence,
                Some("commit_group") => Family::WgmmaCommit,
                Some("wait_group") => Family::WgmmaWait,
                _ => Family::Unknown,
            },
            "ld" => Family::Ld(Space::parse(second)),
            "st" => Family::St(Space::parse(second)),
            "atom" => Family::Atom(Space::parse(second)),
            "red" => Family::Red(Space::parse(second)),
            "cp" => match (second, parts.next()) {
                (Some("async"), Some("commit_group")) => Family::CpAsyncCommit,
                (Some("async"), Some("wait_group" | "wait_all")) => Family::CpAsyncWait,
                (Some("async"), Some("ca" | "cg")) => Family::CpAsync,
                (Some("async"), Some("bulk")) => Family::CpAsyncBulk,
                _ => Family::Unknown,
            },
            "mbarrier" => match (second, parts.next()) {
                (Some("try_wait" | "test_wait"), _) => Family::MbarrierWait,
                (Some("arrive"), Some("expect_tx")) => Family::Mbarrier,
                (Some("arrive"), _) => Family::MbarrierArrive,
                _ => Family::Mbarrier,
            },
            "ldmatrix" => Family::Ldmatrix,
            "stmatrix" => Family::Stmatrix,
            "shfl" => Family::Shfl,
            "bar" | "barrier" if second == Some("cluster") => Family::BarrierCluster,
            "bar" | "barrier" if second == Some("red") => Family::BarRed,
            "bar" | "barrier" => Family::Bar,
            "fence" | "membar" => Family::Fence,
            "griddepcontrol" => Family::Griddepcontrol,
            "setmaxnreg" => Family::Setmaxnreg,
            "pmevent" => Family::Pmevent,
            "bra" => Family::Bra,
            "ret" | "exit" => Family::Ret,
            "trap" => Family::Trap,
            _ => Family::Unknown,
        }
    }

    pub fn effects(self) -> Effects {
        use Family::*;
        let e = Effects::NONE;
        match self {
            Mov | Cvt | Cvta | Add | Sub | Mul | Mad | Fma | Div | Rem | Neg | Abs | Min | Max
            | And | Or | Xor | Not | Shl | Shr | Selp | Setp | Ex2 | Lg2 | Rsqrt | Sqrt | Rcp
            | Tanh | Sin | Cos | Copysign | Bfe | Bfi | Prmt | Popc | Clz | Brev | Lop3 | Mapa
            | Createpolicy | Mma => e,
            // Loads are kept even when unused (the data-dependent barrier reads them).
            Ld(_) | Ldmatrix => Effects {
                reads_memory: true,
                ..e
            },
            St(_) | Stmatrix => Effects {
                writes_memory: true,
                ..e
            },
            Atom(_) | Red(_) | CpAsync | CpAsyncBulk => Effects {
                reads_memory: true,
                writes_memory: true,
                ..e
            },
            // Kept (never dead): what it orders is ptxas's schedule (or, for a turn, when
            // the other warpgroup may issue).
            Shfl | Pmevent | WarpTurn => Effects { syncs: true, ..e },
            Wgmma => Effects {
                reads_memory: true,
                syncs: true,
                ..e
            },
            WgmmaFence | WgmmaCommit | WgmmaWait | CpAsyncCommit | CpAsyncWait | Bar | BarRed
            | BarrierCluster | Fence | Griddepcontrol | Mbarrier | MbarrierArrive
            | MbarrierWait | Setmaxnreg => Effects {
                syncs: true,
                reads_memory: true,
                writes_memory: true,
                ..e
            },
            Bra | Ret | Trap => Effects { control: true, ..e },
            Unknown => Effects::ALL,
        }
    }

    pub fn roles(self) -> Roles {
        use Family::*;
        match self {
            St(_) | Red(_) | CpAsync | CpAsyncBulk | CpAsyncCommit | CpAsyncWait | Stmatrix
            | Bar | WarpTurn | BarrierCluster | Fence | Griddepcontrol | Setmaxnreg | Pmevent
            | Bra | Ret | Trap | WgmmaFence | WgmmaCommit | WgmmaWait => Roles::AllUses,
            Wgmma => Roles::DefUseFirst,
            // An unknown instruction is assumed to read everything it names; what it
            // defines is unknown, so it defines nothing a pass could miss (it is never
            // removed).
            Unknown => Roles::AllUses,
            _ => Roles::DefFirst,
        }
    }
}

/// An instruction's opcode: its family (the type) and its full text (what the printer
/// prints; nothing else reads it).
#[derive(Clone, Debug, PartialEq)]
pub struct Opcode {
    pub family: Family,
    pub text: String,
}

impl Opcode {
    /// The PTX ISA version the instruction needs at least (the module's `.version` is
    /// the largest of its instructions' and the target's): a vector `red` needs 8.1;
    /// everything else kgen emits assembles at 8.0.
    pub fn min_version(&self) -> (u32, u32) {
        let vector = self.text.split('.').any(|p| p == "v2" || p == "v4");
        if matches!(self.family, Family::Red(_)) && vector {
            (8, 1)
        } else {
            (8, 0)
        }
    }

    pub fn new(text: impl Into<String>) -> Opcode {
        let text = text.into();
        Opcode {
            family: Family::of(&text),
            text,
        }
    }
}

/// One instruction: `@{!}pred opcode operands;`, with the registers it defines and
/// reads listed explicitly (passes read `defs` / `uses` and `opcode.family`, never the
/// text).
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub guard: Option<(Reg, bool)>,
    pub opcode: Opcode,
    pub operands: Vec<Operand>,
    pub defs: Vec<Reg>,
    pub uses: Vec<Reg>,
}

impl Inst {
    /// An instruction whose defs and uses follow its family's operand roles.
    pub fn new(
        guard: Option<(Reg, bool)>,
        opcode: impl Into<String>,
        operands: Vec<Operand>,
    ) -> Inst {
        let opcode = Opcode::new(opcode);
        let (defs, uses) = roles_of(opcode.family.roles(), guard, &operands);
        Inst {
            guard,
            opcode,
            operands,
            defs,
            uses,
        }
    }

    /// An instruction whose defs and uses the caller states (families whose operands do
    /// not follow one pattern, such as an accumulator both read and written). The guard
    /// is added to the uses.
    pub fn with_roles(
        guard: Option<(Reg, bool)>,
        opcode: impl Into<String>,
        operands: Vec<Operand>,
        defs: Vec<Reg>,
        mut uses: Vec<Reg>,
    ) -> Inst {
        if let Some((g, _)) = guard {
            uses.insert(0, g);
        }
        Inst {
            guard,
            opcode: Opcode::new(opcode),
            operands,
            defs,
            uses,
        }
    }

    /// A turn barrier: `bar.sync` or `bar.arrive` typed [`Family::WarpTurn`] (the text
    /// alone would make it a [`Family::Bar`], whose operand roles it shares).
    pub fn turn(guard: Option<(Reg, bool)>, opcode: &str, operands: Vec<Operand>) -> Inst {
        let mut inst = Inst::new(guard, opcode, operands);
        debug_assert_eq!(inst.opcode.family.roles(), Family::WarpTurn.roles());
        inst.opcode.family = Family::WarpTurn;
        inst
    }

    pub fn effects(&self) -> Effects {
        self.opcode.family.effects()
    }
}

/// The defs and uses of `operands` under `roles`, with the guard read.
fn roles_of(
    roles: Roles,
    guard: Option<(Reg, bool)>,
    operands: &[Operand],
) -> (Vec<Reg>, Vec<Reg>) {
    let mut defs = Vec::new();
    let mut uses = Vec::new();
    if let Some((g, _)) = guard {
        uses.push(g);
    }
    for (k, op) in operands.iter().enumerate() {
        let def = k == 0 && matches!(roles, Roles::DefFirst | Roles::DefUseFirst);
        if k == 0 && roles == Roles::DefUseFirst {
            match op {
                Operand::Reg(r) => uses.push(*r),
                Operand::Vec(rs) => uses.extend(rs.iter().copied()),
                _ => {}
            }
        }
        match op {
            Operand::Reg(r) if def => defs.push(*r),
            Operand::Reg(r) => uses.push(*r),
            Operand::Vec(rs) if def => defs.extend(rs.iter().copied()),
            Operand::Vec(rs) => uses.extend(rs.iter().copied()),
            Operand::Mem(Addr::Reg(r), _) => uses.push(*r),
            Operand::TensorCoords(m, cs) => {
                uses.push(*m);
                uses.extend(cs.iter().copied());
            }
            _ => {}
        }
    }
    (defs, uses)
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
