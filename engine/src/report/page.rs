//! The frame every page of `switchyard serve` shares (SPEC §15): the reports' look, one inline
//! style and one inline script, both carrying the response's nonce, and the Content Security
//! Policy that lets nothing else in. A page holds no data of the store: what it shows it
//! fetches from the server's own `/v1` API and puts into the document as text. The few values
//! a page is built with (a run id from its address) are HTML-escaped into `data-` attributes.

use std::fmt::Write as _;

use super::run::html;

/// The Content Security Policy of a page whose script and style carry `nonce`: no source but
/// the page's own (fetches and event streams to its origin), no frames, no plugins, forms
/// posted only to its origin.
pub fn csp(nonce: &str) -> String {
    format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; \
         frame-ancestors 'none'"
    )
}

/// The style of every page: the run and batch reports' look, and the parts the live pages add.
pub const STYLE: &str = r#"
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1a202c;background:#f7fafc}
header{padding:16px 24px;background:#fff;border-bottom:1px solid #e2e8f0}h1{font-size:18px;margin:0 0 6px}
nav a{margin-right:14px;color:#2b6cb0;text-decoration:none}nav a:hover{text-decoration:underline}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;margin-left:8px;vertical-align:middle}
.status.succeeded{background:#c6f6d5;color:#22543d}.status.failed{background:#fed7d7;color:#822727}
.status.interrupted,.status.running,.status.queued,.status.waiting{background:#fefcbf;color:#744210}.status.cancelled,.status.expired{background:#e2e8f0}
.status.decided{background:#c6f6d5;color:#22543d}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:8px 0 0}dt{color:#718096}dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;word-break:break-all;white-space:pre-wrap}
section{margin:16px 24px;background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:12px 16px}h2{font-size:15px;margin:0 0 10px}h3{font-size:13px;margin:10px 0 4px;color:#4a5568}
table{border-collapse:collapse;width:100%;font-size:13px}th{text-align:left;color:#718096;font-weight:500;border-bottom:1px solid #e2e8f0;padding:4px 6px}
td{padding:3px 6px;border-bottom:1px solid #f0f4f8}td.mono,.mono{font-family:ui-monospace,Menlo,Consolas,monospace}
tr.item{cursor:pointer}tr.item:hover{background:#ebf8ff}tr.sel{background:#bee3f8}tr.done td{color:#a0aec0;text-decoration:line-through}
pre{margin:0;padding:8px;background:#f7fafc;border:1px solid #e2e8f0;border-radius:4px;max-height:40vh;overflow:auto;font-size:12px;white-space:pre-wrap;word-break:break-word}
.counts{display:flex;height:18px;border-radius:3px;overflow:hidden;margin:8px 0;background:#edf2f7}.counts div{height:18px}
.c-succeeded{background:#48bb78}.c-failed{background:#f56565}.c-interrupted{background:#ecc94b}.c-cancelled{background:#a0aec0}.c-other{background:#4299e1}
.muted{color:#718096}.err{color:#c53030;white-space:pre-wrap}.ok{color:#276749}
.cols{display:grid;grid-template-columns:minmax(320px,2fr) 3fr;gap:0}.cols>section{min-width:0}
.group{margin:0 0 12px}.group h3{margin:0;color:#1a202c;font-size:14px}.group .q{white-space:pre-wrap}
input[type=text],input[type=number],input[type=password],textarea,select{font:13px ui-monospace,Menlo,Consolas,monospace;padding:4px 6px;border:1px solid #cbd5e0;border-radius:4px;width:100%}
textarea{min-height:60px}fieldset{border:1px solid #e2e8f0;border-radius:4px;margin:6px 0;padding:6px 10px}legend{color:#4a5568;font-size:12px}
label.field{display:block;margin:6px 0}label.field>span{display:block;font-size:12px;color:#4a5568}
button{font:13px system-ui,sans-serif;padding:4px 12px;margin:6px 6px 0 0;border:1px solid #a0aec0;border-radius:4px;background:#fff;cursor:pointer}
button.primary{background:#2b6cb0;border-color:#2b6cb0;color:#fff}button.danger{border-color:#c53030;color:#c53030}
.row{display:flex;gap:8px;align-items:center}.row>input{flex:1}
.diff .del{color:#822727;background:#fff5f5}.diff .add{color:#22543d;background:#f0fff4}
kbd{font:11px ui-monospace,monospace;border:1px solid #cbd5e0;border-bottom-width:2px;border-radius:3px;padding:0 4px;background:#fff}
"#;

/// A page: `title` (escaped here), `attrs` of `<body>` (name, value; values escaped here), the
/// `body` markup (already safe), and the page's `script`, run after the document is read.
pub fn page(nonce: &str, title: &str, attrs: &[(&str, &str)], body: &str, script: &str) -> String {
    let mut o = String::with_capacity(STYLE.len() + body.len() + script.len() + 512);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"referrer\" content=\"same-origin\"><link rel=\"icon\" href=\"data:,\">\
         <title>{}</title><style nonce=\"{nonce}\">{STYLE}</style></head><body",
        html(title)
    );
    for (k, v) in attrs {
        let _ = write!(o, " {k}=\"{}\"", html(v));
    }
    let _ = write!(
        o,
        ">\n<header><nav><a href=\"/\">runs</a><a href=\"/inbox\">inbox</a><a href=\"/login\">token</a></nav></header>\n\
         {body}\n<script nonce=\"{nonce}\">{COMMON}\n{script}</script>\n</body></html>\n"
    );
    o
}

/// Helpers every page's script uses: `el` (an element with text, never markup), `api` (a
/// same-origin JSON request; an answer that is not 2xx rejects with the text the server gave),
/// `when` (a time as text), `left` (time to an expiry).
const COMMON: &str = r#"
var SY = (function(){
  function el(tag, cls, text){
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function api(method, path, body){
    var opts = {method: method, credentials: 'same-origin', headers: {'accept': 'application/json'}};
    if (body !== undefined) { opts.headers['content-type'] = 'application/json'; opts.body = JSON.stringify(body); }
    return fetch(path, opts).then(function(res){
      return res.text().then(function(text){
        var v = null;
        try { v = text ? JSON.parse(text) : null; } catch (e) { v = null; }
        if (!res.ok) {
          var msg = v && (v.error && (v.error.message || v.error) || v.message) || text || res.statusText;
          if (typeof msg !== 'string') msg = JSON.stringify(msg);
          var err = new Error(res.status + ': ' + msg); err.status = res.status; err.body = v;
          throw err;
        }
        return v;
      });
    });
  }
  function ms(t){
    if (t === null || t === undefined || t === '') return null;
    if (typeof t === 'number') return t;
    var n = Date.parse(t); return isNaN(n) ? null : n;
  }
  function when(t){
    var m = ms(t); if (m === null) return '–';
    return new Date(m).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }
  function span(s){
    s = Math.max(0, Math.floor(s));
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
    if (d) return d + 'd ' + h + 'h';
    if (h) return h + 'h ' + m + 'm';
    if (m) return m + 'm ' + x + 's';
    return x + 's';
  }
  function left(t){
    var m = ms(t); if (m === null) return 'no expiry';
    var s = (m - Date.now()) / 1000;
    return s <= 0 ? 'expired' : 'expires in ' + span(s);
  }
  function age(t){
    var m = ms(t); if (m === null) return '–';
    return span((Date.now() - m) / 1000) + ' ago';
  }
  // Countdowns: every element with data-exp is told its time left, each second.
  setInterval(function(){
    document.querySelectorAll('[data-exp]').forEach(function(e){ e.textContent = left(Number(e.getAttribute('data-exp'))); });
  }, 1000);
  function countdown(t){
    var e = el('span', 'countdown', left(t)); var m = ms(t);
    if (m !== null) e.setAttribute('data-exp', String(m));
    return e;
  }
  function json(v){ return JSON.stringify(v, null, 2); }
  return {el: el, api: api, ms: ms, when: when, left: left, age: age, countdown: countdown, json: json};
})();
"#;

/// `/login`: the form that hands the server a token once; the server answers with a session
/// cookie and sends the browser on to `next` (a path of the server). `error` says why the
/// page is shown again.
pub fn login_html(nonce: &str, error: Option<&str>, next: &str) -> String {
    let err = error
        .map(|e| format!("<p class=\"err\" id=\"login-error\">{}</p>", html(e)))
        .unwrap_or_default();
    let body = format!(
        "<section><h2>Sign in with a token</h2>{err}\
         <form method=\"post\" action=\"/login\" id=\"login\">\
         <label class=\"field\"><span>token</span><input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" required></label>\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <button class=\"primary\" type=\"submit\">sign in</button></form>\
         <p class=\"muted\">The token is sent once; the server keeps a session (an HttpOnly cookie) for this browser.</p></section>",
        html(next)
    );
    page(
        nonce,
        "switchyard · sign in",
        &[],
        &body,
        "document.getElementById('token').focus();",
    )
}

/// A nonce for one response: 128 random bits, hex.
pub fn nonce() -> String {
    crate::record::inbox::random_bytes::<16>()
        .iter()
        .fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_and_title_are_escaped_and_script_carries_the_nonce() {
        let p = page("abc", "<t>", &[("data-run", "\"><script>x</script>")], "", "1;");
        assert!(p.contains("<title>&lt;t&gt;</title>"));
        assert!(p.contains("data-run=\"&quot;&gt;&lt;script&gt;x&lt;/script&gt;\""));
        assert!(p.contains("<script nonce=\"abc\">"));
        assert!(p.contains("<style nonce=\"abc\">"));
        assert!(!p.contains("http://") && !p.contains("https://"));
    }

    #[test]
    fn the_policy_allows_only_the_nonce_and_the_origin() {
        let c = csp("n1");
        assert!(c.starts_with("default-src 'none'"));
        assert!(c.contains("script-src 'nonce-n1'"));
        assert!(c.contains("connect-src 'self'"));
        assert!(!c.contains("unsafe"));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 32);
    }
}
