//! Jinja templates (minijinja): `message`, `prompt`, `system`, `interrupt.prompt`,
//! `fail.message` and command `run` arguments.
//!
//! This module owns checking a template ([`check`]: its syntax error, and the free variables it
//! reads with their byte ranges) and compiling it once ([`compile`]) into a [`Template`] that
//! renders with strict undefined behaviour (an undefined variable is an error, not `""`) and no
//! auto-escaping. It knows nothing of which variables a flow provides, and does no I/O.
//!
//! Syntax: Jinja's defaults (`{{ }}`, `{% %}`, `{# #}`, no `trim_blocks`), except that a trailing
//! newline is kept, so a template renders exactly like the same text without tags. Only the
//! `builtins` feature set is enabled: no `{% macro %}`, `{% include %}`, `{% break %}`, and no
//! `tojson` filter. Values are inserted as text and never parsed again as a template.

use std::sync::{Arc, LazyLock};

use minijinja::machinery::{self, ast};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, UndefinedBehavior};

/// The name of the one template in each compiled environment.
const NAME: &str = "template";

/// How deeply an expression inside a tag may nest. minijinja's parser bounds nested brackets
/// but not chains (`a[0][0]...`, `a + a + ...`), and its code generator and `Drop` recurse once
/// per level; this keeps them far from the end of a 2 MiB stack.
pub const MAX_DEPTH: usize = 256;

/// The free variables a template reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateInfo {
    pub vars: Vec<VarUse>,
}

/// One read of a free variable with its static attribute chain: `{{ input.ticket.id }}` is
/// root `input`, fields `["ticket", "id"]`; the chain stops at `[...]`, a call or a filter.
/// `start..end` covers the root through the last field, in bytes of the template text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarUse {
    pub root: String,
    pub fields: Vec<String>,
    pub start: usize,
    pub end: usize,
}

/// A template syntax error: `start..end` are byte offsets inside the template text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TemplateError {
    pub start: usize,
    pub end: usize,
    pub message: String,
}

/// A compiled template, cheap to clone and share across tasks.
#[derive(Clone)]
pub struct Template {
    text: Arc<str>,
    /// `None` for text without template tags, which renders as itself.
    env: Option<Arc<Environment<'static>>>,
    /// The free variables it reads, with their static attribute chains, found once here so
    /// that rendering copies only what the template can see.
    vars: Arc<[(String, Vec<String>)]>,
}

/// The environment every template is compiled in: strict undefined, no auto-escaping.
static BASE: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_syntax(
        SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env
});

/// Text without `{{`, `{%` or `{#` is not a template at all.
fn is_plain(text: &str) -> bool {
    !text.contains("{{") && !text.contains("{%") && !text.contains("{#")
}

/// Parses a template and lists the free variables it reads, in source order. Loop variables,
/// `loop`, and variables assigned with `set` or `with` inside the template are not free;
/// functions called by name (`range(3)`) are not variables.
pub fn check(text: &str) -> Result<TemplateInfo, TemplateError> {
    if is_plain(text) {
        return Ok(TemplateInfo::default());
    }
    check_depth(text)?;
    let tree = machinery::parse(text, NAME, BASE.syntax().clone()).map_err(|e| locate_error(text, &e))?;
    let mut walker = Walker::default();
    walker.stmt(&tree);
    let mut vars = walker.vars;
    vars.sort_by_key(|v| (v.start, v.end));
    Ok(TemplateInfo { vars })
}

/// Compiles a template for rendering.
pub fn compile(text: &str) -> Result<Template, TemplateError> {
    if is_plain(text) {
        return Ok(Template {
            text: text.into(),
            env: None,
            vars: Arc::new([]),
        });
    }
    check_depth(text)?;
    let mut env = BASE.clone();
    env.add_template_owned(NAME, text.to_owned())
        .map_err(|e| locate_error(text, &e))?;
    let vars = check(text)?
        .vars
        .into_iter()
        .map(|v| (v.root, v.fields))
        .collect();
    Ok(Template {
        text: text.into(),
        env: Some(Arc::new(env)),
        vars,
    })
}

impl Template {
    /// The free variables the template reads: root and static attribute chain, in order.
    pub fn vars(&self) -> &[(String, Vec<String>)] {
        &self.vars
    }

    /// The template as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the text has no template tags (it renders as itself).
    pub fn is_plain(&self) -> bool {
        self.env.is_none()
    }

    /// Renders with `ctx` (a JSON object whose members are the variables). An undefined
    /// variable or attribute is an error, which names it when it can (`` `input.x` is
    /// undefined (line 2) ``).
    pub fn render(&self, ctx: &serde_json::Value) -> Result<String, String> {
        let Some(env) = &self.env else {
            return Ok(self.text.to_string());
        };
        env.get_template(NAME)
            .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(ctx))))
            .map_err(|e| {
                let undefined = (e.kind() == minijinja::ErrorKind::UndefinedError)
                    .then(|| missing_variable(&self.text, ctx, e.line()))
                    .flatten();
                let mut message = match (undefined, e.detail()) {
                    (Some(name), _) => format!("`{name}` is undefined"),
                    (None, Some(detail)) => format!("{}: {detail}", e.kind()),
                    (None, None) => e.kind().to_string(),
                };
                if let Some(line) = e.line() {
                    message.push_str(&format!(" (line {line})"));
                }
                message
            })
    }
}

/// The first variable read on `line` whose chain does not exist in `ctx`, as `root.field`,
/// for render errors (minijinja, without its `debug` feature, does not say which).
fn missing_variable(text: &str, ctx: &serde_json::Value, line: Option<usize>) -> Option<String> {
    let info = check(text).ok()?;
    info.vars.iter().find_map(|var| {
        let var_line = text.get(..var.start)?.matches('\n').count() + 1;
        if line.is_some_and(|l| l != var_line) {
            return None;
        }
        let mut cur = ctx.get(&var.root);
        let mut name = var.root.clone();
        for field in &var.fields {
            let value = cur?;
            cur = value.get(field);
            name.push('.');
            name.push_str(field);
            if cur.is_none() {
                break;
            }
        }
        cur.is_none().then_some(name)
    })
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("text", &self.text)
            .finish_non_exhaustive()
    }
}

/// Rejects a template whose expressions could nest deeper than [`MAX_DEPTH`], by an upper
/// bound computed on the tokens: operators, `.`, `|` and brackets may each add a level; `,` and
/// `:` inside brackets start a sibling; every tag starts from zero. Lexer errors are left to
/// the parser, which reports them with its own message.
fn check_depth(text: &str) -> Result<(), TemplateError> {
    use machinery::Token;
    let mut open: Vec<usize> = Vec::new();
    let mut depth = 0;
    for item in machinery::tokenize(text, false, BASE.syntax().clone()) {
        let Ok((token, span)) = item else { break };
        match token {
            Token::TemplateData(_)
            | Token::VariableStart
            | Token::VariableEnd
            | Token::BlockStart
            | Token::BlockEnd => {
                open.clear();
                depth = 0;
                continue;
            }
            Token::Ident(word) if !matches!(word, "and" | "or" | "not" | "is" | "in" | "if" | "else") => {
                continue;
            }
            Token::Str(_) | Token::String(_) | Token::Int(_) | Token::Int128(_) | Token::Float(_) => continue,
            Token::ParenOpen | Token::BracketOpen | Token::BraceOpen => {
                open.push(depth);
                depth += 1;
            }
            Token::ParenClose | Token::BracketClose | Token::BraceClose => {
                depth = open.pop().unwrap_or(depth) + 1;
            }
            Token::Comma | Token::Colon if !open.is_empty() => depth = open[open.len() - 1] + 1,
            _ => depth += 1,
        }
        if depth > MAX_DEPTH {
            return Err(TemplateError {
                start: span.start_offset as usize,
                end: span.end_offset as usize,
                message: format!("expression nests too deeply (more than {MAX_DEPTH} levels)"),
            });
        }
    }
    Ok(())
}

/// minijinja reports a syntax error's line but (without its `debug` feature) not its byte
/// range. The range is recovered from the tokens: the error sits on the first token at which a
/// prefix of the text fails with the same message. End-of-input errors sit on the last token;
/// errors of the lexer itself on the first character after the last token it produced.
fn locate_error(text: &str, err: &minijinja::Error) -> TemplateError {
    let message = err.detail().unwrap_or("syntax error").to_owned();
    let spans: Vec<(usize, usize)> = machinery::tokenize(text, false, BASE.syntax().clone())
        .map_while(Result::ok)
        .map(|(_, s)| (s.start_offset as usize, s.end_offset as usize))
        .collect();
    let same_error = |k: usize| {
        let prefix = text.get(..spans[k].1).unwrap_or(text);
        matches!(machinery::parse(prefix, NAME, BASE.syntax().clone()), Err(e) if e.detail() == err.detail())
    };
    let after_tokens = || {
        let from = spans.last().map_or(0, |s| s.1);
        let rest = text.get(from..).unwrap_or("");
        let skipped = rest.len() - rest.trim_start().len();
        let start = from + skipped;
        let end = text
            .get(start..)
            .and_then(|r| r.chars().next())
            .map_or(start, |c| start + c.len_utf8());
        (start, end)
    };
    let (start, end) = match spans.len() {
        0 => after_tokens(),
        n if message.starts_with("unexpected end of input") => spans[n - 1],
        n if !same_error(n - 1) => after_tokens(),
        n => {
            let (mut lo, mut hi) = (0, n - 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if same_error(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            spans[lo]
        }
    };
    let end = end.min(text.len());
    TemplateError {
        start: start.min(end),
        end,
        message,
    }
}

/// Collects free variable reads, tracking the names bound by loops, `set` and `with`.
#[derive(Default)]
struct Walker<'a> {
    /// Bound names; `frames` marks where each nested scope starts.
    bound: Vec<&'a str>,
    frames: Vec<usize>,
    vars: Vec<VarUse>,
}

impl<'a> Walker<'a> {
    fn push(&mut self) {
        self.frames.push(self.bound.len());
    }

    fn pop(&mut self) {
        let len = self.frames.pop().unwrap_or(0);
        self.bound.truncate(len);
    }

    fn assign(&mut self, target: &ast::Expr<'a>) {
        match target {
            ast::Expr::Var(v) => self.bound.push(v.id),
            ast::Expr::List(l) => l.items.iter().for_each(|x| self.assign(x)),
            ast::Expr::Tuple(t) => t.items.iter().for_each(|x| self.assign(x)),
            _ => {}
        }
    }

    fn stmts(&mut self, body: &[ast::Stmt<'a>]) {
        body.iter().for_each(|s| self.stmt(s));
    }

    fn stmt(&mut self, stmt: &ast::Stmt<'a>) {
        match stmt {
            ast::Stmt::Template(t) => self.stmts(&t.children),
            ast::Stmt::EmitExpr(e) => self.expr(&e.expr),
            ast::Stmt::EmitRaw(_) => {}
            ast::Stmt::ForLoop(f) => {
                self.expr(&f.iter);
                self.push();
                self.bound.push("loop");
                self.assign(&f.target);
                if let Some(filter) = &f.filter_expr {
                    self.expr(filter);
                }
                self.stmts(&f.body);
                self.pop();
                self.push();
                self.stmts(&f.else_body);
                self.pop();
            }
            // Like Jinja, `if` opens no scope: a `set` inside it is visible after it.
            ast::Stmt::IfCond(i) => {
                self.expr(&i.expr);
                self.stmts(&i.true_body);
                self.stmts(&i.false_body);
            }
            ast::Stmt::WithBlock(w) => {
                self.push();
                for (target, value) in &w.assignments {
                    self.expr(value);
                    self.assign(target);
                }
                self.stmts(&w.body);
                self.pop();
            }
            ast::Stmt::Set(s) => {
                self.expr(&s.expr);
                self.assign(&s.target);
            }
            ast::Stmt::SetBlock(s) => {
                self.push();
                self.stmts(&s.body);
                self.pop();
                if let Some(filter) = &s.filter {
                    self.expr(filter);
                }
                self.assign(&s.target);
            }
            ast::Stmt::AutoEscape(a) => {
                self.expr(&a.enabled);
                self.stmts(&a.body);
            }
            ast::Stmt::FilterBlock(f) => {
                self.expr(&f.filter);
                self.stmts(&f.body);
            }
            ast::Stmt::Do(d) => self.call(&d.call),
            // Statements of minijinja features this crate does not enable.
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }

    fn expr(&mut self, expr: &ast::Expr<'a>) {
        match expr {
            ast::Expr::Var(v) => self.read(v.id, Vec::new(), v.span(), v.span()),
            ast::Expr::GetAttr(g) => {
                // A chain of attribute lookups on a variable is one read.
                let mut fields = vec![g.name];
                let mut cur = &g.expr;
                while let ast::Expr::GetAttr(inner) = cur {
                    fields.push(inner.name);
                    cur = &inner.expr;
                }
                match cur {
                    ast::Expr::Var(v) => {
                        fields.reverse();
                        self.read(v.id, fields, v.span(), g.span());
                    }
                    other => self.expr(other),
                }
            }
            ast::Expr::Const(_) => {}
            ast::Expr::Slice(s) => {
                self.expr(&s.expr);
                for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(part);
                }
            }
            ast::Expr::UnaryOp(u) => self.expr(&u.expr),
            ast::Expr::BinOp(b) => {
                self.expr(&b.left);
                self.expr(&b.right);
            }
            ast::Expr::Compare(c) => {
                self.expr(&c.expr);
                c.ops.iter().for_each(|op| self.expr(&op.expr));
            }
            ast::Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(e) = &i.false_expr {
                    self.expr(e);
                }
            }
            ast::Expr::Filter(f) => {
                if let Some(e) = &f.expr {
                    self.expr(e);
                }
                self.args(&f.args);
            }
            ast::Expr::Test(t) => {
                self.expr(&t.expr);
                self.args(&t.args);
            }
            ast::Expr::GetItem(g) => {
                self.expr(&g.expr);
                self.expr(&g.subscript_expr);
            }
            ast::Expr::Call(c) => self.call(c),
            ast::Expr::List(l) => l.items.iter().for_each(|x| self.expr(x)),
            ast::Expr::Tuple(t) => t.items.iter().for_each(|x| self.expr(x)),
            ast::Expr::Map(m) => {
                m.keys.iter().for_each(|x| self.expr(x));
                m.values.iter().for_each(|x| self.expr(x));
            }
        }
    }

    fn call(&mut self, call: &ast::Call<'a>) {
        match &call.expr {
            // `range(3)`: a function, not a variable read.
            ast::Expr::Var(_) => {}
            // `x.upper()`: a method of `x`; the chain stops before the method name.
            ast::Expr::GetAttr(g) => self.expr(&g.expr),
            other => self.expr(other),
        }
        self.args(&call.args);
    }

    fn args(&mut self, args: &[ast::CallArg<'a>]) {
        for arg in args {
            match arg {
                ast::CallArg::Pos(e)
                | ast::CallArg::Kwarg(_, e)
                | ast::CallArg::PosSplat(e)
                | ast::CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    fn read(&mut self, root: &'a str, fields: Vec<&'a str>, from: machinery::Span, to: machinery::Span) {
        if self.bound.contains(&root) {
            return;
        }
        self.vars.push(VarUse {
            root: root.to_owned(),
            fields: fields.into_iter().map(str::to_owned).collect(),
            start: from.start_offset as usize,
            end: to.end_offset as usize,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(text: &str) -> Vec<(String, Vec<String>, &str)> {
        check(text)
            .expect("valid template")
            .vars
            .into_iter()
            .map(|v| (v.root, v.fields, &text[v.start..v.end]))
            .collect()
    }

    fn v<'a>(root: &str, fields: &[&str], at: &'a str) -> (String, Vec<String>, &'a str) {
        (root.into(), fields.iter().map(|f| f.to_string()).collect(), at)
    }

    #[test]
    fn template_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Template>();
    }

    #[test]
    fn free_variables_with_attribute_chains() {
        assert_eq!(
            vars("Hi {{ input.ticket.id }} and {{ payload . name | upper }}"),
            vec![
                v("input", &["ticket", "id"], "input.ticket.id"),
                v("payload", &["name"], "payload . name")
            ]
        );
        assert_eq!(
            vars("{{ input.items[0].x }}"),
            vec![v("input", &["items"], "input.items")]
        );
        assert_eq!(
            vars("{{ input.name.upper() }}"),
            vec![v("input", &["name"], "input.name")]
        );
        assert_eq!(vars("{{ range(3) | join(sep) }}"), vec![v("sep", &[], "sep")]);
        assert_eq!(vars("{{ a if b else c.d }}").len(), 3);
        assert_eq!(
            vars("{% if step.failed %}x{% endif %}"),
            vec![v("step", &["failed"], "step.failed")]
        );
        assert_eq!(vars("no tags at all"), vec![]);
    }

    #[test]
    fn loop_and_set_variables_are_not_free() {
        let text = "{% for t in input.tickets %}{{ loop.index }}: {{ t.id }} {{ x }}{% endfor %}";
        assert_eq!(
            vars(text),
            vec![v("input", &["tickets"], "input.tickets"), v("x", &[], "x")]
        );
        assert_eq!(
            vars("{% set n = input.n %}{{ n }}"),
            vec![v("input", &["n"], "input.n")]
        );
        assert_eq!(vars("{{ n }}{% set n = 1 %}{{ n }}"), vec![v("n", &[], "n")]);
        assert_eq!(
            vars("{% for k, v in m|items %}{{ k }}{{ v }}{% endfor %}{{ k }}").len(),
            2
        );
        assert_eq!(vars("{% with a = b %}{{ a }}{% endwith %}{{ a }}").len(), 2);
        assert_eq!(
            vars("{% if c %}{% set s = 1 %}{% endif %}{{ s }}"),
            vec![v("c", &[], "c")]
        );
        assert_eq!(
            vars("{% set s %}{{ i }}{% endset %}{{ s }}"),
            vec![v("i", &[], "i")]
        );
    }

    #[test]
    fn syntax_errors_point_at_the_token() {
        let at = |text: &str| {
            let e = check(text).unwrap_err();
            assert_eq!(
                e,
                compile(text).unwrap_err(),
                "check and compile agree on {text:?}"
            );
            (text[e.start..e.end].to_owned(), e.message)
        };
        assert_eq!(
            at("{{ a b }}"),
            (
                "b".into(),
                "unexpected identifier, expected end of variable block".into()
            )
        );
        assert_eq!(at("x\n{% if %}"), ("%}".into(), "unexpected end of block".into()));
        assert_eq!(at("{{ 'é' + }}").0, "}}");
        assert_eq!(at("{% macro m() %}{% endmacro %}").0, "macro");
        assert_eq!(at("{{ a").0, "a");
        assert_eq!(at("{{ a ; }}").0, ";");
        assert_eq!(at("ok {{ 'abc }}").0, "'");
        assert_eq!(at("{{ a }\n}}").0, "}");
    }

    #[test]
    fn render_is_strict_and_unescaped() {
        let t = compile("Hi {{ input.name }} <{{ input.html }}>\n").unwrap();
        let ctx = json!({"input": {"name": "Ann", "html": "<b>&"}});
        assert_eq!(t.render(&ctx).unwrap(), "Hi Ann <<b>&>\n");
        let err = t.render(&json!({"input": {}})).unwrap_err();
        assert_eq!(err, "`input.name` is undefined (line 1)");
        let t = compile("a\n{{ input.a }} {{ nope }}").unwrap();
        assert_eq!(
            t.render(&json!({"input": {"a": 1}})).unwrap_err(),
            "`nope` is undefined (line 2)"
        );
        let t = compile("{% for x in input.l %}{{ x.y }}{% endfor %}").unwrap();
        assert_eq!(
            t.render(&json!({"input": {"l": [{}]}})).unwrap_err(),
            "undefined value (line 1)"
        );
        let t = compile("{{ input.x + 1 }}").unwrap();
        let err = t.render(&json!({"input": {"x": "s"}})).unwrap_err();
        assert!(err.starts_with("invalid operation: "), "{err}");
        let t = compile("{{ input.text }}").unwrap();
        assert_eq!(
            t.render(&json!({"input": {"text": "{{ not again }}"}})).unwrap(),
            "{{ not again }}"
        );
    }

    #[test]
    fn plain_text_takes_the_fast_path() {
        let t = compile("just text } { %\n").unwrap();
        assert!(t.is_plain());
        assert_eq!(t.render(&json!(null)).unwrap(), "just text } { %\n");
        let t = compile("a {# note #} b").unwrap();
        assert!(!t.is_plain());
        assert_eq!(t.render(&json!({})).unwrap(), "a  b");
    }

    #[test]
    fn deep_templates_do_not_crash() {
        let n = 20_000;
        for text in [
            format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n)),
            format!("{{{{ a{} }}}}", "[0]".repeat(n)),
            format!("{{{{ a{} }}}}", ".b".repeat(n)),
            format!("{{{{ a{} }}}}", " + a".repeat(n)),
            format!("{}x{}", "{% if a %}".repeat(n), "{% endif %}".repeat(n)),
        ] {
            let e = check(&text).unwrap_err();
            assert!(
                e.message.contains("too deeply") || e.message.contains("recursion"),
                "{}",
                e.message
            );
            assert!(compile(&text).is_err());
        }
        let wide = format!("{{{{ [{}] }}}}", vec!["input.a.b"; 5_000].join(", "));
        assert_eq!(check(&wide).expect("wide lists are fine").vars.len(), 5_000);
        assert!(compile(&wide).is_ok());
    }
}
