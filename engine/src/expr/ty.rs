//! Static types of JSON values, as lint knows them (SPEC §5.1, "Types flow through the graph").
//!
//! A [`Ty`] says what a value can be: built from a JSON Schema ([`Ty::from_schema`]) or a literal
//! ([`Ty::of_value`]), written into at destination paths ([`Ty::set_path`]), deep-merged
//! ([`Ty::merge`]) and joined where two paths of the graph meet ([`Ty::join`]). [`Ty::Any`] is
//! "nothing is known": every question about it answers "unknown", so a flow without schemas gets
//! no reports. Objects are *closed* (their listed fields are all there can be) only where a
//! schema lists `properties` and allows no others, or a literal or mapping built them whole.

use indexmap::IndexMap;
use serde_json::Value;

/// How deep schemas are followed; deeper parts are [`Ty::Any`].
const MAX_DEPTH: usize = 32;

/// What a JSON value can be.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// Nothing is known: any value.
    Any,
    Null,
    Bool,
    /// A whole number (JSON Schema `integer`; CEL `int`/`uint`).
    Int,
    /// A number with a fraction (CEL `double`). JSON Schema `number` is `Int | Double`.
    Double,
    String,
    /// A list whose elements are all of this type.
    List(Box<Ty>),
    Object(Obj),
    /// One of several types (never nested, never holding `Any`, at least two members).
    Union(Vec<Ty>),
}

/// An object's fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Obj {
    pub fields: IndexMap<String, Field>,
    /// Fields other than those listed may exist.
    pub open: bool,
}

/// A field of an object type.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub ty: Ty,
    /// Present on every value of the type (a schema's `required`, or written on every path).
    pub always: bool,
}

/// The answer to "what is field `f` of a value of this type?".
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup<'a> {
    /// Nothing is known (an open object, [`Ty::Any`], or a union with such a member).
    Unknown,
    /// The field exists; `always` is false when it may be absent.
    Field { ty: Ty, always: bool },
    /// No value of the type has the field; `names` are the fields that do exist (for the help).
    Missing { names: Vec<&'a str> },
    /// The value is not an object at all (a string, a list...).
    NotObject,
}

impl Ty {
    /// JSON Schema `number`.
    pub fn number() -> Ty {
        Ty::Union(vec![Ty::Int, Ty::Double])
    }

    /// An object type with no fields known.
    pub fn open_object() -> Ty {
        Ty::Object(Obj {
            fields: IndexMap::new(),
            open: true,
        })
    }

    /// The type a JSON Schema describes. A `$ref` to a place in the same schema (`#/$defs/x`,
    /// `#/definitions/x`, `#`) is followed, once on each path (a recursive reference is
    /// [`Ty::Any`] where it recurs). What lint cannot follow (another document's `$ref`,
    /// `not`, `if`) is [`Ty::Any`]; `allOf` takes its first member that says anything.
    pub fn from_schema(schema: &Value) -> Ty {
        from_schema(
            schema,
            &mut Refs {
                root: schema,
                open: Vec::new(),
            },
            0,
        )
    }

    /// The type of a literal value: objects closed, a list's element type the join of its
    /// elements (an empty list's is [`Ty::Any`]).
    pub fn of_value(v: &Value) -> Ty {
        match v {
            Value::Null => Ty::Null,
            Value::Bool(_) => Ty::Bool,
            Value::Number(n) if n.is_i64() || n.is_u64() => Ty::Int,
            Value::Number(_) => Ty::Double,
            Value::String(_) => Ty::String,
            Value::Array(items) => {
                let elem = items.iter().map(Ty::of_value).reduce(|a, b| a.join(&b));
                Ty::List(Box::new(elem.unwrap_or(Ty::Any)))
            }
            Value::Object(m) => Ty::Object(Obj {
                fields: m
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            Field {
                                ty: Ty::of_value(v),
                                always: true,
                            },
                        )
                    })
                    .collect(),
                open: false,
            }),
        }
    }

    pub fn is_any(&self) -> bool {
        matches!(self, Ty::Any)
    }

    /// The members of a union, or the type itself.
    pub fn members(&self) -> &[Ty] {
        match self {
            Ty::Union(m) => m,
            other => std::slice::from_ref(other),
        }
    }

    /// What both types allow: the type of a value that came by either of two paths. Object
    /// fields present on one side only become maybe-absent.
    pub fn join(&self, other: &Ty) -> Ty {
        match (self, other) {
            (Ty::Any, _) | (_, Ty::Any) => Ty::Any,
            (a, b) if a == b => a.clone(),
            (Ty::List(a), Ty::List(b)) => Ty::List(Box::new(a.join(b))),
            (Ty::Object(a), Ty::Object(b)) => Ty::Object(a.join(b)),
            _ => {
                let mut out: Vec<Ty> = Vec::new();
                for t in self.members().iter().chain(other.members()) {
                    add_member(&mut out, t);
                }
                if out.len() == 1 {
                    out.pop().unwrap_or(Ty::Any)
                } else {
                    Ty::Union(out)
                }
            }
        }
    }

    /// Field `name` of a value of this type.
    pub fn field(&self, name: &str) -> Lookup<'_> {
        match self {
            Ty::Any => Lookup::Unknown,
            Ty::Object(o) => match o.fields.get(name) {
                Some(f) => Lookup::Field {
                    ty: f.ty.clone(),
                    always: f.always,
                },
                None if o.open => Lookup::Unknown,
                None => Lookup::Missing {
                    names: o.fields.keys().map(String::as_str).collect(),
                },
            },
            Ty::Union(members) => {
                // The field of each object member; members that are not objects do not have it.
                let mut found: Option<(Ty, bool)> = None;
                let mut names = Vec::new();
                let mut all_objects = true;
                for m in members {
                    match m.field(name) {
                        Lookup::Unknown => return Lookup::Unknown,
                        Lookup::Field { ty, always } => {
                            found = Some(match found {
                                None => (ty, always),
                                Some((t, a)) => (t.join(&ty), a && always),
                            })
                        }
                        Lookup::Missing { names: n } => {
                            names.extend(n);
                            found = found.map(|(t, _)| (t, false));
                        }
                        Lookup::NotObject => all_objects = false,
                    }
                }
                match found {
                    Some((ty, always)) => Lookup::Field {
                        ty,
                        always: always && all_objects,
                    },
                    None if names.is_empty() && !all_objects => Lookup::NotObject,
                    None => {
                        names.sort_unstable();
                        names.dedup();
                        Lookup::Missing { names }
                    }
                }
            }
            _ => Lookup::NotObject,
        }
    }

    /// The type of an element of a list of this type (`Any` when unknown or not a list).
    pub fn element(&self) -> Ty {
        match self {
            Ty::List(e) => (**e).clone(),
            _ => Ty::Any,
        }
    }

    /// Writes `ty` at the path `fields` (object keys from the root; the path of a singular
    /// destination), creating objects on the way, as a mapping does. A write through a value
    /// that is not known to be an object makes the written part known and leaves the rest.
    pub fn set_path(&mut self, fields: &[&str], ty: Ty) {
        let Some((first, rest)) = fields.split_first() else {
            *self = ty;
            return;
        };
        if !matches!(self, Ty::Object(_)) {
            // A write into anything but an object replaces it with an object (mappings create
            // missing intermediate objects); what else it held is unknown.
            *self = Ty::open_object();
        }
        if let Ty::Object(o) = self {
            let slot = o.fields.entry((*first).to_owned()).or_insert(Field {
                ty: Ty::Any,
                always: true,
            });
            slot.always = true;
            if rest.is_empty() {
                slot.ty = ty;
            } else {
                slot.ty.set_path(rest, ty);
            }
        }
    }

    /// Makes the fields along the path `fields` present, where the type has them: what is
    /// known once `has(x.<fields>)` is true. Fields the type does not list are left unknown.
    pub fn assume_present(&mut self, fields: &[String]) {
        let Some((first, rest)) = fields.split_first() else {
            return;
        };
        if let Ty::Object(o) = self
            && let Some(f) = o.fields.get_mut(first)
        {
            f.always = true;
            f.ty.assume_present(rest);
        }
    }

    /// Deep-merges a value of type `other` into one of this type (`output: "*"`, SPEC §5.3):
    /// objects merge field by field, anything else replaces.
    pub fn merge(&mut self, other: &Ty) {
        match (self, other) {
            (Ty::Object(a), Ty::Object(b)) => {
                for (k, f) in &b.fields {
                    match a.fields.get_mut(k) {
                        Some(mine) => {
                            if f.always {
                                mine.ty.merge(&f.ty);
                                mine.always = true;
                            } else {
                                mine.ty = mine.ty.join(&f.ty);
                            }
                        }
                        None => {
                            a.fields.insert(k.clone(), f.clone());
                        }
                    }
                }
                a.open |= b.open;
            }
            (me @ Ty::Object(_), Ty::Any) => {
                // An unknown result may add or replace any field.
                *me = Ty::Any;
            }
            (me @ Ty::Any, Ty::Object(b)) => {
                // Merged into an unknown value: the object's fields are there, and whatever
                // else the value had.
                *me = Ty::Object(Obj {
                    fields: b.fields.clone(),
                    open: true,
                });
            }
            (me @ Ty::Union(_), Ty::Object(_)) => {
                // Each kind the value may be of: objects merge, the rest is replaced.
                let members = me.members().to_vec();
                *me = members
                    .into_iter()
                    .map(|mut m| {
                        m.merge(other);
                        m
                    })
                    .reduce(|a, b| a.join(&b))
                    .unwrap_or(Ty::Any);
            }
            (me, other) => *me = other.clone(),
        }
    }

    /// Whether a value of this type and one of `other` can ever be equal in CEL (numbers of
    /// any kind compare by value; otherwise the kinds must match). `true` when unknown.
    pub fn can_equal(&self, other: &Ty) -> bool {
        self.members().iter().any(|a| {
            other.members().iter().any(|b| match (a, b) {
                (Ty::Any, _) | (_, Ty::Any) => true,
                (Ty::Int | Ty::Double, Ty::Int | Ty::Double) => true,
                (Ty::List(_), Ty::List(_)) | (Ty::Object(_), Ty::Object(_)) => true,
                (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
            })
        })
    }

    /// The type in words, for messages: `integer`, `string`, `list of string`, `object`,
    /// `integer or null`.
    pub fn describe(&self) -> String {
        match self {
            Ty::Any => "any value".into(),
            Ty::Null => "null".into(),
            Ty::Bool => "boolean".into(),
            Ty::Int => "integer".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::List(e) if e.is_any() => "list".into(),
            Ty::List(e) => format!("list of {}", e.describe()),
            Ty::Object(_) => "object".into(),
            Ty::Union(m) if *m == [Ty::Int, Ty::Double] || *m == [Ty::Double, Ty::Int] => "number".into(),
            Ty::Union(m) => m.iter().map(Ty::describe).collect::<Vec<_>>().join(" or "),
        }
    }
}

impl Obj {
    fn join(&self, other: &Obj) -> Obj {
        let mut fields = IndexMap::new();
        for (k, f) in &self.fields {
            match other.fields.get(k) {
                Some(g) => fields.insert(
                    k.clone(),
                    Field {
                        ty: f.ty.join(&g.ty),
                        always: f.always && g.always,
                    },
                ),
                // Absent on the other side: maybe absent, unless that side is open (then
                // whether it is there is unknown, and the field is left out of the open join).
                None if other.open => None,
                None => fields.insert(
                    k.clone(),
                    Field {
                        ty: f.ty.clone(),
                        always: false,
                    },
                ),
            };
        }
        if !self.open {
            for (k, g) in &other.fields {
                if !fields.contains_key(k) {
                    fields.insert(
                        k.clone(),
                        Field {
                            ty: g.ty.clone(),
                            always: false,
                        },
                    );
                }
            }
        }
        Obj {
            fields,
            open: self.open || other.open,
        }
    }
}

/// Adds `t` to the members of a union being built, merging it with a member of the same kind.
fn add_member(out: &mut Vec<Ty>, t: &Ty) {
    for m in out.iter_mut() {
        match (&*m, t) {
            (a, b) if a == b => return,
            (Ty::List(_), Ty::List(_)) | (Ty::Object(_), Ty::Object(_)) => {
                *m = m.join(t);
                return;
            }
            _ => {}
        }
    }
    out.push(t.clone());
}

/// The schema being read: its root (where `#/...` references point) and the references being
/// followed on the way to the current part.
struct Refs<'a> {
    root: &'a Value,
    open: Vec<&'a str>,
}

fn from_schema<'a>(s: &'a Value, cx: &mut Refs<'a>, depth: usize) -> Ty {
    let Value::Object(s) = s else {
        // `true` and `false` schemas, and anything that is not a schema.
        return Ty::Any;
    };
    if depth > MAX_DEPTH || s.contains_key("not") || s.contains_key("if") {
        return Ty::Any;
    }
    if let Some(r) = s.get("$ref") {
        // Only a reference into this schema is followed, and not into itself again.
        let Some(r) = r.as_str() else { return Ty::Any };
        let Some(pointer) = r.strip_prefix('#') else {
            return Ty::Any;
        };
        if cx.open.contains(&r) {
            return Ty::Any;
        }
        let Some(target) = cx.root.pointer(&pointer_unescaped(pointer)) else {
            return Ty::Any;
        };
        cx.open.push(r);
        let ty = from_schema(target, cx, depth + 1);
        cx.open.pop();
        return ty;
    }
    if let Some(c) = s.get("const") {
        return Ty::of_value(c);
    }
    if let Some(Value::Array(values)) = s.get("enum") {
        return values
            .iter()
            .map(Ty::of_value)
            .reduce(|a, b| a.join(&b))
            .unwrap_or(Ty::Any);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            return alts
                .iter()
                .map(|a| from_schema(a, cx, depth + 1))
                .reduce(|a, b| a.join(&b))
                .unwrap_or(Ty::Any);
        }
    }
    if let Some(Value::Array(all)) = s.get("allOf") {
        let mut said: Vec<Ty> = all
            .iter()
            .map(|a| from_schema(a, cx, depth + 1))
            .filter(|t| !t.is_any())
            .collect();
        if said.len() > 1 && said.iter().all(|t| matches!(t, Ty::Object(_))) {
            // Objects described in parts: each part's fields, and others may exist (a part that
            // closes itself sees only its own fields).
            let mut merged = Obj {
                fields: IndexMap::new(),
                open: true,
            };
            for t in said {
                if let Ty::Object(o) = t {
                    for (k, f) in o.fields {
                        match merged.fields.get_mut(&k) {
                            Some(m) => m.always |= f.always,
                            None => {
                                merged.fields.insert(k, f);
                            }
                        }
                    }
                }
            }
            return Ty::Object(merged);
        }
        return if said.is_empty() {
            Ty::Any
        } else {
            said.swap_remove(0)
        };
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if s.contains_key("properties") => vec!["object"],
        _ if s.contains_key("items") => vec!["array"],
        _ => return Ty::Any,
    };
    let mut out = Vec::new();
    for t in types {
        let ty = match t {
            "null" => Ty::Null,
            "boolean" => Ty::Bool,
            "integer" => Ty::Int,
            "number" => Ty::number(),
            "string" => Ty::String,
            "array" => Ty::List(Box::new(
                s.get("items").map_or(Ty::Any, |i| from_schema(i, cx, depth + 1)),
            )),
            "object" => object_schema(s, cx, depth),
            _ => return Ty::Any,
        };
        for m in ty.members() {
            add_member(&mut out, m);
        }
    }
    match out.len() {
        0 => Ty::Any,
        1 => out.pop().unwrap_or(Ty::Any),
        _ => Ty::Union(out),
    }
}

/// A `$ref` fragment as a JSON pointer: percent-escapes decoded (`%24defs` is `$defs`).
fn pointer_unescaped(fragment: &str) -> String {
    if !fragment.contains('%') {
        return fragment.to_owned();
    }
    let b = fragment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = fragment.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(h, 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn object_schema<'a>(s: &'a serde_json::Map<String, Value>, cx: &mut Refs<'a>, depth: usize) -> Ty {
    let Some(Value::Object(props)) = s.get("properties") else {
        return Ty::open_object();
    };
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // As the field checks of SY405 read schemas: listed `properties` are all there is unless
    // `additionalProperties` (other than `false`) or `patternProperties` says otherwise.
    let open = s
        .get("additionalProperties")
        .is_some_and(|a| a != &Value::Bool(false))
        || s.contains_key("patternProperties");
    let mut fields: IndexMap<String, Field> = props
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Field {
                    ty: from_schema(v, cx, depth + 1),
                    always: required.contains(&k.as_str()),
                },
            )
        })
        .collect();
    // A required name the properties do not describe is there all the same, of any type.
    for name in required {
        fields.entry(name.to_owned()).or_insert(Field {
            ty: Ty::Any,
            always: true,
        });
    }
    Ty::Object(Obj { fields, open })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Ty {
        Ty::from_schema(&json!({
            "type": "object",
            "required": ["ticket"],
            "properties": {
                "ticket": {
                    "type": "object",
                    "required": ["id"],
                    "properties": {
                        "id": {"type": "integer"},
                        "subject": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "score": {"type": ["number", "null"]}
                    }
                },
                "meta": {"type": "object"}
            }
        }))
    }

    #[test]
    fn a_schema_gives_fields_their_types_and_presence() {
        let t = schema();
        let Lookup::Field {
            ty: ticket,
            always: true,
        } = t.field("ticket")
        else {
            panic!("{:?}", t.field("ticket"))
        };
        assert_eq!(
            ticket.field("id"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert_eq!(
            ticket.field("subject"),
            Lookup::Field {
                ty: Ty::String,
                always: false
            }
        );
        assert_eq!(
            ticket.field("tags"),
            Lookup::Field {
                ty: Ty::List(Box::new(Ty::String)),
                always: false
            }
        );
        assert_eq!(
            ticket.field("subjet"),
            Lookup::Missing {
                names: vec!["id", "subject", "tags", "score"]
            }
        );
        let Lookup::Field { ty: score, .. } = ticket.field("score") else {
            panic!()
        };
        assert_eq!(score.describe(), "integer or double or null");
        // `type: object` without properties says nothing of its fields.
        let Lookup::Field {
            ty: meta,
            always: false,
        } = t.field("meta")
        else {
            panic!()
        };
        assert_eq!(meta.field("anything"), Lookup::Unknown);
        assert_eq!(Ty::String.field("x"), Lookup::NotObject);
        assert_eq!(Ty::Any.field("x"), Lookup::Unknown);
    }

    #[test]
    fn a_field_written_on_one_path_only_is_maybe_absent_after_the_join() {
        let mut a = schema();
        a.set_path(&["route", "queue"], Ty::String);
        let b = schema();
        let joined = a.join(&b);
        let Lookup::Field {
            ty: route,
            always: false,
        } = joined.field("route")
        else {
            panic!("{:?}", joined.field("route"))
        };
        assert_eq!(
            route.field("queue"),
            Lookup::Field {
                ty: Ty::String,
                always: true
            }
        );
        // Written on both paths with different types: present, either type.
        let mut c = schema();
        c.set_path(&["route"], Ty::Int);
        let mut d = schema();
        d.set_path(&["route"], Ty::String);
        assert_eq!(
            c.join(&d).field("route"),
            Lookup::Field {
                ty: Ty::Union(vec![Ty::Int, Ty::String]),
                always: true
            }
        );
        assert_eq!(Ty::Any.join(&schema()), Ty::Any);
    }

    #[test]
    fn a_deep_merge_adds_fields_and_an_unknown_result_forgets_the_object() {
        let mut t = schema();
        t.merge(&Ty::of_value(
            &json!({"ticket": {"queue": "billing"}, "done": true}),
        ));
        let Lookup::Field { ty: ticket, .. } = t.field("ticket") else {
            panic!()
        };
        assert_eq!(
            ticket.field("id"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert_eq!(
            ticket.field("queue"),
            Lookup::Field {
                ty: Ty::String,
                always: true
            }
        );
        assert_eq!(
            t.field("done"),
            Lookup::Field {
                ty: Ty::Bool,
                always: true
            }
        );
        t.merge(&Ty::Any);
        assert_eq!(t, Ty::Any);
    }

    #[test]
    fn a_field_missing_from_an_open_side_is_unknown_after_the_join() {
        // Written on one path; the other path's payload is unknown: nothing is said of it.
        let mut a = Ty::open_object();
        a.set_path(&["x"], Ty::Int);
        let b = Ty::open_object();
        assert_eq!(a.join(&b).field("x"), Lookup::Unknown);
        assert_eq!(b.join(&a).field("x"), Lookup::Unknown);
        // Both closed: maybe absent.
        let c = Ty::of_value(&json!({"x": 1}));
        let d = Ty::of_value(&json!({}));
        assert_eq!(
            c.join(&d).field("x"),
            Lookup::Field {
                ty: Ty::Int,
                always: false
            }
        );
    }

    #[test]
    fn merging_into_an_unknown_value_keeps_it_open() {
        let mut t = Ty::Any;
        t.merge(&Ty::of_value(&json!({"a": 1})));
        assert_eq!(
            t.field("a"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert_eq!(t.field("other"), Lookup::Unknown);
        // Into an object or null: the object part merges, null is replaced.
        let mut u = Ty::of_value(&json!({"b": "s"})).join(&Ty::Null);
        u.merge(&Ty::of_value(&json!({"a": 1})));
        assert_eq!(
            u.field("a"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert_eq!(
            u.field("b"),
            Lookup::Field {
                ty: Ty::String,
                always: false
            }
        );
    }

    #[test]
    fn equality_is_possible_only_between_compatible_kinds() {
        assert!(!Ty::Int.can_equal(&Ty::String));
        assert!(Ty::Int.can_equal(&Ty::Double));
        assert!(Ty::number().can_equal(&Ty::Int));
        assert!(Ty::Union(vec![Ty::String, Ty::Null]).can_equal(&Ty::Null));
        assert!(!Ty::Bool.can_equal(&Ty::Union(vec![Ty::String, Ty::Null])));
        assert!(Ty::Any.can_equal(&Ty::String));
        assert!(Ty::List(Box::new(Ty::Int)).can_equal(&Ty::List(Box::new(Ty::String))));
    }

    #[test]
    fn a_required_field_without_properties_is_there_of_any_type() {
        let t = Ty::from_schema(&json!({
            "type": "object", "required": ["id", "n"], "properties": {"n": {"type": "integer"}}
        }));
        assert_eq!(
            t.field("id"),
            Lookup::Field {
                ty: Ty::Any,
                always: true
            }
        );
        assert_eq!(
            t.field("n"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert!(
            matches!(t.field("other"), Lookup::Missing { .. }),
            "{:?}",
            t.field("other")
        );
    }

    #[test]
    fn schemas_lint_cannot_follow_say_nothing() {
        for s in [json!(true), json!({"$ref": "#/x"}), json!({}), json!({"not": {}})] {
            assert_eq!(Ty::from_schema(&s), Ty::Any, "{s}");
        }
        assert_eq!(Ty::from_schema(&json!({"enum": ["a", "b"]})), Ty::String);
        // Objects in parts: all the parts' fields, others not ruled out.
        let parts = Ty::from_schema(&json!({"allOf": [
            {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}},
            {"type": "object", "properties": {"b": {"type": "string"}}, "additionalProperties": false}
        ]}));
        assert_eq!(
            parts.field("a"),
            Lookup::Field {
                ty: Ty::Int,
                always: true
            }
        );
        assert_eq!(
            parts.field("b"),
            Lookup::Field {
                ty: Ty::String,
                always: false
            }
        );
        assert_eq!(parts.field("c"), Lookup::Unknown);
        assert_eq!(
            Ty::from_schema(&json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})),
            Ty::Union(vec![Ty::String, Ty::Int])
        );
    }
}
