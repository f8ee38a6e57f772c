//! The run page's files (SPEC §6.5, §13): a table of the run's files — names escaped, media
//! type, size, the record that made each — with raster images shown as thumbnails inline
//! (`data:` URLs, so the page stays self-contained).
//!
//! Only raster types are inlined (PNG, JPEG, GIF, WebP, BMP: [`crate::files::sniff::is_raster_image`]),
//! never SVG or HTML, which could carry script; and only up to [`THUMB_MAX_BYTES`] each and
//! [`INLINE_MAX_BYTES`] for the page, so a run of large scans stays an openable page. The rest
//! are listed with the command that writes them out.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use crate::files::sniff::{is_raster_image, media_type};
use crate::record::files::RunFile;

/// Escapes text for HTML (as the run page does everywhere).
fn html(s: &str) -> String {
    crate::plan::svg::xml_text(s)
}

/// The largest image inlined as a thumbnail (512 KiB).
pub const THUMB_MAX_BYTES: u64 = 512 << 10;
/// The most image bytes one page inlines (8 MiB), counting each distinct file once.
pub const INLINE_MAX_BYTES: u64 = 8 << 20;

/// The files whose bytes the page would inline, by hash, in the run's order: raster images
/// up to [`THUMB_MAX_BYTES`], while the page stays within [`INLINE_MAX_BYTES`].
pub fn to_inline(files: &[RunFile]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for f in files {
        let r = &f.file;
        if !is_raster_image(&r.media_type) || r.size > THUMB_MAX_BYTES || seen.contains(&r.file) {
            continue;
        }
        if total + r.size > INLINE_MAX_BYTES {
            continue;
        }
        total += r.size;
        seen.insert(r.file.clone());
        out.push(r.file.clone());
    }
    out
}

/// The files section: `bytes` holds what [`to_inline`] named (read and checked by the
/// caller); an image is shown only when its bytes are there and are, by their content, the
/// raster image the record says.
pub fn section(o: &mut String, run_id: &str, files: &[RunFile], bytes: &HashMap<String, Vec<u8>>) {
    if files.is_empty() {
        return;
    }
    let total: u64 = files.iter().map(|f| f.file.size).sum();
    let _ = write!(
        o,
        "<section id=\"files\"><h2>Files <span class=\"muted\">({} files, {total} bytes; \
         <code>switchyard runs files {} --output DIR</code> writes them out)</span></h2>\
         <table><tr><th>record</th><th>name</th><th>media type</th><th>size</th><th></th></tr>",
        files.len(),
        html(run_id)
    );
    for f in files {
        let r = &f.file;
        let thumb = match bytes.get(&r.file) {
            Some(b) if is_raster_image(&r.media_type) && media_type(b, "") == r.media_type => format!(
                "<img class=\"thumb\" alt=\"{}\" src=\"data:{};base64,{}\">",
                html(&r.name),
                r.media_type,
                crate::agents::redact::base64(b, false)
            ),
            _ if is_raster_image(&r.media_type) => {
                "<span class=\"muted\">not inlined (over the page's bound)</span>".to_string()
            }
            _ => String::new(),
        };
        let _ = write!(
            o,
            "<tr class=\"file\"><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{thumb}</td></tr>",
            html(&f.number),
            html(&r.name),
            html(&r.media_type),
            r.size
        );
    }
    o.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::files::FileRef;

    fn rf(hash: char, name: &str, media_type: &str, size: u64) -> RunFile {
        RunFile {
            number: "1".into(),
            file: FileRef {
                file: format!("sha256:{}", hash.to_string().repeat(64)),
                name: name.into(),
                media_type: media_type.into(),
                size,
            },
        }
    }

    #[test]
    fn only_small_raster_images_are_inlined_within_the_page_bound() {
        let files = vec![
            rf('a', "a.png", "image/png", 100),
            rf('b', "b.svg", "image/svg+xml", 100),
            rf('c', "c.html", "text/html", 100),
            rf('d', "big.jpg", "image/jpeg", THUMB_MAX_BYTES + 1),
            rf('a', "again.png", "image/png", 100),
        ];
        assert_eq!(to_inline(&files), [files[0].file.file.clone()]);
        let many: Vec<RunFile> = "0123456789abcdef0123"
            .chars()
            .enumerate()
            .map(|(i, c)| {
                let mut f = rf(c, "x.png", "image/png", THUMB_MAX_BYTES);
                f.file.file = format!("sha256:{i:064}");
                f
            })
            .collect();
        assert_eq!(to_inline(&many).len() as u64, INLINE_MAX_BYTES / THUMB_MAX_BYTES);
    }

    #[test]
    fn names_are_escaped_and_bytes_that_are_not_the_image_are_not_shown() {
        let f = rf('a', "<img src=x onerror=alert(1)>.png", "image/png", 4);
        let mut bytes = HashMap::new();
        bytes.insert(f.file.file.clone(), b"<svg onload=alert(1)>".to_vec());
        let mut o = String::new();
        section(&mut o, "r1", std::slice::from_ref(&f), &bytes);
        assert!(!o.contains("<img src=x"), "{o}");
        assert!(o.contains("&lt;img src=x onerror=alert(1)&gt;.png"), "{o}");
        assert!(!o.contains("data:"), "{o}");
    }
}
