//! `providers:`: OpenAI-compatible endpoints, their limits, prices and structured-output form.

use indexmap::IndexMap;

use super::cx::Cx;
use super::read::{check_ident, check_keys, duration, enum_, f64_, map, named, string, string_map, u64_};
use crate::diag::{Diagnostic, codes};
use crate::model::*;
use crate::syntax::{Key, Node};

pub(super) fn providers(cx: &mut Cx, node: &Node) -> IndexMap<String, Provider> {
    named(cx, node, "`providers`", |cx, k, v| {
        check_ident(cx, "provider", k);
        provider(cx, k, v)
    })
}

const PROVIDER_KEYS: &[&str] = &[
    "base_url",
    "api_key",
    "headers",
    "max_concurrency",
    "rate_limit",
    "prices",
    "timeout",
    "structured_output",
    "assume_tokens_per_call",
];

fn provider(cx: &mut Cx, key: &Key, node: &Node) -> Option<Provider> {
    let m = map(cx, node, "a provider")?;
    check_keys(cx, m, "a provider", PROVIDER_KEYS);
    let base_url = match node.get("base_url") {
        Some(n) => string(cx, n),
        None => {
            cx.push(
                Diagnostic::new(
                    &codes::MISSING_KEY,
                    key.span,
                    format!("provider `{}` has no `base_url`", key.name),
                )
                .help("add `base_url: http://127.0.0.1:8000/v1` (an OpenAI-compatible endpoint)"),
            );
            None
        }
    };
    Some(Provider {
        name: Sp::new(key.name.clone(), key.span),
        base_url: base_url.unwrap_or_else(|| Sp::new(String::new(), key.span)),
        api_key: node.get("api_key").and_then(|n| string(cx, n)),
        headers: node
            .get("headers")
            .map(|n| string_map(cx, n, "`headers`"))
            .unwrap_or_default(),
        max_concurrency: node.get("max_concurrency").and_then(|n| u64_(cx, n)),
        assume_tokens_per_call: node.get("assume_tokens_per_call").and_then(|n| u64_(cx, n)),
        rate_limit: node.get("rate_limit").and_then(|n| {
            let m = map(cx, n, "`rate_limit`")?;
            check_keys(
                cx,
                m,
                "`rate_limit`",
                &["requests_per_minute", "tokens_per_minute"],
            );
            Some(RateLimit {
                requests_per_minute: n.get("requests_per_minute").and_then(|n| u64_(cx, n)),
                tokens_per_minute: n.get("tokens_per_minute").and_then(|n| u64_(cx, n)),
            })
        }),
        prices: node
            .get("prices")
            .map(|n| {
                named(cx, n, "`prices`", |cx, k, v| {
                    let m = map(cx, v, "a price")?;
                    check_keys(cx, m, "a price", &["input_per_mtok", "output_per_mtok"]);
                    let field = |cx: &mut Cx, f: &str| match v.get(f) {
                        Some(n) => f64_(cx, n),
                        None => {
                            cx.push(Diagnostic::new(
                                &codes::MISSING_KEY,
                                k.span,
                                format!("price of `{}` has no `{f}`", k.name),
                            ));
                            None
                        }
                    };
                    Some(Price {
                        input_per_mtok: field(cx, "input_per_mtok")?,
                        output_per_mtok: field(cx, "output_per_mtok")?,
                    })
                })
            })
            .unwrap_or_default(),
        timeout: node.get("timeout").and_then(|n| duration(cx, n)),
        structured_output: node.get("structured_output").and_then(|n| {
            enum_(
                cx,
                n,
                "structured output form",
                &[
                    ("json_schema", StructuredOutput::JsonSchema),
                    ("json_object", StructuredOutput::JsonObject),
                    ("prompt", StructuredOutput::Prompt),
                ],
            )
        }),
    })
}
