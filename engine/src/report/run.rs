//! A run as one self-contained HTML page (`runs show RUN_ID --format html`, SPEC §13): no
//! network, the style and the script inline. The page holds the run's record (status, time,
//! tokens, cost, error), its flow drawn with the route the run took (steps that ran coloured by
//! how they ended, steps never reached faded), and a timeline: a row per step record — child
//! runs' and agent loops' records under the step that made them — with a bar on the run's
//! clock, its tokens, cost and error kind; clicking a row shows its input, result, payload
//! changes and error. Errors are counted by kind.
//!
//! Large runs stay light: of each step's iterations only the first [`ITERATIONS_SHOWN`] are
//! rows (the rest are summed up in one), a child run's records are shown for the first
//! [`CHILDREN_SHOWN`] child runs, and each value shown on click is cut at [`VALUE_BYTES`].

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::plan::svg::{self, Marks};
use crate::record::{
    RunRecord, RunStatus, StepRecord, StepStatus, group_order, loop_order, loop_owner, tool_name,
};
use crate::runtime::resume::Waiting;

/// Iteration records of one step shown as rows.
pub const ITERATIONS_SHOWN: usize = 50;
/// Child runs whose records are read and shown.
pub const CHILDREN_SHOWN: usize = 100;
/// The most of one value (input, result, changes) the page holds.
pub const VALUE_BYTES: usize = 16 * 1024;

/// What the page is made from.
pub struct RunReport<'a> {
    pub run: &'a RunRecord,
    /// The run's records, latest attempt of each, in record order.
    pub steps: &'a [StepRecord],
    /// Child runs (of any depth) with their records, by id.
    pub children: &'a HashMap<String, (RunRecord, Vec<StepRecord>)>,
    /// The drawing of the run's flow, or why there is none.
    pub layout: Result<svg::Layout, String>,
    /// Unix milliseconds now (for the bar of what is still running, and expiries).
    pub now_ms: u64,
    /// The `interrupt` step or agent loop approval the run's tree waits at, and the command
    /// that answers it.
    pub waiting: Option<(&'a Waiting, String)>,
    /// The run's files (those of its child runs too), by record number.
    pub files: &'a [crate::record::files::RunFile],
    /// The bytes of the images the page inlines ([`super::files::to_inline`]), by hash.
    pub inline: &'a HashMap<String, Vec<u8>>,
    /// The decisions recorded for the run (SPEC §15), in the order made.
    pub decisions: &'a [crate::record::inbox::DecisionRow],
}

/// Escapes text for HTML character data and attribute values (as for the SVG it holds:
/// markup characters as entities, control characters shown as their pictures).
pub fn html(s: &str) -> String {
    svg::xml_text(s)
}

/// JSON for a `<script type="application/json">` block: nothing in it closes the block or
/// opens a comment.
fn script_json(v: &Value) -> String {
    serde_json::to_string(v)
        .expect("JSON values serialize")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// A value as shown on click: pretty JSON, cut at [`VALUE_BYTES`].
fn shown(v: &Value) -> String {
    let text = serde_json::to_string_pretty(v).expect("JSON values serialize");
    if text.len() <= VALUE_BYTES {
        return text;
    }
    let mut end = VALUE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n… ({} bytes in all; `switchyard runs show --json` has the whole)",
        &text[..end],
        text.len()
    )
}

fn state_of(s: StepStatus) -> &'static str {
    match s {
        StepStatus::Succeeded => "ok",
        StepStatus::Failed => "failed",
        StepStatus::Interrupted => "interrupted",
        StepStatus::Started => "running",
    }
}

/// The tools the run's agent loops called, by step and tool (as the drawing names them:
/// `search`, `a/search` for branch `a`'s loop, `helper.search` for a tool of tool `helper`),
/// each with how its calls ended: `ok` when one of them succeeded, else how the last one
/// ended.
fn tools_called(steps: &[StepRecord]) -> HashMap<(String, String), &'static str> {
    let mut out: HashMap<(String, String), &'static str> = HashMap::new();
    for s in steps.iter().filter(|s| s.kind == "tool") {
        let Some(path) = tool_path(steps, &s.number) else {
            continue;
        };
        let state = out.entry((s.step.clone(), path)).or_insert("");
        if *state != "ok" {
            *state = state_of(s.status);
        }
    }
    out
}

/// The tool a call's record (`3.t2.1`: the first call of turn 2 of the loop of step number
/// 3) is of, named by the turn that made it (`tool_calls[0].function.name`), after the branch
/// or the tools its loop is reached through; `None` for a call of a child run's loop or one
/// no turn names.
fn tool_path(steps: &[StepRecord], number: &str) -> Option<String> {
    let (turn, _) = number.rsplit_once('.')?;
    let (owner, k) = turn.rsplit_once(".t")?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let name = tool_name(number, steps)?;
    // The loop's owner: a step (`3`), an iteration (`3[2]`), a branch (`3.a`), or a call of
    // a tool that is a loop itself (`3.t1.2`).
    let top = |n: &str| {
        let n = n
            .split_once('[')
            .map_or(n, |(n, rest)| if rest.ends_with(']') { n } else { "" });
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    };
    if top(owner) {
        return Some(name.to_string());
    }
    let (head, last) = owner.rsplit_once('.')?;
    if last.bytes().all(|b| b.is_ascii_digit()) {
        Some(format!("{}.{name}", tool_path(steps, owner)?))
    } else if top(head) {
        Some(format!("{last}/{name}"))
    } else {
        None
    }
}

fn ms(a: u64, b: Option<u64>) -> String {
    match b {
        Some(b) => {
            let d = b.saturating_sub(a);
            if d >= 10_000 {
                format!("{:.1} s", d as f64 / 1000.0)
            } else {
                format!("{d} ms")
            }
        }
        None => "–".to_string(),
    }
}

/// The marks of the run's route on its flow's drawing: the state of each top-level step (its
/// last record) and the routes taken.
fn marks(run: &RunRecord, steps: &[StepRecord]) -> Marks {
    let mut m = Marks::default();
    let mut first = true;
    let top: Vec<&StepRecord> = steps
        .iter()
        .filter(|s| !s.number.contains('.') && s.iteration.is_none())
        .collect();
    // The last step's way out, when its record names none: to the end, or, from a `fail`
    // step, to `failed`.
    if let Some(last) = top.last()
        && last.route.is_none()
    {
        match run.status {
            RunStatus::Succeeded => {
                m.routes.insert((last.step.clone(), "end".to_string()));
            }
            RunStatus::Failed if last.kind == "fail" => {
                m.routes.insert((last.step.clone(), "failed".to_string()));
            }
            _ => {}
        }
    }
    for s in top {
        m.steps.insert(s.step.clone(), state_of(s.status));
        if first {
            m.routes.insert(("start".to_string(), s.step.clone()));
            first = false;
        }
        if let Some(next) = &s.route {
            m.routes.insert((s.step.clone(), next.clone()));
        }
    }
    m.tools = tools_called(steps);
    m
}

/// One row of the timeline.
struct Row<'a> {
    depth: usize,
    rec: Option<&'a StepRecord>,
    /// For rows that are not a record: a child run's header, or iterations summed up.
    text: String,
    run: &'a str,
}

/// Rows for the records of run `run` (of the tree's `depth`), each under what made it: a
/// step's row, then its agent loop's turns and tool calls in the loop's order, then its
/// iterations or branches, each followed by its own loop's parts; child runs under the
/// record that started them. Records are written as they finish (a loop's turns and a
/// `foreach`'s iterations before the step's own record): the rows are ordered by their
/// numbers, not by that. What finished of a step with no record yet (the run stopped, or
/// runs, while it did) comes last, under a line for the step.
fn rows<'a>(
    out: &mut Vec<Row<'a>>,
    run: &'a str,
    steps: &'a [StepRecord],
    children: &'a HashMap<String, (RunRecord, Vec<StepRecord>)>,
    depth: usize,
) {
    // Iterations and branches by their step's number; loop parts by their loop's owner.
    let mut groups: HashMap<&str, Vec<&StepRecord>> = HashMap::new();
    let mut parts: HashMap<&str, Vec<&StepRecord>> = HashMap::new();
    let mut tops: Vec<&StepRecord> = Vec::new();
    for s in steps {
        if s.is_loop_part() {
            parts.entry(loop_owner(&s.number)).or_default().push(s);
        } else if s.kind == "branch" {
            let owner = s.number.rsplit_once('.').map_or(s.number.as_str(), |(n, _)| n);
            groups.entry(owner).or_default().push(s);
        } else if s.is_group() {
            groups.entry(s.number.as_str()).or_default().push(s);
        } else {
            tops.push(s);
        }
    }
    for p in parts.values_mut() {
        p.sort_by_key(|p| loop_order(&p.number));
    }
    // Iterations in item order and branches as written, whatever order they finished in.
    for (number, g) in groups.iter_mut() {
        group_order(g, tops.iter().copied().find(|s| s.number == *number));
    }
    let tree = Tree {
        run,
        children,
        groups,
        parts,
    };
    for s in &tops {
        tree.record(out, s, depth);
        tree.loop_parts(out, &s.number, depth + 1);
        tree.groups(out, &s.number, depth + 1);
    }
    // The parts of steps with no record of their own.
    let has_record: std::collections::HashSet<String> = tops.iter().map(|s| s.number.clone()).collect();
    let keyed: std::collections::HashSet<String> = steps
        .iter()
        .filter(|s| !s.is_loop_part())
        .map(StepRecord::key)
        .collect();
    let mut open: Vec<(u64, &str, &str)> = Vec::new();
    for (number, g) in &tree.groups {
        if !has_record.contains(*number) {
            let first = g.iter().map(|s| s.started_at).min().unwrap_or(0);
            open.push((first, number, &g[0].step));
        }
    }
    for (owner, p) in &tree.parts {
        if !keyed.contains(*owner) && !tree.groups.contains_key(owner) {
            let first = p.iter().map(|s| s.started_at).min().unwrap_or(0);
            open.push((first, owner, &p[0].step));
        }
    }
    open.sort();
    for (_, number, step) in open {
        out.push(Row {
            depth,
            rec: None,
            text: format!("{number} {step} · not finished: what finished of it"),
            run,
        });
        tree.loop_parts(out, number, depth + 1);
        tree.groups(out, number, depth + 1);
    }
}

/// What the run waits for: the question ([`question`](super::question::question): the prompt
/// or the proposed calls, the decision's schema and forms) and the command that answers it.
fn waiting(o: &mut String, run: &RunRecord, w: &Waiting, command: &str, now_ms: u64) {
    let what = if w.step.kind == "approval" && crate::record::loop_split(&w.step.number).is_none() {
        "approval of the call a step proposed"
    } else if w.step.kind == "approval" {
        "approval of the calls an agent loop proposed"
    } else {
        "a decision"
    };
    let number = w.step.number.as_str();
    let whose = if w.run_id == run.id {
        String::new()
    } else {
        format!(" of child run {} (flow {})", w.run_id, w.flow)
    };
    let _ = write!(
        o,
        "<section id=\"waiting\"><h2>Waiting for {what} <span class=\"muted\">(step {} · number {}{})</span></h2><dl>",
        html(&w.step.step),
        html(number),
        html(&whose)
    );
    for l in super::question::question(&w.step, now_ms, Some(command)) {
        let text = if l.command {
            format!("<code>{}</code>", html(&l.text))
        } else {
            html(&l.text)
        };
        let _ = write!(o, "<dt>{}</dt><dd>{text}</dd>", html(&l.label));
    }
    o.push_str("</dl></section>\n");
}

/// A run's records, indexed for [`rows`].
struct Tree<'a> {
    run: &'a str,
    children: &'a HashMap<String, (RunRecord, Vec<StepRecord>)>,
    groups: HashMap<&'a str, Vec<&'a StepRecord>>,
    parts: HashMap<&'a str, Vec<&'a StepRecord>>,
}

impl<'a> Tree<'a> {
    /// The row of record `s`, and under it the child run it started.
    fn record(&self, out: &mut Vec<Row<'a>>, s: &'a StepRecord, depth: usize) {
        out.push(Row {
            depth,
            rec: Some(s),
            text: String::new(),
            run: self.run,
        });
        if let Some(child) = &s.child_run {
            match self.children.get(child) {
                Some((c, cs)) => {
                    out.push(Row {
                        depth: depth + 1,
                        rec: None,
                        text: format!("child run {} · flow {} · {}", c.id, c.flow, c.status.as_str()),
                        run: &c.id,
                    });
                    rows(out, &c.id, cs, self.children, depth + 2);
                }
                None => out.push(Row {
                    depth: depth + 1,
                    rec: None,
                    text: format!("child run {child} (its records are not shown: too many child runs)"),
                    run: self.run,
                }),
            }
        }
    }

    /// The turns, tool calls and approvals of the loop of `owner`, in the loop's order.
    fn loop_parts(&self, out: &mut Vec<Row<'a>>, owner: &str, depth: usize) {
        for p in self.parts.get(owner).into_iter().flatten() {
            self.record(out, p, depth);
        }
    }

    /// The iterations (the first [`ITERATIONS_SHOWN`] of each attempt; the rest summed up in
    /// one row) or branches of step `number`, each with its loop's parts.
    fn groups(&self, out: &mut Vec<Row<'a>>, number: &str, depth: usize) {
        let mut shown: HashMap<u32, usize> = HashMap::new();
        let mut hidden: BTreeMap<u32, (usize, u64, u64)> = BTreeMap::new();
        for g in self.groups.get(number).into_iter().flatten() {
            if g.iteration.is_some() {
                let n = shown.entry(g.attempt).or_default();
                *n += 1;
                if *n > ITERATIONS_SHOWN {
                    let h = hidden.entry(g.attempt).or_insert((0, 0, 0));
                    let d = g.finished_at.map_or(0, |f| f.saturating_sub(g.started_at));
                    h.0 += 1;
                    h.1 += d;
                    h.2 = h.2.max(d);
                    continue;
                }
            }
            self.record(out, g, depth);
            self.loop_parts(out, &g.key(), depth + 1);
        }
        for (count, total, max) in hidden.into_values() {
            out.push(Row {
                depth,
                rec: None,
                text: format!(
                    "… {count} more iterations of step {number} (mean {} ms, longest {max} ms)",
                    total / count.max(1) as u64
                ),
                run: self.run,
            });
        }
    }
}

const STYLE: &str = r#"
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1a202c;background:#f7fafc}
header{padding:16px 24px;background:#fff;border-bottom:1px solid #e2e8f0}h1{font-size:18px;margin:0 0 6px}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;margin-left:8px;vertical-align:middle}
.status.succeeded{background:#c6f6d5;color:#22543d}.status.failed{background:#fed7d7;color:#822727}
.status.interrupted,.status.running,.status.queued{background:#fefcbf;color:#744210}.status.cancelled{background:#e2e8f0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:8px 0 0}dt{color:#718096}dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;word-break:break-all}
section{margin:16px 24px;background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:12px 16px}h2{font-size:15px;margin:0 0 10px}
.graph{overflow:auto;max-height:70vh}.graph svg{display:block}
table{border-collapse:collapse;width:100%;font-size:13px}th{text-align:left;color:#718096;font-weight:500;border-bottom:1px solid #e2e8f0;padding:4px 6px}
td{padding:3px 6px;border-bottom:1px solid #f0f4f8;white-space:nowrap}tr.rec{cursor:pointer}tr.rec:hover{background:#ebf8ff}tr.sel{background:#bee3f8}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace}td.bar{width:40%;min-width:200px}
.track{position:relative;height:12px;background:#f7fafc;border-radius:2px}.bar-fill{position:absolute;top:0;height:12px;border-radius:2px;min-width:2px}
.bar-fill.ok{background:#48bb78}.bar-fill.failed{background:#f56565}.bar-fill.interrupted,.bar-fill.running{background:#ecc94b}
tr.note td{color:#718096;font-style:italic}.err{color:#c53030}
#detail{white-space:pre-wrap}#detail h3{font-size:13px;margin:10px 0 4px;color:#4a5568}#detail pre{margin:0;padding:8px;background:#f7fafc;border:1px solid #e2e8f0;border-radius:4px;max-height:40vh;overflow:auto;font-size:12px}
img.thumb{display:block;max-width:160px;max-height:120px;border:1px solid #e2e8f0}
.muted{color:#718096}#waiting{border-color:#ecc94b}#waiting dd{white-space:pre-wrap}
"#;

const SCRIPT: &str = r#"
(function(){
  var data = JSON.parse(document.getElementById('records').textContent);
  var detail = document.getElementById('detail');
  function block(title, text){
    var h = document.createElement('h3'); h.textContent = title;
    var p = document.createElement('pre'); p.textContent = text;
    detail.appendChild(h); detail.appendChild(p);
  }
  function show(i, row){
    var r = data[i]; if (!r) return;
    var sel = document.querySelector('tr.sel'); if (sel) sel.classList.remove('sel');
    row.classList.add('sel');
    detail.textContent = '';
    var t = document.createElement('div'); t.className = 'muted';
    t.textContent = 'step ' + r.step + ' · number ' + r.number + ' · ' + r.kind + ' · attempt ' + r.attempt + ' · ' + r.status + ' · run ' + r.run;
    detail.appendChild(t);
    if (r.error) block('error', r.error);
    if (r.changes) block('payload changes', r.changes);
    if (r.input) block('input', r.input);
    if (r.result) block('result', r.result);
    if (r.violations) block('violations', r.violations);
    detail.scrollIntoView({block: 'nearest'});
  }
  document.querySelectorAll('tr.rec').forEach(function(row){
    row.addEventListener('click', function(){ show(row.getAttribute('data-rec'), row); });
  });
  document.querySelectorAll('svg g.node[data-step]').forEach(function(n){
    n.style.cursor = 'pointer';
    n.addEventListener('click', function(){
      var step = n.getAttribute('data-step'), flow = n.getAttribute('data-flow');
      if (flow !== '') return;
      var rows = document.querySelectorAll('tr.rec[data-top="1"]');
      for (var k = 0; k < rows.length; k++) {
        if (rows[k].getAttribute('data-step') === step) { show(rows[k].getAttribute('data-rec'), rows[k]); return; }
      }
    });
  });
})();
"#;

/// The page.
pub fn run_html(r: &RunReport) -> String {
    let run = r.run;
    let mut o = String::with_capacity(64 * 1024);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>run {} · {}</title><style>{STYLE}</style></head><body>\n",
        html(&run.id),
        html(&run.flow)
    );
    let _ = write!(
        o,
        "<header><h1>run {}<span class=\"status {}\">{}</span></h1><dl>",
        html(&run.id),
        run.status.as_str(),
        run.status.as_str()
    );
    let mut field = |k: &str, v: String| {
        let _ = write!(o, "<dt>{k}</dt><dd>{}</dd>", html(&v));
    };
    field("flow", format!("{} ({})", run.flow, run.flow_hash));
    if let Some(p) = &run.flow_path {
        field("file", p.clone());
    }
    if let (Some(b), Some(i)) = (&run.batch, run.item_index) {
        field(
            "batch",
            format!(
                "{b}, line {} (id {})",
                i + 1,
                run.item_id.as_deref().unwrap_or("?")
            ),
        );
    }
    let started = i64::try_from(run.started_at)
        .ok()
        .and_then(|m| m.checked_mul(1000))
        .and_then(crate::expr::time::Timestamp::from_unix_micros)
        .map_or_else(|| run.started_at.to_string(), |t| t.to_string());
    field("started", started);
    field(
        "duration",
        format!("{} · {} steps", ms(run.started_at, run.finished_at), run.steps),
    );
    field(
        "tokens",
        format!("{} in, {} out", run.usage.input_tokens, run.usage.output_tokens),
    );
    field(
        "cost",
        run.usage.cost_usd.to_string() + &crate::record::fmt_unknown(run.usage.cost_unknown_calls),
    );
    if let Some(e) = &run.error {
        field("error", format!("[{}] {}", e.kind, e.message));
    }
    o.push_str("</dl></header>\n");

    if let Some((w, command)) = &r.waiting {
        waiting(&mut o, run, w, command, r.now_ms);
    }
    if !r.decisions.is_empty() {
        o.push_str("<section id=\"decisions\"><h2>Decisions</h2>");
        for d in r.decisions {
            o.push_str("<dl class=\"decision\">");
            for l in super::question::decision_lines(d) {
                let _ = write!(o, "<dt>{}</dt><dd>{}</dd>", html(&l.label), html(&l.text));
            }
            o.push_str("</dl>");
        }
        o.push_str("</section>\n");
    }

    // The flow, with the route taken.
    o.push_str("<section id=\"graph\"><h2>Route</h2><div class=\"graph\">");
    match &r.layout {
        Ok(l) => o.push_str(&svg::render(l, Some(&marks(run, r.steps)))),
        Err(why) => {
            let _ = write!(o, "<p class=\"muted\">The flow is not drawn: {}</p>", html(why));
        }
    }
    o.push_str("</div></section>\n");

    // Errors by kind, over the whole tree.
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let all = r
        .steps
        .iter()
        .chain(r.children.values().flat_map(|(_, s)| s.iter()));
    for s in all {
        if let Some(e) = &s.error {
            *kinds.entry(e.kind.to_string()).or_default() += 1;
        }
    }
    if !kinds.is_empty() {
        o.push_str(
            "<section id=\"errors\"><h2>Errors by kind</h2><table><tr><th>kind</th><th>records</th></tr>",
        );
        for (k, n) in &kinds {
            let _ = write!(o, "<tr><td class=\"err\">{}</td><td>{n}</td></tr>", html(k));
        }
        o.push_str("</table></section>\n");
    }

    super::files::section(&mut o, &run.id, r.files, r.inline);

    // The timeline.
    let mut list = Vec::new();
    rows(&mut list, &run.id, r.steps, r.children, 0);
    let t0 = run.started_at;
    let end = |s: &StepRecord| s.finished_at.unwrap_or(r.now_ms);
    let t1 = list
        .iter()
        .filter_map(|row| row.rec.map(end))
        .chain(run.finished_at)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let _ = write!(
        o,
        "<section id=\"timeline\"><h2>Timeline <span class=\"muted\">({} records, {} on the run's clock; click a row for its \
         input, result and payload changes)</span></h2><table><tr><th>number</th><th>step</th><th>kind</th><th>status</th>\
         <th>time</th><th>tokens</th><th>cost</th><th>error</th><th></th></tr>",
        list.iter().filter(|row| row.rec.is_some()).count(),
        ms(t0, Some(t1))
    );
    let mut records = Vec::new();
    for row in &list {
        let indent = row.depth as f64 * 14.0 + 4.0;
        let Some(s) = row.rec else {
            let _ = write!(
                o,
                "<tr class=\"note\"><td colspan=\"9\" style=\"padding-left:{indent}px\">{}</td></tr>",
                html(&row.text)
            );
            continue;
        };
        let state = state_of(s.status);
        let left = (s.started_at.saturating_sub(t0)) as f64 / span * 100.0;
        let width = ((end(s).saturating_sub(s.started_at)) as f64 / span * 100.0).max(0.2);
        let number = match s.iteration {
            Some(i) => format!("{}[{i}]", s.number),
            None => s.number.clone(),
        };
        let error = s.error.as_ref().map(|e| e.kind.to_string()).unwrap_or_default();
        // A tool call's row names its tool, as the record keeps it (`answers.tool`).
        let of_run: &[StepRecord] = if row.run == run.id {
            r.steps
        } else {
            r.children.get(row.run).map_or(&[], |(_, s)| s)
        };
        let kind = match (s.kind == "tool").then(|| tool_name(&s.number, of_run)).flatten() {
            Some(t) => format!("tool {t}"),
            None => s.kind.clone(),
        };
        let top = row.run == run.id && !s.number.contains('.') && s.iteration.is_none();
        let _ = write!(
            o,
            "<tr class=\"rec\" data-rec=\"{}\" data-step=\"{}\" data-top=\"{}\"><td class=\"name\" style=\"padding-left:{indent}px\">{}</td>\
             <td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"err\">{}</td>\
             <td class=\"bar\"><div class=\"track\"><div class=\"bar-fill {state}\" style=\"left:{left:.3}%;width:{width:.3}%\"></div></div></td></tr>",
            records.len(),
            html(&s.step),
            u8::from(top),
            html(&number),
            html(&s.step),
            html(&kind),
            s.status.as_str(),
            ms(s.started_at, s.finished_at),
            if s.usage.input_tokens + s.usage.output_tokens > 0 {
                format!("{} / {}", s.usage.input_tokens, s.usage.output_tokens)
            } else {
                String::new()
            },
            if !s.usage.cost_usd.is_zero() || s.usage.cost_unknown_calls > 0 {
                s.usage.cost_usd.to_string() + &crate::record::fmt_unknown(s.usage.cost_unknown_calls)
            } else {
                String::new()
            },
            html(&error),
        );
        let changes = (!s.changes.is_empty()).then(|| {
            serde_json::to_value(&s.changes)
                .map(|v| shown(&v))
                .unwrap_or_default()
        });
        let violations = (!s.violations.is_empty()).then(|| {
            serde_json::to_value(&s.violations)
                .map(|v| shown(&v))
                .unwrap_or_default()
        });
        records.push(json!({
            "run": row.run,
            "step": s.step,
            "number": number,
            "kind": s.kind,
            "attempt": s.attempt,
            "status": s.status.as_str(),
            "input": s.input.as_ref().map(shown),
            "result": s.result.as_deref().map(shown),
            "changes": changes,
            "violations": violations,
            "error": s.error.as_ref().map(|e| shown(&e.to_json())),
        }));
    }
    o.push_str("</table></section>\n");
    o.push_str("<section><h2>Selected record</h2><div id=\"detail\" class=\"muted\">Click a row of the timeline, or a step of the route.</div></section>\n");
    let _ = write!(
        o,
        "<script type=\"application/json\" id=\"records\">{}</script>\n<script>{SCRIPT}</script>\n</body></html>\n",
        script_json(&Value::Array(records))
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_close_its_block() {
        let v = json!({"a": "</script><!-- & \u{2028}"});
        let s = script_json(&v);
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'), "{s}");
        assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), v);
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let v = Value::String("é".repeat(VALUE_BYTES));
        let s = shown(&v);
        assert!(s.len() < VALUE_BYTES + 200, "{}", s.len());
        assert!(s.contains("bytes in all"));
    }
}
