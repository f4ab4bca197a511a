//! Names: bindings, the scope stack, and "did you mean" suggestions.
//!
//! Assumes: `Checker::scopes` is never empty (`scopes[0]` holds generics and
//! parameters; each block pushes one scope and pops it).
//! Guarantees: lookups go innermost-first, so `let` shadows; `set_var` updates the
//! innermost binding of a name (the one a reassignment refers to); suggestions come
//! from the names visible at the point of the error.

use super::{Checker, Ev};
use crate::abi::ConstArg;
use crate::span::Span;

/// A name in scope.
#[derive(Clone, Debug)]
pub(crate) enum Binding {
    /// A `let` binding, a loop variable or a scalar parameter. The value of a `mut`
    /// binding is replaced by each assignment (SSA renaming).
    Var {
        value: Ev,
        mutable: bool,
        span: Span,
    },
    /// A tensor parameter.
    Tensor { index: u32, span: Span },
    /// A compile-time parameter with its value.
    Generic { value: ConstArg, span: Span },
}

/// Where a binding was defined.
pub(crate) fn binding_span(b: &Binding) -> Span {
    match b {
        Binding::Var { span, .. }
        | Binding::Tensor { span, .. }
        | Binding::Generic { span, .. } => *span,
    }
}

impl Checker<'_> {
    pub(crate) fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    /// Binds `name` in the innermost scope (shadowing any outer binding).
    pub(crate) fn bind(&mut self, name: &str, b: Binding) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), b);
        }
    }

    /// Replaces the value of the innermost variable called `name`.
    pub(crate) fn set_var(&mut self, name: &str, value: Ev) {
        if let Some(Binding::Var { value: v, .. }) =
            self.scopes.iter_mut().rev().find_map(|s| s.get_mut(name))
        {
            *v = value;
        }
    }

    /// The current value of variable `name`, if it is a variable holding an IR value.
    pub(crate) fn var_value(&self, name: &str) -> Option<crate::ir::ValueId> {
        match self.lookup(name) {
            Some(Binding::Var {
                value: Ev::Value(v),
                ..
            }) => Some(*v),
            _ => None,
        }
    }

    /// Every name visible now (for "did you mean" suggestions), sorted.
    pub(crate) fn visible_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.scopes.iter().flat_map(|s| s.keys().cloned()).collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The closest candidate by edit distance, if close enough to be a likely typo
/// (distance at most a third of the name's length, and at least 1). Ties go to the
/// first candidate in order.
pub(crate) fn closest(name: &str, candidates: &[String]) -> Option<String> {
    let mut best: Option<(usize, &String)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let d = edit_distance(name, c);
        if d <= (name.chars().count().max(2) / 3).max(1) && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.clone())
}

/// Levenshtein distance over chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let sub = prev.get(j).copied().unwrap_or(usize::MAX / 2) + usize::from(ca != cb);
            let del = prev.get(j + 1).copied().unwrap_or(usize::MAX / 2) + 1;
            let ins = cur.get(j).copied().unwrap_or(usize::MAX / 2) + 1;
            cur.push(sub.min(del).min(ins));
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}
