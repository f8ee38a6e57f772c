//! Data mappings (SPEC §5.2–5.4): building an agent's input document, bringing its result back
//! into the payload, and `set`. Pure functions over `serde_json::Value`.
//!
//! This module owns sources ([`eval_source`]), input forms ([`build_input`], [`filter_paths`]),
//! output forms ([`apply_output`], [`deep_merge`]) and `set` ([`apply_set`]), with the
//! [`Change`]s they make and the [`Violation`]s an upstream allowlist finds. It knows nothing of
//! steps, agents or records beyond those two types, and does no I/O.
//!
//! **All or nothing.** A mapping that fails leaves the payload as it was: every source is
//! computed before anything is written (so sources, and expressions, see the payload as it was
//! before the mapping: `set: {$.a: =payload.b, $.b: =payload.a}` swaps), every write is
//! checked, and when one write of several fails the earlier ones are undone. Nothing is copied
//! to make that possible: a write remembers only what it replaced or created.
//!
//! **Errors** are of kind `mapping` (a path that matched nothing, a missing scope, a write
//! through a value of the wrong type), or `expression` from an `=expr` source. `details` names
//! the path, and the destination when there is one.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::expr::eval::{self, Vars};
use crate::expr::path::{Path, Seg, format_path, nearest_key};
use crate::plan::{InputPlan, OutputPlan, SourcePlan};
use crate::record::StepError;
pub use crate::record::{Change, Violation};

/// The reason recorded for what an output allowlist drops.
pub const NOT_ALLOWED: &str = "not in the output allowlist";

/// The value of a source over `doc` (SPEC §5.4). A singular path that matches nothing is an
/// error of kind `mapping` naming the path and the nearest existing key ("`$.ticket.bdy`
/// matched nothing; nearest: `$.ticket.body`"); a non-singular path gives the array of its
/// matches, possibly empty. `WithDefault` gives its default when nothing matches (for a
/// non-singular path: no match at all). `=expr` is evaluated with `vars`.
pub fn eval_source(src: &SourcePlan, doc: &Value, vars: &Vars) -> Result<Value, StepError> {
    match src {
        SourcePlan::Path(p) => read(p, doc),
        SourcePlan::Expr(e) => eval::eval(e, vars),
        SourcePlan::WithDefault(p, default) => Ok(if p.is_singular() {
            p.get(doc).cloned().unwrap_or_else(|| default.clone())
        } else {
            let found = p.query(doc);
            if found.is_empty() {
                default.clone()
            } else {
                Value::Array(found.into_iter().cloned().collect())
            }
        }),
        SourcePlan::Literal(v) => Ok(v.clone()),
    }
}

/// [`eval_source`], without copying what a singular path matches: the value in `doc`, borrowed.
pub fn eval_source_ref<'d>(
    src: &SourcePlan,
    doc: &'d Value,
    vars: &Vars,
) -> Result<std::borrow::Cow<'d, Value>, StepError> {
    match src {
        SourcePlan::Path(p) if p.is_singular() => p
            .get(doc)
            .map(std::borrow::Cow::Borrowed)
            .ok_or_else(|| no_match(p, doc)),
        _ => eval_source(src, doc, vars).map(std::borrow::Cow::Owned),
    }
}

/// The agent's input document (SPEC §5.2) from the payload, or from its `scope` subtree:
/// `All` copies it, `Paths` filters it ([`filter_paths`]), `Map` builds a new document `{}`
/// where each destination gets its source (paths over the payload or scope; expressions see
/// `vars`, with `payload` set to `payload`). A scope that does not exist is kind `mapping`.
pub fn build_input(
    input: &InputPlan,
    scope: Option<&Path>,
    payload: &Value,
    vars: &Vars,
) -> Result<Value, StepError> {
    build_input_ref(input, scope, payload, vars).map(std::borrow::Cow::into_owned)
}

/// [`build_input`], without copying the payload (or scope) that `All` passes whole: the
/// document in `payload`, borrowed.
pub fn build_input_ref<'p>(
    input: &InputPlan,
    scope: Option<&Path>,
    payload: &'p Value,
    vars: &Vars,
) -> Result<std::borrow::Cow<'p, Value>, StepError> {
    use std::borrow::Cow;
    let root = subtree(scope, payload)?;
    match input {
        InputPlan::All => Ok(Cow::Borrowed(root)),
        InputPlan::Paths(paths) => filter_paths(root, paths)
            .map(Cow::Owned)
            .map_err(|e| with_scope(e, scope)),
        InputPlan::Map(entries) => {
            let vars = Vars {
                payload: Some(payload),
                ..*vars
            };
            let mut doc = Value::Object(Map::new());
            for (dest, src) in entries {
                let value =
                    eval_source(src, root, &vars).map_err(|e| with_scope(for_dest(e, dest), scope))?;
                write(&mut doc, dest, value, dest.text())?;
            }
            Ok(Cow::Owned(doc))
        }
    }
}

/// Brings a result back into the payload (SPEC §5.3), under `scope` when there is one, and
/// returns what an allowlist dropped:
///
/// - `None` writes nothing;
/// - `All` deep-merges the result ([`deep_merge`]);
/// - `Paths` deep-merges only the parts of the result at those paths (a path the result lacks
///   merges nothing); everything else the result had is dropped, one [`Violation`] per
///   topmost dropped value, with the reason [`NOT_ALLOWED`];
/// - `Map` writes each destination's source: a path over the result, or an expression that
///   sees `vars` with `result` set to `result` and `payload` to the payload before the writes.
///
/// Each write is recorded in `changes`. On error nothing is written or recorded.
pub fn apply_output(
    output: &OutputPlan,
    scope: Option<&Path>,
    payload: &mut Value,
    shared: &Arc<Value>,
    vars: &Vars,
    changes: &mut Vec<Change>,
) -> Result<Vec<Violation>, StepError> {
    let result: &Value = shared;
    match output {
        OutputPlan::None => Ok(Vec::new()),
        OutputPlan::All => {
            let target = subtree_mut(scope, payload)?;
            deep_merge(target, result.clone());
            changes.push(Change {
                path: scope.map_or_else(|| "$".to_owned(), |s| s.text().to_owned()),
                value: shared.clone(),
            });
            Ok(Vec::new())
        }
        OutputPlan::Paths(paths) => {
            let allowed = paths
                .iter()
                .map(|p| p.segments().ok_or_else(|| not_singular(p)))
                .collect::<Result<Vec<_>, _>>()?;
            let parts: Vec<(&Path, &Value)> =
                paths.iter().filter_map(|p| Some((p, p.get(result)?))).collect();
            let target = subtree_mut(scope, payload)?;
            for (p, _) in &parts {
                locate(target, p, &dest_text(scope, p))?;
            }
            for (p, part) in parts {
                let shown = dest_text(scope, p);
                merge_at(target, p, part.clone(), &shown)?;
                changes.push(Change {
                    path: shown,
                    value: Arc::new(part.clone()),
                });
            }
            let mut violations = Vec::new();
            dropped(result, &mut Vec::new(), &allowed, &mut violations);
            Ok(violations)
        }
        OutputPlan::Map(entries) => {
            subtree(scope, payload)?;
            let vars = Vars {
                payload: Some(&*payload),
                result: Some(result),
                ..*vars
            };
            if let [(dest, src)] = entries.as_slice() {
                if let Some(items) = appended(scope, dest, src, &vars) {
                    append_in_place(payload, scope, dest, items, dest_text(scope, dest), changes)?;
                    return Ok(Vec::new());
                }
                let value = eval_source(src, result, &vars).map_err(|e| for_dest(e, dest))?;
                let target = subtree_mut(scope, payload)?;
                let whole = matches!(src, SourcePlan::Path(p) if p.segments().is_some_and(<[_]>::is_empty));
                write_one(
                    target,
                    dest,
                    value,
                    whole.then_some(shared),
                    dest_text(scope, dest),
                    changes,
                )?;
                return Ok(Vec::new());
            }
            let values = entries
                .iter()
                .map(|(dest, src)| {
                    if let Some(items) = appended_alone(scope, dest, src, entries, &vars) {
                        return Ok(Write::Append(items));
                    }
                    eval_source(src, result, &vars)
                        .map(Write::Value)
                        .map_err(|e| for_dest(e, dest))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let target = subtree_mut(scope, payload)?;
            write_all(target, entries.iter().map(|(d, _)| d).zip(values), scope, changes)?;
            Ok(Vec::new())
        }
    }
}

/// `set` (SPEC §3.5): each destination gets its source, computed over the payload as it was
/// before any of the writes (expressions see `vars` with `payload` set to it).
pub fn apply_set(
    set: &[(Path, SourcePlan)],
    payload: &mut Value,
    vars: &Vars,
    changes: &mut Vec<Change>,
) -> Result<(), StepError> {
    let vars = Vars {
        payload: Some(&*payload),
        ..*vars
    };
    if let [(dest, src)] = set {
        if let Some(items) = appended(None, dest, src, &vars) {
            return append_in_place(payload, None, dest, items, dest.text().to_owned(), changes);
        }
        let value = eval_source(src, payload, &vars).map_err(|e| for_dest(e, dest))?;
        return write_one(payload, dest, value, None, dest.text().to_owned(), changes);
    }
    let values = set
        .iter()
        .map(|(dest, src)| {
            if let Some(items) = appended_alone(None, dest, src, set, &vars) {
                return Ok(Write::Append(items));
            }
            eval_source(src, payload, &vars)
                .map(Write::Value)
                .map_err(|e| for_dest(e, dest))
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_all(payload, set.iter().map(|(d, _)| d).zip(values), None, changes)
}

/// Deep merge (SPEC §5.3): objects merge recursively, key by key (new keys go last); arrays
/// and scalars replace; nothing is deleted.
pub fn deep_merge(target: &mut Value, src: Value) {
    match (target, src) {
        (Value::Object(t), Value::Object(s)) => {
            for (k, v) in s {
                match t.get_mut(&k) {
                    Some(existing) => deep_merge(existing, v),
                    None => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (t, s) => *t = s,
    }
}

/// The downstream filter (SPEC §5.2): a document with only the values at `paths`, each at the
/// same place as in `doc`. Array positions are kept: filtering `$.items[2]` gives
/// `{"items": [null, null, <the third item>]}`. A path that matches nothing is kind `mapping`;
/// paths must be singular. No paths give `{}`.
pub fn filter_paths(doc: &Value, paths: &[Path]) -> Result<Value, StepError> {
    if paths.is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let mut out = Value::Null;
    for p in paths {
        let segs = p.segments().ok_or_else(|| not_singular(p))?;
        if !copy_at(doc, segs, &mut out) {
            return Err(no_match(p, doc));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Reading

fn read(p: &Path, doc: &Value) -> Result<Value, StepError> {
    if p.is_singular() {
        p.get(doc).cloned().ok_or_else(|| no_match(p, doc))
    } else {
        Ok(Value::Array(p.query(doc).into_iter().cloned().collect()))
    }
}

/// "`$.ticket.bdy` matched nothing; nearest: `$.ticket.body`", or, without a close key, what
/// stopped the path ("`$.ticket` has no key `bdy`").
fn no_match(p: &Path, doc: &Value) -> StepError {
    let mut message = format!("`{}` matched nothing", p.text());
    let mut details = json!({ "path": p.text() });
    if let Some(near) = nearest_key(doc, p) {
        message.push_str(&format!("; nearest: `{near}`"));
        details["nearest"] = Value::String(near);
    } else if let Some(why) = p.segments().and_then(|segs| why_missing(doc, segs)) {
        message.push_str(&format!(" ({why})"));
    }
    StepError::mapping(message).with_details(details)
}

/// Where a singular path stops matching in `doc`.
fn why_missing(doc: &Value, segs: &[Seg]) -> Option<String> {
    let mut cur = doc;
    for (i, seg) in segs.iter().enumerate() {
        let at = format_path(&segs[..i]);
        cur = match (seg, cur) {
            (Seg::Key(k), Value::Object(m)) => match m.get(k) {
                Some(v) => v,
                None => return Some(format!("`{at}` has no key `{k}`")),
            },
            (Seg::Index(n), Value::Array(a)) => match index(*n, a.len()) {
                Some(i) => &a[i],
                None => {
                    return Some(format!(
                        "index {n} is out of range for `{at}` (length {})",
                        a.len()
                    ));
                }
            },
            (_, other) => return Some(format!("`{at}` is {}", kind(other))),
        };
    }
    None
}

/// The scope subtree, or the payload.
fn subtree<'v>(scope: Option<&Path>, payload: &'v Value) -> Result<&'v Value, StepError> {
    let Some(s) = scope else { return Ok(payload) };
    let segs = s.segments().ok_or_else(|| not_singular(s))?;
    walk(payload, segs).ok_or_else(|| scope_missing(s, payload))
}

fn subtree_mut<'v>(scope: Option<&Path>, payload: &'v mut Value) -> Result<&'v mut Value, StepError> {
    let Some(s) = scope else { return Ok(payload) };
    let segs = s.segments().ok_or_else(|| not_singular(s))?;
    if walk(payload, segs).is_none() {
        return Err(scope_missing(s, payload));
    }
    walk_mut(payload, segs).ok_or_else(|| scope_missing(s, &Value::Null))
}

fn scope_missing(s: &Path, payload: &Value) -> StepError {
    let inner = no_match(s, payload);
    StepError::mapping(format!("scope {}", inner.message)).with_details(inner.details.unwrap_or(Value::Null))
}

fn walk<'v>(mut v: &'v Value, segs: &[Seg]) -> Option<&'v Value> {
    for seg in segs {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get(k)?,
            (Seg::Index(n), Value::Array(a)) => a.get(index(*n, a.len())?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn walk_mut<'v>(mut v: &'v mut Value, segs: &[Seg]) -> Option<&'v mut Value> {
    for seg in segs {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (Seg::Index(n), Value::Array(a)) => {
                let i = index(*n, a.len())?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(v)
}

/// The position of index `n` in an array of `len`; negative counts from the end.
fn index(n: i64, len: usize) -> Option<usize> {
    crate::expr::path::resolve_index(n, len)
}

/// Copies the value at `segs` of `src` to the same place in `out`, creating containers (and
/// `null` array elements before an index) on the way. `false` when `src` has nothing there.
fn copy_at(src: &Value, segs: &[Seg], out: &mut Value) -> bool {
    let Some((seg, rest)) = segs.split_first() else {
        *out = src.clone();
        return true;
    };
    match (seg, src) {
        (Seg::Key(k), Value::Object(m)) => {
            let Some(child) = m.get(k) else { return false };
            if !out.is_object() {
                *out = Value::Object(Map::new());
            }
            let Value::Object(o) = out else { return false };
            let slot = o.entry(k.clone()).or_insert(Value::Null);
            copy_at(child, rest, slot)
        }
        (Seg::Index(n), Value::Array(a)) => {
            let Some(i) = index(*n, a.len()) else { return false };
            if !out.is_array() {
                *out = Value::Array(Vec::new());
            }
            let Value::Array(o) = out else { return false };
            if o.len() <= i {
                o.resize(i + 1, Value::Null);
            }
            copy_at(&a[i], rest, &mut o[i])
        }
        _ => false,
    }
}

/// Collects the topmost values of `v` (at `at` in the result) under no allowed path.
fn dropped(v: &Value, at: &mut Vec<Seg>, allowed: &[&[Seg]], out: &mut Vec<Violation>) {
    let depth = at.len();
    if allowed.iter().any(|a| a.len() == depth) {
        return; // allowed whole
    }
    if allowed.is_empty() {
        out.push(Violation {
            path: format_path(at),
            reason: NOT_ALLOWED.to_owned(),
        });
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let under: Vec<&[Seg]> = allowed
                    .iter()
                    .copied()
                    .filter(|a| matches!(&a[depth], Seg::Key(x) if x == k))
                    .collect();
                at.push(Seg::Key(k.clone()));
                dropped(child, at, &under, out);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let under: Vec<&[Seg]> = allowed
                    .iter()
                    .copied()
                    .filter(|a| matches!(&a[depth], Seg::Index(n) if index(*n, items.len()) == Some(i)))
                    .collect();
                at.push(Seg::Index(i64::try_from(i).unwrap_or(i64::MAX)));
                dropped(child, at, &under, out);
                at.pop();
            }
        }
        // An allowed path goes deeper than this value: the value itself is not allowed.
        _ => out.push(Violation {
            path: format_path(at),
            reason: NOT_ALLOWED.to_owned(),
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Where a write lands in the document as it is now.
enum Point {
    /// The destination exists: it is replaced (or merged into) in place.
    Exists,
    /// The value at this many segments is `null` and becomes a container.
    Null(usize),
    /// The entry at this many segments is created (a new key, or an appended element).
    Missing(usize),
}

/// How to take one write back.
enum Undo {
    /// Put this value back at the first `n` segments.
    Put(usize, Value),
    /// Remove the entry the write created below the first `n` segments.
    Remove(usize),
}

/// Checks that a write to `p` can be made, and where it lands. `shown` names the destination
/// in messages.
fn locate(root: &Value, p: &Path, shown: &str) -> Result<Point, StepError> {
    let segs = p.segments().ok_or_else(|| not_singular(p))?;
    let blocked = |i: usize, why: String| {
        StepError::mapping(format!("cannot write `{shown}`: {why}"))
            .with_details(json!({ "destination": shown, "at": format_path(&segs[..i]) }))
    };
    let mut cur = root;
    let mut point = Point::Exists;
    for (i, seg) in segs.iter().enumerate() {
        cur = match (seg, cur) {
            (_, Value::Null) => {
                point = Point::Null(i);
                break;
            }
            (Seg::Key(k), Value::Object(m)) => match m.get(k) {
                Some(v) => v,
                None => {
                    point = Point::Missing(i);
                    break;
                }
            },
            (Seg::Index(n), Value::Array(a)) => match index(*n, a.len()) {
                Some(j) => &a[j],
                None if usize::try_from(*n).is_ok_and(|n| n == a.len()) => {
                    point = Point::Missing(i);
                    break;
                }
                None => {
                    let why = format!(
                        "index {n} is out of range for `{}` (length {})",
                        format_path(&segs[..i]),
                        a.len()
                    );
                    return Err(blocked(i, why));
                }
            },
            (seg, other) => {
                let want = if matches!(seg, Seg::Key(_)) {
                    "an object"
                } else {
                    "an array"
                };
                let why = format!("`{}` is {}, not {want}", format_path(&segs[..i]), kind(other));
                return Err(blocked(i, why));
            }
        };
    }
    // Below a created container, only names and index 0 (the first element) can be written.
    let created = match point {
        Point::Exists => segs.len(),
        Point::Null(i) => i,
        Point::Missing(i) => i + 1,
    };
    for (i, seg) in segs.iter().enumerate().skip(created) {
        if let Seg::Index(n) = seg
            && *n != 0
        {
            let why = format!(
                "index {n} is out of range for `{}` (length 0)",
                format_path(&segs[..i])
            );
            return Err(blocked(i, why));
        }
    }
    Ok(point)
}

/// Writes `value` at `p` (creating what is missing); returns how to undo it.
/// Makes again, in order, writes recorded before (`Change::path` is the full destination):
/// how a resumed run replays a finished step without evaluating it again.
pub fn replay_changes(root: &mut Value, changes: &[Change]) -> Result<(), StepError> {
    for c in changes {
        let p = crate::expr::path::parse(&c.path).map_err(|e| {
            StepError::new(
                crate::record::ErrorKind::Mapping,
                format!("the recorded destination `{}` does not parse: {e}", c.path),
            )
        })?;
        write(root, &p, Value::clone(&c.value), &c.path)?;
    }
    Ok(())
}

fn write(root: &mut Value, p: &Path, value: Value, shown: &str) -> Result<Undo, StepError> {
    let segs = p.segments().ok_or_else(|| not_singular(p))?;
    // The common case first: the destination exists and is replaced in place.
    if let Some(slot) = walk_mut(root, segs) {
        return Ok(Undo::Put(segs.len(), std::mem::replace(slot, value)));
    }
    let undo = match locate(root, p, shown)? {
        Point::Exists => return Err(StepError::mapping(format!("cannot write `{shown}`"))),
        Point::Null(i) => Undo::Put(i, Value::Null),
        Point::Missing(i) => {
            // The next most common case: a new key in an object that exists.
            if i + 1 == segs.len()
                && let Seg::Key(k) = &segs[i]
                && let Some(Value::Object(m)) = walk_mut(root, &segs[..i])
            {
                m.insert(k.clone(), value);
                return Ok(Undo::Remove(i));
            }
            Undo::Remove(i)
        }
    };
    p.set(root, value)
        .map_err(|e| StepError::mapping(e.to_string()))?;
    Ok(undo)
}

/// Deep-merges `value` at `p`, or writes it there when nothing is there yet.
fn merge_at(root: &mut Value, p: &Path, value: Value, shown: &str) -> Result<(), StepError> {
    let segs = p.segments().ok_or_else(|| not_singular(p))?;
    match walk_mut(root, segs) {
        Some(slot) => {
            deep_merge(slot, value);
            Ok(())
        }
        None => write(root, p, value, shown).map(|_| ()),
    }
}

fn undo(root: &mut Value, segs: &[Seg], undo: Undo) {
    match undo {
        Undo::Put(n, old) => {
            if let Some(slot) = walk_mut(root, &segs[..n]) {
                *slot = old;
            }
        }
        Undo::Remove(n) => match (walk_mut(root, &segs[..n]), &segs[n]) {
            (Some(Value::Object(m)), Seg::Key(k)) => {
                m.shift_remove(k);
            }
            (Some(Value::Array(a)), Seg::Index(_)) => {
                a.pop();
            }
            _ => {}
        },
    }
}

/// One write, recorded: with `shared`, the value written, to share rather than copy.
fn write_one(
    root: &mut Value,
    dest: &Path,
    value: Value,
    shared: Option<&Arc<Value>>,
    shown: String,
    changes: &mut Vec<Change>,
) -> Result<(), StepError> {
    let recorded = shared.map_or_else(|| Arc::new(value.clone()), Arc::clone);
    write(root, dest, value, &shown)?;
    changes.push(Change {
        path: shown,
        value: recorded,
    });
    Ok(())
}

/// The elements a single write `dest: =payload.<dest> + [...]` appends to the list at `dest`
/// (the scope, if any, in front), when the source is of that form and that list exists in the
/// payload `vars` sees: see [`eval::appended`]. `None`: evaluate the source as written.
fn appended(scope: Option<&Path>, dest: &Path, src: &SourcePlan, vars: &Vars) -> Option<Vec<Value>> {
    let SourcePlan::Expr(e) = src else {
        return None;
    };
    let segs = scope
        .map_or(Some(&[][..]), Path::segments)?
        .iter()
        .chain(dest.segments()?);
    let mut fields = Vec::new();
    for seg in segs {
        match seg {
            Seg::Key(k) => fields.push(k.as_str()),
            Seg::Index(_) => return None,
        }
    }
    // `payload` as the expression sees it (a local of that name would shadow it).
    let payload = vars
        .get("payload")
        .filter(|p| vars.payload.is_some_and(|q| std::ptr::eq(*p, q)))?;
    let mut at = payload;
    for f in &fields {
        at = at.as_object()?.get(*f)?;
    }
    if !at.is_array() {
        return None;
    }
    eval::appended(e, &fields, vars)
}

/// Appends `items` to the list at `dest` (under `scope`), which [`appended`] found: the same
/// payload as writing `payload.<dest> + items` back, without copying the list. Each element is
/// recorded as the write that appends it (`$.log[3]`, the list's length before it), so a record
/// holds what this write added, not the whole list.
fn append_in_place(
    payload: &mut Value,
    scope: Option<&Path>,
    dest: &Path,
    items: Vec<Value>,
    shown: String,
    changes: &mut Vec<Change>,
) -> Result<(), StepError> {
    let scope = scope.and_then(Path::segments).unwrap_or(&[]);
    let Some(Value::Array(list)) =
        walk_mut(payload, scope).and_then(|t| walk_mut(t, dest.segments().unwrap_or(&[])))
    else {
        return Err(StepError::mapping(format!("cannot append to `{shown}`")));
    };
    list.reserve(items.len());
    for item in items {
        changes.push(Change {
            path: format!("{shown}[{}]", list.len()),
            value: Arc::new(item.clone()),
        });
        list.push(item);
    }
    Ok(())
}

/// One of several writes of a mapping: a value, or elements appended in place to the list
/// there (see [`appended_alone`]).
enum Write {
    Value(Value),
    Append(Vec<Value>),
}

/// The elements `dest: =payload.<dest> + [...]` appends to its list, as [`appended`] finds
/// them, when no other destination of the same mapping writes into that list or around it (an
/// append in place must not see another write's effect, nor undo it).
fn appended_alone(
    scope: Option<&Path>,
    dest: &Path,
    src: &SourcePlan,
    entries: &[(Path, SourcePlan)],
    vars: &Vars,
) -> Option<Vec<Value>> {
    let segs = dest.segments()?;
    let apart = entries.iter().all(|(other, _)| {
        std::ptr::eq(other, dest)
            || other.segments().is_some_and(|o| {
                let n = o.len().min(segs.len());
                o[..n] != segs[..n]
            })
    });
    if !apart {
        return None;
    }
    appended(scope, dest, src, vars)
}

/// Several writes, all or none, recorded.
fn write_all<'p>(
    root: &mut Value,
    writes: impl Iterator<Item = (&'p Path, Write)>,
    scope: Option<&Path>,
    changes: &mut Vec<Change>,
) -> Result<(), StepError> {
    enum Done {
        Wrote(Undo),
        /// The list's length before the append.
        Appended(usize),
    }
    let mut done: Vec<(&Path, Done)> = Vec::new();
    let mut recorded = Vec::new();
    let mut failed = None;
    for (dest, write_) in writes {
        let shown = dest_text(scope, dest);
        match write_ {
            Write::Value(value) => {
                let copy = value.clone();
                match write(root, dest, value, &shown) {
                    Ok(u) => {
                        done.push((dest, Done::Wrote(u)));
                        recorded.push(Change {
                            path: shown,
                            value: Arc::new(copy),
                        });
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            Write::Append(items) => {
                let Some(Value::Array(list)) = walk_mut(root, dest.segments().unwrap_or(&[])) else {
                    failed = Some(StepError::mapping(format!("cannot append to `{shown}`")));
                    break;
                };
                done.push((dest, Done::Appended(list.len())));
                list.reserve(items.len());
                for item in items {
                    recorded.push(Change {
                        path: format!("{shown}[{}]", list.len()),
                        value: Arc::new(item.clone()),
                    });
                    list.push(item);
                }
            }
        }
    }
    if let Some(e) = failed {
        for (dest, d) in done.into_iter().rev() {
            let segs = dest.segments().unwrap_or(&[]);
            match d {
                Done::Wrote(u) => undo(root, segs, u),
                Done::Appended(len) => {
                    if let Some(Value::Array(list)) = walk_mut(root, segs) {
                        list.truncate(len);
                    }
                }
            }
        }
        return Err(e);
    }
    changes.extend(recorded);
    Ok(())
}

/// A destination as a path in the payload: the scope's segments, then the destination's.
fn dest_text(scope: Option<&Path>, dest: &Path) -> String {
    match scope.and_then(|s| Some((s.segments()?, dest.segments()?))) {
        Some((s, d)) if !s.is_empty() => format_path(&[s, d].concat()),
        _ => dest.text().to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Messages

fn not_singular(p: &Path) -> StepError {
    StepError::mapping(format!("`{}` is not a singular path", p.text()))
        .with_details(json!({ "path": p.text() }))
}

/// Names the destination a source was for, in `details`.
fn for_dest(mut e: StepError, dest: &Path) -> StepError {
    match &mut e.details {
        Some(Value::Object(m)) => {
            m.insert("destination".into(), Value::String(dest.text().to_owned()));
        }
        _ => e.details = Some(json!({ "destination": dest.text() })),
    }
    e
}

/// Says that a path was read under a scope.
fn with_scope(mut e: StepError, scope: Option<&Path>) -> StepError {
    if let Some(s) = scope
        && e.kind == crate::record::ErrorKind::Mapping
    {
        e.message = format!("under scope `{}`: {}", s.text(), e.message);
        if let Some(Value::Object(m)) = &mut e.details {
            m.insert("scope".into(), Value::String(s.text().to_owned()));
        }
    }
    e
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::expr;
    use crate::expr::path;
    use crate::record::ErrorKind;

    fn p(text: &str) -> Path {
        path::parse(text).expect("valid path")
    }

    /// [`super::apply_output`] on a result made for the call.
    fn apply_output(
        output: &OutputPlan,
        scope: Option<&Path>,
        payload: &mut Value,
        result: &Value,
        vars: &Vars,
        changes: &mut Vec<Change>,
    ) -> Result<Vec<Violation>, StepError> {
        super::apply_output(output, scope, payload, &Arc::new(result.clone()), vars, changes)
    }

    fn change(path: &str, value: Value) -> Change {
        Change {
            path: path.into(),
            value: Arc::new(value),
        }
    }

    fn src_path(text: &str) -> SourcePlan {
        SourcePlan::Path(p(text))
    }

    fn src_expr(text: &str) -> SourcePlan {
        SourcePlan::Expr(Arc::new(expr::parse(text).expect("valid expression")))
    }

    fn map(entries: &[(&str, SourcePlan)]) -> Vec<(Path, SourcePlan)> {
        entries
            .iter()
            .map(|(d, s)| {
                let s = match s {
                    SourcePlan::Path(x) => SourcePlan::Path(x.clone()),
                    SourcePlan::Expr(e) => SourcePlan::Expr(Arc::clone(e)),
                    SourcePlan::WithDefault(x, v) => SourcePlan::WithDefault(x.clone(), v.clone()),
                    SourcePlan::Literal(v) => SourcePlan::Literal(v.clone()),
                };
                (p(d), s)
            })
            .collect()
    }

    fn no_vars() -> Vars<'static> {
        Vars::default()
    }

    #[test]
    fn sources() {
        let doc =
            json!({"ticket": {"body": "hi", "tags": ["a", "b"]}, "items": [{"id": 1}, {"id": 2}, {"x": 3}]});
        let v = no_vars();
        assert_eq!(
            eval_source(&src_path("$.ticket.body"), &doc, &v).unwrap(),
            json!("hi")
        );
        assert_eq!(
            eval_source(&src_path("$.items[-1].x"), &doc, &v).unwrap(),
            json!(3)
        );
        assert_eq!(eval_source(&src_path("$"), &doc, &v).unwrap(), doc);
        // Non-singular: the array of matches, possibly empty.
        assert_eq!(
            eval_source(&src_path("$.items[*].id"), &doc, &v).unwrap(),
            json!([1, 2])
        );
        assert_eq!(eval_source(&src_path("$..nothing"), &doc, &v).unwrap(), json!([]));
        // Defaults.
        let d = SourcePlan::WithDefault(p("$.ticket.missing"), json!("none"));
        assert_eq!(eval_source(&d, &doc, &v).unwrap(), json!("none"));
        let d = SourcePlan::WithDefault(p("$.ticket.body"), json!("none"));
        assert_eq!(eval_source(&d, &doc, &v).unwrap(), json!("hi"));
        let d = SourcePlan::WithDefault(p("$.items[*].nope"), json!([]));
        assert_eq!(eval_source(&d, &doc, &v).unwrap(), json!([]));
        let d = SourcePlan::WithDefault(p("$.items[*].id"), json!(0));
        assert_eq!(eval_source(&d, &doc, &v).unwrap(), json!([1, 2]));
        // Literals and expressions.
        assert_eq!(
            eval_source(&SourcePlan::Literal(json!({"k": 1})), &doc, &v).unwrap(),
            json!({"k": 1})
        );
        let vars = Vars {
            payload: Some(&doc),
            ..Vars::default()
        };
        assert_eq!(
            eval_source(&src_expr("size(payload.items) + 1"), &doc, &vars).unwrap(),
            json!(4)
        );
    }

    #[test]
    fn a_singular_path_that_matches_nothing_names_the_nearest_key() {
        let doc = json!({"ticket": {"body": "hi"}, "list": [1]});
        let e = eval_source(&src_path("$.ticket.bdy"), &doc, &no_vars()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(
            e.message,
            "`$.ticket.bdy` matched nothing; nearest: `$.ticket.body`"
        );
        assert_eq!(
            e.details,
            Some(json!({"path": "$.ticket.bdy", "nearest": "$.ticket.body"}))
        );
        let e = eval_source(&src_path("$.ticket.zzzzzz"), &doc, &no_vars()).unwrap_err();
        assert_eq!(
            e.message,
            "`$.ticket.zzzzzz` matched nothing (`$.ticket` has no key `zzzzzz`)"
        );
        let e = eval_source(&src_path("$.list[3]"), &doc, &no_vars()).unwrap_err();
        assert_eq!(
            e.message,
            "`$.list[3]` matched nothing (index 3 is out of range for `$.list` (length 1))"
        );
        let e = eval_source(&src_path("$.ticket.body.x"), &doc, &no_vars()).unwrap_err();
        assert_eq!(
            e.message,
            "`$.ticket.body.x` matched nothing (`$.ticket.body` is a string)"
        );
        let e = eval_source(
            &src_expr("payload.nope"),
            &doc,
            &Vars {
                payload: Some(&doc),
                ..Vars::default()
            },
        );
        assert_eq!(e.unwrap_err().kind, ErrorKind::Expression);
    }

    #[test]
    fn input_all_paths_and_map() {
        let payload = json!({"ticket": {"body": "hi", "id": 7, "meta": {"a": 1, "b": 2}}, "customer": {"id": 3, "name": "N"}});
        let v = no_vars();
        assert_eq!(build_input(&InputPlan::All, None, &payload, &v).unwrap(), payload);

        let paths = InputPlan::Paths(vec![p("$.ticket.body"), p("$.customer.id"), p("$.ticket.meta.b")]);
        assert_eq!(
            build_input(&paths, None, &payload, &v).unwrap(),
            json!({"ticket": {"body": "hi", "meta": {"b": 2}}, "customer": {"id": 3}})
        );

        let m = InputPlan::Map(map(&[
            ("$.text", src_path("$.ticket.body")),
            ("$.who.id", src_path("$.customer.id")),
            ("$.n", src_expr("payload.ticket.id * 2")),
            ("$.fixed", SourcePlan::Literal(json!([1]))),
            ("$.opt", SourcePlan::WithDefault(p("$.nope"), json!(null))),
        ]));
        assert_eq!(
            build_input(&m, None, &payload, &v).unwrap(),
            json!({"text": "hi", "who": {"id": 3}, "n": 14, "fixed": [1], "opt": null})
        );
        // `$` as a destination replaces the document.
        let m = InputPlan::Map(map(&[("$", src_path("$.customer"))]));
        assert_eq!(
            build_input(&m, None, &payload, &v).unwrap(),
            json!({"id": 3, "name": "N"})
        );
        let e = build_input(
            &InputPlan::Map(map(&[("$.t", src_path("$.ticket.bdy"))])),
            None,
            &payload,
            &v,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(e.details.unwrap()["destination"], json!("$.t"));
    }

    #[test]
    fn input_under_a_scope() {
        let payload = json!({"report": {"title": "T", "sections": [1, 2]}, "secret": 1});
        let scope = p("$.report");
        let v = no_vars();
        assert_eq!(
            build_input(&InputPlan::All, Some(&scope), &payload, &v).unwrap(),
            json!({"title": "T", "sections": [1, 2]})
        );
        let paths = InputPlan::Paths(vec![p("$.title")]);
        assert_eq!(
            build_input(&paths, Some(&scope), &payload, &v).unwrap(),
            json!({"title": "T"})
        );
        let m = InputPlan::Map(map(&[
            ("$.t", src_path("$.title")),
            ("$.all", src_expr("payload.secret")),
        ]));
        assert_eq!(
            build_input(&m, Some(&scope), &payload, &v).unwrap(),
            json!({"t": "T", "all": 1})
        );
        let e = build_input(
            &InputPlan::Map(map(&[("$.t", src_path("$.titl"))])),
            Some(&scope),
            &payload,
            &v,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "under scope `$.report`: `$.titl` matched nothing; nearest: `$.title`"
        );
        assert_eq!(e.details.unwrap()["scope"], json!("$.report"));
        // A scope that does not exist.
        let e = build_input(&InputPlan::All, Some(&p("$.reprt")), &payload, &v).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(e.message, "scope `$.reprt` matched nothing; nearest: `$.report`");
    }

    #[test]
    fn filter_keeps_structure_and_reports_missing_paths() {
        let doc = json!({"a": {"b": 1, "c": 2}, "items": [{"id": 1}, {"id": 2}, {"id": 3}], "top": null});
        assert_eq!(filter_paths(&doc, &[p("$.a.b")]).unwrap(), json!({"a": {"b": 1}}));
        assert_eq!(
            filter_paths(&doc, &[p("$.items[1].id")]).unwrap(),
            json!({"items": [null, {"id": 2}]})
        );
        assert_eq!(
            filter_paths(&doc, &[p("$.items[-1]")]).unwrap(),
            json!({"items": [null, null, {"id": 3}]})
        );
        assert_eq!(
            filter_paths(&doc, &[p("$.a"), p("$.a.b")]).unwrap(),
            json!({"a": {"b": 1, "c": 2}})
        );
        assert_eq!(
            filter_paths(&doc, &[p("$.a.b"), p("$.a")]).unwrap(),
            json!({"a": {"b": 1, "c": 2}})
        );
        assert_eq!(filter_paths(&doc, &[p("$.top")]).unwrap(), json!({"top": null}));
        assert_eq!(filter_paths(&doc, &[p("$")]).unwrap(), doc);
        assert_eq!(filter_paths(&doc, &[]).unwrap(), json!({}));
        let e = filter_paths(&doc, &[p("$.a.d")]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert!(e.message.starts_with("`$.a.d` matched nothing"), "{}", e.message);
        let e = filter_paths(&doc, &[p("$.items[*]")]).unwrap_err();
        assert_eq!(e.message, "`$.items[*]` is not a singular path");
    }

    #[test]
    fn deep_merge_semantics() {
        let mut t = json!({"a": {"x": 1, "l": [1, 2, 3]}, "s": "old", "keep": true});
        deep_merge(
            &mut t,
            json!({"a": {"y": 2, "l": [9]}, "s": {"now": "object"}, "new": null}),
        );
        assert_eq!(
            t,
            json!({"a": {"x": 1, "l": [9], "y": 2}, "s": {"now": "object"}, "keep": true, "new": null})
        );
        let mut t = json!({"a": 1});
        deep_merge(&mut t, json!([1]));
        assert_eq!(t, json!([1]));
        let mut t = json!({"a": {"b": {"c": 1}}});
        deep_merge(&mut t, json!({"a": {"b": {}}}));
        assert_eq!(t, json!({"a": {"b": {"c": 1}}}), "nothing is deleted");
    }

    #[test]
    fn output_none_and_all() {
        let mut payload = json!({"a": {"x": 1}, "l": [1, 2]});
        let mut changes = Vec::new();
        let v = no_vars();
        let r = json!({"a": {"y": 2}, "l": [3]});
        assert!(
            apply_output(&OutputPlan::None, None, &mut payload, &r, &v, &mut changes)
                .unwrap()
                .is_empty()
        );
        assert_eq!(payload, json!({"a": {"x": 1}, "l": [1, 2]}));
        assert!(changes.is_empty());
        apply_output(&OutputPlan::All, None, &mut payload, &r, &v, &mut changes).unwrap();
        assert_eq!(payload, json!({"a": {"x": 1, "y": 2}, "l": [3]}));
        assert_eq!(changes, vec![change("$", r.clone())]);
        // Under a scope.
        let mut changes = Vec::new();
        apply_output(
            &OutputPlan::All,
            Some(&p("$.a")),
            &mut payload,
            &json!({"z": 0}),
            &v,
            &mut changes,
        )
        .unwrap();
        assert_eq!(payload["a"], json!({"x": 1, "y": 2, "z": 0}));
        assert_eq!(changes[0].path, "$.a");
        let e = apply_output(
            &OutputPlan::All,
            Some(&p("$.b")),
            &mut payload,
            &r,
            &v,
            &mut changes,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
    }

    #[test]
    fn output_allowlist_merges_allowed_parts_and_lists_the_rest() {
        let mut payload = json!({"reply": {"old": 1}, "meta": {"keep": true}});
        let mut changes = Vec::new();
        let result = json!({
            "reply": {"text": "hi"},
            "meta": {"summary": "s", "tokens": 5},
            "extra": [1],
            "debug": {"x": 1},
        });
        let out = OutputPlan::Paths(vec![p("$.reply"), p("$.meta.summary")]);
        let violations = apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap();
        assert_eq!(
            payload,
            json!({"reply": {"old": 1, "text": "hi"}, "meta": {"keep": true, "summary": "s"}})
        );
        let dropped: Vec<_> = violations.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(dropped, ["$.meta.tokens", "$.extra", "$.debug"]);
        assert!(violations.iter().all(|v| v.reason == NOT_ALLOWED));
        assert_eq!(
            changes,
            vec![
                change("$.reply", json!({"text": "hi"})),
                change("$.meta.summary", json!("s")),
            ]
        );
        // A path the result lacks merges nothing; a scalar where the allowlist goes deeper is dropped.
        let mut changes = Vec::new();
        let out = OutputPlan::Paths(vec![p("$.meta.summary"), p("$.items[0]")]);
        let violations = apply_output(
            &out,
            None,
            &mut payload,
            &json!({"meta": "flat", "items": [1, 2]}),
            &no_vars(),
            &mut changes,
        )
        .unwrap();
        let dropped: Vec<_> = violations.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(dropped, ["$.meta", "$.items[1]"]);
        assert_eq!(payload["items"], json!([1]));
        // A result that is not an object at all.
        let violations =
            apply_output(&out, None, &mut payload, &json!("text"), &no_vars(), &mut changes).unwrap();
        assert_eq!(
            violations,
            vec![Violation {
                path: "$".into(),
                reason: NOT_ALLOWED.into()
            }]
        );
    }

    #[test]
    fn output_allowlist_is_all_or_nothing() {
        let mut payload = json!({"a": "scalar", "b": {}});
        let before = payload.clone();
        let mut changes = Vec::new();
        let out = OutputPlan::Paths(vec![p("$.b.x"), p("$.a.y")]);
        let e = apply_output(
            &out,
            None,
            &mut payload,
            &json!({"b": {"x": 1}, "a": {"y": 2}}),
            &no_vars(),
            &mut changes,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(
            e.message,
            "cannot write `$.a.y`: `$.a` is a string, not an object"
        );
        assert_eq!(payload, before);
        assert!(changes.is_empty());
    }

    #[test]
    fn output_map_reads_the_result() {
        let mut payload = json!({"job": {"id": 1}});
        let mut changes = Vec::new();
        let result = json!({"state": "done", "raw": {"answer": 42}, "rows": [{"v": 1}, {"v": 2}]});
        let out = OutputPlan::Map(map(&[
            ("$.job.state", src_path("$.state")),
            ("$.result", src_path("$.raw.answer")),
            ("$.vs", src_path("$.rows[*].v")),
            ("$.double", src_expr("result.raw.answer * 2 + payload.job.id")),
            ("$.whole", src_path("$")),
        ]));
        apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap();
        assert_eq!(
            payload,
            json!({"job": {"id": 1, "state": "done"}, "result": 42, "vs": [1, 2], "double": 85, "whole": result})
        );
        let paths: Vec<_> = changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["$.job.state", "$.result", "$.vs", "$.double", "$.whole"]);
        assert_eq!(*changes[1].value, json!(42));

        // Under a scope, writes land below it and changes name the full path.
        let mut payload = json!({"report": {"title": "T"}});
        let mut changes = Vec::new();
        let out = OutputPlan::Map(map(&[("$.summary", src_path("$.s"))]));
        apply_output(
            &out,
            Some(&p("$.report")),
            &mut payload,
            &json!({"s": "short"}),
            &no_vars(),
            &mut changes,
        )
        .unwrap();
        assert_eq!(payload, json!({"report": {"title": "T", "summary": "short"}}));
        assert_eq!(changes, vec![change("$.report.summary", json!("short"))]);
    }

    #[test]
    fn a_change_that_writes_the_whole_result_shares_it() {
        let result = Arc::new(json!({"rows": [1, 2, 3]}));
        let all = OutputPlan::Map(map(&[("$.whole", src_path("$")), ("$.rows", src_path("$.rows"))]));
        for out in [
            OutputPlan::All,
            OutputPlan::Map(map(&[("$.whole", src_path("$"))])),
            all,
        ] {
            let (mut payload, mut changes) = (json!({}), Vec::new());
            super::apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap();
            let first = &changes[0].value;
            assert_eq!(**first, *result);
            // The single map entry from `$` and `output: "*"` share; several entries copy.
            assert_eq!(Arc::ptr_eq(first, &result), changes.len() == 1, "{:?}", changes);
        }
    }

    #[test]
    fn output_map_is_all_or_nothing() {
        let payload0 = json!({"a": {"keep": 1}, "s": "x", "l": [0]});
        let result = json!({"v": 1, "w": 2});
        // A source that matches nothing: nothing written.
        let mut payload = payload0.clone();
        let mut changes = Vec::new();
        let out = OutputPlan::Map(map(&[("$.a.new", src_path("$.v")), ("$.b", src_path("$.nope"))]));
        let e = apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(e.details.unwrap()["destination"], json!("$.b"));
        assert_eq!(payload, payload0);
        assert!(changes.is_empty());
        // A write that fails after others succeeded: they are undone, in order.
        let out = OutputPlan::Map(map(&[
            ("$.a.keep", src_path("$.v")),     // replaces
            ("$.a.new.deep", src_path("$.w")), // creates
            ("$.l[1]", src_path("$.w")),       // appends
            ("$.n", src_path("$.w")),          // creates
            ("$.n.x", src_path("$.w")),        // through the number just written: fails
        ]));
        let e = apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(
            e.message,
            "cannot write `$.n.x`: `$.n` is a number, not an object"
        );
        assert_eq!(payload, payload0);
        assert_eq!(payload.to_string(), payload0.to_string(), "key order restored");
        assert!(changes.is_empty());
        // Writing through a null replaces it; undone, it is null again.
        let mut payload = json!({"z": null});
        let out = OutputPlan::Map(map(&[("$.z.a", src_path("$.v")), ("$.z.b[3]", src_path("$.v"))]));
        let e = apply_output(&out, None, &mut payload, &result, &no_vars(), &mut changes).unwrap_err();
        assert!(e.message.contains("out of range"), "{}", e.message);
        assert_eq!(payload, json!({"z": null}));
    }

    #[test]
    fn set_computes_everything_before_writing() {
        let mut payload = json!({"a": 1, "b": 2, "n": 0});
        let mut changes = Vec::new();
        let set = map(&[
            ("$.a", src_expr("payload.b")),
            ("$.b", src_expr("payload.a")),
            ("$.c.d", src_path("$.n")),
        ]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(payload, json!({"a": 2, "b": 1, "n": 0, "c": {"d": 0}}));
        assert_eq!(changes.len(), 3);

        // The W1 step.
        let set = map(&[("$.n", src_expr("payload.n + 1"))]);
        let mut payload = json!({"n": 0});
        let mut changes = Vec::new();
        for _ in 0..20 {
            apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        }
        assert_eq!(payload, json!({"n": 20}));
        assert!(payload["n"].is_i64());
        assert_eq!(changes.last(), Some(&change("$.n", json!(20))));

        // An error leaves the payload alone.
        let set = map(&[("$.x", src_expr("1")), ("$.y", src_expr("payload.missing"))]);
        let e = apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Expression);
        assert_eq!(payload, json!({"n": 20}));
        let set = map(&[("$.n.x", src_expr("1"))]);
        let e = apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mapping);
        assert_eq!(payload, json!({"n": 20}));
    }

    #[test]
    fn a_write_of_a_list_plus_more_appends_in_place_and_records_what_it_added() {
        let mut payload = json!({"log": [{"k": 0}], "s": "a", "n": 1, "o": {"l": []}});
        let mut changes = Vec::new();
        let set = map(&[("$.log", src_expr("payload.log + [{'k': payload.n}, 2]"))]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(payload["log"], json!([{"k": 0}, {"k": 1}, 2]));
        assert_eq!(
            changes,
            [change("$.log[1]", json!({"k": 1})), change("$.log[2]", json!(2))]
        );

        // The recorded writes make the same payload again (a resumed run replays them).
        let mut replayed = json!({"log": [{"k": 0}]});
        replay_changes(&mut replayed, &changes).unwrap();
        assert_eq!(replayed["log"], payload["log"]);

        // Under a scope, from an output map.
        let out = OutputPlan::Map(map(&[("$.l", src_expr("payload.o.l + [result.v]"))]));
        let mut changes = Vec::new();
        apply_output(
            &out,
            Some(&p("$.o")),
            &mut payload,
            &json!({"v": 7}),
            &no_vars(),
            &mut changes,
        )
        .unwrap();
        assert_eq!(payload["o"], json!({"l": [7]}));
        assert_eq!(changes, [change("$.o.l[0]", json!(7))]);

        // Anything else is evaluated as written: strings concatenate, another destination
        // gets the whole sum, and a value that is not a list fails as cel says.
        let mut changes = Vec::new();
        let set = map(&[("$.s", src_expr("payload.s + 'b'"))]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(changes, [change("$.s", json!("ab"))]);
        let set = map(&[("$.copy", src_expr("payload.log + [3]"))]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(payload["copy"], json!([{"k": 0}, {"k": 1}, 2, 3]));
        assert_eq!(payload["log"].as_array().map(Vec::len), Some(3));
        let set = map(&[("$.n", src_expr("payload.n + [3]"))]);
        let e = apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Expression);
        let set = map(&[("$.log", src_expr("payload.log + 3"))]);
        let e = apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Expression);
        assert_eq!(payload["log"].as_array().map(Vec::len), Some(3));
    }

    /// An append beside other writes of the same mapping is still an append (a loop body that
    /// counts and logs records what it added, not the whole list), all or none with the others;
    /// a write into the same list keeps the whole sum.
    #[test]
    fn an_append_among_several_writes_appends_in_place_all_or_none() {
        let mut payload = json!({"i": 1, "log": [0], "s": "x"});
        let mut changes = Vec::new();
        let set = map(&[
            ("$.i", src_expr("payload.i + 1")),
            ("$.log", src_expr("payload.log + [payload.i]")),
        ]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(payload, json!({"i": 2, "log": [0, 1], "s": "x"}));
        assert_eq!(changes, [change("$.i", json!(2)), change("$.log[1]", json!(1))]);
        let mut replayed = json!({"i": 1, "log": [0], "s": "x"});
        replay_changes(&mut replayed, &changes).unwrap();
        assert_eq!(replayed, payload);

        // A later write that fails takes the append back.
        let set = map(&[
            ("$.log", src_expr("payload.log + [9]")),
            ("$.s.deeper", src_expr("1")),
        ]);
        let mut changes = Vec::new();
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap_err();
        assert_eq!(payload, json!({"i": 2, "log": [0, 1], "s": "x"}));
        assert!(changes.is_empty());

        // Another write into the list: the sum is written whole.
        let set = map(&[
            ("$.log", src_expr("payload.log + [5]")),
            ("$.log[0]", src_expr("7")),
        ]);
        apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        assert_eq!(changes[0], change("$.log", json!([0, 1, 5])));
    }

    /// Not a timed assertion: prints what a W1 `set` step's mapping costs (run with
    /// `--release --nocapture` for meaningful numbers).
    #[test]
    fn measure_set_cost() {
        let set = map(&[("$.n", src_expr("payload.n + 1"))]);
        let mut payload = json!({"n": 0});
        for k in 0..19 {
            payload[format!("key{k}")] = json!({"text": "some text", "k": k});
        }
        let rounds = 20_000;
        let mut changes = Vec::with_capacity(rounds);
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            apply_set(&set, &mut payload, &no_vars(), &mut changes).unwrap();
        }
        let per = start.elapsed().as_secs_f64() * 1e9 / rounds as f64;
        assert_eq!(payload["n"], json!(rounds));
        println!("apply_set `$.n: =payload.n + 1` (with its change record): {per:.0} ns");
    }
}
