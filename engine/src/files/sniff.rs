//! Media types (SPEC §6.5): sniffed from the content for images — a `.png` holding SVG is
//! SVG — else taken from the name's extension.

/// How many leading bytes sniffing looks at.
pub const HEAD: usize = 512;

/// The media type of a file whose first bytes are `head` and whose name is `name`.
pub fn media_type(head: &[u8], name: &str) -> String {
    if let Some(m) = sniff_image(head) {
        return m.to_string();
    }
    by_extension(name).to_string()
}

/// A media type a maker declared (a `Content-Type`, an MCP block's `mimeType`), corrected by
/// the content for images: bytes that are an image are that image whatever was declared, and
/// a declared image whose bytes are SVG is SVG.
pub fn refine(declared: &str, head: &[u8]) -> String {
    if let Some(m) = sniff_image(head) {
        return m.to_string();
    }
    let base = declared
        .split(';')
        .next()
        .unwrap_or(declared)
        .trim()
        .to_ascii_lowercase();
    if base.starts_with("image/") && base != "image/svg+xml" {
        // Declared an image, and it is none we know: not to be shown as one.
        return "application/octet-stream".to_string();
    }
    base
}

/// Whether a media type is a raster image a page may show inline (never SVG, never HTML).
pub fn is_raster_image(media_type: &str) -> bool {
    matches!(
        media_type,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" | "image/bmp"
    )
}

fn sniff_image(head: &[u8]) -> Option<&'static str> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if head.starts_with(PNG) {
        return Some("image/png");
    }
    if head.starts_with(b"\xff\xd8\xff") {
        return Some("image/jpeg");
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some("image/gif");
    }
    if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        return Some("image/webp");
    }
    if is_bmp(head) {
        return Some("image/bmp");
    }
    if looks_like_svg(head) {
        return Some("image/svg+xml");
    }
    None
}

/// `BM`, then (after the file header's 12 bytes) the size of a DIB header of a known kind:
/// `BM` alone is how much text opens (`BMW sales rose…`).
fn is_bmp(head: &[u8]) -> bool {
    head.len() >= 18
        && head.starts_with(b"BM")
        && matches!(
            u32::from_le_bytes([head[14], head[15], head[16], head[17]]),
            12 | 40 | 52 | 56 | 64 | 108 | 124
        )
}

/// Text that opens (after a BOM, whitespace, an XML declaration, comments or a doctype) with
/// an `<svg` element.
fn looks_like_svg(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let mut t = text.trim_start_matches('\u{feff}').trim_start();
    loop {
        if let Some(rest) = t.strip_prefix("<?") {
            match rest.find("?>") {
                Some(i) => t = rest[i + 2..].trim_start(),
                None => return false,
            }
        } else if let Some(rest) = t.strip_prefix("<!--") {
            match rest.find("-->") {
                Some(i) => t = rest[i + 3..].trim_start(),
                None => return false,
            }
        } else if starts_with_ascii_ci(t, "<!doctype") {
            match t.find('>') {
                Some(i) => t = t[i + 1..].trim_start(),
                None => return false,
            }
        } else {
            break;
        }
    }
    starts_with_ascii_ci(t, "<svg") && t[4..].starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/')
}

/// Whether `t` opens with `prefix` (ASCII), case aside; compared as bytes, so that text whose
/// first characters are not ASCII (the bytes of a binary file) is no reason to panic.
fn starts_with_ascii_ci(t: &str, prefix: &str) -> bool {
    t.as_bytes()
        .get(..prefix.len())
        .is_some_and(|b| b.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// The media type a name's extension says, `application/octet-stream` when it says none.
pub fn by_extension(name: &str) -> &'static str {
    let ext = name
        .rsplit('/')
        .next()
        .and_then(|base| base.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "text" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "yaml" | "yml" => "application/yaml",
        "xml" => "application/xml",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "bmp" => "image/bmp",
        "svg" => "image/svg+xml",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "ogg" => "audio/ogg",
        "mp4" => "video/mp4",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

/// Whether a media type is text an `llm` agent can be sent as a text part.
pub fn is_text(media_type: &str) -> bool {
    media_type.starts_with("text/")
        || matches!(
            media_type,
            "application/json" | "application/x-ndjson" | "application/yaml" | "application/xml"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_bytes_with_a_character_across_a_cut_are_not_svg() {
        // Valid UTF-8 whose 4th and 9th bytes fall inside a three-byte character.
        assert_eq!(
            media_type("<sv€ and more".as_bytes(), "a.bin"),
            "application/octet-stream"
        );
        assert_eq!(
            media_type("abc€def".as_bytes(), "a.bin"),
            "application/octet-stream"
        );
        assert_eq!(
            media_type("<!doctyp€>".as_bytes(), "a.bin"),
            "application/octet-stream"
        );
        assert_eq!(
            media_type(b"\x85\xbd\x14hello world", "a.bin"),
            "application/octet-stream"
        );
    }

    #[test]
    fn text_that_opens_with_bm_is_no_bitmap() {
        assert_eq!(
            media_type(b"BMW sales rose in March, Audi fell.\n", "cars.txt"),
            "text/plain"
        );
        assert_eq!(media_type(b"BM", "x.bmp"), "image/bmp");
        // A 1x1 24-bit BMP: a 14-byte file header, then a 40-byte BITMAPINFOHEADER.
        let mut bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0".to_vec();
        bmp.extend_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 24, 0]);
        assert_eq!(media_type(&bmp, "x.dat"), "image/bmp");
        assert!(is_raster_image(&media_type(&bmp, "x.dat")));
    }

    #[test]
    fn bytes_that_are_not_text_are_no_svg_and_no_panic() {
        // A replacement character across the 4th or 9th byte of the text made of them.
        for head in [
            &b"abcdefg\xffhijk"[..],
            b"ab\xff\xfe<svg>",
            b"\x1f\x8b\x08\x00\xa5\xd2\x9c\x01\xff\x03",
        ] {
            assert_eq!(sniff_image(head), None, "{head:?}");
        }
        assert!(looks_like_svg(
            b"<!DOCTYPE svg>\n<svg xmlns='http://www.w3.org/2000/svg'/>"
        ));
        assert!(!looks_like_svg("<!doctyp\u{e9}>".as_bytes()));
    }

    #[test]
    fn images_are_sniffed_whatever_their_name() {
        assert_eq!(media_type(b"\x89PNG\r\n\x1a\n....", "a.txt"), "image/png");
        assert_eq!(
            media_type(b"<?xml version='1.0'?>\n<svg xmlns='x'>", "evil.png"),
            "image/svg+xml"
        );
        assert_eq!(media_type(b"<!-- hi --><SVG>", "x"), "image/svg+xml");
        assert_eq!(media_type(b"<svgfoo>", "x.txt"), "text/plain");
        assert_eq!(media_type(b"hello", "a/b/notes.MD"), "text/markdown");
        assert_eq!(media_type(b"hello", "noext"), "application/octet-stream");
        assert_eq!(refine("image/png", b"<svg onload=alert(1)>"), "image/svg+xml");
        assert_eq!(refine("image/png", b"not an image"), "application/octet-stream");
        assert_eq!(refine("Text/Plain; charset=utf-8", b"hi"), "text/plain");
        assert!(is_raster_image("image/png") && !is_raster_image("image/svg+xml"));
    }
}
