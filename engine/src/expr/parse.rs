//! CEL expressions, parsed once and inspected for the variables they read.
//!
//! This module owns [`Expr`] (the expression text and its AST, parsed with cel's Pratt parser,
//! which expands the standard macros `has`, `all`, `exists`, `exists_one`, `map`, `filter`;
//! cel-go's two-variable comprehensions are expanded after it, by `two_var.rs`),
//! [`ExprError`] (a terse message on a byte range of the text) and [`Reference`]s (each free
//! variable read, with its static field chain and byte range). It does not evaluate, and it does
//! not know which variable names a flow allows: that is lint's business.
//!
//! The Pratt parser keeps byte offsets only on failure, so on success the offsets of references
//! are recovered by lexing the text with cel's own lexer and pairing identifier tokens with AST
//! identifiers in source order (AST ids are handed out left to right).

use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr as Node, LiteralValue};
use cel::parser::pratt_parser::{Lexer, Token, TokenKind};
use cel::parser::{Expression, ParseErrors, PrattParser};

use std::sync::OnceLock;

use super::functions::NAMESPACES;
use super::two_var;

/// A parsed CEL expression. `Send + Sync`, so it can be shared behind an `Arc`.
#[derive(Clone, Debug)]
pub struct Expr {
    text: String,
    ast: Expression,
    /// What the evaluator derives from the AST, once, on the first evaluation.
    derived: OnceLock<Derived>,
}

/// What the evaluator (`expr::eval`) derives from an expression's AST: computed by it on
/// the first evaluation and kept with the expression, so that later evaluations do not walk
/// or copy the tree again.
#[derive(Clone, Debug)]
pub struct Derived {
    /// The tree to evaluate in place of the parsed one, when there is one.
    pub exact: Option<Expression>,
    /// Whether the evaluation of the tree it runs needs JSON views to stand in for cel's
    /// lists and maps.
    pub stand_ins: bool,
    /// The tree to evaluate again when the first evaluation fails, when there is one, and
    /// whether its evaluation needs the stand-ins.
    pub retry: Option<(Expression, bool)>,
}

/// A CEL syntax error: `start..end` are byte offsets inside the expression text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExprError {
    pub start: usize,
    pub end: usize,
    pub message: String,
}

/// A free variable the expression reads, with the static member chain that follows it:
/// `payload.items[0].x` is root `payload`, fields `["items"]` (the chain stops at the first
/// index, call or other non-static access). `start..end` covers the root through the last
/// field, in bytes of the expression text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub root: String,
    pub fields: Vec<String>,
    pub start: usize,
    pub end: usize,
}

/// A function or macro called by name, as written: `size(x)` is global `size` with one
/// argument, `x.size()` is member `size` with none (the receiver is not counted). A macro
/// called with the arguments it takes is expanded by the parser and not listed; one called
/// otherwise (`l.all(x)`) stays a call and is. `start..end` is the name, in bytes of the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub member: bool,
    pub args: usize,
    pub start: usize,
    pub end: usize,
}

/// How deeply an expression may nest. cel's parser, its `Clone`/`Drop` and every walk over the
/// AST recurse once per level, and chains (`a[0][0]...`, `a + a + ...`) are not bounded by the
/// parser's own recursion limit; this keeps all of them far from the end of a 2 MiB stack.
pub const MAX_DEPTH: usize = 256;

/// Parses a CEL expression. On failure the first error (in source order) is returned.
pub fn parse(text: &str) -> Result<Expr, ExprError> {
    check_depth(text)?;
    match PrattParser::new().enable_ident_escape_syntax(true).parse(text) {
        Ok(mut ast) => {
            if text.contains('`') {
                dotted_fields_as_indexes(&mut ast);
            }
            match two_var::check(&ast) {
                Ok(false) => {}
                Ok(true) => {
                    let mut next_id = max_id(&ast);
                    two_var::expand(&mut ast, &mut next_id);
                }
                Err(refused) => {
                    let (start, end) = call_span(&ast, text, refused.id);
                    return Err(ExprError {
                        start,
                        end,
                        message: refused.message,
                    });
                }
            }
            Ok(Expr {
                text: text.to_owned(),
                ast,
                derived: OnceLock::new(),
            })
        }
        Err(errors) => Err(convert_error(text, &errors)),
    }
}

impl Expr {
    /// What the evaluator derives from the AST, computed by `derive` on the first call.
    pub fn derived(&self, derive: impl FnOnce(&Expression) -> Derived) -> &Derived {
        self.derived.get_or_init(|| derive(&self.ast))
    }

    /// The expression as written (without the leading `=` of a mapping).
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn ast(&self) -> &Expression {
        &self.ast
    }

    /// Every read of a free variable, in source order. Variables bound by a comprehension
    /// (the iteration variable of `exists(x, ...)`, `map(x, ...)`, ... and its accumulator) are
    /// not free and not reported.
    pub fn references(&self) -> Vec<Reference> {
        self.references_and_calls().0
    }

    /// [`Expr::references`] and [`Expr::calls`], from one walk of the AST and one lexing.
    pub fn references_and_calls(&self) -> (Vec<Reference>, Vec<Call>) {
        let mut walker = Walker::default();
        walker.expr(&self.ast);
        let tokens = lex(&self.text);
        let calls = self.calls_of(&mut walker, &tokens);
        let roots = root_idents(&tokens, &self.text);
        let positions = pair_in_order(&mut walker.idents, &roots, &tokens, &self.text);
        let mut refs: Vec<Reference> = walker
            .refs
            .into_iter()
            .map(|r| {
                let (start, end) = match lookup(&positions, r.id) {
                    Some(t) => (tokens[t].start, chain_end(&tokens, t, r.fields.len())),
                    None => (0, self.text.len()),
                };
                Reference {
                    root: r.root.to_owned(),
                    fields: r.fields.into_iter().map(str::to_owned).collect(),
                    start,
                    end,
                }
            })
            .collect();
        refs.sort_by_key(|r| (r.start, r.end));
        (refs, calls)
    }

    /// Every function called by name (global `size(x)` or member `x.size()`), with the byte
    /// range of the name, in source order. Operators and expanded macros are not included.
    pub fn functions(&self) -> Vec<(String, usize, usize)> {
        self.calls()
            .into_iter()
            .map(|c| (c.name, c.start, c.end))
            .collect()
    }

    /// Every call by name, with how it is called ([`Call`]), in source order.
    pub fn calls(&self) -> Vec<Call> {
        let mut walker = Walker::default();
        walker.expr(&self.ast);
        let tokens = lex(&self.text);
        self.calls_of(&mut walker, &tokens)
    }

    fn calls_of(&self, walker: &mut Walker, tokens: &[Token]) -> Vec<Call> {
        let calls: Vec<usize> = (0..tokens.len())
            .filter(|&i| {
                is_ident(tokens[i].kind) && tokens.get(i + 1).map(|t| t.kind) == Some(TokenKind::TokLeftParen)
            })
            .collect();
        let positions = pair_in_order(&mut walker.calls, &calls, tokens, &self.text);
        let mut out: Vec<Call> = walker
            .calls
            .iter()
            .map(|&(id, name)| {
                let (member, args) = walker.shapes.get(&id).copied().unwrap_or((false, 0));
                let (start, end) = match lookup(&positions, id) {
                    Some(t) => (tokens[t].start, tokens[t].end),
                    None => (0, self.text.len()),
                };
                let name = match walker.namespaced.get(&id) {
                    Some(ns) => format!("{ns}.{name}"),
                    None => name.to_owned(),
                };
                Call {
                    name,
                    member,
                    args,
                    start,
                    end,
                }
            })
            .collect();
        out.sort_by_key(|c| (c.start, c.end));
        out
    }
}

/// Rewrites each selection of a backquoted field name that holds a `.` (`` m.`a.b` ``) as the
/// index it means (`m['a.b']`). cel hands a chain of selections to the variable resolver as
/// one dotted name, in which `a.b` would read as two fields. Presence tests (`has()`) are
/// left alone: cel selects their last field by itself.
fn dotted_fields_as_indexes(e: &mut Expression) {
    use cel::common::ast::{CallExpr, LiteralValue, SelectExpr, operators};
    let mut next_id = max_id(e) + 1;
    fn walk(e: &mut Expression, next_id: &mut u64) {
        match &mut e.expr {
            Node::Select(s) => {
                walk(&mut s.operand, next_id);
                if !s.test && s.field.contains('.') {
                    let SelectExpr { operand, field, .. } = std::mem::replace(
                        s,
                        SelectExpr {
                            operand: Box::default(),
                            field: String::new(),
                            test: false,
                        },
                    );
                    let key = Expression {
                        id: *next_id,
                        expr: Node::Literal(LiteralValue::String(field.into())),
                    };
                    *next_id += 1;
                    e.expr = Node::Call(CallExpr {
                        func_name: operators::INDEX.to_owned(),
                        target: None,
                        args: vec![*operand, key],
                    });
                }
            }
            Node::Call(c) => {
                if let Some(t) = &mut c.target {
                    walk(t, next_id);
                }
                c.args.iter_mut().for_each(|a| walk(a, next_id));
            }
            Node::Comprehension(c) => {
                for part in [
                    &mut c.iter_range,
                    &mut c.accu_init,
                    &mut c.loop_cond,
                    &mut c.loop_step,
                    &mut c.result,
                ] {
                    walk(part, next_id);
                }
            }
            Node::List(l) => l.elements.iter_mut().for_each(|x| walk(x, next_id)),
            Node::Map(m) => m
                .entries
                .iter_mut()
                .for_each(|x| walk_entry(&mut x.expr, next_id)),
            Node::Struct(st) => st
                .entries
                .iter_mut()
                .for_each(|x| walk_entry(&mut x.expr, next_id)),
            Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
        }
    }
    fn walk_entry(entry: &mut EntryExpr, next_id: &mut u64) {
        match entry {
            EntryExpr::MapEntry(m) => {
                walk(&mut m.key, next_id);
                walk(&mut m.value, next_id);
            }
            EntryExpr::StructField(f) => walk(&mut f.value, next_id),
        }
    }
    walk(e, &mut next_id);
}

/// The largest AST id in `e`.
fn max_id(e: &Expression) -> u64 {
    let entry = |x: &EntryExpr| match x {
        EntryExpr::MapEntry(m) => max_id(&m.key).max(max_id(&m.value)),
        EntryExpr::StructField(f) => max_id(&f.value),
    };
    let inner = match &e.expr {
        Node::Select(s) => max_id(&s.operand),
        Node::Call(c) => c
            .target
            .iter()
            .map(|t| max_id(t))
            .chain(c.args.iter().map(max_id))
            .max()
            .unwrap_or(0),
        Node::Comprehension(c) => [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result]
            .into_iter()
            .map(max_id)
            .max()
            .unwrap_or(0),
        Node::List(l) => l.elements.iter().map(max_id).max().unwrap_or(0),
        Node::Map(m) => m
            .entries
            .iter()
            .map(|x| entry(&x.expr).max(x.id))
            .max()
            .unwrap_or(0),
        Node::Struct(st) => st
            .entries
            .iter()
            .map(|x| entry(&x.expr).max(x.id))
            .max()
            .unwrap_or(0),
        Node::Ident(_) | Node::Literal(_) | Node::Unspecified => 0,
    };
    inner.max(e.id)
}

/// The byte range of the name of the call `id` in `text`, or the whole text.
fn call_span(ast: &Expression, text: &str, id: u64) -> (usize, usize) {
    let mut walker = Walker::default();
    walker.expr(ast);
    let tokens = lex(text);
    let calls: Vec<usize> = (0..tokens.len())
        .filter(|&i| {
            is_ident(tokens[i].kind) && tokens.get(i + 1).map(|t| t.kind) == Some(TokenKind::TokLeftParen)
        })
        .collect();
    let positions = pair_in_order(&mut walker.calls, &calls, &tokens, text);
    match lookup(&positions, id) {
        Some(t) => (tokens[t].start, tokens[t].end),
        None => (0, text.len()),
    }
}

impl Expr {
    /// The byte ranges, by AST id, of what lint reports type problems at: the operator of each
    /// binary operator written in the text (`==`, `in`, `+`, ...; not `&&`, `||`, `?:` or
    /// indexing) and the field name of each selection (`name` in `a.name`, and in `has(a.name)`).
    /// Nodes a macro expansion adds are not listed. Sorted by id.
    ///
    /// The parser hands out ids as it consumes these tokens, left to right, so the nodes of one
    /// kind sorted by id pair with the tokens of that kind in source order.
    pub fn node_spans(&self) -> Vec<(u64, usize, usize)> {
        let mut ops: Vec<(u64, &str)> = Vec::new();
        let mut fields: Vec<(u64, &str)> = Vec::new();
        written_nodes(&self.ast, &mut ops, &mut fields);
        let tokens = lex(&self.text);
        let ends_operand = |i: usize| {
            i > 0
                && matches!(
                    tokens[i - 1].kind,
                    TokenKind::TokIdent
                        | TokenKind::TokReservedWord
                        | TokenKind::TokNull
                        | TokenKind::TokTrue
                        | TokenKind::TokFalse
                        | TokenKind::TokInt
                        | TokenKind::TokUint
                        | TokenKind::TokFloat
                        | TokenKind::TokString
                        | TokenKind::TokBytes
                        | TokenKind::TokRightParen
                        | TokenKind::TokRightBracket
                        | TokenKind::TokRightBrace
                )
        };
        let op_tokens: Vec<usize> = (0..tokens.len())
            .filter(|&i| match tokens[i].kind {
                // A `-` after an operand subtracts; anywhere else it negates.
                TokenKind::TokMinus => ends_operand(i),
                k => binary_symbol_of_token(k).is_some(),
            })
            .collect();
        let field_tokens: Vec<usize> = (0..tokens.len())
            .filter(|&i| {
                is_ident(tokens[i].kind)
                    && i > 0
                    && tokens[i - 1].kind == TokenKind::TokDot
                    && tokens.get(i + 1).map(|t| t.kind) != Some(TokenKind::TokLeftParen)
            })
            .collect();
        let mut out: Vec<(u64, usize, usize)> = pair_in_order(&mut ops, &op_tokens, &tokens, &self.text)
            .into_iter()
            .chain(pair_in_order(&mut fields, &field_tokens, &tokens, &self.text))
            .map(|(id, t)| (id, tokens[t].start, tokens[t].end))
            .collect();
        out.sort_unstable_by_key(|n| n.0);
        out
    }
}

/// The parts of an expanded macro that were written in the text.
#[derive(Clone, Copy, Debug)]
pub enum Macro<'a> {
    /// `r.all(x, pred)`
    All(&'a Expression),
    /// `r.exists(x, pred)`
    Exists(&'a Expression),
    /// `r.exists_one(x, pred)`
    ExistsOne(&'a Expression),
    /// `r.map(x, f)`, `r.map(x, pred, f)`, and `r.filter(x, pred)` (whose `f` is `x` itself);
    /// `r.transformList(k, v, [pred,] f)`.
    Map {
        filter: Option<&'a Expression>,
        transform: &'a Expression,
    },
    /// `r.transformMap(k, v, [pred,] f)`, or with `entry` `r.transformMapEntry(k, v, [pred,] f)`.
    TransformMap {
        filter: Option<&'a Expression>,
        transform: &'a Expression,
        entry: bool,
    },
}

/// Which macro a comprehension is the expansion of, by the shape cel (or `two_var.rs`, with
/// its `iter_var2`) gives each. `None` for a shape none of them has.
pub fn macro_of<'a>(c: &'a ComprehensionExpr) -> Option<Macro<'a>> {
    fn call<'e>(e: &'e Expression, name: &str, n: usize) -> Option<&'e [Expression]> {
        match &e.expr {
            Node::Call(k) if k.func_name == name && k.target.is_none() && k.args.len() == n => Some(&k.args),
            _ => None,
        }
    }
    /// `accu + [f]`: the transform `f`.
    fn append<'e>(e: &'e Expression, accu: &str) -> Option<&'e Expression> {
        let a = call(e, "_+_", 2)?;
        if !matches!(&a[0].expr, Node::Ident(n) if n == accu) {
            return None;
        }
        match &a[1].expr {
            Node::List(l) if l.elements.len() == 1 => Some(&l.elements[0]),
            _ => None,
        }
    }
    let is_accu = |e: &Expression| matches!(&e.expr, Node::Ident(n) if *n == c.accu_var);
    let step = &c.loop_step;
    match &c.accu_init.expr {
        Node::Literal(LiteralValue::Boolean(b)) => {
            let all = *b.inner();
            let a = call(step, if all { "_&&_" } else { "_||_" }, 2)?;
            if !is_accu(&a[0]) {
                return None;
            }
            Some(if all {
                Macro::All(&a[1])
            } else {
                Macro::Exists(&a[1])
            })
        }
        Node::Literal(LiteralValue::Int(_)) => call(step, "_?_:_", 3).map(|a| Macro::ExistsOne(&a[0])),
        Node::List(l) if l.elements.is_empty() => {
            if let Some(f) = append(step, &c.accu_var) {
                return Some(Macro::Map {
                    filter: None,
                    transform: f,
                });
            }
            let a = call(step, "_?_:_", 3)?;
            Some(Macro::Map {
                filter: Some(&a[0]),
                transform: append(&a[1], &c.accu_var)?,
            })
        }
        Node::Map(m) if m.entries.is_empty() => {
            // `@transform_map(accu, f)` or `@transform_map_entry(accu, f)`: the transform `f`.
            let insert = |e: &'a Expression| {
                [
                    (two_var::TRANSFORM_MAP, false),
                    (two_var::TRANSFORM_MAP_ENTRY, true),
                ]
                .into_iter()
                .find_map(|(name, entry)| call(e, name, 2).map(|a| (a, entry)))
                .filter(|(a, _)| is_accu(&a[0]))
                .map(|(a, entry)| (&a[1], entry))
            };
            let (filter, (transform, entry)) = match insert(step) {
                Some(found) => (None, found),
                None => {
                    let a = call(step, "_?_:_", 3)?;
                    (Some(&a[0]), insert(&a[1])?)
                }
            };
            Some(Macro::TransformMap {
                filter,
                transform,
                entry,
            })
        }
        _ => None,
    }
}

/// The symbol of a binary operator function (`_==_` → `==`), for those [`Expr::node_spans`]
/// places.
fn binary_symbol(func: &str) -> Option<&'static str> {
    Some(match func {
        "_==_" => "==",
        "_!=_" => "!=",
        "_<_" => "<",
        "_<=_" => "<=",
        "_>_" => ">",
        "_>=_" => ">=",
        "@in" => "in",
        "_+_" => "+",
        "_-_" => "-",
        "_*_" => "*",
        "_/_" => "/",
        "_%_" => "%",
        _ => return None,
    })
}

fn binary_symbol_of_token(kind: TokenKind) -> Option<&'static str> {
    Some(match kind {
        TokenKind::TokEqualEqual => "==",
        TokenKind::TokExclamationEqual => "!=",
        TokenKind::TokLess => "<",
        TokenKind::TokLessEqual => "<=",
        TokenKind::TokGreater => ">",
        TokenKind::TokGreaterEqual => ">=",
        TokenKind::TokIn => "in",
        TokenKind::TokPlus => "+",
        TokenKind::TokMinus => "-",
        TokenKind::TokAsterisk => "*",
        TokenKind::TokSlash => "/",
        TokenKind::TokPercent => "%",
        _ => return None,
    })
}

/// Collects the binary operators and selections written in the text (see
/// [`Expr::node_spans`]): of an expanded macro, only its range and the parts written in its
/// arguments.
fn written_nodes<'a>(e: &'a Expression, ops: &mut Vec<(u64, &'a str)>, fields: &mut Vec<(u64, &'a str)>) {
    match &e.expr {
        Node::Select(s) => {
            fields.push((e.id, s.field.as_str()));
            written_nodes(&s.operand, ops, fields);
        }
        Node::Call(call) => {
            if let Some(sym) = binary_symbol(&call.func_name)
                && call.target.is_none()
                && call.args.len() == 2
            {
                ops.push((e.id, sym));
            }
            if let Some(t) = &call.target {
                written_nodes(t, ops, fields);
            }
            call.args.iter().for_each(|a| written_nodes(a, ops, fields));
        }
        Node::Comprehension(c) => {
            written_nodes(&c.iter_range, ops, fields);
            match macro_of(c) {
                Some(Macro::All(p) | Macro::Exists(p) | Macro::ExistsOne(p)) => written_nodes(p, ops, fields),
                Some(
                    Macro::Map { filter, transform }
                    | Macro::TransformMap {
                        filter, transform, ..
                    },
                ) => {
                    if let Some(f) = filter {
                        written_nodes(f, ops, fields);
                    }
                    written_nodes(transform, ops, fields);
                }
                None => {}
            }
        }
        Node::List(list) => list.elements.iter().for_each(|x| written_nodes(x, ops, fields)),
        Node::Map(map) => map.entries.iter().for_each(|x| match &x.expr {
            EntryExpr::MapEntry(m) => {
                written_nodes(&m.key, ops, fields);
                written_nodes(&m.value, ops, fields);
            }
            EntryExpr::StructField(f) => written_nodes(&f.value, ops, fields),
        }),
        Node::Struct(s) => s.entries.iter().for_each(|x| match &x.expr {
            EntryExpr::MapEntry(m) => {
                written_nodes(&m.key, ops, fields);
                written_nodes(&m.value, ops, fields);
            }
            EntryExpr::StructField(f) => written_nodes(&f.value, ops, fields),
        }),
        Node::Ident(_) | Node::Literal(_) | Node::Unspecified => {}
    }
}

/// A reference found in the AST: `id` is the AST id of its root identifier.
struct RawRef<'a> {
    id: u64,
    root: &'a str,
    fields: Vec<&'a str>,
}

/// Collects identifiers (free or bound, for pairing with tokens), free references and named
/// calls, tracking the variables bound by enclosing comprehensions.
#[derive(Default)]
struct Walker<'a> {
    bound: Vec<&'a str>,
    idents: Vec<(u64, &'a str)>,
    refs: Vec<RawRef<'a>>,
    calls: Vec<(u64, &'a str)>,
    /// Of each call in `calls`, by AST id: whether it has a receiver, and its arguments.
    shapes: std::collections::HashMap<u64, (bool, usize)>,
    /// The namespace of each call in `calls` that is a namespace's function, by AST id.
    namespaced: std::collections::HashMap<u64, &'a str>,
}

impl<'a> Walker<'a> {
    fn expr(&mut self, e: &'a Expression) {
        match &e.expr {
            Node::Ident(name) => self.ident(e.id, name, Vec::new()),
            Node::Select(_) => {
                // A chain of selections on an identifier is one reference.
                let mut fields = Vec::new();
                let mut cur = e;
                while let Node::Select(s) = &cur.expr {
                    fields.push(s.field.as_str());
                    cur = &s.operand;
                }
                fields.reverse();
                match &cur.expr {
                    Node::Ident(name) => self.ident(cur.id, name, fields),
                    _ => self.expr(cur),
                }
            }
            Node::Call(call) => {
                // `optional.of(x)` is a global function of a namespace, not a method of a
                // variable `optional` (unless a comprehension binds that name).
                let namespace = match call.target.as_deref().map(|t| &t.expr) {
                    Some(Node::Ident(ns))
                        if NAMESPACES.contains(&ns.as_str()) && !self.bound.contains(&ns.as_str()) =>
                    {
                        Some(ns.as_str())
                    }
                    _ => None,
                };
                if is_function_name(&call.func_name) {
                    self.calls.push((e.id, &call.func_name));
                    let member = call.target.is_some() && namespace.is_none();
                    self.shapes.insert(e.id, (member, call.args.len()));
                    if let Some(ns) = namespace {
                        self.namespaced.insert(e.id, ns);
                    }
                }
                if let Some(target) = &call.target
                    && namespace.is_none()
                {
                    self.expr(target);
                }
                call.args.iter().for_each(|a| self.expr(a));
            }
            Node::Comprehension(c) => {
                self.expr(&c.iter_range);
                self.expr(&c.accu_init);
                let depth = self.bound.len();
                self.bound.push(&c.accu_var);
                self.expr(&c.result);
                self.bound.push(&c.iter_var);
                if let Some(v) = &c.iter_var2 {
                    self.bound.push(v);
                }
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                self.bound.truncate(depth);
            }
            Node::List(list) => list.elements.iter().for_each(|x| self.expr(x)),
            Node::Map(map) => map.entries.iter().for_each(|x| self.entry(&x.expr)),
            Node::Struct(s) => s.entries.iter().for_each(|x| self.entry(&x.expr)),
            Node::Literal(_) | Node::Unspecified => {}
        }
    }

    fn entry(&mut self, entry: &'a EntryExpr) {
        match entry {
            EntryExpr::MapEntry(m) => {
                self.expr(&m.key);
                self.expr(&m.value);
            }
            EntryExpr::StructField(f) => self.expr(&f.value),
        }
    }

    fn ident(&mut self, id: u64, name: &'a str, fields: Vec<&'a str>) {
        self.idents.push((id, name));
        if !self.bound.contains(&name) {
            self.refs.push(RawRef {
                id,
                root: name,
                fields,
            });
        }
    }
}

/// Operators (`_+_`, `@in`, `!_`, ...) are calls too; only names a user can write count.
fn is_function_name(name: &str) -> bool {
    !name.starts_with('@')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn is_ident(kind: TokenKind) -> bool {
    matches!(kind, TokenKind::TokIdent | TokenKind::TokReservedWord)
}

/// The significant tokens of `text` (no whitespace or comments).
fn lex(text: &str) -> Vec<Token> {
    let mut lexer = Lexer::new(text);
    let mut tokens = Vec::new();
    // Every token but the last consumes input, so this bounds the loop even on a lexer bug.
    for _ in 0..=text.len() {
        let tok = lexer.lex();
        match tok.kind {
            TokenKind::TokEnd | TokenKind::TokError => break,
            TokenKind::TokWhitespace | TokenKind::TokComment => {}
            _ => tokens.push(tok),
        }
    }
    tokens
}

/// Indexes of the identifier tokens that the parser turns into `Ident` nodes, in order: not
/// after `.` (a field or method), not before `(` (a function), and not the variable declared
/// by a macro that drops it (`x` in `l.all(x, p)`; `filter` keeps it in its expansion).
fn root_idents(tokens: &[Token], text: &str) -> Vec<usize> {
    let kind = |i: usize| tokens.get(i).map(|t| t.kind);
    let name = |i: usize| tokens.get(i).map_or("", |t| &text[t.start..t.end]);
    (0..tokens.len())
        .filter(|&i| {
            tokens[i].kind == TokenKind::TokIdent
                && (i == 0 || kind(i - 1) != Some(TokenKind::TokDot))
                && kind(i + 1) != Some(TokenKind::TokLeftParen)
        })
        .filter(|&i| {
            let declares = i >= 3
                && kind(i - 1) == Some(TokenKind::TokLeftParen)
                && kind(i - 3) == Some(TokenKind::TokDot)
                && kind(i + 1) == Some(TokenKind::TokComma);
            if !declares {
                return true;
            }
            let args = count_args(tokens, i - 1);
            let expands = match name(i - 2) {
                "all" | "exists" | "exists_one" | "existsOne" => args == 2,
                "map" => args == 2 || args == 3,
                _ => false,
            };
            !expands && !two_var::is_two_var(name(i - 2), args)
        })
        // The second variable of a two-variable macro (`v` in `m.all(k, v, p)`).
        .filter(|&i| {
            let declares = i >= 5
                && kind(i - 1) == Some(TokenKind::TokComma)
                && kind(i - 2) == Some(TokenKind::TokIdent)
                && kind(i - 3) == Some(TokenKind::TokLeftParen)
                && kind(i - 5) == Some(TokenKind::TokDot)
                && kind(i + 1) == Some(TokenKind::TokComma);
            !(declares && two_var::is_two_var(name(i - 4), count_args(tokens, i - 3)))
        })
        .collect()
}

/// The number of arguments of the call whose `(` is at `open`.
fn count_args(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    let mut args = 1;
    for t in &tokens[open..] {
        match t.kind {
            TokenKind::TokLeftParen | TokenKind::TokLeftBracket | TokenKind::TokLeftBrace => depth += 1,
            TokenKind::TokRightParen | TokenKind::TokRightBracket | TokenKind::TokRightBrace => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            TokenKind::TokComma if depth == 1 => args += 1,
            _ => {}
        }
    }
    args
}

/// Pairs AST nodes (`(id, name)`, sorted here by id, which is source order) with candidate
/// tokens of the same name, left to right. Returns `(id, token index)` sorted by id.
fn pair_in_order(
    nodes: &mut [(u64, &str)],
    candidates: &[usize],
    tokens: &[Token],
    text: &str,
) -> Vec<(u64, usize)> {
    nodes.sort_by_key(|n| n.0);
    let mut out = Vec::with_capacity(nodes.len());
    let mut cursor = 0;
    let mut last = None;
    for &(id, name) in nodes.iter() {
        if last == Some(id) {
            continue; // the same node reached twice
        }
        last = Some(id);
        let found = candidates[cursor..]
            .iter()
            .position(|&t| &text[tokens[t].start..tokens[t].end] == name);
        if let Some(k) = found {
            out.push((id, candidates[cursor + k]));
            cursor += k + 1;
        }
    }
    out
}

fn lookup(positions: &[(u64, usize)], id: u64) -> Option<usize> {
    positions
        .binary_search_by_key(&id, |p| p.0)
        .ok()
        .map(|i| positions[i].1)
}

/// The end of the root token at `t` followed by up to `fields` `.name` selections.
fn chain_end(tokens: &[Token], t: usize, fields: usize) -> usize {
    let mut j = t;
    for _ in 0..fields {
        match (tokens.get(j + 1), tokens.get(j + 2)) {
            (Some(dot), Some(name)) if dot.kind == TokenKind::TokDot && is_ident(name.kind) => j += 2,
            _ => break,
        }
    }
    tokens[j].end
}

/// Rejects text whose AST could be deeper than [`MAX_DEPTH`], by an upper bound computed on
/// the tokens: every operator, selection and bracket may add a level; `,` and `:` inside
/// brackets start a sibling, which is as deep as the bracket itself.
fn check_depth(text: &str) -> Result<(), ExprError> {
    let mut lexer = Lexer::new(text);
    let mut open: Vec<usize> = Vec::new();
    let mut depth = 0;
    for _ in 0..=text.len() {
        let tok = lexer.lex();
        match tok.kind {
            TokenKind::TokEnd | TokenKind::TokError => break,
            TokenKind::TokWhitespace
            | TokenKind::TokComment
            | TokenKind::TokIdent
            | TokenKind::TokReservedWord
            | TokenKind::TokNull
            | TokenKind::TokTrue
            | TokenKind::TokFalse
            | TokenKind::TokInt
            | TokenKind::TokUint
            | TokenKind::TokFloat
            | TokenKind::TokString
            | TokenKind::TokBytes => continue,
            TokenKind::TokLeftParen | TokenKind::TokLeftBracket | TokenKind::TokLeftBrace => {
                open.push(depth);
                depth += 1;
            }
            TokenKind::TokRightParen | TokenKind::TokRightBracket | TokenKind::TokRightBrace => {
                depth = open.pop().unwrap_or(depth) + 1;
            }
            TokenKind::TokComma | TokenKind::TokColon if !open.is_empty() => {
                depth = open[open.len() - 1] + 1;
            }
            _ => depth += 1,
        }
        if depth > MAX_DEPTH {
            return Err(ExprError {
                start: tok.start,
                end: tok.end,
                message: format!("expression nests too deeply (more than {MAX_DEPTH} levels)"),
            });
        }
    }
    Ok(())
}

fn convert_error(text: &str, errors: &ParseErrors) -> ExprError {
    let Some(e) = errors.errors.first() else {
        return ExprError {
            start: 0,
            end: text.len(),
            message: "invalid expression".into(),
        };
    };
    let by_id = (e.expr_id != 0)
        .then(|| e.source_info.as_ref()?.offset_for(e.expr_id))
        .flatten()
        .map(|(s, e)| (s as usize, e as usize));
    let (start, end) = match by_id {
        Some(range) => range,
        None if e.pos.0 >= 1 && e.pos.1 >= 1 => {
            let start = offset_of(text, e.pos.0 as usize, e.pos.1 as usize);
            let tok = Lexer::new(&text[floor_boundary(text, start)..]).lex();
            (start, start + tok.end.max(1))
        }
        None => (0, text.len()),
    };
    let start = floor_boundary(text, start.min(text.len()));
    let end = ceil_boundary(text, end.clamp(start, text.len()));
    let message = if e.msg == "unexpected quoted identifier" {
        quoted_name_message(text, start, end)
    } else {
        tidy_message(&e.msg)
    };
    ExprError { start, end, message }
}

/// The message for a backquoted name the parser refuses at `start..end`: one with characters
/// CEL does not allow there, or one that is not a field.
fn quoted_name_message(text: &str, start: usize, end: usize) -> String {
    let name = text[start..end].trim_matches('`');
    if text[..start].trim_end().ends_with('.') {
        format!(
            "backquoted field `{name}` may hold only letters, digits, `_`, `.`, `-`, `/` and \
             spaces; write `['{name}']` instead"
        )
    } else {
        format!("only field names can be backquoted; write `payload['{name}']` or the like")
    }
}

/// Byte offset of a 1-based line and 1-based byte column.
fn offset_of(text: &str, line: usize, col: usize) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(line - 1).map(str::len).sum();
    (line_start + col - 1).min(text.len())
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// cel's messages, made terse and lower case with code in backticks.
fn tidy_message(msg: &str) -> String {
    let msg = msg.strip_prefix("Syntax error: ").unwrap_or(msg);
    if let Some((found, expecting)) = msg
        .strip_prefix("mismatched input ")
        .and_then(|m| m.split_once(" expecting "))
    {
        let found = unquote(found);
        return match (found, expecting) {
            ("<EOF>", "expression") => "expected an expression".to_owned(),
            ("<EOF>", other) => format!("unexpected end of expression, expected `{}`", unquote(other)),
            (found, "<EOF>") => format!("unexpected `{found}`"),
            (found, "expression") => format!("unexpected `{found}`, expected an expression"),
            (found, other) => format!("unexpected `{found}`, expected `{}`", unquote(other)),
        };
    }
    if let Some(word) = msg.strip_prefix("reserved identifier: ") {
        return format!("`{word}` is a reserved word");
    }
    if msg == "unterminated quoted identifier" {
        return "unterminated backquoted name".to_owned();
    }
    if msg == "invalid argument to has() macro" {
        return "`has()` takes a field selection, like `has(payload.x)`".to_owned();
    }
    let mut out = String::with_capacity(msg.len());
    // 'x' → `x`, for quotes around a short piece of code.
    let mut rest = msg;
    while let Some(open) = rest.find('\'') {
        let after = &rest[open + 1..];
        match after.find('\'') {
            Some(close) if close > 0 && !after[..close].contains(' ') => {
                out.push_str(&rest[..open]);
                out.push('`');
                out.push_str(&after[..close]);
                out.push('`');
                rest = &after[close + 1..];
            }
            _ => break,
        }
    }
    out.push_str(rest);
    let mut chars = out.chars();
    match chars.next() {
        Some(first) if first.is_uppercase() => first.to_lowercase().chain(chars).collect(),
        _ => out,
    }
}

/// `'x'` → `x` (one pair of quotes only).
fn unquote(s: &str) -> &str {
    s.strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(text: &str) -> Vec<(String, Vec<String>, &str)> {
        let e = parse(text).expect("valid expression");
        e.references()
            .into_iter()
            .map(|r| (r.root, r.fields, &text[r.start..r.end]))
            .collect()
    }

    fn r<'a>(root: &str, fields: &[&str], at: &'a str) -> (String, Vec<String>, &'a str) {
        (root.into(), fields.iter().map(|f| f.to_string()).collect(), at)
    }

    #[test]
    fn expr_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Expr>();
        check::<std::sync::Arc<Expr>>();
    }

    #[test]
    fn references_with_field_chains() {
        assert_eq!(
            refs("payload.ticket.id"),
            vec![r("payload", &["ticket", "id"], "payload.ticket.id")]
        );
        assert_eq!(
            refs("steps.classify.result.confidence > 0.8"),
            vec![r(
                "steps",
                &["classify", "result", "confidence"],
                "steps.classify.result.confidence"
            )]
        );
        assert_eq!(
            refs("payload.items[0].x"),
            vec![r("payload", &["items"], "payload.items")]
        );
        assert_eq!(refs("has(payload.x)"), vec![r("payload", &["x"], "payload.x")]);
        assert_eq!(
            refs("size(payload.items) + 1"),
            vec![r("payload", &["items"], "payload.items")]
        );
        assert_eq!(
            refs("payload . a .\n b"),
            vec![r("payload", &["a", "b"], "payload . a .\n b")]
        );
        assert_eq!(
            refs("payload.name.startsWith('x')"),
            vec![r("payload", &["name"], "payload.name")]
        );
        assert_eq!(refs("x"), vec![r("x", &[], "x")]);
    }

    #[test]
    fn references_in_source_order_with_repeats() {
        assert_eq!(
            refs("result.ok ? payload.a : payload.b + item"),
            vec![
                r("result", &["ok"], "result.ok"),
                r("payload", &["a"], "payload.a"),
                r("payload", &["b"], "payload.b"),
                r("item", &[], "item"),
            ]
        );
        assert_eq!(
            refs("{input.k: [context.v, index]}"),
            vec![
                r("input", &["k"], "input.k"),
                r("context", &["v"], "context.v"),
                r("index", &[], "index")
            ]
        );
    }

    #[test]
    fn comprehension_variables_are_not_free() {
        assert_eq!(
            refs("payload.items.all(i, i.ok)"),
            vec![r("payload", &["items"], "payload.items")]
        );
        assert_eq!(
            refs("payload.items.exists(x, x > payload.min)"),
            vec![
                r("payload", &["items"], "payload.items"),
                r("payload", &["min"], "payload.min")
            ]
        );
        assert_eq!(
            refs("payload.items.map(x, x.ok, x.id).exists_one(y, y == 1)"),
            vec![r("payload", &["items"], "payload.items")]
        );
        assert_eq!(
            refs("payload.l.filter(x, x > 1)"),
            vec![r("payload", &["l"], "payload.l")]
        );
        // A variable bound inside a comprehension is free again outside it.
        assert_eq!(
            refs("payload.l.all(x, x > 0) && x == 2"),
            vec![r("payload", &["l"], "payload.l"), r("x", &[], "x")]
        );
        let text = "payload.l.all(x, x > 0) && x == 2";
        let last = parse(text).unwrap().references().pop().unwrap();
        assert_eq!(last.start, text.rfind('x').unwrap());
        assert_eq!(
            refs("payload.l.filter(x, x > 1).size() > x"),
            vec![r("payload", &["l"], "payload.l"), r("x", &[], "x")]
        );
        assert_eq!(refs("payload.l.map(p, p.map(q, q + payload.k))").len(), 2);
        // Nested comprehensions over the same name.
        assert_eq!(
            refs("[1].all(x, [2].all(x, x > 0)) || x").last().map(|r| r.2),
            Some("x")
        );
    }

    #[test]
    fn functions_are_listed_without_operators_or_macros() {
        let text = "size(payload.a) > 1 && payload.b.startsWith('x') && payload.c.all(y, y)";
        let e = parse(text).unwrap();
        let names: Vec<_> = e
            .functions()
            .into_iter()
            .map(|(n, s, e)| (n, &text[s..e]))
            .collect();
        assert_eq!(
            names,
            vec![
                ("size".to_string(), "size"),
                ("startsWith".to_string(), "startsWith")
            ]
        );
    }

    #[test]
    fn calls_say_how_they_are_called() {
        let text = "size(payload.a) + payload.s.split(',', 2).size() + optional.of(1).orValue(0) \
                    + payload.l.all(x) + int(x.map(y, y))";
        let calls: Vec<_> = parse(text)
            .unwrap()
            .calls()
            .into_iter()
            .map(|c| (c.name, c.member, c.args, &text[c.start..c.end]))
            .collect();
        assert_eq!(
            calls,
            vec![
                ("size".to_string(), false, 1, "size"),
                ("split".to_string(), true, 2, "split"),
                ("size".to_string(), true, 0, "size"),
                ("optional.of".to_string(), false, 1, "of"),
                ("orValue".to_string(), true, 1, "orValue"),
                // A macro with the wrong arguments stays a call; with the right ones it does not.
                ("all".to_string(), true, 1, "all"),
                ("int".to_string(), false, 1, "int"),
            ]
        );
        // The namespace of `optional.of` is not a variable.
        assert_eq!(refs("optional.none()"), vec![]);
    }

    #[test]
    fn backquoted_field_names() {
        assert_eq!(
            refs("payload.`odd-key` + payload.m.`x y`"),
            vec![
                r("payload", &["odd-key"], "payload.`odd-key`"),
                r("payload", &["m", "x y"], "payload.m.`x y`"),
            ]
        );
        // A field with a `.` in its name is an index, so no resolver reads it as two fields.
        let e = parse("payload.m.`a.b`").unwrap();
        assert!(
            matches!(&e.ast().expr, Node::Call(c) if c.func_name == "_[_]"),
            "{:?}",
            e.ast()
        );
        assert_eq!(refs("payload.m.`a.b`.c"), vec![r("payload", &["m"], "payload.m")]);
        assert!(parse("has(payload.`a.b`)").is_ok());
        let e = parse("payload.`a:b`").unwrap_err();
        assert_eq!(
            (e.start, e.end, e.message.as_str()),
            (
                8,
                13,
                "backquoted field `a:b` may hold only letters, digits, `_`, `.`, `-`, `/` and spaces; \
                 write `['a:b']` instead"
            )
        );
        let e = parse("`odd-key` == 1").unwrap_err();
        assert_eq!(
            e.message,
            "only field names can be backquoted; write `payload['odd-key']` or the like"
        );
        let e = parse("payload.`unclosed").unwrap_err();
        assert_eq!(e.message, "unterminated backquoted name");
    }

    #[test]
    fn node_spans_point_at_operators_and_field_names() {
        let text = "a.b == 1 && -c - d.e.f > 2 || x.all(y, y.z in [1]) || has(m.n) || -1 - q % 2";
        let e = parse(text).unwrap();
        let spans: Vec<&str> = e.node_spans().iter().map(|&(_, s, e)| &text[s..e]).collect();
        assert_eq!(spans, ["b", "==", "-", "e", "f", ">", "z", "in", "n", "-", "%"]);
        // The `-` of the subtraction, not the negation before it.
        let minus = e.node_spans()[2].1;
        assert_eq!(&text[minus - 2..minus + 1], "c -");
        // Macro expansions add `+`, `==` and `?:` nodes of their own; none is listed.
        let text = "l.exists_one(v, v > 1) && l.map(v, v + 1) == l.filter(v, v != 0)";
        let e = parse(text).unwrap();
        let spans: Vec<&str> = e.node_spans().iter().map(|&(_, s, e)| &text[s..e]).collect();
        assert_eq!(spans, [">", "+", "==", "!="]);
        // ... and the `+` listed is the one written in `map`.
        let Node::Call(and) = &e.ast().expr else { panic!() };
        let Node::Call(eq) = &and.args[1].expr else {
            panic!()
        };
        let Node::Comprehension(c) = &eq.args[0].expr else {
            panic!()
        };
        let Some(Macro::Map { transform, .. }) = macro_of(c) else {
            panic!()
        };
        let plus = e.node_spans().into_iter().find(|n| n.0 == transform.id);
        assert_eq!(plus.map(|(_, s, e)| &text[s..e]), Some("+"));
    }

    #[test]
    fn errors_have_terse_messages_and_ranges() {
        let cases = [
            ("payload.x +", 11, 11, "expected an expression"),
            ("payload.x )", 10, 11, "unexpected `)`"),
            ("a.b.", 4, 4, "expected identifier after `.`"),
            ("a &b", 2, 3, "unexpected single `&`, expected `&&`"),
            ("'abc", 0, 4, "unterminated string literal"),
            (
                "has(x)",
                4,
                5,
                "`has()` takes a field selection, like `has(payload.x)`",
            ),
            ("x.all(1, y)", 6, 7, "argument must be a simple name"),
            ("if", 0, 2, "`if` is a reserved word"),
            ("a ? b", 5, 5, "expected `:` in conditional expression"),
            ("", 0, 0, "expected an expression"),
            ("a\n  + )", 6, 7, "unexpected token"),
            ("é", 0, 2, "unexpected character"),
        ];
        for (text, start, end, message) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(
                (e.start, e.end, e.message.as_str()),
                (start, end, message),
                "{text:?}"
            );
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let n = 20_000;
        let texts = [
            format!("{}1{}", "(".repeat(n), ")".repeat(n)),
            format!("{}1{}", "[".repeat(n), "]".repeat(n)),
            format!("{}1{}", "(1 + ".repeat(n), ")".repeat(n)),
            format!("a{}", ".f()".repeat(n)),
            format!("a{}", "[0]".repeat(n)),
            format!("a{}", ".b".repeat(n)),
            format!("{}a", "-".repeat(n)),
            format!("{}a", "!".repeat(n)),
            format!("a{}", " + a".repeat(n)),
            format!("a{}", " && a".repeat(n)),
        ];
        for text in &texts {
            let e = parse(text).unwrap_err();
            assert!(
                e.message.contains("too deeply") || e.message.contains("recursion"),
                "{}",
                e.message
            );
        }
        let flat = format!("[{}]", vec!["payload.a.b.c"; 5_000].join(", "));
        assert_eq!(
            parse(&flat).expect("flat lists are fine").references().len(),
            5_000
        );
    }
}
