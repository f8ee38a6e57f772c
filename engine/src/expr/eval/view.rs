//! The lazy view of a JSON array or object.

use super::*;

/// The types of views: equal to cel's `list` and `map` (overloads such as `size` pick them),
/// but at their own addresses, so a view is told apart from cel's containers.
pub(super) static JSON_LIST_TYPE: Type = cel_types::LIST_TYPE;
pub(super) static JSON_MAP_TYPE: Type = cel_types::MAP_TYPE;

/// A JSON array (a CEL `list`) or object (a `map` with string keys), borrowed. Elements are
/// converted when reached; iterating converts the elements (or, for a map, the keys) once.
///
/// **Equality with cel's own lists and maps.** A view compares itself by content with any list
/// or map ([`json_equals`]), but cel's lists and maps only equal their own kind: `[1] ==
/// payload.v` asks the literal, which downcasts `payload.v` to a cel list. A view that
/// `stand_in`s answers that downcast with itself converted one level deep (its elements are
/// views again), built once: so the literal on the left, a list literal holding the view, and
/// `payload.v in [[1]]` all compare by content. Only expressions that can compare a view with
/// a container cel built get such views ([`stand_ins`]), as cel asks every value it reads a
/// field of whether it is an optional, which is such a downcast too.
#[derive(Debug)]
pub(super) struct JsonView<'a> {
    value: &'a Value,
    stand_in: bool,
    /// An array's converted elements, built on first iteration (or downcast).
    list: OnceLock<CelList<'a>>,
    /// An object's keys, in order, built on first iteration.
    keys: OnceLock<Vec<Box<dyn Val + 'a>>>,
    /// An object as a cel map, built on first downcast.
    map: OnceLock<CelMap<'a>>,
}

impl<'a> JsonView<'a> {
    pub(super) fn new(value: &'a Value, stand_in: bool) -> Self {
        JsonView {
            value,
            stand_in,
            list: OnceLock::new(),
            keys: OnceLock::new(),
            map: OnceLock::new(),
        }
    }

    fn is_list(&self) -> bool {
        self.value.is_array()
    }

    fn len(&self) -> usize {
        match self.value {
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            _ => 0,
        }
    }

    fn list(&self) -> &CelList<'a> {
        self.list.get_or_init(|| cel_list(self.value, self.stand_in))
    }

    fn map(&self) -> &CelMap<'a> {
        self.map.get_or_init(|| cel_map(self.value, self.stand_in))
    }

    fn items(&self) -> &[Box<dyn Val + 'a>] {
        match self.value {
            Value::Array(_) => self.list().inner(),
            // In ascending order, as a comprehension visits a map cel built ([`order`]): the
            // same map read from the payload or written as a literal is visited alike.
            Value::Object(m) => self.keys.get_or_init(|| {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort_unstable();
                keys.into_iter()
                    .map(|k| Box::new(CelString::from(k.as_str())) as Box<dyn Val + 'a>)
                    .collect()
            }),
            _ => &[],
        }
    }
}

/// A JSON array's elements as a cel list (of views, for nested containers).
pub(super) fn cel_list(value: &Value, stand_in: bool) -> CelList<'_> {
    let items = match value {
        Value::Array(a) => a.iter().map(|v| json_val(v, stand_in)).collect(),
        _ => Vec::new(),
    };
    CelList::from(items)
}

/// A JSON object as a cel map with string keys (of views, for nested containers).
pub(super) fn cel_map(value: &Value, stand_in: bool) -> CelMap<'_> {
    let entries: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = match value {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                (
                    CelMapKey::String(CelString::from(k.as_str())),
                    json_val(v, stand_in),
                )
            })
            .collect(),
        _ => HashMap::new(),
    };
    CelMap::from(entries)
}

impl Val for JsonView<'_> {
    fn get_type(&self) -> &Type {
        if self.is_list() {
            &JSON_LIST_TYPE
        } else {
            &JSON_MAP_TYPE
        }
    }

    /// Views have no single static type; only `add_overload!` asks, and it is never used
    /// with them.
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }

    fn as_adder<'b, 'v>(&'b self) -> Option<&'b (dyn Adder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    // The other arithmetic operators only fail on a view, but with its own type in the message
    // (cel would name the left operand by its `Value`, which a view has none of).
    fn as_subtractor<'b, 'v>(&'b self) -> Option<&'b (dyn Subtractor + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_multiplier<'b, 'v>(&'b self) -> Option<&'b (dyn Multiplier + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_divider<'b, 'v>(&'b self) -> Option<&'b (dyn Divider + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_modder<'b, 'v>(&'b self) -> Option<&'b (dyn Modder + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        json_equals(self.value, other)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(JsonView::new(self.value, self.stand_in))
    }

    /// Indexing a view cel owns goes through here once [`Val::as_builtin`] names a built-in
    /// type; it is the same indexing.
    fn into_indexer<'v>(self: Box<Self>) -> Option<Box<dyn Indexer + 'v>>
    where
        Self: 'v,
    {
        Some(self)
    }

    /// A view that stands in is, to cel, its own list or map (see [`JsonView`]).
    fn as_builtin<'b, 'v>(&'b self) -> BuiltinRef<'b, 'v>
    where
        Self: 'v,
    {
        match self.value {
            _ if !self.stand_in => BuiltinRef::Other,
            Value::Array(_) => BuiltinRef::List(self.list()),
            Value::Object(_) => BuiltinRef::Map(self.map()),
            _ => BuiltinRef::Other,
        }
    }

    /// Agrees with [`Val::as_builtin`], as cel requires.
    fn into_builtin<'v>(self: Box<Self>) -> Option<Builtin<'v>>
    where
        Self: 'v,
    {
        let JsonView {
            value,
            stand_in,
            list,
            map,
            ..
        } = *self;
        match value {
            _ if !stand_in => None,
            Value::Array(_) => Some(Builtin::List(
                list.into_inner().unwrap_or_else(|| cel_list(value, stand_in)),
            )),
            Value::Object(_) => Some(Builtin::Map(
                map.into_inner().unwrap_or_else(|| cel_map(value, stand_in)),
            )),
            _ => None,
        }
    }
}

impl Indexer for JsonView<'_> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        if idx.as_any().is_some_and(|a| a.is::<Probe>()) {
            return Ok(CowVal::owned(JsonClone(self.value.clone())));
        }
        match self.value {
            Value::Object(m) => match string_key(idx) {
                Some(key) => match m.get(key) {
                    Some(v) => Ok(CowVal::Owned(json_val(v, self.stand_in))),
                    None => Err(ExecutionError::no_such_key(key)),
                },
                // As cel's maps: another key type finds nothing, a value of no key type is
                // the wrong type.
                None if is_key_type(idx) => Err(ExecutionError::no_such_key(&key_text_of(idx))),
                None => Err(ExecutionError::UnexpectedType {
                    got: idx.get_type().name().to_owned(),
                    want: "map key".to_owned(),
                }),
            },
            Value::Array(items) => {
                let i = list_index(idx)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| items.get(i))
                    .map(|v| CowVal::Owned(json_val(v, self.stand_in)))
                    .ok_or_else(|| ExecutionError::IndexOutOfBounds(cel::Value::Int(i)))
            }
            _ => Err(ExecutionError::no_such_key(&key_text_of(idx))),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// A list index: an `int`, a `uint`, or a whole `double`.
pub(super) fn list_index(idx: &dyn Val) -> Result<i64, ExecutionError> {
    if let Some(i) = idx.downcast_ref::<CelInt>() {
        Ok(*i.inner())
    } else if let Some(u) = idx.downcast_ref::<CelUInt>() {
        Ok(i64::try_from(*u.inner()).unwrap_or(i64::MAX))
    } else if let Some(d) = idx.downcast_ref::<CelDouble>().map(|d| *d.inner())
        && d.fract() == 0.0
        && d.abs() < 9.0e15
    {
        Ok(d as i64)
    } else {
        Err(ExecutionError::UnexpectedType {
            got: idx.get_type().name().to_owned(),
            want: "int".to_owned(),
        })
    }
}

impl Container for JsonView<'_> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(match self.value {
            Value::Array(items) => items.iter().any(|item| json_equals(item, value)),
            Value::Object(m) => match string_key(value) {
                Some(k) => m.contains_key(k),
                None if is_key_type(value) => false,
                // As cel's maps: a value that can be no key is an error.
                None => {
                    return Err(ExecutionError::UnsupportedKeyType(
                        cel::Value::try_from(value).unwrap_or(cel::Value::Null),
                    ));
                }
            },
            _ => false,
        })
    }
}

/// `v` as a string map key. The kind is asked first: a downcast of a view that stands in
/// converts it.
pub(super) fn string_key(v: &dyn Val) -> Option<&str> {
    if v.get_type().kind() != Kind::String {
        return None;
    }
    v.downcast_ref::<CelString>().map(|s| s.inner())
}

/// Whether cel looks `v` up in a map (finding nothing where the keys are strings): a key
/// type, or a `double`.
pub(super) fn is_key_type(v: &dyn Val) -> bool {
    matches!(
        v.get_type().kind(),
        Kind::String | Kind::Int | Kind::UInt | Kind::Boolean | Kind::Double
    )
}

impl<'a> Iterable for JsonView<'a> {
    fn iter<'b, 'v>(&'b self) -> Box<dyn traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        Box::new(ItemIter(self.items().iter()))
    }
}

/// Lends the converted elements of a [`JsonView`].
pub(super) struct ItemIter<'b, 'a>(std::slice::Iter<'b, Box<dyn Val + 'a>>);

impl<'b, 'a: 'v, 'v> traits::Iterator<'b, 'v> for ItemIter<'b, 'a> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        self.0.next().map(|b| b.as_ref() as &(dyn Val + 'v))
    }
}

impl Sizer for JsonView<'_> {
    fn size(&self) -> CelInt {
        CelInt::from(i64::try_from(self.len()).unwrap_or(i64::MAX))
    }
}

impl Zeroer for JsonView<'_> {
    fn is_zero_value(&self) -> bool {
        self.len() == 0
    }
}

impl Adder for JsonView<'_> {
    fn add<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let rhs_items = rhs
            .as_iterable()
            .filter(|_| self.is_list() && rhs.get_type().kind() == Kind::List);
        let Some(rhs_items) = rhs_items else {
            return Err(no_overload("_+_", self, rhs));
        };
        let mut out: Vec<Box<dyn Val + 'v>> = Vec::with_capacity(self.len());
        if let Value::Array(items) = self.value {
            out.extend(
                items
                    .iter()
                    .map(|v| json_val(v, self.stand_in) as Box<dyn Val + 'v>),
            );
        }
        let mut it = rhs_items.iter();
        while let Some(v) = it.next() {
            out.push(v.clone_as_boxed());
        }
        Ok(CowVal::owned(CelList::from(out)))
    }
}

/// The error of an arithmetic operator on a view.
pub(super) fn no_overload(op: &str, lhs: &dyn Val, rhs: &dyn Val) -> ExecutionError {
    let word = match op {
        "_+_" => "add",
        "_-_" => "sub",
        "_*_" => "mul",
        "_/_" => "div",
        _ => "rem",
    };
    ExecutionError::UnsupportedBinaryOperator(word, message_value(lhs), message_value(rhs))
}

/// `v` as a cel value, for an error's message: a view, or a container holding views, converts
/// to no cel value, and is written as an empty one of its kind (the message names its type).
pub(super) fn message_value(v: &dyn Val) -> cel::Value {
    cel::Value::try_from(v).unwrap_or_else(|_| match v.get_type().kind() {
        Kind::List => cel::Value::List(Arc::default()),
        Kind::Map => cel::Value::from(std::collections::HashMap::<String, cel::Value>::new()),
        _ => cel::Value::Null,
    })
}

macro_rules! no_arithmetic {
    ($($trait:ident :: $method:ident => $op:literal),* $(,)?) => {$(
        impl $trait for JsonView<'_> {
            fn $method<'b, 'v>(&'b self, rhs: &(dyn Val + 'v)) -> Result<CowVal<'b, 'v>, ExecutionError>
            where
                Self: 'v,
            {
                Err(no_overload($op, self, rhs))
            }
        }
    )*};
}

no_arithmetic! {
    Subtractor::sub => "_-_",
    Multiplier::mul => "_*_",
    Divider::div => "_/_",
    Modder::modulo => "_%_",
}

/// Whether a JSON value equals a CEL value, by CEL's rules (`1 == 1.0`, lists element-wise,
/// maps by keys and values). Nothing is converted beyond a scalar on the stack.
pub(super) fn json_equals(j: &Value, other: &dyn Val) -> bool {
    match j {
        Value::Null => other.get_type().kind() == Kind::NullType,
        Value::Bool(b) => other.downcast_ref::<CelBool>().is_some_and(|o| o.inner() == b),
        Value::String(s) => string_key(other).is_some_and(|o| o == s),
        Value::Number(n) => number_val(n).equals(other),
        Value::Array(items) => {
            if other.get_type().kind() != Kind::List || !same_size(other, items.len()) {
                return false;
            }
            let Some(iterable) = other.as_iterable() else {
                return false;
            };
            let mut it = iterable.iter();
            items
                .iter()
                .all(|item| it.next().is_some_and(|o| json_equals(item, o)))
        }
        Value::Object(m) => {
            if other.get_type().kind() != Kind::Map || !same_size(other, m.len()) {
                return false;
            }
            let Some(indexer) = other.as_indexer() else {
                return false;
            };
            m.iter().all(|(k, v)| {
                indexer
                    .get(&CelString::from(k.as_str()))
                    .is_ok_and(|o| json_equals(v, &*o))
            })
        }
    }
}

pub(super) fn same_size(v: &dyn Val, len: usize) -> bool {
    v.as_sizer()
        .is_some_and(|s| usize::try_from(*s.size().inner()).is_ok_and(|n| n == len))
}

/// The key [`val_to_json`] indexes a view with to get a copy of its JSON in one piece.
#[derive(Debug)]
pub(super) struct Probe;

impl Val for Probe {
    fn get_type(&self) -> &Type {
        &cel_types::DYN_TYPE
    }
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(Probe)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for Probe {}

/// A copy of a view's JSON, handed out for a [`Probe`].
#[derive(Debug)]
pub(super) struct JsonClone(pub(super) Value);

impl Val for JsonClone {
    fn get_type(&self) -> &Type {
        &cel_types::DYN_TYPE
    }
    fn cel_type() -> &'static Type {
        &cel_types::DYN_TYPE
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(JsonClone(self.0.clone()))
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl StaticVal for JsonClone {}
