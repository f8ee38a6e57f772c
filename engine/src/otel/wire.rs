//! The OTLP/HTTP request body, written straight from a run tree's records: the protobuf
//! encoding of `ExportTraceServiceRequest` (opentelemetry-proto's `trace.proto`,
//! `common.proto`, `resource.proto`; the field numbers below are theirs), without building
//! the messages first. Building them cost two dozen allocations per span, on a thread that
//! competes with the runs for the machine; this costs none past the reused buffers. The
//! tests decode what it writes with the official message types (`opentelemetry-proto`).

use std::fmt::Write as _;

/// Wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

/// `SpanKind::SPAN_KIND_INTERNAL`.
const SPAN_KIND_INTERNAL: u64 = 1;
/// `SpanKind::SPAN_KIND_CLIENT`.
const SPAN_KIND_CLIENT: u64 = 3;
/// `StatusCode::STATUS_CODE_ERROR`.
const STATUS_CODE_ERROR: u64 = 2;

fn varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    // 7 bits a byte; 0 takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key(b: &mut Vec<u8>, field: u32, wire: u32) {
    varint(b, u64::from(field << 3 | wire));
}

/// The key of a length-delimited field and its length.
fn len_key(b: &mut Vec<u8>, field: u32, len: usize) {
    key(b, field, LEN);
    varint(b, len as u64);
}

fn bytes(b: &mut Vec<u8>, field: u32, v: &[u8]) {
    len_key(b, field, v.len());
    b.extend_from_slice(v);
}

fn fixed64(b: &mut Vec<u8>, field: u32, v: u64) {
    key(b, field, FIXED64);
    b.extend_from_slice(&v.to_le_bytes());
}

/// The encoded size of a length-delimited field of `len` bytes (fields 1 to 15).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// An attribute's value (`AnyValue`).
#[derive(Clone, Copy)]
pub(super) enum Val<'a> {
    S(&'a str),
    I(u64),
    F(f64),
}

impl<'a> From<&'a str> for Val<'a> {
    fn from(s: &'a str) -> Val<'a> {
        Val::S(s)
    }
}

impl From<u64> for Val<'_> {
    fn from(n: u64) -> Self {
        Val::I(n.min(i64::MAX as u64))
    }
}

impl From<f64> for Val<'_> {
    fn from(f: f64) -> Self {
        Val::F(f)
    }
}

fn any_len(v: Val<'_>) -> usize {
    match v {
        Val::S(s) => field_len(s.len()),
        Val::I(i) => 1 + varint_len(i),
        Val::F(_) => 1 + 8,
    }
}

fn kv_len(k: &str, v: Val<'_>) -> usize {
    field_len(k.len()) + field_len(any_len(v))
}

/// A `KeyValue` as field `field` of the message being written.
fn kv(b: &mut Vec<u8>, field: u32, k: &str, v: Val<'_>) {
    len_key(b, field, kv_len(k, v));
    bytes(b, 1, k.as_bytes());
    len_key(b, 2, any_len(v));
    match v {
        Val::S(s) => bytes(b, 1, s.as_bytes()),
        Val::I(i) => {
            key(b, 3, VARINT);
            varint(b, i);
        }
        Val::F(f) => {
            key(b, 4, FIXED64);
            b.extend_from_slice(&f.to_le_bytes());
        }
    }
}

/// One span, as its fields come from a record.
pub(super) struct SpanIn<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    /// Empty for a root span.
    pub parent_span_id: &'a [u8],
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: &'a [(&'a str, Val<'a>)],
    /// A `route` event at the span's end, to this step.
    pub route: Option<&'a str>,
    /// An error status: the error's kind and message.
    pub error: Option<(&'a str, &'a str)>,
    /// A call to another program (an MCP server): `SPAN_KIND_CLIENT`, else internal.
    pub client: bool,
}

/// Spans written so far for the next request, and the buffers reused for each span.
#[derive(Default)]
pub(super) struct Encoder {
    /// `ScopeSpans.spans` entries, each already keyed and length-prefixed.
    spans: Vec<u8>,
    count: usize,
    scratch: Vec<u8>,
    /// The span's name, written by the caller ([`Encoder::name`]).
    name: String,
}

impl Encoder {
    /// Spans waiting for the next request.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The buffer the next span's name is written into, cleared.
    pub fn name(&mut self) -> &mut String {
        self.name.clear();
        &mut self.name
    }

    /// Appends a span named by what [`Encoder::name`] was given.
    pub fn span(&mut self, s: &SpanIn<'_>) {
        let b = &mut self.scratch;
        b.clear();
        bytes(b, 1, s.trace_id);
        bytes(b, 2, s.span_id);
        if !s.parent_span_id.is_empty() {
            bytes(b, 4, s.parent_span_id);
        }
        bytes(b, 5, self.name.as_bytes());
        key(b, 6, VARINT);
        varint(
            b,
            if s.client {
                SPAN_KIND_CLIENT
            } else {
                SPAN_KIND_INTERNAL
            },
        );
        fixed64(b, 7, s.start_ns);
        fixed64(b, 8, s.end_ns);
        for (k, v) in s.attributes {
            kv(b, 9, k, *v);
        }
        if let Some(to) = s.route {
            const NAME: &str = "route";
            const KEY: &str = "switchyard.route.to";
            let attr = kv_len(KEY, Val::S(to));
            len_key(b, 11, 1 + 8 + field_len(NAME.len()) + field_len(attr));
            fixed64(b, 1, s.end_ns);
            bytes(b, 2, NAME.as_bytes());
            kv(b, 3, KEY, Val::S(to));
        }
        if let Some((kind, message)) = s.error {
            // `[kind] message`.
            let text = 1 + kind.len() + 2 + message.len();
            len_key(b, 15, field_len(text) + 1 + varint_len(STATUS_CODE_ERROR));
            len_key(b, 2, text);
            b.push(b'[');
            b.extend_from_slice(kind.as_bytes());
            b.extend_from_slice(b"] ");
            b.extend_from_slice(message.as_bytes());
            key(b, 3, VARINT);
            varint(b, STATUS_CODE_ERROR);
        }
        len_key(&mut self.spans, 2, self.scratch.len());
        self.spans.extend_from_slice(&self.scratch);
        self.count += 1;
    }

    /// The request body of the spans written so far (`ExportTraceServiceRequest`, one
    /// resource with `resource`'s attributes and one scope), and their count; the encoder
    /// starts over.
    pub fn request(&mut self, resource: &[(&str, Val<'_>)]) -> (Vec<u8>, usize) {
        let version = env!("CARGO_PKG_VERSION");
        let attributes: usize = resource.iter().map(|(k, v)| field_len(kv_len(k, *v))).sum();
        let scope = field_len("switchyard".len()) + field_len(version.len());
        let scope_spans = field_len(scope) + self.spans.len();
        let resource_spans = field_len(attributes) + field_len(scope_spans);
        let mut b = Vec::with_capacity(field_len(resource_spans));
        len_key(&mut b, 1, resource_spans);
        len_key(&mut b, 1, attributes);
        for (k, v) in resource {
            kv(&mut b, 1, k, *v);
        }
        len_key(&mut b, 2, scope_spans);
        len_key(&mut b, 1, scope);
        bytes(&mut b, 1, b"switchyard");
        bytes(&mut b, 2, version.as_bytes());
        b.extend_from_slice(&self.spans);
        self.spans.clear();
        (b, std::mem::take(&mut self.count))
    }
}

/// Writes `name` as a span's name: `{what} {id}`, or `{what} {id} [{i}]`.
pub(super) fn name(out: &mut String, what: &str, id: &str, iteration: Option<u64>) {
    out.push_str(what);
    out.push(' ');
    out.push_str(id);
    if let Some(i) = iteration {
        let _ = write!(out, " [{i}]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message as _;

    #[test]
    fn varint_lengths_match_what_is_written() {
        for v in [0, 1, 127, 128, 300, 16_383, 16_384, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn what_is_written_decodes_as_the_official_messages() {
        let mut enc = Encoder::default();
        let long = "x".repeat(300);
        for (i, parent) in [&b""[..], &[9u8; 8][..]].into_iter().enumerate() {
            name(enc.name(), "step", "classify", (i == 1).then_some(3));
            enc.span(&SpanIn {
                trace_id: &[7; 16],
                span_id: &[i as u8 + 1; 8],
                parent_span_id: parent,
                start_ns: 1_000_000,
                end_ns: 2_000_000 + i as u64,
                attributes: &[
                    ("switchyard.step", Val::S("classify")),
                    ("switchyard.attempt", Val::I(2)),
                    ("switchyard.cost_usd", Val::F(0.125)),
                    ("switchyard.long", Val::S(&long)),
                    ("big", Val::from(u64::MAX)),
                ],
                route: (i == 0).then_some("next ü"),
                error: (i == 1).then_some(("agent", "it broke")),
                client: false,
            });
        }
        assert_eq!(enc.count(), 2);
        let (body, n) = enc.request(&[
            ("service.name", Val::S("switchyard")),
            ("process.pid", Val::I(42)),
        ]);
        assert_eq!((n, enc.count()), (2, 0));
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("decodes");
        let rs = &req.resource_spans[0];
        let res = rs.resource.as_ref().unwrap();
        assert_eq!(res.attributes[0].key, "service.name");
        assert_eq!(
            (
                res.attributes[1].key.as_str(),
                res.attributes[1].value.clone().and_then(|v| v.value)
            ),
            ("process.pid", Some(Value::IntValue(42)))
        );
        let scope = &rs.scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "switchyard");
        assert_eq!(scope.scope.as_ref().unwrap().version, env!("CARGO_PKG_VERSION"));
        let spans = &scope.spans;
        assert_eq!(spans.len(), 2);
        let (a, b) = (&spans[0], &spans[1]);
        assert_eq!(
            (a.name.as_str(), b.name.as_str()),
            ("step classify", "step classify [3]")
        );
        assert_eq!(a.trace_id, vec![7; 16]);
        assert_eq!(
            (a.span_id.clone(), a.parent_span_id.clone()),
            (vec![1; 8], vec![])
        );
        assert_eq!(b.parent_span_id, vec![9; 8]);
        assert_eq!(a.kind, 1);
        assert_eq!(
            (a.start_time_unix_nano, b.end_time_unix_nano),
            (1_000_000, 2_000_001)
        );
        let attr = |s: &opentelemetry_proto::tonic::trace::v1::Span, k: &str| {
            s.attributes
                .iter()
                .find(|kv| kv.key == k)
                .and_then(|kv| kv.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            attr(a, "switchyard.step"),
            Some(Value::StringValue("classify".into()))
        );
        assert_eq!(attr(a, "switchyard.attempt"), Some(Value::IntValue(2)));
        assert_eq!(attr(a, "switchyard.cost_usd"), Some(Value::DoubleValue(0.125)));
        assert_eq!(attr(a, "switchyard.long"), Some(Value::StringValue(long.clone())));
        assert_eq!(attr(a, "big"), Some(Value::IntValue(i64::MAX)));
        assert_eq!(a.events.len(), 1);
        assert_eq!(
            (a.events[0].name.as_str(), a.events[0].time_unix_nano),
            ("route", 2_000_000)
        );
        assert_eq!(
            a.events[0].attributes[0].value.clone().and_then(|v| v.value),
            Some(Value::StringValue("next ü".into()))
        );
        assert!(a.status.is_none() && b.events.is_empty());
        let status = b.status.as_ref().unwrap();
        assert_eq!((status.code, status.message.as_str()), (2, "[agent] it broke"));
    }
}
