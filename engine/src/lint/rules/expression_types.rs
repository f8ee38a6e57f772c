//! Types of expressions: comparisons that can never be true (SY415), arithmetic CEL has no
//! operator for (SY416), `if:`/`while:` conditions and operands of `&&`, `||`, `!` and `?:`
//! that are not booleans (SY417), arguments of a type the function does not take (SY418), and
//! fields a known value cannot have past an index, a call or on a macro's variable (SY405, as for the
//! static field chains of variables).
//!
//! The types come from [`crate::expr::types`]; the types of the variables from the
//! caller's [`Scope`]. Where a type is unknown nothing is reported.

use crate::diag::{Diagnostic, codes};
use crate::expr::Expr;
use crate::expr::ty::Ty;
use crate::expr::types::{self, ProblemKind, Scope};
use crate::source::Span;

/// Checks the types in `expr`, reporting at `span_of(start, end)` (bytes of the expression
/// text), and returns the expression's type.
pub fn check(
    expr: &Expr,
    scope: &dyn Scope,
    span_of: &dyn Fn(usize, usize) -> Span,
    out: &mut Vec<Diagnostic>,
) -> Ty {
    let (ty, problems) = types::check(expr, scope);
    for p in problems {
        let rule = match p.kind {
            ProblemKind::NeverTrue => &codes::COMPARISON_NEVER_TRUE,
            ProblemKind::Arithmetic => &codes::ARITHMETIC_TYPE_MISMATCH,
            ProblemKind::NotBool => &codes::CONDITION_NOT_BOOL,
            ProblemKind::UnknownField => &codes::UNKNOWN_FIELD,
            ProblemKind::ArgumentType => &codes::ARGUMENT_TYPE_MISMATCH,
        };
        out.push(
            Diagnostic::new(rule, span_of(p.start, p.end), p.message)
                .label(p.label)
                .help(p.help),
        );
    }
    ty
}

/// Reports a condition (`key` is `if` or `while`) whose type `ty` is known and can never be a
/// boolean; `span` covers the expression.
pub fn condition(key: &str, ty: &Ty, span: Span, out: &mut Vec<Diagnostic>) {
    if ty.is_any() || ty.members().contains(&Ty::Bool) {
        return;
    }
    let help = types::bool_help(ty);
    out.push(
        Diagnostic::new(
            &codes::CONDITION_NOT_BOOL,
            span,
            format!("`{key}` condition is {}, not a boolean", ty.describe()),
        )
        .label(format!("{} here", ty.describe()))
        .help(format!("a condition must be `true` or `false`; {help}")),
    );
}
