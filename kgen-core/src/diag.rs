//! Diagnostics: located, labelled errors rendered rustc-style by `codespan-reporting`.
//!
//! Every layer (parser, checker, specialization, target limits) reports through
//! [`Diagnostic`]. Each kind of error has a stable [`ErrorCode`], so that tests can
//! name it and users can search for it. Rendering never panics.

use crate::span::{SourceFile, Span};
use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label as CsLabel};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, termcolor};
use std::fmt;

/// Stable error codes, one per diagnostic kind. The numbering groups them by layer:
/// E01xx syntax, E02xx names, E03xx types, E04xx shapes, E05xx constant evaluation and
/// specialization, E06xx memory access, E07xx control flow, E08xx target limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The source does not parse.
    Syntax,
    /// An integer or float literal that does not fit.
    BadLiteral,
    /// A name that is not defined.
    UndefinedName,
    /// A name defined twice in the same scope.
    Redefinition,
    /// A call to a function that does not exist.
    UnknownFunction,
    /// Wrong number or names of arguments.
    BadArguments,
    /// A call whose arguments could mean two different operations (`max(t, 0)`: a
    /// reduction along axis 0, or the element-wise maximum with 0).
    AmbiguousCall,
    /// Operand dtypes that do not fit the operation.
    TypeMismatch,
    /// An expression used as the wrong kind of thing (e.g. a dtype where a value is needed).
    WrongKind,
    /// Assignment to an immutable binding or a parameter.
    ImmutableAssign,
    /// Shapes that cannot be broadcast together, or a bad reshape.
    ShapeMismatch,
    /// A bad axis for a reduction or shape operation.
    BadAxis,
    /// A tile shape that is not allowed (zero extent, too large, too many dimensions).
    BadTileShape,
    /// An expression that must be a compile-time constant and is not.
    NotConstant,
    /// A compile-time parameter without a value, or with a value of the wrong kind.
    BadSpecialization,
    /// `static_assert` failed.
    StaticAssert,
    /// Division by zero or overflow in constant evaluation.
    ConstEval,
    /// Index rank or dimension mismatch in a memory access.
    BadAccess,
    /// A store or atomic on a tensor that cannot be written, or similar.
    BadMemoryOp,
    /// A control-flow construct used wrongly (non-scalar condition, type change across a loop).
    BadControlFlow,
    /// A kernel that exceeds a hardware limit of the target (shared memory, registers, threads).
    TargetLimit,
    /// The requested kernel does not exist in the file.
    NoSuchKernel,
    /// A feature the compiler does not support (yet) for this target.
    Unsupported,
    /// IR that breaks an invariant: a compiler bug, reported instead of a panic.
    InvalidIr,
}

impl ErrorCode {
    pub fn code(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Syntax => "E0101",
            BadLiteral => "E0102",
            UndefinedName => "E0201",
            Redefinition => "E0202",
            UnknownFunction => "E0203",
            BadArguments => "E0204",
            NoSuchKernel => "E0205",
            AmbiguousCall => "E0206",
            TypeMismatch => "E0301",
            WrongKind => "E0302",
            ImmutableAssign => "E0303",
            ShapeMismatch => "E0401",
            BadAxis => "E0402",
            BadTileShape => "E0403",
            NotConstant => "E0501",
            BadSpecialization => "E0502",
            StaticAssert => "E0503",
            ConstEval => "E0504",
            BadAccess => "E0601",
            BadMemoryOp => "E0602",
            BadControlFlow => "E0701",
            TargetLimit => "E0801",
            Unsupported => "E0802",
            InvalidIr => "E0901",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// A secondary (or primary) location with its own message: "previous definition here".
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub span: Span,
    pub message: String,
    pub primary: bool,
}

/// One diagnostic: a message, a code, a primary span and optional labels and notes.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: ErrorCode,
    pub message: String,
    pub labels: Vec<Label>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// An error at `span`. The primary label is empty until [`Diagnostic::with_label_message`].
    pub fn error(code: ErrorCode, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            labels: vec![Label {
                span,
                message: String::new(),
                primary: true,
            }],
            notes: Vec::new(),
        }
    }

    /// An error with no location (e.g. a bad `-D` option on the command line).
    pub fn unlocated(code: ErrorCode, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            labels: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Sets the text printed under the primary caret.
    pub fn with_label_message(mut self, message: impl Into<String>) -> Diagnostic {
        if let Some(l) = self.labels.iter_mut().find(|l| l.primary) {
            l.message = message.into();
        }
        self
    }

    /// Adds a secondary label ("previous definition here").
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label {
            span,
            message: message.into(),
            primary: false,
        });
        self
    }

    /// Adds a note or help line below the snippet.
    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    pub fn primary_span(&self) -> Option<Span> {
        self.labels.iter().find(|l| l.primary).map(|l| l.span)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error[{}]: {}", self.code.code(), self.message)
    }
}

/// A non-empty list of diagnostics from one compilation. Errors are reported together
/// where the layer can recover (the checker reports every independent error).
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn single(d: Diagnostic) -> Diagnostics {
        Diagnostics(vec![d])
    }

    /// Renders every diagnostic rustc-style (`error[E0301]: ...`, ` --> file:line:col`,
    /// a caret under the span), without colour.
    pub fn render(&self, file: &SourceFile) -> String {
        render_all(&self.0, file, false)
    }

    /// Like [`Diagnostics::render`], with ANSI colour.
    pub fn render_color(&self, file: &SourceFile) -> String {
        render_all(&self.0, file, true)
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

fn render_all(diags: &[Diagnostic], file: &SourceFile, color: bool) -> String {
    let files = SimpleFile::new(file.name.as_str(), file.text.as_str());
    let config = term::Config::default();
    let mut out: Vec<u8> = Vec::new();
    for d in diags {
        let cs = to_codespan(d, file.text.len());
        let res = if color {
            let mut w = termcolor::Ansi::new(&mut out);
            term::emit(&mut w, &config, &files, &cs)
        } else {
            let mut w = termcolor::NoColor::new(&mut out);
            term::emit(&mut w, &config, &files, &cs)
        };
        if res.is_err() {
            // Rendering a snippet failed (a span outside the text): fall back to the
            // one-line form rather than lose the error.
            out.extend_from_slice(format!("{d}\n").as_bytes());
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn to_codespan(d: &Diagnostic, text_len: usize) -> CsDiagnostic<()> {
    let clamp = |s: Span| {
        let start = (s.start as usize).min(text_len);
        let end = (s.end as usize).clamp(start, text_len);
        start..end
    };
    let labels = d
        .labels
        .iter()
        .map(|l| {
            let label = if l.primary {
                CsLabel::primary((), clamp(l.span))
            } else {
                CsLabel::secondary((), clamp(l.span))
            };
            label.with_message(l.message.clone())
        })
        .collect();
    let base = match d.severity {
        Severity::Error => CsDiagnostic::error(),
        Severity::Warning => CsDiagnostic::warning(),
    };
    base.with_code(d.code.code())
        .with_message(d.message.clone())
        .with_labels(labels)
        .with_notes(d.notes.clone())
}
