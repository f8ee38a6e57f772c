//! The one integration-test binary of Switchyard. It drives the real `switchyard` binary (and,
//! for the property tests, the library) the way users do:
//!
//! - [`lint_fixtures`]: YAML fixtures per rule with inline caret expectations;
//! - [`lint_agent_loops`]: agent loops that lint clean, the type of their answer, imported loops;
//! - [`snapshots`]: rendered human output, snapshot-tested with insta;
//! - [`cli`]: exit codes, output formats, `explain`, `--help`;
//! - [`change_files`]: agent-change files checked like flows by `lint`, `run` and `batch`;
//! - [`engine`]: runs and flow tests: every runtime semantic, through `run` and `test`;
//! - [`engine_commands`]: `command` agents: stdin, argv, environment, idempotency keys,
//!   failures, timeouts that kill the process group, capped output, secrets they print;
//! - [`files_command`]: files out of `command` agents (`$SWITCHYARD_OUTPUT_DIR`) and into
//!   them (`$SWITCHYARD_INPUT_DIR`), by hash, on SQLite and PostgreSQL;
//! - [`engine_context`]: `--context`, JSON texts that enter a run, `--allow` and
//!   `--agent-change`;
//! - [`batch_interrupts`]: interrupt steps through `run`, `batch`, `resume` and `runs cancel`;
//! - [`batch_stores`]: `batch` on PostgreSQL, the memory store, and a store that fails or is
//!   locked;
//! - [`corpus`]: hostile inputs (alias bombs, deep nesting, huge and binary files);
//! - [`fuzz`]: property tests over generated and mutated flows;
//! - [`expressions`]: property test of expressions: payload values compare as their literals;
//! - [`files_http_llm`]: files from and to `http` agents, attachments of `llm` agents;
//! - [`llm`] and [`http_agent`]: `llm` and `http` agents against local servers
//!   ([`mock_server`]): limits, retries, structured output, secrets;
//! - [`llm_cost`]: what `llm` calls cost: budgets, a batch's cost, a rate-limited batch of
//!   2,000 items, an abandoned request;
//! - [`llm_servers`]: servers people run locally: refused structured-output forms and their
//!   fallback, permanent server errors;
//! - [`redaction`]: secrets echoed back in other spellings reach no output, page or store;
//! - [`payload_types`]: the payload's type through the graph on real and schema-less flows;
//! - [`agent_loop_requests`]: what an agent loop's requests ask of the model: the answer's
//!   `response_format`, tool results as text, one tool call at a time;
//! - [`agent_loop_durable`]: agent loops through the binary and SQLite: a killed batch of loops,
//!   approvals end to end, and how `runs show` and `--trace` show a loop;
//! - [`inbox_cli`]: the inbox on the command line (SPEC §15): a bulk answer applied to exactly
//!   the previewed items, two `inbox decide`s raced, answers refused (schema, second, late),
//!   expiry settled by `inbox list`, `resume --decision` recorded, the decisions log;
//! - [`resume`]: what a stopped run records and tells: the flow hash over imports and called
//!   flows, the question of an interrupt and how to answer it;
//! - [`resume_changes`]: a stopped or killed run resumes under the agent changes it started
//!   with, and other changes are refused;
//! - [`cluster`]: many machines on PostgreSQL: `submit`, `worker` processes killed, frozen
//!   and cut off, a poison item, the drain, a store from a newer switchyard;
//! - [`cluster_bundle`]: a command's sibling modules shipped by `bundle:` patterns, and the
//!   warning when they are not;
//! - [`cluster_worker`]: a worker's heartbeat from its lease, and the runs it gives back when
//!   it cannot run their bundle;
//! - [`inbox_workers`]: decisions on PostgreSQL continued by workers exactly once each, expiry
//!   settled by a running worker, a worker killed with decided runs in hand;
//! - [`cluster_limits`]: a provider's rate limit and `max_concurrency` held by three workers
//!   together;
//! - [`one_writer`]: one writer per run: two `resume`s of one run raced on SQLite and
//!   PostgreSQL (an interrupt's decision, an agent loop's approval), a `resume` of a run a live
//!   process runs;
//! - [`memory_store`]: the peak memory of long loops on `--store memory`;
//! - [`time`]: `timestamp()`, `duration()` and the recorded `now` of a run tree;
//! - [`money`]: costs priced so that float sums drift, exact in every JSON output and shown
//!   with four decimals in every text, on SQLite and PostgreSQL;
//! - [`transcripts`]: agent loops seen wherever they run: transcripts of iterations, branches
//!   and child runs, the run page's timeline order and a waiting run's question, a batch page's
//!   flow and start.
//! - [`mcp`]: tools from MCP servers (the fixture server, `kind: mcp` steps, the pool of
//!   servers, their shutdown, `lint --mcp` and `mcp list`);
//! - [`mcp_serve`]: `mcp serve` driven by the official MCP Python SDK over stdio and HTTP, in
//!   both protocol revisions: tools and schemas, results, errors, a run that stops for a
//!   human and the run tools, progress, cancellation, the token and Origin checks, origin `mcp`;
//! - [`serve`]: `switchyard serve` over loopback HTTP: tokens, scopes, sessions and `Origin`;
//!   decisions (one answer wins, schema violations record nothing), bulk, runs started once
//!   per idempotency key, server-sent events, decided runs continued by the server;
//! - [`mcp_conformance`]: the official MCP conformance suite against `mcp serve --http`;
//! - [`mcp_loop`]: MCP tools in agent loops (definitions from `tools/list`, tool messages,
//!   names that collide), approvals of MCP calls, a server's questions answered by `resume`,
//!   a loop killed with an MCP call in flight;
//! - [`mcp_real`]: MCP servers people run (the reference everything server, the time server)
//!   over stdio, `lint --mcp` and `mcp list` against them, and batches of thousands of calls
//!   through one fixture server process, finished or stopped with SIGINT;
//! - [`mcp_stranger`]: MCP features where they meet the rest: a plain step's approval in
//!   `runs show` and the run page, bad server definitions, a loop of MCP tools over budget;
//! - [`files_tree`]: files from MCP tools (a plain step, an agent loop's tool call) and from
//!   mocks, gathered up the run tree (iterations, branches, child runs), once each after a
//!   kill -9 and `resume` and after a worker's takeover on PostgreSQL; flow tests and lint of
//!   mocked files;
//! - [`files_stranger`]: files together with the rest: the directories a killed switchyard
//!   left, `--files` and `--output` pointed at a file, a damaged store read back;
//! - [`layers`]: `engine/src`'s modules use only the layers below their own, and no files
//!   import each other;
//! - [`inbox_expiry`]: an agent loop's approval with `approve_expires`: an inbox item whose
//!   schema takes the three decisions, rejected (the model told) or failed `timeout` once it
//!   expired, a late decision refused;
//! - [`library`]: the crate root as an application uses it: `examples/approve.rs` run to its
//!   question and resumed, an approval's pending calls in the outcome, event streams that end.

mod agent_loop;
mod agent_loop_durable;
mod agent_loop_requests;
mod agent_loop_tests;
mod batch;
mod batch_interrupts;
mod batch_stores;
mod budget;
mod change_files;
mod cli;
mod cluster;
mod cluster_bundle;
mod cluster_limits;
mod cluster_worker;
mod corpus;
mod embed;
mod engine;
mod engine_commands;
mod engine_context;
mod expressions;
mod files_command;
mod files_http_llm;
mod files_limits;
mod files_out;
mod files_stranger;
mod files_tree;
mod fuzz;
mod graph;
mod http_agent;
mod inbox_cli;
mod inbox_expiry;
mod inbox_stranger;
mod inbox_workers;
mod layers;
mod library;
mod lint_agent_loops;
mod lint_fixtures;
mod llm;
mod llm_cost;
mod llm_servers;
mod logs;
mod mcp;
mod mcp_conformance;
mod mcp_flow_tests;
mod mcp_http_sessions;
mod mcp_lint_live;
mod mcp_loop;
mod mcp_real;
mod mcp_serve;
mod mcp_stranger;
mod memory_store;
mod mock_server;
mod money;
mod one_writer;
mod otel;
mod otel_mcp;
mod payload_types;
mod readme;
mod redaction;
mod report;
mod resume;
mod resume_changes;
mod serve;
mod serve_pages;
mod snapshots;
mod store;
mod store_queue;
mod support;
mod time;
mod transcripts;
