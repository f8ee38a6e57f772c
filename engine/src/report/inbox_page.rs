//! The inbox page of `switchyard serve` (`/inbox`, `/inbox/{id}`; SPEC §15): the questions runs
//! wait at, grouped by shape, each group with its count, its oldest item and a countdown to its
//! soonest expiry; a filter box whose CEL goes to `GET /v1/inbox?filter=` (its errors shown as
//! the server words them); an item with its question, its proposed calls and its run's input;
//! a form generated from the decision's JSON Schema, checked here before it is sent (the server
//! checks again); Approve, Edit (a call's arguments through a form from its tool's
//! `input_schema`, the change shown before and after) and Reject (with a reason); bulk approval
//! by the filter, previewed first (`POST /v1/inbox/bulk` with `preview`) and applied with the
//! preview's token only once its count is confirmed; keys `j`/`k` (move), `a` (approve), `e`
//! (edit), `r` (reject).
//!
//! Everything of the store reaches the document as text (`textContent`, form values): a
//! question that holds markup shows the markup.

use super::page::page;

/// Items of one group listed on the page; the rest are counted, and a filter narrows them.
pub const ITEMS_LISTED: usize = 200;

/// The inbox page; `focus` is the item (or a run waiting at one) `/inbox/{id}` opens.
pub fn inbox_html(nonce: &str, focus: Option<&str>) -> String {
    let attrs: Vec<(&str, &str)> = match focus {
        Some(id) => vec![("data-focus", id)],
        None => vec![],
    };
    let listed = ITEMS_LISTED.to_string();
    let mut attrs = attrs;
    attrs.push(("data-listed", &listed));
    page(nonce, "switchyard · inbox", &attrs, BODY, SCRIPT)
}

const BODY: &str = r#"<section><h2>Inbox</h2>
<div class="row"><input type="text" id="filter" placeholder="filter (CEL), e.g. calls.exists(c, c.name == &quot;refund&quot;) &amp;&amp; input.amount &lt; 100" autocomplete="off" spellcheck="false">
<button id="apply-filter" type="button">filter</button></div>
<div class="err" id="filter-error"></div>
<div class="row"><input type="text" id="bulk-decision" value="{&quot;approve&quot;: true}" autocomplete="off" spellcheck="false" title="the decision bulk approval gives each item">
<button id="bulk" type="button">bulk approve by filter…</button></div>
<div id="bulk-confirm"></div>
<p class="muted">Keys: <kbd>j</kbd>/<kbd>k</kbd> move, <kbd>a</kbd> approve, <kbd>e</kbd> edit, <kbd>r</kbd> reject.</p>
</section>
<div class="cols"><section><h2>Waiting <span class="muted" id="total"></span></h2><div id="groups"><p class="muted">loading…</p></div></section>
<section id="item"><h2>Item</h2><p class="muted">Select an item (<kbd>j</kbd>).</p></section></div>"#;

const SCRIPT: &str = r#"
(function(){
  var el = SY.el, api = SY.api;
  var listed = Number(document.body.getAttribute('data-listed')) || 200;
  var focus = document.body.getAttribute('data-focus');
  var rows = [];        // item rows in page order: {id, tr}
  var cur = -1;         // the selected row
  var item = null;      // the item shown
  var view = null;      // its controls: {form, editCall, editForm, reason}
  var $ = function(id){ return document.getElementById(id); };

  function filterText(){ return $('filter').value.trim(); }

  function load(){
    var f = filterText();
    var q = '?items=' + listed + (f ? '&filter=' + encodeURIComponent(f) : '');
    $('filter-error').textContent = '';
    return api('GET', '/v1/inbox' + q).then(render, function(e){
      $('filter-error').textContent = e.message;
    });
  }

  function render(v){
    var groups = (v && v.groups) || [];
    var box = $('groups'); box.textContent = '';
    var keep = rows[cur] && rows[cur].id;
    rows = []; cur = -1;
    var total = 0;
    groups.forEach(function(g){
      total += g.count || 0;
      var div = el('div', 'group');
      var h = el('h3', null, (g.flow || '') + ' · ' + (g.step || '') + ' ');
      h.appendChild(el('span', 'status waiting', (g.count || 0) + ' waiting'));
      div.appendChild(h);
      div.appendChild(el('div', 'q muted', g.question || ''));
      var meta = el('div', 'muted');
      meta.appendChild(document.createTextNode('oldest ' + SY.age(g.oldest) + ' · soonest: '));
      meta.appendChild(SY.countdown(g.soonest_expiry));
      div.appendChild(meta);
      var t = el('table'); var head = el('tr');
      ['item', 'batch', 'question', 'expiry'].forEach(function(c){ head.appendChild(el('th', null, c)); });
      t.appendChild(head);
      (g.items || []).slice(0, listed).forEach(function(it){
        var tr = el('tr', 'item');
        tr.setAttribute('data-id', it.id);
        tr.appendChild(el('td', 'mono', it.item || it.id));
        tr.appendChild(el('td', 'mono', it.batch || ''));
        var q = String(it.question || ''); if (q.length > 80) q = q.slice(0, 80) + '…';
        tr.appendChild(el('td', null, q));
        var td = el('td'); td.appendChild(SY.countdown(it.expires_at)); tr.appendChild(td);
        var k = rows.length;
        tr.addEventListener('click', function(){ select(k); });
        rows.push({id: it.id, tr: tr});
        t.appendChild(tr);
      });
      div.appendChild(t);
      var n = (g.items || []).length;
      if ((g.count || 0) > Math.min(n, listed)) {
        div.appendChild(el('p', 'muted', 'showing ' + Math.min(n, listed) + ' of ' + g.count + '; a filter narrows them'));
      }
      box.appendChild(div);
    });
    if (!groups.length) box.appendChild(el('p', 'muted', 'Nothing waits.'));
    $('total').textContent = '(' + total + ')';
    for (var i = 0; i < rows.length; i++) if (rows[i].id === keep) { mark(i); break; }
    // When the list was last drawn (ms since the page's start): what a reader waits for.
    document.body.setAttribute('data-rendered', String(Math.round(performance.now())));
  }

  function mark(k){
    if (rows[cur]) rows[cur].tr.classList.remove('sel');
    cur = k;
    if (rows[cur]) { rows[cur].tr.classList.add('sel'); rows[cur].tr.scrollIntoView({block: 'nearest'}); }
  }

  function select(k){
    if (k < 0 || k >= rows.length) return;
    mark(k);
    open(rows[k].id);
  }

  function open(id){
    return api('GET', '/v1/inbox/' + encodeURIComponent(id)).then(function(it){
      return inputOf(it).then(function(input){ show(it, input); });
    }, function(e){
      var s = $('item'); s.textContent = ''; s.appendChild(el('h2', null, 'Item')); s.appendChild(el('p', 'err', e.message));
    });
  }

  // The run's input: the item's own when the server sends it, else its root run's record.
  function inputOf(it){
    if (it && it.input !== undefined) return Promise.resolve(it.input);
    var run = it.root_run || it.run_id;
    if (!run) return Promise.resolve(null);
    return api('GET', '/v1/runs/' + encodeURIComponent(run)).then(function(v){
      var r = v && (v.run || v.record || v);
      return r ? r.input : null;
    }, function(){ return null; });
  }

  function show(it, input){
    item = it; view = {};
    var s = $('item'); s.textContent = '';
    document.body.setAttribute('data-shown', it.id);
    var h = el('h2', null, 'Item ' + it.id);
    h.appendChild(el('span', 'status ' + (it.state || 'waiting'), it.state || 'waiting'));
    s.appendChild(h);
    var dl = el('dl');
    function dd(k, v){ if (v === undefined || v === null || v === '') return; dl.appendChild(el('dt', null, k)); dl.appendChild(el('dd', null, v)); }
    dd('kind', it.kind); dd('flow', it.flow); dd('step', it.step); dd('run', it.run_id);
    dd('batch', it.batch); dd('batch item', it.item); dd('created', SY.when(it.created_at));
    dl.appendChild(el('dt', null, 'expiry')); var e = el('dd'); e.appendChild(SY.countdown(it.expires_at)); dl.appendChild(e);
    s.appendChild(dl);
    s.appendChild(el('h3', null, 'question'));
    s.appendChild(el('pre', 'question', it.question || ''));
    var calls = it.calls || [];
    if (calls.length) {
      s.appendChild(el('h3', null, 'proposed calls'));
      calls.forEach(function(c, i){
        s.appendChild(el('div', 'mono', (i + 1) + '. ' + (c.tool || c.name || '?')));
        s.appendChild(el('pre', 'call', SY.json(c.arguments)));
      });
    }
    s.appendChild(el('h3', null, 'the run\'s input'));
    s.appendChild(el('pre', 'input', SY.json(input)));
    var waiting = (it.state || 'waiting') === 'waiting';
    var out = el('div', null); out.id = 'outcome';
    if (!waiting) { s.appendChild(el('p', 'muted', 'This item is ' + it.state + '.')); return; }
    if (it.kind === 'approval') approvalControls(s, it); else formControls(s, it);
    s.appendChild(out);
  }

  function say(text, cls){ var o = $('outcome'); if (o) { o.textContent = ''; o.appendChild(el('p', cls, text)); } }

  // An interrupt (or any question that is not an approval): the form of its decision schema.
  function formControls(s, it){
    s.appendChild(el('h3', null, 'decision'));
    view.form = Form.build(it.schema === undefined ? true : it.schema, undefined, 'decision');
    s.appendChild(view.form.el);
    var b = el('button', 'primary', 'decide (a)'); b.type = 'button'; b.id = 'approve';
    b.addEventListener('click', approve);
    s.appendChild(b);
  }

  function approvalControls(s, it){
    var calls = it.calls || [];
    var b = el('button', 'primary', 'approve (a)'); b.type = 'button'; b.id = 'approve';
    b.addEventListener('click', approve);
    var e = el('button', null, 'edit (e)'); e.type = 'button'; e.id = 'edit';
    e.addEventListener('click', edit);
    var r = el('button', 'danger', 'reject (r)'); r.type = 'button'; r.id = 'reject';
    r.addEventListener('click', reject);
    s.appendChild(b); s.appendChild(e); s.appendChild(r);
    var box = el('div'); box.id = 'edit-box'; s.appendChild(box);
    var rb = el('div'); rb.id = 'reject-box'; s.appendChild(rb);
  }

  function send(decision, reason){
    var id = item.id;
    var body = {decision: decision};
    if (reason) body.reason = reason;
    say('sending…', 'muted');
    return api('POST', '/v1/inbox/' + encodeURIComponent(id) + '/decision', body).then(function(row){
      say('decided by ' + (row && row.actor || '?') + ' (' + (row && row.via || '?') + ')', 'ok');
      item.state = 'decided';
      rows.forEach(function(r){ if (r.id === id) r.tr.classList.add('done'); });
      ['approve', 'edit', 'reject'].forEach(function(b){ var x = $(b); if (x) x.disabled = true; });
      var h = document.querySelector('#item h2 .status'); if (h) { h.className = 'status decided'; h.textContent = 'decided'; }
    }, function(e){ say(e.message, 'err'); });
  }

  function each(calls, one){ return calls.length === 1 ? one(0) : calls.map(function(_, i){ return one(i); }); }

  function approve(){
    if (!item || item.state !== 'waiting') return;
    if (item.kind !== 'approval') {
      var v = view.form.read();
      if (v.errors.length) { say(v.errors.join('\n'), 'err'); return; }
      return send(v.value);
    }
    var calls = item.calls || [];
    if (view.editForm) {
      var r = view.editForm.read();
      if (r.errors.length) { say(r.errors.join('\n'), 'err'); return; }
      var k = view.editCall;
      return send(each(calls, function(i){ return i === k ? {edit: r.value} : {approve: true}; }));
    }
    return send(each(calls, function(){ return {approve: true}; }));
  }

  // Edit: a form from the call's tool's input schema, filled with the proposed arguments; the
  // change is shown before and after as it is made; approve sends it.
  function edit(){
    if (!item || item.kind !== 'approval' || item.state !== 'waiting') return;
    var calls = item.calls || [];
    var box = $('edit-box'); box.textContent = '';
    var pick = el('select'); pick.id = 'edit-call';
    calls.forEach(function(c, i){ var o = el('option', null, (i + 1) + '. ' + (c.tool || c.name || '?')); o.value = String(i); pick.appendChild(o); });
    if (calls.length > 1) box.appendChild(pick);
    var holder = el('div'); box.appendChild(holder);
    function build(k){
      holder.textContent = '';
      var c = calls[k] || {};
      view.editCall = k;
      view.editForm = Form.build(c.input_schema === undefined || c.input_schema === null ? true : c.input_schema, c.arguments, 'arguments of ' + (c.tool || c.name || '?'));
      holder.appendChild(view.editForm.el);
      holder.appendChild(el('h3', null, 'change'));
      var d = el('pre', 'diff'); d.id = 'diff'; holder.appendChild(d);
      var redraw = function(){ diff(d, c.arguments, view.editForm.read().value); };
      view.editForm.el.addEventListener('input', redraw);
      view.editForm.el.addEventListener('change', redraw);
      redraw();
      var first = holder.querySelector('input,textarea,select'); if (first) first.focus();
    }
    pick.addEventListener('change', function(){ build(Number(pick.value)); });
    build(0);
    var b = $('approve'); if (b) b.textContent = 'approve edited (a / ctrl+enter)';
  }

  function diff(pre, before, after){
    pre.textContent = '';
    var keys = {};
    var isObj = function(v){ return v && typeof v === 'object' && !Array.isArray(v); };
    if (isObj(before) && isObj(after)) {
      Object.keys(before).forEach(function(k){ keys[k] = 1; }); Object.keys(after).forEach(function(k){ keys[k] = 1; });
      var any = false;
      Object.keys(keys).forEach(function(k){
        var a = JSON.stringify(before[k]), b = JSON.stringify(after[k]);
        if (a === b) return;
        any = true;
        if (a !== undefined) pre.appendChild(el('div', 'del', '- ' + k + ': ' + a));
        if (b !== undefined) pre.appendChild(el('div', 'add', '+ ' + k + ': ' + b));
      });
      if (!any) pre.appendChild(el('div', 'muted', 'no change'));
      return;
    }
    var a = JSON.stringify(before), b = JSON.stringify(after);
    if (a === b) { pre.appendChild(el('div', 'muted', 'no change')); return; }
    pre.appendChild(el('div', 'del', '- ' + a)); pre.appendChild(el('div', 'add', '+ ' + b));
  }

  function reject(){
    if (!item || item.kind !== 'approval' || item.state !== 'waiting') return;
    var box = $('reject-box'); box.textContent = '';
    var l = el('label', 'field'); l.appendChild(el('span', null, 'reason (told to the model)'));
    var t = el('input'); t.type = 'text'; t.id = 'reason'; l.appendChild(t); box.appendChild(l);
    var b = el('button', 'danger', 'send rejection'); b.type = 'button'; b.id = 'send-reject';
    box.appendChild(b);
    var go = function(){
      var why = t.value.trim();
      if (!why) { say('give a reason', 'err'); return; }
      send(each(item.calls || [], function(){ return {reject: why}; }), why);
    };
    b.addEventListener('click', go);
    t.addEventListener('keydown', function(ev){ if (ev.key === 'Enter') { ev.preventDefault(); go(); } });
    t.focus();
  }

  // Bulk approval: preview by the filter, confirm the count, apply with the preview's token.
  function bulk(){
    var box = $('bulk-confirm'); box.textContent = '';
    var decision;
    try { decision = JSON.parse($('bulk-decision').value); } catch (e) { box.appendChild(el('p', 'err', 'the bulk decision is not JSON: ' + e.message)); return; }
    var f = filterText();
    if (!f) { box.appendChild(el('p', 'err', 'bulk approval needs a filter')); return; }
    api('POST', '/v1/inbox/bulk', {filter: f, decision: decision, preview: true}).then(function(p){
      box.textContent = '';
      var msg = el('p', null, (p.matched || 0) + ' item(s) match, in ' + (p.shapes || 0) + ' question shape(s).');
      msg.id = 'bulk-count';
      box.appendChild(msg);
      if (p.unfit && p.unfit.length) box.appendChild(el('p', 'err', p.unfit.length + ' of them do not fit this decision\'s schema and would be refused.'));
      if (p.filter_failed && p.filter_failed.length) box.appendChild(el('p', 'err', 'the filter could not be read on ' + p.filter_failed.length + ' item(s): ' + p.filter_failed[0].reason));
      (p.samples || []).slice(0, 5).forEach(function(s){
        box.appendChild(el('div', 'muted mono', typeof s === 'string' ? s : ((s.id || '') + ' ' + (s.question || ''))));
      });
      if (!p.matched) return;
      var ok = el('button', 'primary', 'approve these ' + p.matched); ok.type = 'button'; ok.id = 'bulk-apply';
      var no = el('button', null, 'cancel'); no.type = 'button';
      box.appendChild(ok); box.appendChild(no);
      no.addEventListener('click', function(){ box.textContent = ''; });
      ok.addEventListener('click', function(){
        ok.disabled = true;
        api('POST', '/v1/inbox/bulk', {token: p.token, decision: decision}).then(function(r){
          box.textContent = '';
          var done = el('p', 'ok', 'applied ' + (r.applied || []).length + ', refused ' + (r.refused || []).length);
          done.id = 'bulk-done'; box.appendChild(done);
          (r.refused || []).forEach(function(x){ box.appendChild(el('div', 'err', (x.id || '') + ': ' + (x.reason || ''))); });
          load();
        }, function(e){ box.textContent = ''; box.appendChild(el('p', 'err', e.message)); ok.disabled = false; });
      });
    }, function(e){ box.appendChild(el('p', 'err', e.message)); });
  }

  // A form from a JSON Schema: objects, booleans, strings, numbers, integers, enums and arrays
  // of scalars get their own inputs; anything else is JSON text. read() gives the value and
  // what is wrong with it (by JSON pointer).
  var Form = (function(){
    function type(s){
      if (!s || typeof s !== 'object') return 'any';
      if (Array.isArray(s.enum)) return 'enum';
      var t = Array.isArray(s.type) ? s.type.filter(function(x){ return x !== 'null'; })[0] : s.type;
      if (!t && s.properties) return 'object';
      if (t === 'object' && !s.properties) return 'any';
      if (t === 'array') {
        var it = type(s.items);
        return ['string', 'number', 'integer', 'boolean', 'enum'].indexOf(it) >= 0 ? 'array' : 'any';
      }
      return ['object', 'boolean', 'string', 'number', 'integer'].indexOf(t) >= 0 ? t : 'any';
    }
    function scalar(s, text, ptr, errs){
      var t = type(s);
      if (t === 'enum') {
        var k = Number(text); var v = s.enum[k];
        return v;
      }
      if (t === 'number' || t === 'integer') {
        if (String(text).trim() === '') { errs.push(ptr + ': a number is required'); return undefined; }
        var n = Number(text);
        if (!isFinite(n)) { errs.push(ptr + ': not a number'); return undefined; }
        if (t === 'integer' && Math.floor(n) !== n) errs.push(ptr + ': must be an integer');
        if (typeof s.minimum === 'number' && n < s.minimum) errs.push(ptr + ': must be at least ' + s.minimum);
        if (typeof s.maximum === 'number' && n > s.maximum) errs.push(ptr + ': must be at most ' + s.maximum);
        return n;
      }
      if (t === 'boolean') return text === true || text === 'true';
      var str = String(text);
      if (typeof s.minLength === 'number' && str.length < s.minLength) errs.push(ptr + ': must be at least ' + s.minLength + ' characters');
      if (typeof s.maxLength === 'number' && str.length > s.maxLength) errs.push(ptr + ': must be at most ' + s.maxLength + ' characters');
      if (typeof s.pattern === 'string') { try { if (!new RegExp(s.pattern, 'u').test(str)) errs.push(ptr + ': must match ' + s.pattern); } catch (e) {} }
      return str;
    }
    function node(s, value, label, ptr){
      var t = type(s);
      var wrap = el('label', 'field');
      if (t !== 'object') wrap.appendChild(el('span', null, label + (s && s.description ? ' — ' + s.description : '')));
      var input, read;
      if (t === 'object') {
        var fs = el('fieldset'); fs.appendChild(el('legend', null, label));
        var props = s.properties || {}, req = s.required || [];
        var parts = Object.keys(props).map(function(k){
          var sub = node(props[k], value && typeof value === 'object' ? value[k] : undefined, k + (req.indexOf(k) >= 0 ? ' *' : ''), ptr + '/' + k);
          fs.appendChild(sub.el);
          return {k: k, sub: sub, req: req.indexOf(k) >= 0};
        });
        // Properties the schema does not name but the value holds are kept as they are.
        var extra = {};
        if (value && typeof value === 'object' && !Array.isArray(value)) Object.keys(value).forEach(function(k){ if (!(k in props)) extra[k] = value[k]; });
        return {el: fs, read: function(errs){
          var out = {};
          Object.keys(extra).forEach(function(k){ out[k] = extra[k]; });
          parts.forEach(function(p){
            var v = p.sub.read(errs, p.req);
            if (v !== undefined) out[p.k] = v;
            else if (p.req) errs.push(ptr + '/' + p.k + ': required');
          });
          return out;
        }};
      } else if (t === 'boolean') {
        input = el('input'); input.type = 'checkbox'; input.checked = value === true;
        read = function(){ return input.checked; };
      } else if (t === 'enum') {
        input = el('select');
        if (!(s.enum.some(function(v){ return JSON.stringify(v) === JSON.stringify(value); }))) input.appendChild(el('option', null, '—')).value = '';
        s.enum.forEach(function(v, i){ var o = el('option', null, typeof v === 'string' ? v : JSON.stringify(v)); o.value = String(i); if (JSON.stringify(v) === JSON.stringify(value)) o.selected = true; input.appendChild(o); });
        read = function(errs, req){ if (input.value === '') return undefined; return s.enum[Number(input.value)]; };
      } else if (t === 'string' || t === 'number' || t === 'integer') {
        input = el('input'); input.type = t === 'string' ? 'text' : 'number';
        if (t !== 'string') input.step = t === 'integer' ? '1' : 'any';
        if (value !== undefined && value !== null) input.value = String(value);
        read = function(errs, req){
          if (input.value === '' && !req && t !== 'string') return undefined;
          if (input.value === '' && !req && value === undefined) return undefined;
          return scalar(s, input.value, ptr || '/', errs);
        };
      } else if (t === 'array') {
        input = el('textarea'); input.placeholder = 'one item a line';
        if (Array.isArray(value)) input.value = value.map(function(v){ return typeof v === 'string' ? v : JSON.stringify(v); }).join('\n');
        read = function(errs){
          var lines = input.value.split('\n').filter(function(l){ return l.trim() !== ''; });
          var it = s.items || {};
          var out = lines.map(function(l, i){
            if (type(it) === 'enum') {
              var m = it.enum.filter(function(v){ return (typeof v === 'string' ? v : JSON.stringify(v)) === l.trim(); });
              if (!m.length) errs.push(ptr + '/' + i + ': must be one of ' + JSON.stringify(it.enum));
              return m[0];
            }
            if (type(it) === 'boolean') { if (l.trim() !== 'true' && l.trim() !== 'false') errs.push(ptr + '/' + i + ': must be true or false'); return l.trim() === 'true'; }
            return scalar(it, type(it) === 'string' ? l : l.trim(), ptr + '/' + i, errs);
          });
          if (typeof s.minItems === 'number' && out.length < s.minItems) errs.push(ptr + ': at least ' + s.minItems + ' items');
          if (typeof s.maxItems === 'number' && out.length > s.maxItems) errs.push(ptr + ': at most ' + s.maxItems + ' items');
          return out;
        };
      } else {
        input = el('textarea'); input.placeholder = 'JSON';
        if (value !== undefined) input.value = JSON.stringify(value, null, 2);
        read = function(errs, req){
          if (input.value.trim() === '') return req ? undefined : undefined;
          try { return JSON.parse(input.value); } catch (e) { errs.push((ptr || '/') + ': not JSON (' + e.message + ')'); return undefined; }
        };
      }
      input.setAttribute('data-pointer', ptr || '/');
      wrap.appendChild(input);
      return {el: wrap, read: read};
    }
    function build(schema, value, label){
      var root = node(schema, value, label, '');
      return {el: root.el, read: function(){ var errs = []; var v = root.read(errs, true); return {value: v, errors: errs}; }};
    }
    return {build: build};
  })();

  document.addEventListener('keydown', function(ev){
    var t = ev.target && ev.target.tagName;
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey) && view && view.editForm) { ev.preventDefault(); approve(); return; }
    if (t === 'INPUT' || t === 'TEXTAREA' || t === 'SELECT' || ev.ctrlKey || ev.metaKey || ev.altKey) {
      if (ev.key === 'Escape' && ev.target.blur) ev.target.blur();
      return;
    }
    if (ev.key === 'j') { ev.preventDefault(); select(Math.min(cur + 1, rows.length - 1)); }
    else if (ev.key === 'k') { ev.preventDefault(); select(Math.max(cur - 1, 0)); }
    else if (ev.key === 'a') { ev.preventDefault(); approve(); }
    else if (ev.key === 'e') { ev.preventDefault(); edit(); }
    else if (ev.key === 'r') { ev.preventDefault(); reject(); }
  });
  $('apply-filter').addEventListener('click', load);
  $('filter').addEventListener('keydown', function(ev){ if (ev.key === 'Enter') { ev.preventDefault(); load(); } });
  $('bulk').addEventListener('click', bulk);
  load().then(function(){
    if (!focus) return;
    for (var i = 0; i < rows.length; i++) if (rows[i].id === focus) { select(i); return; }
    open(focus);
  });
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_focus_is_an_escaped_attribute_and_nothing_is_fetched_from_elsewhere() {
        let p = inbox_html("n", Some("q1\"><img src=x>"));
        assert!(p.contains("data-focus=\"q1&quot;&gt;&lt;img src=x&gt;\""));
        assert!(!p.contains("http:") && !p.contains("https:") && !p.contains("//cdn"));
        assert!(!p.contains("innerHTML"));
        assert!(!p.contains(" onclick="));
    }
}
