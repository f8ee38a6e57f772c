//! The registry of lint codes: stable code, kebab-case name, default severity, one-line summary
//! and the long explanation shown by `switchyard explain`.
//!
//! Codes never change meaning once published. `SY1xx` syntax and shape, `SY2xx` references and
//! graph, `SY3xx` loops and limits, `SY4xx` expressions and mappings, `SY5xx` agents and security.

use super::Severity;

#[derive(Debug, PartialEq, Eq)]
pub struct Rule {
    pub code: &'static str,
    pub name: &'static str,
    pub severity: Severity,
    pub summary: &'static str,
    /// Markdown: What it does / Why is this bad / Example / Use instead.
    pub doc: &'static str,
}

macro_rules! rules {
    ($($ident:ident = $code:literal, $name:literal, $sev:ident, $summary:literal;)*) => {
        $(
            pub static $ident: Rule = Rule {
                code: $code,
                name: $name,
                severity: Severity::$sev,
                summary: $summary,
                doc: include_str!(concat!("explain/", $code, ".md")),
            };
        )*
        /// Every rule, in code order.
        pub static RULES: &[&Rule] = &[$(&$ident),*];
    };
}

rules! {
    YAML_SYNTAX = "SY100", "yaml-syntax", Error, "the file is not valid YAML (or not UTF-8 text)";
    YAML_BUDGET = "SY101", "yaml-budget-exceeded", Error, "the file exceeds a hard parsing limit (size, depth, nodes, aliases)";
    DUPLICATE_KEY = "SY102", "duplicate-key", Error, "a mapping has the same key twice";
    UNKNOWN_KEY = "SY103", "unknown-key", Error, "a key that this place does not accept";
    INVALID_TYPE = "SY104", "invalid-type", Error, "a value of the wrong type (a list where a map is expected, ...)";
    MISSING_KEY = "SY105", "missing-key", Error, "a required key is missing";
    INVALID_IDENTIFIER = "SY106", "invalid-identifier", Error, "a step, agent, provider or flow name that is not a valid identifier";
    RESERVED_IDENTIFIER = "SY107", "reserved-identifier", Error, "`end` used as a step id";
    INVALID_VALUE = "SY108", "invalid-value", Error, "a value outside its allowed set (a duration, a size, an enum)";
    STEP_KIND = "SY109", "step-kind", Error, "a step with no kind key, or with more than one";
    UNKNOWN_STEP = "SY201", "unknown-step", Error, "a reference to a step that does not exist";
    UNKNOWN_AGENT = "SY202", "unknown-agent", Error, "a reference to an agent that does not exist";
    UNKNOWN_PROVIDER = "SY203", "unknown-provider", Error, "a reference to a provider that does not exist";
    DUPLICATE_DEFINITION = "SY204", "duplicate-definition", Error, "an agent or provider defined twice across imports";
    UNREACHABLE_STEP = "SY205", "unreachable-step", Error, "a step that no path from `start` reaches";
    EDGE_CYCLE = "SY206", "edge-cycle", Error, "edges that form a cycle";
    FLOW_CALL_CYCLE = "SY207", "flow-call-cycle", Error, "flows that call each other in a cycle";
    IMPORT_CYCLE = "SY208", "import-cycle", Error, "files that import each other in a cycle";
    PATH_OUTSIDE_ROOT = "SY209", "path-outside-root", Error, "a file path that leaves the project root";
    MISSING_FILE = "SY210", "missing-file", Error, "an imported, called or referenced file that cannot be read";
    MISSING_FALLBACK = "SY211", "missing-fallback", Warning, "conditional edges with no unconditional fallback for the outcome";
    UNKNOWN_BRANCH = "SY212", "unknown-branch", Error, "a reference to a `parallel` branch that does not exist";
    UNKNOWN_CHANGE_TARGET = "SY213", "unknown-change-target", Error, "an agent-change file names an agent or flow that the flows it is checked with do not have";
    ERROR_KIND_NEVER_RAISED = "SY214", "error-kind-never-raised", Error, "a failure edge's `errors:` names a kind its step never fails with (a `foreach` fails with `limit`, `mapping` or `expression`)";
    UNKNOWN_MCP_SERVER = "SY215", "unknown-mcp-server", Error, "an `mcp` agent whose `server` is not under `mcp_servers:`";
    WHILE_WITHOUT_BOUND = "SY301", "while-without-bound", Error, "a `while` loop without `max_iterations`";
    LIMIT_OUT_OF_RANGE = "SY302", "limit-out-of-range", Error, "a limit, count or bound outside its allowed range";
    JSONPATH_SYNTAX = "SY401", "jsonpath-syntax", Error, "a JSONPath that does not parse";
    NON_SINGULAR_DESTINATION = "SY402", "non-singular-destination", Error, "a destination path that can match more than one place";
    EXPRESSION_SYNTAX = "SY403", "expression-syntax", Error, "a CEL expression that does not parse";
    UNKNOWN_VARIABLE = "SY404", "unknown-variable", Error, "an expression or template variable that is not in scope here";
    UNKNOWN_FIELD = "SY405", "unknown-field", Error, "a field that the declared JSON Schema does not have";
    TEMPLATE_SYNTAX = "SY406", "template-syntax", Error, "a template that does not parse";
    STEP_MAY_NOT_HAVE_RUN = "SY407", "step-may-not-have-run", Error, "`steps.x` referenced where `x` has not run on every path";
    PARALLEL_OUTPUT_CONFLICT = "SY408", "parallel-output-conflict", Error, "two `parallel` branches whose outputs can write the same path";
    INVALID_SCHEMA = "SY409", "invalid-schema", Error, "a JSON Schema that is not valid";
    UNKNOWN_FUNCTION = "SY410", "unknown-function", Error, "a call of a function or macro that does not exist, or not the way it is called";
    WRONG_ARGUMENT_COUNT = "SY411", "wrong-argument-count", Error, "a call of a function or macro with a number of arguments it does not take";
    UNKNOWN_PAYLOAD_FIELD = "SY412", "unknown-payload-field", Error, "a `payload` field read that cannot exist on the path to it";
    MAYBE_ABSENT_FIELD = "SY413", "maybe-absent-field", Warning, "a `payload` field read that is there on some paths only, without a `has()` guard";
    SOURCE_NEVER_MATCHES = "SY414", "source-never-matches", Error, "a mapping, `foreach` or `select` source path that can never match";
    COMPARISON_NEVER_TRUE = "SY415", "comparison-never-true", Error, "a comparison or `in` between types that can never be equal, or an ordering CEL cannot do";
    ARITHMETIC_TYPE_MISMATCH = "SY416", "arithmetic-type-mismatch", Error, "arithmetic on types CEL has no operator for (a string times a number, ...)";
    CONDITION_NOT_BOOL = "SY417", "condition-not-bool", Error, "an `if:`, `while:`, operand of `&&`/`||`/`!` or `?:` condition whose value is known and is not a boolean";
    ARGUMENT_TYPE_MISMATCH = "SY418", "argument-type-mismatch", Error, "a call whose argument has a known type the function does not take (`file(1)`)";
    CAPABILITY_NOT_ALLOWED = "SY501", "capability-not-allowed", Error, "an agent kind outside the flow's `allow` list";
    UNUSED_RESULT = "SY502", "unused-result", Warning, "an agent step whose result is neither mapped nor referenced";
    LITERAL_SECRET = "SY503", "literal-secret", Warning, "a literal that looks like a secret";
    SHELL_WITH_TEMPLATE = "SY504", "shell-with-template", Warning, "a `command` agent that runs a shell with templated input";
    HOST_NOT_ALLOWED = "SY505", "host-not-allowed", Error, "an `http` agent or LLM provider whose host is outside the flow's `allow_hosts`";
    UNKNOWN_TOOL = "SY506", "unknown-tool", Error, "an `until_tool` or `approve` entry that is not one of the agent loop's tools";
    TOOL_CYCLE = "SY507", "tool-cycle", Error, "an agent loop whose tools include its own agent, directly or through other agent loops";
    LOOP_SETTING_WITHOUT_TOOLS = "SY508", "loop-setting-without-tools", Warning, "`max_iterations`, `max_parallel_tools`, `until_tool`, `approve`, `approve_expires` or `on_expire` on an `llm` agent without `tools`";
    TOOL_INPUT_NOT_OBJECT = "SY509", "tool-input-not-object", Error, "a tool whose `input_schema` does not describe an object";
    MCP_TOOL_NOT_ALLOWED = "SY510", "mcp-tool-not-allowed", Error, "an MCP tool named by an `mcp` agent, an agent loop's `tools` (`server.tool`), `approve`, `no_approval` or `idempotent` that its server's `tools:` allowlist leaves out";
    SECRET_IN_MCP_TARGET = "SY511", "secret-in-mcp-target", Error, "a secret reference in an MCP server's `url` or `command`, where it would be seen and logged";
    TOOL_NAME_COLLISION = "SY512", "tool-name-collision", Error, "two tools of an agent loop offered to the model under one name (`<server>__<tool>`, cut to 64 characters, or an agent of that name)";
    MCP_SERVER_UNREACHABLE = "SY513", "mcp-server-unreachable", Error, "an MCP server that `lint --mcp` cannot start, reach or list the tools of";
    MCP_TOOL_NOT_LISTED = "SY514", "mcp-tool-not-listed", Error, "a tool named by an `mcp` agent, a server's `tools:` or `approve:`, or an agent loop's `tools`/`approve` that the live server does not list (`lint --mcp`)";
    EXPIRY_WITHOUT_APPROVAL = "SY515", "expiry-without-approval", Warning, "`approve_expires` or `on_expire` on an agent loop that asks for no approval, or `on_expire` without `approve_expires`";
}

/// The rule with this code (`SY201`) or name (`unknown-step`), case-insensitive.
pub fn find(code_or_name: &str) -> Option<&'static Rule> {
    RULES
        .iter()
        .copied()
        .find(|r| r.code.eq_ignore_ascii_case(code_or_name) || r.name.eq_ignore_ascii_case(code_or_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_sorted() {
        for w in RULES.windows(2) {
            assert!(w[0].code < w[1].code, "{} before {}", w[0].code, w[1].code);
        }
        let mut names: Vec<_> = RULES.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
    }

    const SECTIONS: [&str; 4] = ["What it does", "Why is this bad", "Example", "Use instead"];

    /// The body of each of [`SECTIONS`] in `doc`, in order; panics naming the rule when a section
    /// is missing, repeated or out of order.
    fn sections(r: &Rule) -> Vec<&'static str> {
        let doc = r.doc;
        let starts: Vec<(usize, usize)> = SECTIONS
            .iter()
            .map(|s| {
                let heading = format!("\n## {s}\n");
                let found: Vec<usize> = doc.match_indices(&heading).map(|(i, _)| i).collect();
                assert_eq!(found.len(), 1, "{} needs exactly one `## {s}`", r.code);
                (found[0], found[0] + heading.len())
            })
            .collect();
        assert!(
            starts.windows(2).all(|w| w[0].0 < w[1].0),
            "{}: sections out of order",
            r.code
        );
        (0..SECTIONS.len())
            .map(|i| &doc[starts[i].1..starts.get(i + 1).map_or(doc.len(), |n| n.0)])
            .collect()
    }

    /// The content of the one ```yaml block of a section.
    fn yaml_block<'a>(code: &str, section: &str, body: &'a str) -> &'a str {
        assert_eq!(
            body.matches("```yaml\n").count(),
            1,
            "{code}: `## {section}` needs one ```yaml block"
        );
        let start = body.find("```yaml\n").expect("counted above") + "```yaml\n".len();
        let len = body[start..]
            .find("```")
            .unwrap_or_else(|| panic!("{code}: unclosed block in `## {section}`"));
        &body[start..start + len]
    }

    #[test]
    fn every_rule_has_an_explanation_with_examples() {
        for r in RULES {
            let title = r.doc.lines().next().unwrap_or_default();
            assert_eq!(
                title,
                format!("# {} {}", r.code, r.name),
                "{}: the first line names the rule",
                r.code
            );
            let headings = r.doc.lines().filter(|l| l.starts_with("## ")).count();
            assert_eq!(headings, SECTIONS.len(), "{}: only the four sections", r.code);
            assert_eq!(
                r.doc.matches("```").count() % 2,
                0,
                "{}: unbalanced code fences",
                r.code
            );

            let bodies = sections(r);
            for (section, body) in SECTIONS.iter().zip(&bodies) {
                assert!(!body.trim().is_empty(), "{}: `## {section}` is empty", r.code);
            }
            for (section, body) in SECTIONS.iter().zip(&bodies).take(2) {
                assert!(
                    !body.contains("```"),
                    "{}: `## {section}` is prose, not code",
                    r.code
                );
                assert!(
                    body.trim().len() >= 40,
                    "{}: `## {section}` says too little",
                    r.code
                );
            }
            let bad = yaml_block(r.code, "Example", bodies[2]);
            let good = yaml_block(r.code, "Use instead", bodies[3]);
            for (section, block) in [("Example", bad), ("Use instead", good)] {
                let has_yaml = block
                    .lines()
                    .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
                assert!(
                    has_yaml,
                    "{}: the ```yaml block of `## {section}` is empty",
                    r.code
                );
            }
            assert_ne!(
                bad.trim(),
                good.trim(),
                "{}: the fixed example repeats the bad one",
                r.code
            );
        }
    }
}
