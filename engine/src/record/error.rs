//! Step errors: a kind that edges, `errors:` filters and `retry.on` act on (SPEC §9), a
//! message, and optional structured details.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kind of a step or run error.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum ErrorKind {
    Agent,
    Timeout,
    RateLimited,
    InvalidOutput,
    Mapping,
    Expression,
    Limit,
    Depth,
    Capability,
    NoRoute,
    InDoubt,
    Cancelled,
    /// A submitted run taken over from dead workers more times than its batch allows (SPEC §12).
    Lost,
    /// A kind named by a `fail` step.
    Custom(String),
}

impl ErrorKind {
    pub fn as_str(&self) -> &str {
        match self {
            ErrorKind::Agent => "agent",
            ErrorKind::Timeout => "timeout",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::Mapping => "mapping",
            ErrorKind::Expression => "expression",
            ErrorKind::Limit => "limit",
            ErrorKind::Depth => "depth",
            ErrorKind::Capability => "capability",
            ErrorKind::NoRoute => "no_route",
            ErrorKind::InDoubt => "in_doubt",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Lost => "lost",
            ErrorKind::Custom(s) => s,
        }
    }

    pub fn parse(s: &str) -> ErrorKind {
        match s {
            "agent" => ErrorKind::Agent,
            "timeout" => ErrorKind::Timeout,
            "rate_limited" => ErrorKind::RateLimited,
            "invalid_output" => ErrorKind::InvalidOutput,
            "mapping" => ErrorKind::Mapping,
            "expression" => ErrorKind::Expression,
            "limit" => ErrorKind::Limit,
            "depth" => ErrorKind::Depth,
            "capability" => ErrorKind::Capability,
            "no_route" => ErrorKind::NoRoute,
            "in_doubt" => ErrorKind::InDoubt,
            "cancelled" => ErrorKind::Cancelled,
            "lost" => ErrorKind::Lost,
            other => ErrorKind::Custom(other.to_string()),
        }
    }
}

impl From<ErrorKind> for String {
    fn from(k: ErrorKind) -> String {
        k.as_str().to_string()
    }
}

impl From<String> for ErrorKind {
    fn from(s: String) -> ErrorKind {
        ErrorKind::parse(&s)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error of a step, an agent call, or a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepError {
    pub kind: ErrorKind,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl StepError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        StepError {
            kind,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn mapping(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Mapping, message)
    }

    pub fn expression(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Expression, message)
    }

    /// `{kind, message, details}` as JSON, for `step.error` and records.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("kind".into(), Value::String(self.kind.as_str().to_string()));
        m.insert("message".into(), Value::String(self.message.clone()));
        m.insert("details".into(), self.details.clone().unwrap_or(Value::Null));
        Value::Object(m)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for StepError {}
