//! Steps (SPEC §3): the kind of each (`agent`, `set`, `parallel`, `interrupt`, `fail`,
//! `succeed`) and the keys that apply to it, the `foreach`/`while` fields of an agent step,
//! `parallel` branches, a field indented as a step id, and the placeholder a step whose kind
//! cannot be read is kept with.

use indexmap::IndexMap;

use super::agents::agent;
use super::cx::Cx;
use super::edges::next;
use super::limits::retry;
use super::mappings::{input_spec, mappings, output_spec};
use super::read::{
    bool_, check_ident, check_keys, duration, map, named, schema_ref, string, type_error, u64_, unknown_key,
};
use crate::diag::{Diagnostic, article, codes, did_you_mean};
use crate::model::*;
use crate::source::Span;
use crate::syntax::{Key, Node, Value};

const STEP_KINDS: &[&str] = &["agent", "set", "parallel", "interrupt", "fail", "succeed"];
const STEP_COMMON: &[&str] = &["description", "next", "timeout", "retry", "idempotent"];
const AGENT_STEP: &[&str] = &[
    "message",
    "scope",
    "input",
    "output",
    "foreach",
    "as",
    "max_items",
    "tolerate",
    "select",
    "concurrency",
    "while",
    "max_iterations",
    "delay",
];
const FOREACH_ONLY: &[&str] = &["as", "max_items", "tolerate", "select"];
const WHILE_ONLY: &[&str] = &["max_iterations", "delay"];

/// The keys a step of kind `kind` may have, in the order messages list them: the common
/// keys, the kind, then the kind's own.
fn step_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "agent" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "agent",
            "message",
            "scope",
            "input",
            "output",
            "foreach",
            "as",
            "max_items",
            "tolerate",
            "select",
            "concurrency",
            "while",
            "max_iterations",
            "delay",
        ],
        "set" => &["description", "next", "timeout", "retry", "idempotent", "set"],
        "parallel" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "parallel",
            "concurrency",
            "fail_fast",
        ],
        "interrupt" => &[
            "description",
            "next",
            "timeout",
            "retry",
            "idempotent",
            "interrupt",
            "scope",
            "input",
            "output",
        ],
        "fail" => &["description", "fail"],
        _ => &["description", "succeed"],
    }
}

pub(super) fn steps(cx: &mut Cx, node: &Node) -> IndexMap<String, Step> {
    if let Value::Map(m) = &node.value
        && m.is_empty()
    {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "`steps` is empty")
                .help("a flow needs at least one step"),
        );
    }
    if matches!(node.value, Value::Null) {
        cx.push(
            Diagnostic::new(&codes::MISSING_KEY, node.span, "`steps` is empty")
                .help("a flow needs at least one step"),
        );
        return IndexMap::new();
    }
    let Some(m) = map(cx, node, "`steps`") else {
        return IndexMap::new();
    };
    let mut out: IndexMap<String, Step> = IndexMap::with_capacity(m.len());
    for (k, v) in m {
        if !matches!(v.value, Value::Map(_))
            && let Some((_, previous)) = out.last_mut()
            && step_keys("agent").iter().chain(STEP_KINDS).any(|f| *f == k.name)
        {
            dedented_field(cx, k, v, previous);
            continue;
        }
        check_ident(cx, "step", k);
        out.insert(k.name.clone(), step(cx, k, v));
    }
    out
}

/// A step's field written at the indentation of step ids (`next: b` two spaces short): one
/// error saying so, and no step of that name. A `next` becomes the step's above when it has
/// none, so that the steps it leads to stay reachable and raise no error of their own.
fn dedented_field(cx: &mut Cx, key: &Key, value: &Node, previous: &mut Step) {
    cx.push(
        Diagnostic::new(
            &codes::INVALID_TYPE,
            key.span,
            format!("`{}` is indented as a step id, under `steps:`", key.name),
        )
        .label("at the indentation of a step")
        .help(format!(
            "indent it under `{}:` (as deep as that step's other fields) to make it that step's `{}`",
            previous.id.value, key.name
        )),
    );
    if key.name == "next" && previous.next.is_none() {
        previous.next = next(cx, value);
    }
}

/// The kind a malformed step is kept with: an `agent` step whose agent lint cannot see (an
/// empty name, which no agent has). Steps with this kind are listed in
/// [`Cx::malformed_steps`]; lint reports nothing about their kind, and the error that made
/// them malformed keeps the flow from compiling.
pub fn placeholder_kind(at: Span) -> StepKind {
    StepKind::Agent(AgentRef::Named(Sp::new(String::new(), at)))
}

/// The entries of a step's mapping that [`step`] reads, found in one pass over its keys.
#[derive(Default)]
struct StepFields<'n> {
    description: Option<&'n (Key, Node)>,
    next: Option<&'n (Key, Node)>,
    timeout: Option<&'n (Key, Node)>,
    retry: Option<&'n (Key, Node)>,
    idempotent: Option<&'n (Key, Node)>,
    message: Option<&'n (Key, Node)>,
    scope: Option<&'n (Key, Node)>,
    input: Option<&'n (Key, Node)>,
    output: Option<&'n (Key, Node)>,
    foreach: Option<&'n (Key, Node)>,
    as_name: Option<&'n (Key, Node)>,
    max_items: Option<&'n (Key, Node)>,
    tolerate: Option<&'n (Key, Node)>,
    select: Option<&'n (Key, Node)>,
    while_: Option<&'n (Key, Node)>,
    max_iterations: Option<&'n (Key, Node)>,
    delay: Option<&'n (Key, Node)>,
    concurrency: Option<&'n (Key, Node)>,
    fail_fast: Option<&'n (Key, Node)>,
}

impl<'n> StepFields<'n> {
    /// The fields of `node` (none when it is not a mapping). Keys are unique: the parser
    /// keeps the first of duplicates.
    fn of(node: &'n Node) -> Self {
        let mut f = StepFields::default();
        for entry in node.as_map().unwrap_or_default() {
            let slot = match entry.0.name.as_str() {
                "description" => &mut f.description,
                "next" => &mut f.next,
                "timeout" => &mut f.timeout,
                "retry" => &mut f.retry,
                "idempotent" => &mut f.idempotent,
                "message" => &mut f.message,
                "scope" => &mut f.scope,
                "input" => &mut f.input,
                "output" => &mut f.output,
                "foreach" => &mut f.foreach,
                "as" => &mut f.as_name,
                "max_items" => &mut f.max_items,
                "tolerate" => &mut f.tolerate,
                "select" => &mut f.select,
                "while" => &mut f.while_,
                "max_iterations" => &mut f.max_iterations,
                "delay" => &mut f.delay,
                "concurrency" => &mut f.concurrency,
                "fail_fast" => &mut f.fail_fast,
                _ => continue,
            };
            slot.get_or_insert(entry);
        }
        f
    }
}

/// The value node of an entry.
fn val(entry: Option<&(Key, Node)>) -> Option<&Node> {
    entry.map(|(_, v)| v)
}

/// Lowers one step. A step whose kind cannot be read is still returned, with
/// [`placeholder_kind`] and its other fields as written, so that one problem gives one
/// diagnostic rather than unknown-step and unreachable-step errors around it.
fn step(cx: &mut Cx, key: &Key, node: &Node) -> Step {
    let m = match &node.value {
        Value::Map(m) => Some(m.as_slice()),
        _ => map(cx, node, &format!("step `{}`", key.name)),
    };
    let f = StepFields::of(node);
    let kind = m.and_then(|m| step_kind(cx, key, m, &f));
    let kind = kind.unwrap_or_else(|| {
        cx.malformed_steps.push(key.span);
        placeholder_kind(key.span)
    });
    let looping = LoopFields {
        foreach: val(f.foreach).and_then(|n| string(cx, n)),
        as_name: val(f.as_name).and_then(|n| string(cx, n)),
        max_items: val(f.max_items).and_then(|n| u64_(cx, n)),
        tolerate: val(f.tolerate).and_then(|n| tolerate(cx, n)),
        select: val(f.select).and_then(|n| string(cx, n)),
        while_: val(f.while_).and_then(|n| string(cx, n)),
        max_iterations: val(f.max_iterations).and_then(|n| u64_(cx, n)),
        max_iterations_written: f.max_iterations.is_some(),
        delay: val(f.delay).and_then(|n| duration(cx, n)),
    };
    if let (Some((fk, _)), Some((w, _))) = (f.foreach, f.while_) {
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                w.span,
                "a step is either a `foreach` or a `while` loop, not both",
            )
            .with_secondary(fk.span, "`foreach` here")
            .help("nest one loop in a `flow` agent called by the other"),
        );
    }
    if f.foreach.is_none() {
        // FOREACH_ONLY, in its order.
        for (k, entry) in FOREACH_ONLY
            .iter()
            .zip([f.as_name, f.max_items, f.tolerate, f.select])
        {
            if let Some((key, _)) = entry {
                cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        key.span,
                        format!("`{k}` applies only to `foreach` steps"),
                    )
                    .label("no `foreach` here")
                    .help("add `foreach:` or remove this key"),
                );
            }
        }
    }
    if f.while_.is_none() {
        // WHILE_ONLY, in its order.
        for (k, entry) in WHILE_ONLY.iter().zip([f.max_iterations, f.delay]) {
            if let Some((key, _)) = entry {
                cx.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_KEY,
                        key.span,
                        format!("`{k}` applies only to `while` steps"),
                    )
                    .label("no `while` here")
                    .help("add `while:` or remove this key"),
                );
            }
        }
    }
    // The kind key that counts (the first, when there are several).
    let kname = m.and_then(|m| {
        m.iter()
            .map(|(k, _)| k.name.as_str())
            .find(|n| STEP_KINDS.contains(n))
    });
    if kname == Some("agent")
        && f.foreach.is_none()
        && let Some((key, _)) = f.concurrency
    {
        cx.push(
            Diagnostic::new(
                &codes::UNKNOWN_KEY,
                key.span,
                "`concurrency` applies only to `foreach` and `parallel` steps",
            )
            .label("no `foreach` here"),
        );
    }
    Step {
        id: Sp::new(key.name.clone(), key.span),
        description: val(f.description).and_then(|n| string(cx, n)).map(|s| s.value),
        kind,
        next: val(f.next).and_then(|n| next(cx, n)),
        timeout: val(f.timeout).and_then(|n| duration(cx, n)),
        retry: val(f.retry).and_then(|n| retry(cx, n)),
        idempotent: val(f.idempotent).and_then(|n| bool_(cx, n)),
        message: val(f.message).and_then(|n| string(cx, n)),
        scope: val(f.scope).and_then(|n| string(cx, n)),
        input: val(f.input).and_then(|n| input_spec(cx, n)),
        output: val(f.output).and_then(|n| output_spec(cx, n)),
        looping,
        concurrency: val(f.concurrency).and_then(|n| u64_(cx, n)),
        fail_fast: val(f.fail_fast).and_then(|n| bool_(cx, n)),
        span: node.span,
    }
}

/// The kind of a step (a mapping), with the problems of its kind key and of the keys that do not
/// apply to that kind. `None`, with an error, when no kind can be read.
fn step_kind(cx: &mut Cx, key: &Key, m: &[(Key, Node)], f: &StepFields) -> Option<StepKind> {
    let mut kinds = m.iter().filter(|(k, _)| STEP_KINDS.contains(&k.name.as_str()));
    let Some((kind_key, kind_node)) = kinds.next() else {
        let looping = f.foreach.or(f.while_).is_some();
        let help = if looping {
            "`foreach` and `while` modify an `agent` step: add `agent: <name>`".to_string()
        } else {
            let mut h = format!(
                "give it one of {}",
                STEP_KINDS
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (k, _) in m {
                if let Some(d) = did_you_mean(&k.name, STEP_KINDS.iter().copied()) {
                    h = format!("{d} ({h})");
                    break;
                }
            }
            h
        };
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                key.span,
                format!("step `{}` has no kind", key.name),
            )
            .label("no kind key")
            .help(help),
        );
        return None;
    };
    for (extra, _) in kinds {
        cx.push(
            Diagnostic::new(
                &codes::STEP_KIND,
                extra.span,
                format!(
                    "step `{}` has more than one kind: `{}` and `{}`",
                    key.name, kind_key.name, extra.name
                ),
            )
            .label("second kind key")
            .with_secondary(kind_key.span, "first kind key")
            .help("a step does one thing; split it into two steps joined by `next`"),
        );
    }
    let kname = kind_key.name.as_str();
    let valid = step_keys(kname);
    for (k, _) in m {
        let n = k.name.as_str();
        if valid.contains(&n) || STEP_KINDS.contains(&n) {
            continue;
        }
        let a = article(kname);
        let all: Vec<&str> = STEP_COMMON
            .iter()
            .chain(AGENT_STEP)
            .chain(&["concurrency", "fail_fast"])
            .copied()
            .collect();
        if all.contains(&n) {
            cx.push(
                Diagnostic::new(
                    &codes::UNKNOWN_KEY,
                    k.span,
                    format!("`{n}` does not apply to {a} `{kname}` step"),
                )
                .label(format!("not a field of `{kname}` steps"))
                .help(format!(
                    "valid keys of {a} `{kname}` step are: {}",
                    valid
                        .iter()
                        .map(|v| format!("`{v}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            );
        } else {
            unknown_key(cx, k, &format!("{a} `{kname}` step"), valid);
        }
    }
    // A body that cannot be read keeps the kind, empty: its problem is reported, and the
    // step still does what its kind says. Only an agent cannot be made up.
    let kind = match kname {
        "agent" => StepKind::Agent(agent_ref(cx, key, kind_node)?),
        "set" => StepKind::Set(mappings(cx, kind_node, "`set`").unwrap_or_default()),
        "parallel" => StepKind::Parallel(branches(cx, kind_node)),
        "interrupt" => StepKind::Interrupt(match map(cx, kind_node, "`interrupt`") {
            Some(im) => {
                check_keys(cx, im, "`interrupt`", &["prompt", "schema", "expires"]);
                Interrupt {
                    prompt: kind_node.get("prompt").and_then(|n| string(cx, n)),
                    schema: kind_node.get("schema").and_then(|n| schema_ref(cx, n)),
                    expires: kind_node.get("expires").and_then(|n| duration(cx, n)),
                }
            }
            None => Interrupt {
                prompt: None,
                schema: None,
                expires: None,
            },
        }),
        "fail" => StepKind::Fail(if matches!(kind_node.value, Value::Null) {
            FailSpec::default()
        } else {
            match map(cx, kind_node, "`fail`") {
                Some(fm) => {
                    check_keys(cx, fm, "`fail`", &["kind", "message"]);
                    FailSpec {
                        kind: kind_node.get("kind").and_then(|n| string(cx, n)),
                        message: kind_node.get("message").and_then(|n| string(cx, n)),
                    }
                }
                None => FailSpec::default(),
            }
        }),
        _ => {
            if !matches!(kind_node.value, Value::Null)
                && let Some(sm) = map(cx, kind_node, "`succeed`")
            {
                check_keys(cx, sm, "`succeed`", &[]);
            }
            StepKind::Succeed(SucceedSpec {})
        }
    };
    Some(kind)
}

fn tolerate(cx: &mut Cx, node: &Node) -> Option<Sp<Tolerate>> {
    match &node.value {
        Value::Int(i) if *i >= 0 => Some(Sp::new(Tolerate::Count(*i as u64), node.span)),
        Value::Str(s) if s.ends_with('%') => match s[..s.len() - 1].trim().parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Some(Sp::new(Tolerate::Percent(p), node.span)),
            _ => {
                cx.push(
                    Diagnostic::new(
                        &codes::INVALID_VALUE,
                        node.span,
                        format!("invalid percentage `{s}`"),
                    )
                    .help("`tolerate` is a count (`3`) or a percentage from 0% to 100% (`5%`)"),
                );
                None
            }
        },
        _ => {
            cx.push(
                Diagnostic::new(&codes::INVALID_VALUE, node.span, "invalid `tolerate`")
                    .label(node.type_name())
                    .help("`tolerate` is a count (`3`) or a percentage (`5%`)"),
            );
            None
        }
    }
}

fn agent_ref(cx: &mut Cx, step: &Key, node: &Node) -> Option<AgentRef> {
    match &node.value {
        Value::Str(s) => Some(AgentRef::Named(Sp::new(s.clone(), node.span))),
        Value::Map(_) => {
            agent(cx, Sp::new(step.name.clone(), step.span), node).map(|a| AgentRef::Inline(Box::new(a)))
        }
        _ => {
            type_error(cx, node, "an agent name or an inline agent definition");
            None
        }
    }
}

const BRANCH_KEYS: &[&str] = &[
    "agent",
    "message",
    "scope",
    "input",
    "output",
    "timeout",
    "retry",
    "idempotent",
];

fn branches(cx: &mut Cx, node: &Node) -> IndexMap<String, Branch> {
    let out = named(cx, node, "`parallel`", |cx, k, v| {
        check_ident(cx, "branch", k);
        let m = map(cx, v, &format!("branch `{}`", k.name))?;
        check_keys(cx, m, "a `parallel` branch", BRANCH_KEYS);
        let agent = match v.get("agent") {
            Some(a) => agent_ref(cx, k, a)?,
            None => {
                cx.push(
                    Diagnostic::new(
                        &codes::MISSING_KEY,
                        k.span,
                        format!("branch `{}` has no `agent`", k.name),
                    )
                    .label("missing `agent`"),
                );
                return None;
            }
        };
        Some(Branch {
            name: Sp::new(k.name.clone(), k.span),
            agent,
            message: v.get("message").and_then(|n| string(cx, n)),
            scope: v.get("scope").and_then(|n| string(cx, n)),
            input: v.get("input").and_then(|n| input_spec(cx, n)),
            output: v.get("output").and_then(|n| output_spec(cx, n)),
            timeout: v.get("timeout").and_then(|n| duration(cx, n)),
            retry: v.get("retry").and_then(|n| retry(cx, n)),
            idempotent: v.get("idempotent").and_then(|n| bool_(cx, n)),
            span: v.span,
        })
    });
    if out.is_empty() && node.as_map().is_some_and(|m| m.is_empty()) {
        cx.push(Diagnostic::new(
            &codes::MISSING_KEY,
            node.span,
            "`parallel` has no branches",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_keys_are_the_common_keys_the_kind_and_its_own() {
        for kind in STEP_KINDS {
            let mut v: Vec<&str> = STEP_COMMON.to_vec();
            v.push(kind);
            match *kind {
                "agent" => v.extend_from_slice(AGENT_STEP),
                "parallel" => v.extend_from_slice(&["concurrency", "fail_fast"]),
                "interrupt" => v.extend_from_slice(&["scope", "input", "output"]),
                "fail" | "succeed" => {
                    v.retain(|k| *k != "next" && *k != "retry" && *k != "timeout" && *k != "idempotent")
                }
                _ => {}
            }
            assert_eq!(step_keys(kind), v.as_slice(), "{kind}");
        }
    }
}
