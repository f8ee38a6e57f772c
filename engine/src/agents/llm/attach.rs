//! An `llm` agent's `attach:` (SPEC §6.5): the files sent with the user message, in the
//! OpenAI-compatible vision format. The task's text becomes the first part of the message's
//! `content`, then each file in the order given: a raster image as an `image_url` part whose
//! URL is `data:<media type>;base64,…`, a text file as a `text` part opened by a line naming
//! it. Any other type fails the call with kind `agent`, not retried.
//!
//! `attach:` gives one reference, a list of them (`null` items skipped) or `null` (nothing).
//! `max_attach_bytes` counts all of one call's files: over it, the call fails with kind
//! `limit` before any byte is read and before any request. Types are judged by the bytes
//! (an image declared `image/png` holding SVG is SVG, and is refused), read from the store
//! and checked against their hash.

use base64::Engine as _;
use serde_json::{Value, json};

use super::super::CallContext;
use super::super::transform::eval_value_template;
use crate::files::sniff;
use crate::plan::LlmPlan;
use crate::record::files::FileRef;
use crate::record::{ErrorKind, StepError};

/// The parts `attach:` adds to the user message; none without `attach:`.
pub(super) async fn parts(
    plan: &LlmPlan,
    who: &str,
    input: &Value,
    cx: &CallContext<'_>,
) -> Result<Vec<Value>, StepError> {
    let Some(template) = &plan.attach else {
        return Ok(Vec::new());
    };
    let value = eval_value_template(template, input, cx).map_err(|e| StepError {
        message: format!("{who}: `attach`: {}", e.message),
        ..e
    })?;
    let files = references(&value, who)?;
    let max = plan.max_attach_bytes;
    let declared: u64 = files.iter().map(|f| f.size).sum();
    if declared > max {
        return Err(over_limit(who, declared, max));
    }
    for f in &files {
        check_type(who, f, &f.media_type)?;
    }
    let mut out = Vec::with_capacity(files.len());
    let mut total = 0u64;
    for f in &files {
        let bytes = cx.files.read_bytes(f).await.map_err(|e| StepError {
            message: format!("{who}: `attach`: {}", e.message),
            ..e
        })?;
        total += bytes.len() as u64;
        if total > max {
            return Err(over_limit(who, total, max));
        }
        let media_type = sniff::refine(&f.media_type, &bytes[..bytes.len().min(sniff::HEAD)]);
        check_type(who, f, &media_type)?;
        out.push(part(f, &media_type, &bytes));
    }
    Ok(out)
}

/// Puts `parts` after the text of the last message (the task): its `content` becomes a list
/// of parts. Nothing changes without parts.
pub(super) fn append(messages: &mut [Value], parts: Vec<Value>) {
    if parts.is_empty() {
        return;
    }
    let Some(last) = messages.last_mut() else {
        return;
    };
    let text = last
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(parts);
    last["content"] = Value::Array(content);
}

/// The references `attach:` gave.
fn references(value: &Value, who: &str) -> Result<Vec<FileRef>, StepError> {
    let one = |v: &Value| {
        FileRef::from_value(v).ok_or_else(|| {
            StepError::new(
                ErrorKind::Agent,
                format!(
                    "{who}: `attach` gives {}, not a file reference (`{{file, name, media_type, size}}`) or a list of them",
                    crate::expr::path::type_name(v)
                ),
            )
            .with_details(json!({"retryable": false}))
        })
    };
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.iter().filter(|v| !v.is_null()).map(one).collect(),
        v => Ok(vec![one(v)?]),
    }
}

/// Refuses a file a model is not sent: neither a raster image nor text.
fn check_type(who: &str, f: &FileRef, media_type: &str) -> Result<(), StepError> {
    if sniff::is_raster_image(media_type) || sniff::is_text(media_type) {
        return Ok(());
    }
    Err(StepError::new(
        ErrorKind::Agent,
        format!(
            "{who}: cannot attach file `{}` of type `{media_type}`: a model is sent raster images (png, jpeg, gif, webp, bmp) and text files only",
            f.name
        ),
    )
    .with_details(json!({"retryable": false, "file": f.name, "media_type": media_type})))
}

fn over_limit(who: &str, bytes: u64, max: u64) -> StepError {
    StepError::new(
        ErrorKind::Limit,
        format!("{who}: the attachments are {bytes} bytes, over the limit max_attach_bytes ({max} bytes)"),
    )
    .with_details(json!({"limit": "max_attach_bytes", "value": max}))
}

/// One file as a message part.
fn part(f: &FileRef, media_type: &str, bytes: &[u8]) -> Value {
    if sniff::is_raster_image(media_type) {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        json!({"type": "image_url", "image_url": {"url": format!("data:{media_type};base64,{data}")}})
    } else {
        let text = String::from_utf8_lossy(bytes);
        json!({"type": "text", "text": format!("File `{}` ({media_type}):\n{text}", f.name)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_the_task_text() {
        let mut messages = vec![json!({"role": "user", "content": "describe"})];
        append(&mut messages, Vec::new());
        assert_eq!(messages[0]["content"], "describe");
        let png = FileRef {
            file: format!("sha256:{}", "0".repeat(64)),
            name: "a.png".into(),
            media_type: "image/png".into(),
            size: 3,
        };
        let notes = FileRef {
            name: "n.txt".into(),
            media_type: "text/plain".into(),
            ..png.clone()
        };
        let parts = vec![part(&png, "image/png", b"abc"), part(&notes, "text/plain", b"hi")];
        append(&mut messages, parts);
        assert_eq!(
            messages[0]["content"],
            json!([
                {"type": "text", "text": "describe"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,YWJj"}},
                {"type": "text", "text": "File `n.txt` (text/plain):\nhi"},
            ])
        );
    }

    #[test]
    fn attach_takes_references_lists_and_null() {
        let r = json!({"file": format!("sha256:{}", "a".repeat(64)), "name": "x.png", "media_type": "image/png", "size": 1});
        assert_eq!(references(&Value::Null, "a").unwrap().len(), 0);
        assert_eq!(references(&r, "a").unwrap().len(), 1);
        assert_eq!(references(&json!([r, null, r]), "a").unwrap().len(), 2);
        let e = references(&json!("scan.png"), "agent `a`").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Agent);
        assert!(
            e.message.starts_with("agent `a`: `attach` gives a string"),
            "{}",
            e.message
        );
        let pdf = FileRef::from_value(&r).map(|f| FileRef {
            media_type: "application/pdf".into(),
            ..f
        });
        let e = check_type("agent `a`", pdf.as_ref().unwrap(), "application/pdf").unwrap_err();
        assert_eq!(
            e.message,
            "agent `a`: cannot attach file `x.png` of type `application/pdf`: a model is sent raster images (png, jpeg, gif, webp, bmp) and text files only"
        );
    }
}
