//! Answers to what an MCP server asks during a tool call (`elicitation/create`, SPEC §6.4),
//! as one call sees them: the answers a human gave before (recorded, handed in by the
//! runtime) and the first question that has none, which stops the call.
//!
//! A call asks its server's questions in order: the k-th question of a call gets the k-th
//! answer on record when the server asks the same thing again (its message and schema);
//! otherwise the question is kept and [`Elicitor::stopped`] fires, so that the caller abandons
//! the call and stops its run to ask a human. On resume the call is sent again and the
//! recorded answers are given, in order, to the server's questions. Knows no run and no store.

use std::sync::Mutex;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What a server asked: its message and the JSON Schema of the answer it wants.
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    pub message: String,
    pub schema: Value,
}

/// A human's answer to a server's question.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// The content the server asked for (a value its schema accepts).
    Accept(Value),
    /// Declined, with the reason the human gave (kept on record, not sent: MCP's decline
    /// carries no reason).
    Decline(String),
}

impl Reply {
    /// A decision as `resume --decision` gives it: `{"reject": "why"}` declines; any other
    /// value is the content.
    pub fn from_decision(decision: &Value) -> Reply {
        match decision.as_object() {
            Some(o) if o.len() == 1 => match o.get("reject") {
                Some(Value::String(why)) => Reply::Decline(why.clone()),
                _ => Reply::Accept(decision.clone()),
            },
            _ => Reply::Accept(decision.clone()),
        }
    }
}

/// The answers one call has, and the question it stopped at.
#[derive(Debug, Default)]
pub struct Elicitor {
    answers: Vec<(Asked, Reply)>,
    state: Mutex<State>,
    stop: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    /// Questions asked so far in this call.
    asked: usize,
    /// The question with no answer, once asked.
    open: Option<Asked>,
}

impl Elicitor {
    /// An elicitor with the answers on record, in the order their questions were asked.
    pub fn new(answers: Vec<(Asked, Reply)>) -> Elicitor {
        Elicitor {
            answers,
            ..Elicitor::default()
        }
    }

    /// The answer to the next question the server asks, if one is on record for it; else
    /// `None`, the question kept and [`Elicitor::stopped`] fired.
    pub fn answer(&self, asked: Asked) -> Option<Reply> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.open.is_some() {
            return None;
        }
        let k = state.asked;
        state.asked += 1;
        match self.answers.get(k) {
            Some((before, reply)) if before.message == asked.message && before.schema == asked.schema => {
                Some(reply.clone())
            }
            _ => {
                state.open = Some(asked);
                self.stop.cancel();
                None
            }
        }
    }

    /// Fires when a question with no answer was asked: the call is to be abandoned.
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// The question with no answer, if one was asked; with the number it has among the
    /// call's questions (1 for the first).
    pub fn open(&self) -> Option<(usize, Asked)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.open.clone().map(|a| (state.asked, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(m: &str) -> Asked {
        Asked {
            message: m.into(),
            schema: json!({"type": "object"}),
        }
    }

    #[test]
    fn questions_get_the_answers_on_record_in_order_then_stop() {
        let e = Elicitor::new(vec![(asked("one"), Reply::Accept(json!({"ok": true})))]);
        assert_eq!(e.answer(asked("one")), Some(Reply::Accept(json!({"ok": true}))));
        assert!(e.open().is_none());
        assert_eq!(e.answer(asked("two")), None);
        assert_eq!(e.open(), Some((2, asked("two"))));
        assert!(e.stop.is_cancelled());
        // Another question once stopped is not taken.
        assert_eq!(e.answer(asked("three")), None);
        assert_eq!(e.open(), Some((2, asked("two"))));
    }

    #[test]
    fn a_different_question_is_asked_anew() {
        let e = Elicitor::new(vec![(asked("one"), Reply::Decline("no".into()))]);
        assert_eq!(e.answer(asked("other")), None);
        assert_eq!(e.open(), Some((1, asked("other"))));
    }

    #[test]
    fn reject_declines() {
        assert_eq!(
            Reply::from_decision(&json!({"reject": "not now"})),
            Reply::Decline("not now".into())
        );
        assert_eq!(
            Reply::from_decision(&json!({"ok": true})),
            Reply::Accept(json!({"ok": true}))
        );
    }
}
