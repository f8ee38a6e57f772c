//! The inbox's filter (SPEC §15): a CEL expression over one item, parsed once with the flow
//! language's parser and evaluated with its evaluator. It sees `question`, `calls` (`[{name,
//! arguments}]`), `input` (the root run's input), `batch`, `item`, `kind`, `flow`, `step`,
//! `age_s` and `expires_in_s`; any other name, or a function CEL does not have, is an error
//! naming its column before any item is read.

use serde_json::{Value, json};

use crate::expr::eval::{Vars, eval};
use crate::expr::{Expr, parse};
use crate::record::inbox::InboxItem;

/// The names a filter may read.
pub const NAMES: &[&str] = &[
    "question",
    "calls",
    "input",
    "batch",
    "item",
    "kind",
    "flow",
    "step",
    "age_s",
    "expires_in_s",
];

/// A filter that could not be parsed: `start..end` are byte offsets in its text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct FilterError {
    pub text: String,
    pub start: usize,
    pub end: usize,
    pub message: String,
}

impl FilterError {
    /// The error as a linter prints it: the filter, a caret line under the span, the
    /// message with its column (1-based, in characters).
    pub fn render(&self) -> String {
        let col = self.text[..self.start.min(self.text.len())].chars().count();
        let width = self.text[self.start.min(self.text.len())..self.end.min(self.text.len())]
            .chars()
            .count()
            .max(1);
        format!(
            "--filter, column {}: {}\n  {}\n  {}{}",
            col + 1,
            self.message,
            self.text,
            " ".repeat(col),
            "^".repeat(width)
        )
    }
}

/// A parsed filter.
#[derive(Clone, Debug)]
pub struct Filter {
    expr: Expr,
}

impl Filter {
    /// Parses `text`, checking the names it reads and the functions it calls.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        let err = |start: usize, end: usize, message: String| FilterError {
            text: text.to_string(),
            start,
            end,
            message,
        };
        let expr = parse(text).map_err(|e| err(e.start, e.end, e.message))?;
        let (refs, calls) = expr.references_and_calls();
        for r in refs {
            if !NAMES.contains(&r.root.as_str()) {
                return Err(err(
                    r.start,
                    r.start + r.root.len(),
                    format!(
                        "unknown name `{}`: a filter reads {}",
                        r.root,
                        NAMES
                            .iter()
                            .map(|n| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        for c in calls {
            use crate::expr::functions::{Problem, arity};
            let call = if c.member {
                format!(".{}()", c.name)
            } else {
                format!("{}()", c.name)
            };
            let why = match crate::expr::functions::check(&c.name, c.member, c.args) {
                None => continue,
                Some(Problem::Unknown { closest: Some(n) }) => {
                    format!("unknown function `{call}`: did you mean `{n}`?")
                }
                Some(Problem::Unknown { closest: None }) => format!("unknown function `{call}`"),
                Some(Problem::WrongStyle(f)) | Some(Problem::WrongCount(f)) => {
                    format!("`{call}` is called as {}", arity(f))
                }
            };
            return Err(err(c.start, c.end, why));
        }
        Ok(Filter { expr })
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        self.expr.text()
    }

    /// Whether item `item` (its root run's input `input`, the store's clock `now`, Unix ms)
    /// matches. An evaluation error (a missing key, a type mismatch) is a non-match with its
    /// reason, so one odd item does not stop a bulk operation.
    pub fn matches(&self, item: &InboxItem, input: &Value, now: u64) -> Result<bool, String> {
        let vars = item_vars(item, now);
        let locals: Vec<(&str, &Value)> = vars.iter().map(|(k, v)| (*k, v)).collect();
        let v = Vars {
            input: Some(input),
            locals: &locals,
            ..Vars::default()
        };
        match eval(&self.expr, &v) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("the filter gave {other}, not a bool")),
            Err(e) => Err(e.message),
        }
    }
}

/// The variables of item `item` at time `now` (besides `input`).
fn item_vars(item: &InboxItem, now: u64) -> Vec<(&'static str, Value)> {
    let calls: Vec<Value> = item
        .calls
        .iter()
        .map(|c| {
            json!({
                "name": c.get("tool").cloned().unwrap_or(Value::Null),
                "arguments": c.get("arguments").cloned().unwrap_or(Value::Null),
            })
        })
        .collect();
    let secs = |ms: i128| Value::from(i64::try_from(ms.div_euclid(1000)).unwrap_or(i64::MAX));
    vec![
        ("question", Value::String(item.question.clone())),
        ("calls", Value::Array(calls)),
        ("batch", item.batch.clone().map_or(Value::Null, Value::String)),
        ("item", item.item.clone().map_or(Value::Null, Value::String)),
        ("kind", Value::String(item.kind.clone())),
        ("flow", Value::String(item.flow.clone())),
        ("step", Value::String(item.step.clone())),
        ("age_s", secs(i128::from(now) - i128::from(item.created_at))),
        (
            "expires_in_s",
            item.expires_at
                .map_or(Value::Null, |e| secs(i128::from(e) - i128::from(now))),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::inbox::ItemState;

    fn item() -> InboxItem {
        InboxItem {
            id: "q1".into(),
            run_id: "r1".into(),
            root_run: "r1".into(),
            number: "2".into(),
            iteration: None,
            flow: "refunds".into(),
            step: "approve".into(),
            batch: Some("b".into()),
            item: Some("t-7".into()),
            kind: "approval".into(),
            question: "Refund 40?".into(),
            schema: json!(true),
            calls: vec![json!({"id": "c1", "tool": "refund", "arguments": {"amount": 40}})],
            shape: "s1".into(),
            created_at: 10_000,
            expires_at: Some(70_000),
            state: ItemState::Waiting,
            settled_at: None,
        }
    }

    #[test]
    fn a_filter_reads_the_item_and_its_input() {
        let f = Filter::parse(
            "calls.exists(c, c.name == 'refund' && c.arguments.amount < 100) && input.tier == 'gold' && age_s == 5",
        )
        .unwrap();
        assert_eq!(f.matches(&item(), &json!({"tier": "gold"}), 15_000), Ok(true));
        assert_eq!(f.matches(&item(), &json!({"tier": "silver"}), 15_000), Ok(false));
        let f = Filter::parse("expires_in_s < 60").unwrap();
        assert_eq!(f.matches(&item(), &json!({}), 15_000), Ok(true));
    }

    #[test]
    fn unknown_names_and_bad_syntax_name_their_column() {
        let e = Filter::parse("qestion == 'x'").unwrap_err();
        assert_eq!((e.start, e.end), (0, 7));
        assert!(e.message.contains("unknown name `qestion`"), "{}", e.message);
        assert!(e.render().contains("column 1"), "{}", e.render());
        let e = Filter::parse("age_s > ").unwrap_err();
        assert!(e.render().starts_with("--filter, column"), "{}", e.render());
        let e = Filter::parse("sizee(calls) > 1").unwrap_err();
        assert_eq!(e.start, 0);
    }

    #[test]
    fn a_filter_that_fails_on_an_item_does_not_match_it() {
        let f = Filter::parse("input.missing == 1").unwrap();
        assert!(f.matches(&item(), &json!({}), 0).is_err());
        let f = Filter::parse("question").unwrap();
        assert!(f.matches(&item(), &json!({}), 0).is_err());
    }
}
