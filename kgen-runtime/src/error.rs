//! Runtime errors. Every failure of the driver, of argument checking or of a launch comes
//! back as a value; nothing in this crate panics on a driver result.

use kgen_core::types::DType;

/// An argument that does not fit the kernel's ABI, found before anything touches the GPU.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    #[error("kernel `{kernel}` takes {expected} argument(s), got {got}")]
    ArgCount {
        kernel: String,
        expected: usize,
        got: usize,
    },
    #[error("argument `{param}`: expected a {expected}, got a {got}")]
    WrongKind {
        param: String,
        expected: &'static str,
        got: &'static str,
    },
    #[error("argument `{param}`: expected dtype {expected}, got {got}")]
    DtypeMismatch {
        param: String,
        expected: DType,
        got: DType,
    },
    #[error("argument `{param}`: expected a rank-{expected} tensor, got rank {got}")]
    RankMismatch {
        param: String,
        expected: usize,
        got: usize,
    },
    #[error("argument `{param}`: dimension {dim} is declared as {expected}, got extent {got}")]
    ConstDimMismatch {
        param: String,
        dim: usize,
        expected: u32,
        got: usize,
    },
    #[error("argument `{param}`: declared `contiguous` but the last dimension has stride {stride} (must be 1)")]
    NotContiguous { param: String, stride: usize },
    #[error(
        "argument `{param}`: the kernel was specialized for {required}-byte alignment, but {what} is only {actual}-byte aligned \
         (compile with a smaller alignment for this tensor)"
    )]
    Misaligned {
        param: String,
        required: u32,
        actual: u32,
        /// What is misaligned: `the base address`, `the stride of dimension 0`, ...
        what: String,
    },
    #[error("argument `{param}`: {what}")]
    SizeOutOfRange { param: String, what: String },
    #[error("arguments `{a}` and `{b}` share device memory and `{written}` is written")]
    Aliasing {
        a: String,
        b: String,
        written: String,
    },
}

/// Everything the runtime can report.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No CUDA driver library (`libcuda.so`) could be loaded: no GPU on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver loaded but offers no (such) device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A driver call failed.
    #[error("CUDA driver error in {op}: {err}")]
    Driver {
        op: &'static str,
        err: cudarc::driver::DriverError,
    },
    /// The driver's JIT refused the PTX.
    #[error(
        "the CUDA driver could not load the PTX of `{entry}`: {err}{}",
        fmt_log(log)
    )]
    PtxLoad {
        entry: String,
        err: cudarc::driver::DriverError,
        log: String,
    },
    /// The compiled kernel does not fit the device or the PTX does not match its ABI.
    #[error("kernel `{entry}` cannot run on this device: {why}")]
    Incompatible { entry: String, why: String },
    /// An argument does not fit the kernel.
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// The grid or block shape is outside what the hardware launches.
    #[error("bad launch configuration: {0}")]
    LaunchConfig(String),
    /// A tensor or stream used with another device than the one it belongs to.
    #[error("wrong device: {0}")]
    WrongDevice(String),
    /// A view that does not fit its tensor (narrow out of range, reshape of a
    /// non-contiguous tensor, ...).
    #[error("invalid view: {0}")]
    InvalidView(String),
    /// A copy between tensors or host buffers that do not match.
    #[error("bad copy: {0}")]
    Transfer(String),
    /// The kernel did not compile: the compiler's diagnostics (codes, spans, help), kept
    /// whole so a caller can act on them (`diagnostics.0[0].code`), and their text
    /// rendered against the source.
    #[error("the kernel did not compile:\n{rendered}")]
    Compile {
        diagnostics: kgen_core::Diagnostics,
        rendered: String,
    },
    /// A bundled kernel's source file is not in this build.
    #[error("no bundled kernel file kernels-src/{0}.kg")]
    NoSource(String),
    /// The interpreter backend failed (an out-of-range access it caught, ...).
    #[error("interpreter: {0}")]
    Interpreter(String),
    /// A panic inside the driver bindings, caught (e.g. a missing driver symbol).
    #[error("the CUDA bindings failed: {0}")]
    Bindings(String),
    /// Graph capture misuse: capture on the interpreter or the legacy default stream, or
    /// an operation a captured graph cannot replay correctly (a host synchronization, a
    /// staged upload).
    #[error("CUDA graph: {0}")]
    Graph(String),
}

impl RuntimeError {
    /// A compile failure: `diagnostics` kept whole beside their rendering against `file`.
    pub fn compile(diagnostics: kgen_core::Diagnostics, file: &kgen_core::SourceFile) -> Self {
        let rendered = diagnostics.render(file);
        RuntimeError::Compile {
            diagnostics,
            rendered,
        }
    }
}

fn fmt_log(log: &str) -> String {
    let log = log.trim();
    if log.is_empty() {
        String::new()
    } else {
        format!("\n{log}")
    }
}

pub(crate) trait DriverResultExt<T> {
    fn op(self, op: &'static str) -> Result<T, RuntimeError>;
}

impl<T> DriverResultExt<T> for Result<T, cudarc::driver::DriverError> {
    fn op(self, op: &'static str) -> Result<T, RuntimeError> {
        self.map_err(|err| RuntimeError::Driver { op, err })
    }
}
