//! The tools an agent loop offers its model (SPEC §6.3, §6.4): the flow's agents named in
//! `tools:` that the capability ceiling allows, each with its definition, and whether a call
//! of it waits for a human (`approve`). What is refused is kept, so that a call of it after
//! all is told why.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::Run;
use crate::plan::*;
use crate::store::Store;

/// A tool as the loop holds it: one of its plan's, or one made when the loop starts.
pub(super) enum ToolRef<'a> {
    Plan(&'a ToolPlan),
    Made(Arc<ToolPlan>),
}

impl std::ops::Deref for ToolRef<'_> {
    type Target = ToolPlan;

    fn deref(&self) -> &ToolPlan {
        match self {
            ToolRef::Plan(t) => t,
            ToolRef::Made(t) => t,
        }
    }
}

/// A tool offered to the model.
pub(super) struct Offered<'a> {
    pub tool: ToolRef<'a>,
    /// A call of it waits for a human decision.
    pub approve: bool,
}

/// A tool the loop names that is not offered, and why.
pub(super) struct Refused<'a> {
    pub tool: ToolRef<'a>,
    pub why: String,
}

/// What a loop offers and refuses.
pub(super) struct Tools<'a> {
    pub offered: Vec<Offered<'a>>,
    pub refused: Vec<Refused<'a>>,
}

impl Tools<'_> {
    /// The offered tool named `name`.
    pub fn offered(&self, name: &str) -> Option<&Offered<'_>> {
        self.offered.iter().find(|o| o.tool.name == name)
    }

    /// The definitions the model is sent, in the protocol's form.
    pub fn definitions(&self) -> Vec<Value> {
        self.offered
            .iter()
            .map(|o| {
                let t = &o.tool;
                let mut f = Map::new();
                f.insert("name".into(), Value::String(t.name.clone()));
                if let Some(d) = &t.description {
                    f.insert("description".into(), Value::String(d.clone()));
                }
                f.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": f})
            })
            .collect()
    }

    /// The names of the tools offered, for the model: `kb_search, crm`, or `none`.
    pub fn names(&self) -> String {
        if self.offered.is_empty() {
            return "none".to_string();
        }
        self.offered
            .iter()
            .map(|o| o.tool.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl<'e, S: Store> Run<'e, S> {
    /// The tools loop `lp` offers: those the ceiling allows are offered, the others are
    /// unknown to the model.
    pub(super) fn loop_tools<'a>(&self, lp: &'a LoopPlan) -> Tools<'a> {
        let mut tools = Tools {
            offered: Vec::new(),
            refused: Vec::new(),
        };
        for t in &lp.tools {
            match self.agent_for(&t.call, false) {
                Ok(_) => tools.offered.push(Offered {
                    approve: lp.approve.contains(&t.name),
                    tool: ToolRef::Plan(t),
                }),
                Err(e) => tools.refused.push(Refused {
                    tool: ToolRef::Plan(t),
                    why: e.message,
                }),
            }
        }
        tools
    }
}
