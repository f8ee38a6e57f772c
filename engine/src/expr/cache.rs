//! Every JSONPath, expression and template parsed once per command: a table by text that lint
//! fills as it checks a project and that lowering then takes its compiled forms from.
//!
//! Entries are keyed by the text itself (an expression without its `=`), so the same text
//! written many times — `=payload.n + 1` on every step of a chain — is parsed once, and its
//! free variables listed once. Parsing is pure, so a text always gives the same entry; the
//! spans of problems are computed by each caller from the entry's byte offsets, as before.
//! Nothing here outlives the command, and nothing is shared between threads while it is
//! written: each lint worker has its own table.

use std::sync::Arc;

use crate::expr::path::{self, Path, PathError};
use crate::expr::template::{self, Template, TemplateError, TemplateInfo};
use crate::expr::{self, Call, Expr, ExprError, Reference};
use crate::source::FastMap;

/// A parsed expression and the free variables it reads.
#[derive(Debug)]
pub struct ParsedExpr {
    pub expr: Result<Arc<Expr>, ExprError>,
    /// [`Expr::references`], in source order; empty when the expression did not parse.
    pub refs: Vec<Reference>,
    /// [`Expr::calls`], in source order; empty when the expression did not parse.
    pub calls: Vec<Call>,
}

/// Parsed forms by text. See the module documentation.
#[derive(Default)]
pub struct ParseCache {
    exprs: FastMap<Box<str>, Arc<ParsedExpr>>,
    paths: FastMap<Box<str>, Result<Path, PathError>>,
    template_checks: FastMap<Box<str>, Arc<Result<TemplateInfo, TemplateError>>>,
    templates: FastMap<Box<str>, Result<Template, TemplateError>>,
}

impl ParseCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The expression `text` (without a leading `=`), parsed, with its references.
    pub fn expr(&mut self, text: &str) -> Arc<ParsedExpr> {
        if let Some(e) = self.exprs.get(text) {
            return Arc::clone(e);
        }
        let parsed = Arc::new(match expr::parse(text) {
            Ok(e) => {
                let (refs, calls) = e.references_and_calls();
                ParsedExpr {
                    expr: Ok(Arc::new(e)),
                    refs,
                    calls,
                }
            }
            Err(e) => ParsedExpr {
                expr: Err(e),
                refs: Vec::new(),
                calls: Vec::new(),
            },
        });
        self.exprs.insert(text.into(), Arc::clone(&parsed));
        parsed
    }

    /// The JSONPath `text`, parsed.
    pub fn path(&mut self, text: &str) -> &Result<Path, PathError> {
        if !self.paths.contains_key(text) {
            self.paths.insert(text.into(), path::parse(text));
        }
        &self.paths[text]
    }

    /// [`template::check`] of `text`: its syntax error, or the variables it reads.
    pub fn template_check(&mut self, text: &str) -> Arc<Result<TemplateInfo, TemplateError>> {
        if let Some(t) = self.template_checks.get(text) {
            return Arc::clone(t);
        }
        let checked = Arc::new(template::check(text));
        self.template_checks.insert(text.into(), Arc::clone(&checked));
        checked
    }

    /// [`template::compile`] of `text`, compiled once (a [`Template`] is cheap to clone).
    pub fn template(&mut self, text: &str) -> &Result<Template, TemplateError> {
        if !self.templates.contains_key(text) {
            self.templates.insert(text.into(), template::compile(text));
        }
        &self.templates[text]
    }

    /// Adds the entries of `other` that this table does not have.
    pub fn merge(&mut self, other: ParseCache) {
        for (k, v) in other.exprs {
            self.exprs.entry(k).or_insert(v);
        }
        for (k, v) in other.paths {
            self.paths.entry(k).or_insert(v);
        }
        for (k, v) in other.template_checks {
            self.template_checks.entry(k).or_insert(v);
        }
        for (k, v) in other.templates {
            self.templates.entry(k).or_insert(v);
        }
    }
}
