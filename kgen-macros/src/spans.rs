//! Synthetic kgen spans and the side table that maps them back to Rust token spans.
//!
//! Every AST node built from Rust tokens gets a fresh one-byte [`Span`] `[n, n+1)` from a
//! counter; the table remembers the first and last token span of the Rust syntax it came
//! from. A span the checker made with `Span::to` (`[a, b+1)`) maps back to the first
//! token of node `a` through the last token of node `b`.

use kgen_core::diag::Diagnostic;
use kgen_core::Span;
use proc_macro2::{Ident, Span as RustSpan, TokenStream};
use quote::{ToTokens, TokenStreamExt};

#[derive(Default)]
pub struct SpanMap {
    /// Indexed by the synthetic offset.
    entries: Vec<(RustSpan, RustSpan)>,
}

/// Two tokens carrying a start and an end span, so that `syn::Error::new_spanned`
/// underlines the whole range (on stable, too).
struct Range(RustSpan, RustSpan);

impl ToTokens for Range {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.append(Ident::new("a", self.0));
        tokens.append(Ident::new("b", self.1));
    }
}

impl SpanMap {
    /// A fresh span for the Rust syntax `node`.
    pub fn alloc(&mut self, node: &dyn ToTokens) -> Span {
        let ts = node.to_token_stream();
        let mut iter = ts.into_iter();
        let first = iter.next().map_or_else(RustSpan::call_site, |t| t.span());
        let last = iter.last().map_or(first, |t| t.span());
        self.alloc_range(first, last)
    }

    /// A fresh span for one Rust span.
    pub fn alloc_span(&mut self, s: RustSpan) -> Span {
        self.alloc_range(s, s)
    }

    fn alloc_range(&mut self, first: RustSpan, last: RustSpan) -> Span {
        let n = self.entries.len();
        self.entries.push((first, last));
        Span::new(n, n + 1)
    }

    fn lookup(&self, s: Span) -> Option<Range> {
        let first = self.entries.get(s.start as usize)?.0;
        let end = (s.end as usize).checked_sub(1)?;
        let last = self.entries.get(end).map_or(first, |e| e.1);
        Some(Range(first, last))
    }

    /// A located `syn::Error` for `span` (the call site when the span is unknown).
    pub fn error(&self, span: Option<Span>, msg: &str) -> syn::Error {
        match span.and_then(|s| self.lookup(s)) {
            Some(r) => syn::Error::new_spanned(r, msg),
            None => syn::Error::new(RustSpan::call_site(), msg),
        }
    }

    /// One kgen diagnostic as errors: the primary message at the primary span (with the
    /// code, label and notes), then one `note:` error per secondary label.
    pub fn diagnostic(&self, d: &Diagnostic) -> syn::Error {
        let mut msg = format!("{} [kgen {}]", d.message, d.code.code());
        let primary = d.labels.iter().find(|l| l.primary);
        if let Some(l) = primary {
            if !l.message.is_empty() {
                msg.push_str(&format!("\nlabel: {}", l.message));
            }
        }
        for n in &d.notes {
            if n.starts_with("help:") || n.starts_with("note:") {
                msg.push_str(&format!("\n{n}"));
            } else {
                msg.push_str(&format!("\nnote: {n}"));
            }
        }
        let mut err = self.error(primary.map(|l| l.span), &msg);
        for l in d.labels.iter().filter(|l| !l.primary) {
            err.combine(self.error(Some(l.span), &format!("note: {}", l.message)));
        }
        err
    }
}
