//! The live pages of `switchyard serve` (SPEC §13, §15): `/` lists runs and the batches they
//! belong to, read again every few seconds; `/runs/{id}` is a run's record and its timeline of
//! steps, `/batches/{name}` a batch's counts by status, both redrawn on each server-sent event
//! of `/v1/runs/{id}/events` or `/v1/batches/{name}/events` until the run or batch ends. The
//! look is the reports'; every value of the store goes into the document as text.

use super::page::page;

/// `/`: runs and batches, live.
pub fn home_html(nonce: &str) -> String {
    page(nonce, "switchyard · runs", &[], HOME_BODY, HOME_SCRIPT)
}

/// `/runs/{id}`: one run, live.
pub fn run_html(nonce: &str, run_id: &str) -> String {
    page(
        nonce,
        &format!("run {run_id}"),
        &[("data-run", run_id)],
        RUN_BODY,
        RUN_SCRIPT,
    )
}

/// `/batches/{name}`: one batch, live.
pub fn batch_html(nonce: &str, name: &str) -> String {
    page(
        nonce,
        &format!("batch {name}"),
        &[("data-batch", name)],
        BATCH_BODY,
        BATCH_SCRIPT,
    )
}

const HOME_BODY: &str = r#"<section><h2>Waiting for a decision</h2><p id="inbox-count" class="muted">…</p></section>
<section><h2>Batches</h2><div id="batches"><p class="muted">loading…</p></div></section>
<section><h2>Runs <span class="muted" id="updated"></span></h2><table id="runs"><tr><th>run</th><th>flow</th><th>status</th><th>started</th><th>steps</th><th>batch</th><th>cost</th></tr></table><p class="err" id="runs-error"></p></section>"#;

const HOME_SCRIPT: &str = concat!(
    r#"(function(){"#,
    r#"
function link(path, text){ var a = SY.el('a', 'mono', text); a.href = path; return a; }
function badge(s){ return SY.el('span', 'status ' + String(s || '').replace(/[^a-z_]/g, ''), s || '?'); }
function cost(u){ return u && u.cost_usd !== undefined ? '$' + Number(u.cost_usd).toFixed(4) : ''; }
var $ = function(id){ return document.getElementById(id); };
function draw(v){
  var list = Array.isArray(v) ? v : (v && (v.runs || v.items)) || [];
  var t = $('runs');
  while (t.rows.length > 1) t.deleteRow(1);
  var batches = {};
  list.forEach(function(r){
    var tr = SY.el('tr');
    var td = SY.el('td'); td.appendChild(link('/runs/' + encodeURIComponent(r.id), r.id)); tr.appendChild(td);
    tr.appendChild(SY.el('td', 'mono', r.flow));
    td = SY.el('td'); td.appendChild(badge(r.status)); tr.appendChild(td);
    tr.appendChild(SY.el('td', 'mono', SY.when(r.started_at)));
    tr.appendChild(SY.el('td', null, r.steps));
    td = SY.el('td');
    if (r.batch) { td.appendChild(link('/batches/' + encodeURIComponent(r.batch), r.batch)); var b = batches[r.batch] = batches[r.batch] || {}; b[r.status] = (b[r.status] || 0) + 1; }
    tr.appendChild(td);
    tr.appendChild(SY.el('td', 'mono', cost(r.usage)));
    t.appendChild(tr);
  });
  var box = $('batches'); box.textContent = '';
  var names = Object.keys(batches);
  if (!names.length) box.appendChild(SY.el('p', 'muted', 'No batch among the runs listed.'));
  names.forEach(function(n){
    var p = SY.el('p'); p.appendChild(link('/batches/' + encodeURIComponent(n), n));
    var c = batches[n];
    p.appendChild(document.createTextNode(' ' + Object.keys(c).map(function(k){ return k + ' ' + c[k]; }).join(' · ') + ' (of the runs listed)'));
    box.appendChild(p);
  });
  $('updated').textContent = 'updated ' + SY.when(Date.now());
}
function tick(){
  SY.api('GET', '/v1/runs?limit=100').then(function(v){ $('runs-error').textContent = ''; draw(v); }, function(e){ $('runs-error').textContent = e.message; });
  SY.api('GET', '/v1/inbox').then(function(v){
    var n = ((v && v.groups) || []).reduce(function(a, g){ return a + (g.count || 0); }, 0);
    var p = $('inbox-count'); p.textContent = '';
    p.appendChild(link('/inbox', n + ' item(s) in the inbox'));
  }, function(e){ $('inbox-count').textContent = e.message; });
}
tick(); setInterval(tick, 3000);
})();"#
);

const RUN_BODY: &str = r#"<section id="head"><h1>run <span id="run-id" class="mono"></span> <span id="run-status"></span></h1><dl id="run-facts"></dl><p class="err" id="run-error"></p></section>
<section id="waits"><h2>Waiting</h2><div id="waiting"><p class="muted">nothing</p></div></section>
<section><h2>Steps <span class="muted" id="live"></span></h2><table id="steps"><tr><th>number</th><th>step</th><th>kind</th><th>status</th><th>attempt</th><th>time</th><th>tokens</th><th>cost</th><th>error</th></tr></table></section>
<section><h2>Detail</h2><div id="detail" class="muted">Click a step.</div></section>"#;

const RUN_SCRIPT: &str = concat!(
    r#"(function(){"#,
    r#"
function link(path, text){ var a = SY.el('a', 'mono', text); a.href = path; return a; }
function badge(s){ return SY.el('span', 'status ' + String(s || '').replace(/[^a-z_]/g, ''), s || '?'); }
function cost(u){ return u && u.cost_usd !== undefined ? '$' + Number(u.cost_usd).toFixed(4) : ''; }
var $ = function(id){ return document.getElementById(id); };
var id = document.body.getAttribute('data-run');
var ended = {succeeded: 1, failed: 1, cancelled: 1};
var status = null, steps = [];
$('run-id').textContent = id;
function errText(e){ return e ? (e.kind ? e.kind + ': ' : '') + (e.message || '') : ''; }
function show(i){
  var s = steps[i]; if (!s) return;
  var d = $('detail'); d.textContent = ''; d.className = '';
  d.appendChild(SY.el('div', 'muted', 'step ' + s.step + ' · number ' + s.number + ' · ' + s.kind + ' · attempt ' + s.attempt + ' · ' + s.status));
  [['error', s.error], ['payload changes', s.changes && s.changes.length ? s.changes : undefined], ['input', s.input], ['result', s.result]].forEach(function(p){
    if (p[1] === undefined || p[1] === null) return;
    d.appendChild(SY.el('h3', null, p[0])); d.appendChild(SY.el('pre', null, SY.json(p[1])));
  });
}
function draw(v){
  var r = v && (v.run || v.record) || v || {};
  steps = (v && v.steps) || [];
  status = r.status;
  var st = $('run-status'); st.textContent = ''; st.appendChild(badge(r.status));
  var dl = $('run-facts'); dl.textContent = '';
  function dd(k, x, node){ if ((x === undefined || x === null || x === '') && !node) return; dl.appendChild(SY.el('dt', null, k)); var e = SY.el('dd', null, node ? undefined : x); if (node) e.appendChild(node); dl.appendChild(e); }
  dd('flow', r.flow);
  if (r.batch) dd('batch', null, link('/batches/' + encodeURIComponent(r.batch), r.batch));
  dd('batch item', r.item_id);
  if (r.parent_run) dd('parent run', null, link('/runs/' + encodeURIComponent(r.parent_run), r.parent_run));
  dd('started', SY.when(r.started_at)); dd('finished', r.finished_at ? SY.when(r.finished_at) : '');
  dd('steps', r.steps);
  if (r.usage) { dd('tokens', (r.usage.input_tokens || 0) + ' in · ' + (r.usage.output_tokens || 0) + ' out'); dd('cost', cost(r.usage)); }
  dd('input', SY.json(r.input));
  if (r.output !== undefined && r.output !== null) dd('output', SY.json(r.output));
  $('run-error').textContent = errText(r.error);
  var t = $('steps');
  while (t.rows.length > 1) t.deleteRow(1);
  var waits = [];
  steps.forEach(function(s, i){
    var tr = SY.el('tr', 'item');
    tr.appendChild(SY.el('td', 'mono', s.number));
    tr.appendChild(SY.el('td', 'mono', s.step));
    tr.appendChild(SY.el('td', null, s.kind));
    var td = SY.el('td'); td.appendChild(badge(s.status)); tr.appendChild(td);
    tr.appendChild(SY.el('td', null, s.attempt));
    tr.appendChild(SY.el('td', 'mono', s.finished_at ? (s.finished_at - s.started_at) + ' ms' : '–'));
    tr.appendChild(SY.el('td', null, s.usage ? (s.usage.input_tokens || 0) + (s.usage.output_tokens || 0) : ''));
    tr.appendChild(SY.el('td', 'mono', cost(s.usage)));
    tr.appendChild(SY.el('td', 'err', s.error ? s.error.kind : ''));
    tr.addEventListener('click', function(){ show(i); });
    t.appendChild(tr);
    if (s.status === 'interrupted') waits.push(s);
  });
  var w = $('waiting'); w.textContent = '';
  if (r.status === 'interrupted') {
    w.appendChild(SY.el('p', null, 'The run waits for a decision' + (waits.length ? ' at step ' + waits.map(function(s){ return s.step; }).join(', ') : '') + '. '));
    SY.api('GET', '/v1/inbox?filter=' + encodeURIComponent('true')).then(function(v){
      ((v && v.groups) || []).forEach(function(g){ (g.items || []).forEach(function(it){
        if (it.run_id === id || it.root_run === id) { var p = SY.el('p'); p.appendChild(link('/inbox/' + encodeURIComponent(it.id), 'answer ' + it.id)); p.appendChild(document.createTextNode(' — ' + (it.question || ''))); w.appendChild(p); }
      }); });
    }, function(){});
  } else w.appendChild(SY.el('p', 'muted', 'nothing'));
  SY.api('GET', '/v1/decisions?run=' + encodeURIComponent(id)).then(function(v){
    var list = Array.isArray(v) ? v : (v && (v.decisions || v.rows)) || [];
    if (!list.length) return;
    w.appendChild(SY.el('h3', null, 'decisions'));
    list.forEach(function(d){ w.appendChild(SY.el('div', 'mono', SY.when(d.at) + ' ' + d.actor + ' (' + d.via + ') ' + JSON.stringify(d.decision) + (d.reason ? ' — ' + d.reason : ''))); });
  }, function(){});
}
var pending = false;
function refresh(){
  if (pending) return; pending = true;
  SY.api('GET', '/v1/runs/' + encodeURIComponent(id)).then(function(v){ pending = false; draw(v); }, function(e){ pending = false; $('run-error').textContent = e.message; });
}
refresh();
if (window.EventSource) {
  var es = new EventSource('/v1/runs/' + encodeURIComponent(id) + '/events');
  $('live').textContent = '(live)';
  es.onmessage = refresh;
  ['step', 'status', 'end', 'run'].forEach(function(k){ es.addEventListener(k, refresh); });
  es.onerror = function(){ if (!status || ended[status] || es.readyState === 2) { es.close(); $('live').textContent = ''; refresh(); } };
}
})();"#
);

const BATCH_BODY: &str = r#"<section><h1>batch <span id="batch-name" class="mono"></span> <span class="muted" id="live"></span></h1><div id="bar"></div><dl id="counts"></dl><p class="err" id="batch-error"></p></section>
<section><h2>Runs</h2><table id="runs"><tr><th>run</th><th>item</th><th>status</th><th>started</th><th>cost</th><th>error</th></tr></table></section>"#;

const BATCH_SCRIPT: &str = concat!(
    r#"(function(){"#,
    r#"
function link(path, text){ var a = SY.el('a', 'mono', text); a.href = path; return a; }
function badge(s){ return SY.el('span', 'status ' + String(s || '').replace(/[^a-z_]/g, ''), s || '?'); }
function cost(u){ return u && u.cost_usd !== undefined ? '$' + Number(u.cost_usd).toFixed(4) : ''; }
var $ = function(id){ return document.getElementById(id); };
var name = document.body.getAttribute('data-batch');
$('batch-name').textContent = name;
function draw(v){
  var c = (v && (v.counts || v.by_status)) || {};
  if (Array.isArray(c)) { var m = {}; c.forEach(function(x){ m[x.status] = x.count; }); c = m; }
  var total = 0; Object.keys(c).forEach(function(k){ total += Number(c[k]) || 0; });
  var bar = SY.el('div', 'counts');
  Object.keys(c).forEach(function(k){
    var n = Number(c[k]) || 0; if (!n) return;
    var cls = ['succeeded', 'failed', 'interrupted', 'cancelled'].indexOf(k) >= 0 ? k : 'other';
    var x = SY.el('div', 'c-' + cls); x.style.width = (100 * n / total) + '%'; x.title = k + ' ' + n; bar.appendChild(x);
  });
  var b = $('bar'); b.textContent = ''; b.appendChild(bar);
  var dl = $('counts'); dl.textContent = '';
  dl.appendChild(SY.el('dt', null, 'runs')); dl.appendChild(SY.el('dd', null, total));
  Object.keys(c).forEach(function(k){ dl.appendChild(SY.el('dt', null, k)); dl.appendChild(SY.el('dd', null, c[k])); });
}
function runs(v){
  var list = Array.isArray(v) ? v : (v && (v.runs || v.items)) || [];
  var t = $('runs'); while (t.rows.length > 1) t.deleteRow(1);
  list.forEach(function(r){
    var tr = SY.el('tr');
    var td = SY.el('td'); td.appendChild(link('/runs/' + encodeURIComponent(r.id), r.id)); tr.appendChild(td);
    tr.appendChild(SY.el('td', 'mono', r.item_id || ''));
    td = SY.el('td'); td.appendChild(badge(r.status)); tr.appendChild(td);
    tr.appendChild(SY.el('td', 'mono', SY.when(r.started_at)));
    tr.appendChild(SY.el('td', 'mono', cost(r.usage)));
    tr.appendChild(SY.el('td', 'err', r.error ? r.error.kind : ''));
    t.appendChild(tr);
  });
}
var pending = false;
function refresh(){
  if (pending) return; pending = true;
  SY.api('GET', '/v1/batches/' + encodeURIComponent(name)).then(function(v){ pending = false; $('batch-error').textContent = ''; draw(v); }, function(e){ pending = false; $('batch-error').textContent = e.message; });
  SY.api('GET', '/v1/runs?limit=500&batch=' + encodeURIComponent(name)).then(runs, function(){});
}
refresh();
if (window.EventSource) {
  var es = new EventSource('/v1/batches/' + encodeURIComponent(name) + '/events');
  $('live').textContent = '(live)';
  es.onmessage = refresh;
  es.addEventListener('counts', refresh);
  es.onerror = function(){ if (es.readyState === 2) { es.close(); $('live').textContent = ''; } };
}
})();"#
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_escaped_attributes() {
        let p = run_html("n", "r<1>");
        assert!(p.contains("data-run=\"r&lt;1&gt;\""));
        assert!(p.contains("<title>run r&lt;1&gt;</title>"));
        let b = batch_html("n", "b\"x");
        assert!(b.contains("data-batch=\"b&quot;x\""));
        for p in [home_html("n"), p, b] {
            assert!(!p.contains("innerHTML") && !p.contains("https:"));
        }
    }
}
