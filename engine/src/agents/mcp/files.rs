//! The files of an MCP tool's result (SPEC §6.4, §6.5): its image and audio blocks and its
//! embedded blob resources are stored through the call's [`FileSink`], and each such block
//! becomes `{type, file: <reference>}` in the result's `content` (a resource keeps its `uri`).
//! Text resources stay as MCP's JSON of them: their text is already JSON.
//!
//! Names: `<tool>-<k>.<ext>` for the k-th image or audio block of the result (the extension
//! from the block's `mimeType`), a resource's URI's last segment (else as an image's).

use serde_json::{Map, Value, json};

use crate::files::FileSink;
use crate::record::{ErrorKind, StepError};

/// `content` with its file blocks stored and replaced by references, in the same order. A
/// block whose data holds a secret the server was given (`secret` says so of a text: the base64
/// as sent, or the bytes when they are text) fails the call and nothing of it is stored: a
/// secret never reaches the store.
pub async fn store(
    tool: &str,
    content: Vec<Value>,
    files: &FileSink,
    secret: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Vec<Value>, StepError> {
    let check = |kind: &str, data: &str, bytes: &[u8]| {
        if secret(data) || std::str::from_utf8(bytes).is_ok_and(secret) {
            return Err(StepError::new(
                ErrorKind::Agent,
                format!(
                    "the {kind} data MCP tool `{tool}` returned holds a secret the server was given; it was not stored"
                ),
            ));
        }
        Ok(())
    };
    let mut out = Vec::with_capacity(content.len());
    let mut k = 0u64;
    for block in content {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "image" | "audio" => {
                k += 1;
                let media_type = block.get("mimeType").and_then(Value::as_str).unwrap_or_default();
                let data = block.get("data").and_then(Value::as_str).unwrap_or_default();
                let bytes = decode(data).map_err(|e| bad_block(tool, kind, &e))?;
                check(kind, data, &bytes)?;
                let name = format!("{tool}-{k}.{}", extension(media_type));
                let r = files.store_bytes(&bytes, name, Some(media_type)).await?;
                out.push(json!({"type": kind, "file": r.to_value()}));
            }
            "resource" if block["resource"].get("blob").is_some() => {
                k += 1;
                let res = &block["resource"];
                let uri = res.get("uri").and_then(Value::as_str).unwrap_or_default();
                let media_type = res.get("mimeType").and_then(Value::as_str);
                let data = res.get("blob").and_then(Value::as_str).unwrap_or_default();
                let bytes = decode(data).map_err(|e| bad_block(tool, kind, &e))?;
                check(kind, data, &bytes)?;
                let name = last_segment(uri)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{tool}-{k}.{}", extension(media_type.unwrap_or_default())));
                let r = files.store_bytes(&bytes, name, media_type).await?;
                let mut m = Map::new();
                m.insert("type".into(), json!("resource"));
                m.insert("uri".into(), json!(uri));
                m.insert("file".into(), r.to_value());
                out.push(Value::Object(m));
            }
            _ => out.push(block),
        }
    }
    Ok(out)
}

/// What a model is told of a file block of a result: `[file NAME (MEDIA_TYPE, SIZE bytes)]`;
/// `None` for any other block.
pub fn describe(block: &Value) -> Option<String> {
    let f = block.get("file")?;
    Some(format!(
        "[file {} ({}, {} bytes)]",
        f.get("name")?.as_str()?,
        f.get("media_type")?.as_str()?,
        f.get("size")?.as_u64()?
    ))
}

fn bad_block(tool: &str, kind: &str, why: &str) -> StepError {
    StepError::new(
        ErrorKind::Agent,
        format!("the {kind} data MCP tool `{tool}` returned is not base64: {why}"),
    )
}

/// The last segment of a URI's path, without query or fragment; `None` when empty.
fn last_segment(uri: &str) -> Option<&str> {
    let path = uri.split(['?', '#']).next().unwrap_or_default();
    let path = path
        .split_once("://")
        .map_or(path, |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
    path.rsplit('/').next().filter(|s| !s.is_empty())
}

/// The usual extension of a media type; `bin` when unknown.
fn extension(media_type: &str) -> &'static str {
    let essence = media_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/bmp" => "bmp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/ogg" => "ogg",
        "audio/webm" => "webm",
        "audio/flac" => "flac",
        "application/pdf" => "pdf",
        "application/json" => "json",
        "text/plain" => "txt",
        "text/csv" => "csv",
        _ => "bin",
    }
}

/// Standard base64 (padding optional, whitespace ignored), as MCP sends binary data.
fn decode(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let mut acc = 0u32;
    let mut bits = 0u32;
    let mut padding = false;
    for (i, c) in s.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("byte {i} is `{}`", char::from(c).escape_default())),
        };
        if padding {
            return Err(format!("byte {i} follows padding"));
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if bits >= 6 {
        return Err("its length is not a whole number of bytes".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(decode("aGVs\nbG8h").unwrap(), b"hello!");
        assert_eq!(decode("").unwrap(), b"");
        assert!(decode("aGV*").is_err());
        assert!(decode("a").is_err());
        assert!(decode("aG=Vs").is_err());
    }

    #[test]
    fn names_come_from_the_uri_or_the_tool() {
        assert_eq!(last_segment("file:///tmp/a/report.pdf"), Some("report.pdf"));
        assert_eq!(
            last_segment("https://x.test/files/scan.png?v=2#p"),
            Some("scan.png")
        );
        assert_eq!(last_segment("test://static/resource/"), None);
        assert_eq!(last_segment("https://x.test"), None);
        assert_eq!(extension("image/png"), "png");
        assert_eq!(extension("audio/wav; codecs=1"), "wav");
        assert_eq!(extension("application/x-unknown"), "bin");
    }

    #[tokio::test]
    async fn file_blocks_become_references_and_the_rest_stays() {
        let sink = FileSink::detached();
        let content = vec![
            json!("a text"),
            json!({"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}),
            json!({"type": "audio", "data": "aGk=", "mimeType": "audio/wav"}),
            json!({"type": "resource", "resource": {"uri": "file:///r/notes.txt", "blob": "aGk=", "mimeType": "text/plain"}}),
            json!({"type": "resource", "resource": {"uri": "file:///r/t.txt", "text": "inline"}}),
        ];
        let out = store("snap", content, &sink, &|_| false).await.unwrap();
        assert_eq!(out[0], json!("a text"));
        assert_eq!(out[1]["type"], "image");
        assert_eq!(out[1]["file"]["name"], "snap-1.png");
        assert_eq!(out[1]["file"]["size"], 5);
        assert_eq!(out[2]["file"]["name"], "snap-2.wav");
        assert_eq!(out[2]["file"]["media_type"], "audio/wav");
        assert_eq!(out[3]["uri"], "file:///r/notes.txt");
        assert_eq!(out[3]["file"]["name"], "notes.txt");
        assert_eq!(out[4]["resource"]["text"], "inline");
        let made = sink.take();
        assert_eq!(made.len(), 3);
        assert_eq!(sink.read_bytes(&made[0]).await.unwrap(), b"hello");
        assert_eq!(
            describe(&out[2]).unwrap(),
            "[file snap-2.wav (audio/wav, 2 bytes)]"
        );
        assert_eq!(describe(&out[0]), None);

        let bad = vec![json!({"type": "image", "data": "!!", "mimeType": "image/png"})];
        let e = store("snap", bad, &sink, &|_| false).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Agent);
        assert_eq!(
            e.message,
            "the image data MCP tool `snap` returned is not base64: byte 0 is `!`"
        );

        // "hunter2" as text, inside a blob resource: refused, nothing stored.
        let leak =
            vec![json!({"type": "resource", "resource": {"uri": "file:///env", "blob": "aHVudGVyMg=="}})];
        let e = store("env", leak, &sink, &|t| t.contains("hunter2"))
            .await
            .unwrap_err();
        assert_eq!(
            e.message,
            "the resource data MCP tool `env` returned holds a secret the server was given; it was not stored"
        );
        assert!(sink.take().is_empty());
    }
}
