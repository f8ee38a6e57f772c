//! The run's conversation as `llm` agents see it (SPEC §6.2): `--messages` checked once,
//! and the part each agent's `message_mode` selects.

use serde_json::{Value, json};

use crate::model::MessageMode;

/// The part of the run's conversation an agent sees (SPEC §6.2): `none`; `all`; `latest`
/// (the last `max_messages`); `bookend` (the first two, a marker saying how many were left
/// out, the last `max_messages - 2`). Without `max_messages`, `latest` and `bookend` see all.
pub fn select_messages(all: &[Value], mode: MessageMode, max: Option<u64>) -> Vec<Value> {
    let max = max.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    match mode {
        MessageMode::None => Vec::new(),
        MessageMode::All => all.to_vec(),
        MessageMode::Latest => all[all.len().saturating_sub(max)..].to_vec(),
        MessageMode::Bookend => {
            if all.len() <= max {
                return all.to_vec();
            }
            let tail = max.saturating_sub(2);
            let left_out = all.len() - 2 - tail;
            let mut out = all[..2].to_vec();
            out.push(json!({
                "role": "user",
                "content": format!("[{left_out} earlier messages left out]"),
            }));
            out.extend_from_slice(&all[all.len() - tail..]);
            out
        }
    }
}

/// Checks a conversation (`--messages`): an array of objects, each with a string `role` and
/// a `content`. The error names the first bad message by index.
pub fn check_conversation(v: &Value) -> Result<Vec<Value>, String> {
    let Value::Array(items) = v else {
        return Err("messages are a JSON array of {\"role\", \"content\"} objects".to_owned());
    };
    for (i, m) in items.iter().enumerate() {
        let ok = m.get("role").is_some_and(Value::is_string) && m.get("content").is_some();
        if !ok {
            return Err(format!(
                "message {i} is not an object with a string `role` and a `content`"
            ));
        }
    }
    Ok(items.clone())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn msgs(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect()
    }

    fn contents(v: &[Value]) -> Vec<&str> {
        v.iter().map(|m| m["content"].as_str().unwrap()).collect()
    }

    #[test]
    fn message_modes() {
        let all = msgs(6);
        assert!(select_messages(&all, MessageMode::None, Some(3)).is_empty());
        assert_eq!(select_messages(&all, MessageMode::All, Some(3)).len(), 6);
        assert_eq!(
            contents(&select_messages(&all, MessageMode::Latest, Some(2))),
            ["m4", "m5"]
        );
        assert_eq!(select_messages(&all, MessageMode::Latest, Some(10)).len(), 6);
        assert_eq!(
            contents(&select_messages(&all, MessageMode::Bookend, Some(4))),
            ["m0", "m1", "[2 earlier messages left out]", "m4", "m5"]
        );
        assert_eq!(select_messages(&all, MessageMode::Bookend, Some(6)).len(), 6);
        assert!(select_messages(&[], MessageMode::Bookend, Some(3)).is_empty());
    }

    #[test]
    fn conversations_are_checked() {
        assert_eq!(
            check_conversation(&json!([{"role": "user", "content": "x"}]))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            check_conversation(&json!([{"role": "user", "content": "x"}, {"content": "y"}])).unwrap_err(),
            "message 1 is not an object with a string `role` and a `content`"
        );
        assert!(check_conversation(&json!({})).is_err());
    }
}
