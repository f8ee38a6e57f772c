//! A batch as one self-contained HTML page (`switchyard report OUT.jsonl`, or `--batch NAME`):
//! its items counted by status, cost, how long items took (quantiles and a histogram), the
//! slowest items, the failed ones by error kind and the interrupted ones, each linked to its
//! run's page when there is one.
//!
//! The page is built from a [`Summary`] that takes items one at a time and keeps a bounded
//! part of them (the slowest [`SLOWEST`], the first [`LISTED`] of each error kind) and one
//! duration per item, so a batch of a million items is summed up in a few megabytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::run::html;
use crate::record::cost::Cost;
use crate::record::fmt_unknown;

/// The slowest items listed.
pub const SLOWEST: usize = 20;
/// Items listed for each error kind, and of the interrupted ones.
pub const LISTED: usize = 50;

/// One item of a batch, as its output line tells it.
#[derive(Clone, Debug)]
pub struct Item {
    /// 1-based.
    pub line: u64,
    /// The input's id as written (a number stays a number).
    pub id: String,
    pub status: String,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub run_id: Option<String>,
    pub cost_usd: Cost,
    /// Model calls whose cost is unknown (no `usage` reported).
    pub cost_unknown_calls: u64,
    pub duration_ms: u64,
}

impl Item {
    /// The item of output line `line` (1-based) of a batch: `{id, status, output, error,
    /// run_id, cost_usd, duration_ms}`.
    pub fn from_line(line: u64, text: &str) -> Result<Item, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("line {line}: not JSON: {e}"))?;
        let Value::Object(o) = v else {
            return Err(format!("line {line}: not a JSON object"));
        };
        let status = o
            .get("status")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("line {line}: no `status` (is this a batch's output file?)"))?
            .to_string();
        let id = match o.get("id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => format!("line {line}"),
            Some(other) => other.to_string(),
        };
        let error = o.get("error").filter(|e| !e.is_null());
        Ok(Item {
            line,
            id,
            status,
            error_kind: error.and_then(|e| e["kind"].as_str()).map(str::to_string),
            error_message: error.and_then(|e| e["message"].as_str()).map(str::to_string),
            run_id: o.get("run_id").and_then(Value::as_str).map(str::to_string),
            cost_usd: match o.get("cost_usd") {
                None | Some(Value::Null) => Cost::ZERO,
                Some(v) => v
                    .as_f64()
                    .and_then(Cost::from_usd)
                    .ok_or_else(|| format!("line {line}: `cost_usd` is {v}, not a cost in USD"))?,
            },
            cost_unknown_calls: o.get("cost_unknown_calls").and_then(Value::as_u64).unwrap_or(0),
            duration_ms: o.get("duration_ms").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// What the page shows of a batch, gathered item by item.
#[derive(Debug, Default)]
pub struct Summary {
    pub name: String,
    /// The flow the batch ran, when the store read knows it.
    pub flow: Option<String>,
    /// When the batch started (Unix ms): its first run's start, or a submitted batch's
    /// submission; when the store read knows it.
    pub started_at: Option<u64>,
    /// The run of the batch that started first: the smallest run id (ids are time-ordered).
    first_run: Option<String>,
    pub items: u64,
    pub by_status: BTreeMap<String, u64>,
    pub cost_usd: Cost,
    pub cost_unknown_calls: u64,
    durations: Vec<u32>,
    /// The slowest items, slowest first.
    pub slowest: Vec<Item>,
    /// Failed (and cancelled) items by error kind: how many, and the first [`LISTED`].
    pub failed: BTreeMap<String, (u64, Vec<Item>)>,
    /// Interrupted items: how many, and the first [`LISTED`].
    pub interrupted: (u64, Vec<Item>),
}

impl Summary {
    pub fn new(name: impl Into<String>) -> Summary {
        Summary {
            name: name.into(),
            ..Summary::default()
        }
    }

    pub fn add(&mut self, item: Item) {
        self.items += 1;
        if let Some(id) = &item.run_id
            && self.first_run.as_ref().is_none_or(|f| id < f)
        {
            self.first_run = Some(id.clone());
        }
        *self.by_status.entry(item.status.clone()).or_default() += 1;
        self.cost_usd += item.cost_usd;
        self.cost_unknown_calls += item.cost_unknown_calls;
        self.durations
            .push(u32::try_from(item.duration_ms).unwrap_or(u32::MAX));
        match item.status.as_str() {
            "failed" | "cancelled" => {
                let kind = item.error_kind.clone().unwrap_or_else(|| item.status.clone());
                let e = self.failed.entry(kind).or_default();
                e.0 += 1;
                if e.1.len() < LISTED {
                    e.1.push(item.clone());
                }
            }
            "interrupted" => {
                self.interrupted.0 += 1;
                if self.interrupted.1.len() < LISTED {
                    self.interrupted.1.push(item.clone());
                }
            }
            _ => {}
        }
        let slower = self.slowest.len() < SLOWEST
            || self
                .slowest
                .last()
                .is_some_and(|l| item.duration_ms > l.duration_ms);
        if slower {
            let at = self
                .slowest
                .partition_point(|s| s.duration_ms >= item.duration_ms);
            self.slowest.insert(at, item);
            self.slowest.truncate(SLOWEST);
        }
    }

    /// The id of the batch's run that started first (run ids are time-ordered), whose record
    /// tells the flow and the batch's start.
    pub fn first_run(&self) -> Option<&str> {
        self.first_run.as_deref()
    }

    /// The run ids the page links to: the slowest, failed and interrupted items listed.
    pub fn linked_runs(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .slowest
            .iter()
            .chain(self.failed.values().flat_map(|(_, v)| v.iter()))
            .chain(self.interrupted.1.iter())
            .filter_map(|i| i.run_id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn quantile(sorted: &[u32], q: f64) -> u32 {
        if sorted.is_empty() {
            return 0;
        }
        let i = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[i.min(sorted.len() - 1)]
    }
}

const STYLE: &str = r#"
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1a202c;background:#f7fafc}
header{padding:16px 24px;background:#fff;border-bottom:1px solid #e2e8f0}h1{font-size:18px;margin:0 0 6px}
section{margin:16px 24px;background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:12px 16px}h2{font-size:15px;margin:0 0 10px}
.counts{display:flex;height:18px;border-radius:3px;overflow:hidden;margin:8px 0}.counts div{height:18px}
.succeeded{background:#48bb78}.failed{background:#f56565}.interrupted{background:#ecc94b}.cancelled{background:#a0aec0}.other{background:#4299e1}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
table{border-collapse:collapse;width:100%;font-size:13px}th{text-align:left;color:#718096;font-weight:500;border-bottom:1px solid #e2e8f0;padding:4px 6px}
td{padding:3px 6px;border-bottom:1px solid #f0f4f8}td.mono{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap}
.hist{display:flex;align-items:flex-end;height:90px;gap:2px}.hist div{flex:1;background:#4299e1;min-height:1px}
.hist-axis{display:flex;gap:2px;font-size:10px;color:#718096}.hist-axis span{flex:1;text-align:center;overflow:hidden}
.muted{color:#718096}.err{color:#c53030}details summary{cursor:pointer}
"#;

/// A relative link to a file below the page's folder: `./` then each path segment
/// percent-encoded (all but `A-Z a-z 0-9 - . _ ~`), so no name is read as a scheme
/// (`javascript:`), a fragment, a query or an escape.
pub fn relative_link(segments: &[&str]) -> String {
    let mut out = String::from(".");
    for seg in segments {
        out.push('/');
        for b in seg.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The page. `link` gives the (relative) address of a run's page, when there is one.
pub fn batch_html(s: &Summary, link: &dyn Fn(&str) -> Option<String>, note: Option<&str>) -> String {
    let mut sorted = s.durations.clone();
    sorted.sort_unstable();
    let mut o = String::with_capacity(64 * 1024);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>batch {}{}</title><style>{STYLE}</style></head><body>\n<header><h1>batch {}</h1>",
        html(&s.name),
        s.flow
            .as_ref()
            .map(|f| format!(" · {}", html(f)))
            .unwrap_or_default(),
        html(&s.name)
    );
    // Which flow, and when: what the store knows of the batch.
    let flow = match &s.flow {
        Some(f) => format!("flow <b>{}</b>", html(f)),
        None => "<span class=\"muted\">flow unknown: the store read holds none of its runs</span>".into(),
    };
    let started = s
        .started_at
        .and_then(|ms| i64::try_from(ms / 1000).ok())
        .and_then(|secs| crate::expr::time::Timestamp::from_unix_secs(secs).ok())
        .map(|t| format!(" · started <time>{t}</time> (UTC)"))
        .unwrap_or_default();
    let _ = write!(o, "<div id=\"batch-of\">{flow}{started}</div>");
    let _ = write!(
        o,
        "<div>{} items · cost {}{} · median {} ms · 90% within {} ms · longest {} ms</div>",
        s.items,
        s.cost_usd,
        fmt_unknown(s.cost_unknown_calls),
        Summary::quantile(&sorted, 0.5),
        Summary::quantile(&sorted, 0.9),
        sorted.last().copied().unwrap_or(0)
    );
    if let Some(n) = note {
        let _ = write!(o, "<div class=\"muted\">{}</div>", html(n));
    }
    o.push_str("<div class=\"counts\">");
    let total = s.items.max(1) as f64;
    for (status, n) in &s.by_status {
        let class = match status.as_str() {
            "succeeded" | "failed" | "interrupted" | "cancelled" => status.as_str(),
            _ => "other",
        };
        let _ = write!(
            o,
            "<div class=\"{class}\" style=\"width:{:.3}%\" title=\"{} {}\"></div>",
            *n as f64 / total * 100.0,
            n,
            html(status)
        );
    }
    o.push_str("</div><div class=\"legend\" id=\"counts\">");
    for (status, n) in &s.by_status {
        let class = match status.as_str() {
            "succeeded" | "failed" | "interrupted" | "cancelled" => status.as_str(),
            _ => "other",
        };
        let _ = write!(
            o,
            "<span data-status=\"{}\"><i class=\"{class}\"></i>{} {}</span>",
            html(status),
            n,
            html(status)
        );
    }
    o.push_str("</div></header>\n");

    // How long items took: a histogram over twenty equal spans up to the longest.
    if let Some(&max) = sorted.last() {
        let buckets = 20usize;
        let width = (u64::from(max) / buckets as u64).max(1);
        let mut counts = vec![0u64; buckets];
        for d in &sorted {
            let b = (u64::from(*d) / width).min(buckets as u64 - 1) as usize;
            counts[b] += 1;
        }
        let top = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
        o.push_str("<section id=\"durations\"><h2>How long items took</h2><div class=\"hist\">");
        for (i, c) in counts.iter().enumerate() {
            let _ = write!(
                o,
                "<div style=\"height:{:.1}%\" title=\"{} items of {}–{} ms\"></div>",
                *c as f64 / top * 100.0,
                c,
                i as u64 * width,
                (i as u64 + 1) * width
            );
        }
        o.push_str("</div><div class=\"hist-axis\">");
        for i in 0..buckets {
            let label = if i % 5 == 0 {
                format!("{} ms", i as u64 * width)
            } else {
                String::new()
            };
            let _ = write!(o, "<span>{label}</span>");
        }
        o.push_str("</div></section>\n");
    }

    let row = |o: &mut String, i: &Item, with_error: bool| {
        let run = match (&i.run_id, i.run_id.as_deref().and_then(link)) {
            (Some(id), Some(href)) => format!("<a href=\"{}\">{}</a>", html(&href), html(id)),
            (Some(id), None) => html(id),
            (None, _) => "<span class=\"muted\">no run</span>".to_string(),
        };
        let _ = write!(
            o,
            "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td><td>{} ms</td><td>{}</td><td class=\"mono\">{run}</td>",
            i.line,
            html(&i.id),
            html(&i.status),
            i.duration_ms,
            i.cost_usd.to_string() + &fmt_unknown(i.cost_unknown_calls)
        );
        if with_error {
            let _ = write!(
                o,
                "<td class=\"err\">{}</td>",
                html(i.error_message.as_deref().unwrap_or(""))
            );
        }
        o.push_str("</tr>");
    };
    let head = |o: &mut String, with_error: bool| {
        o.push_str(
            "<table><tr><th>line</th><th>id</th><th>status</th><th>time</th><th>cost</th><th>run</th>",
        );
        if with_error {
            o.push_str("<th>error</th>");
        }
        o.push_str("</tr>");
    };

    if !s.failed.is_empty() {
        o.push_str("<section id=\"failed\"><h2>Failed items by error kind</h2>");
        for (kind, (n, items)) in &s.failed {
            let _ = write!(
                o,
                "<details open data-kind=\"{}\"><summary><b class=\"err\">{}</b> · {n} item(s){}</summary>",
                html(kind),
                html(kind),
                if *n as usize > items.len() {
                    format!(" (the first {} listed)", items.len())
                } else {
                    String::new()
                }
            );
            head(&mut o, true);
            for i in items {
                row(&mut o, i, true);
            }
            o.push_str("</table></details>");
        }
        o.push_str("</section>\n");
    }
    if s.interrupted.0 > 0 {
        let _ = write!(
            o,
            "<section id=\"interrupted\"><h2>Interrupted items · {}</h2>",
            s.interrupted.0
        );
        head(&mut o, true);
        for i in &s.interrupted.1 {
            row(&mut o, i, true);
        }
        o.push_str("</table></section>\n");
    }
    let _ = write!(
        o,
        "<section id=\"slowest\"><h2>The slowest {} items</h2>",
        s.slowest.len()
    );
    head(&mut o, false);
    for i in &s.slowest {
        row(&mut o, i, false);
    }
    o.push_str("</table></section>\n</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(line: u64, status: &str, ms: u64, kind: Option<&str>) -> Item {
        Item {
            line,
            id: format!("i{line}"),
            status: status.into(),
            error_kind: kind.map(str::to_string),
            error_message: kind.map(|k| format!("{k} happened")),
            run_id: Some(format!("r{line}")),
            cost_usd: Cost::from_nanos(500_000_000),
            cost_unknown_calls: 0,
            duration_ms: ms,
        }
    }

    #[test]
    fn the_summary_keeps_the_slowest_and_the_first_failures_of_each_kind() {
        let mut s = Summary::new("b");
        for i in 0..1000 {
            let (status, kind) = match i % 10 {
                0 => ("failed", Some("timeout")),
                1 => ("failed", Some("agent")),
                2 => ("interrupted", Some("in_doubt")),
                _ => ("succeeded", None),
            };
            s.add(item(i + 1, status, (i * 37) % 1000, kind));
        }
        assert_eq!(s.items, 1000);
        assert_eq!(s.by_status["succeeded"], 700);
        assert_eq!(s.failed["timeout"].0, 100);
        assert_eq!(s.failed["timeout"].1.len(), LISTED);
        assert_eq!(s.interrupted.0, 100);
        assert_eq!(s.slowest.len(), SLOWEST);
        assert_eq!(s.slowest[0].duration_ms, 999);
        assert!(s.slowest.windows(2).all(|w| w[0].duration_ms >= w[1].duration_ms));
        assert_eq!(s.cost_usd, Cost::from_nanos(500_000_000_000));
        assert_eq!(
            relative_link(&["javascript:alert(1)?é #%.runs", "r1.html"]),
            "./javascript%3Aalert%281%29%3F%C3%A9%20%23%25.runs/r1.html"
        );
        let page = batch_html(&s, &|id| Some(format!("runs/{id}.html")), None);
        assert!(page.contains("href=\"runs/r1.html\""));
        assert!(page.contains("data-kind=\"timeout\""));
    }

    #[test]
    fn an_output_line_reads_into_an_item_or_names_what_is_wrong() {
        let i = Item::from_line(
            3,
            r#"{"id": 7, "status": "failed", "output": null, "error": {"kind": "timeout", "message": "slow"}, "run_id": "r1", "cost_usd": 0.25, "duration_ms": 40}"#,
        )
        .unwrap();
        assert_eq!(
            (i.id.as_str(), i.error_kind.as_deref(), i.duration_ms),
            ("7", Some("timeout"), 40)
        );
        assert!(
            Item::from_line(2, "{")
                .unwrap_err()
                .starts_with("line 2: not JSON")
        );
        assert!(
            Item::from_line(5, "{\"a\": 1}")
                .unwrap_err()
                .contains("line 5: no `status`")
        );
        // A cost written by a float sum reads as the amount it meant; no amount is an error.
        let drifted = r#"{"status": "succeeded", "cost_usd": 0.0009900000000000002}"#;
        assert_eq!(
            Item::from_line(1, drifted).unwrap().cost_usd,
            Cost::from_nanos(990_000)
        );
        assert_eq!(
            Item::from_line(4, r#"{"status": "succeeded", "cost_usd": -1}"#)
                .err()
                .as_deref(),
            Some("line 4: `cost_usd` is -1, not a cost in USD")
        );
    }
}
