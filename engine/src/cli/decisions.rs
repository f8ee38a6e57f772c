//! `switchyard decisions log` (SPEC §15): the append-only audit of every answer the inbox
//! recorded — who, how, what, why, and when.

use std::time::Duration;

use serde_json::Value;

use super::common::{self, StoreArg};
use super::runs_decisions::plain;
use crate::record::inbox::format_ms;
use crate::store::Store;
use crate::store::inbox::LogQuery;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: DecisionsCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DecisionsCommand {
    /// Every recorded answer, oldest first.
    Log(LogArgs),
}

#[derive(clap::Args, Debug)]
#[command(
    after_long_help = "Each row: {\"id\", \"item_id\", \"run_id\", \"actor\", \"via\", \"decision\", \"reason\", \
\"edited\", \"bulk_id\", \"at\"}; `via` is `cli` (`inbox decide`, `inbox bulk`, `resume --decision`), `api` or \
`ui` (`serve`); `at` is an RFC 3339 UTC string. Refused answers are not recorded."
)]
pub struct LogArgs {
    /// Only the answers to this run's questions (a root run includes its child runs').
    #[arg(long, value_name = "RUN_ID")]
    pub run: Option<String>,
    /// Only answers from this time on: RFC 3339 (`2026-12-05T09:00:00Z`) or a duration meaning
    /// that long ago (`90s`, `15m`, `1h`, `2d`).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    pub since: Option<u64>,
    /// One JSON object per line.
    #[arg(long)]
    pub jsonl: bool,
    #[command(flatten)]
    pub store: StoreArg,
}

/// `--since`: Unix milliseconds.
fn parse_since(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return u64::try_from(t.as_millisecond())
            .map_err(|_| format!("`{s}` is before 1970: no decision is that old"));
    }
    let ago = match s.strip_suffix('d').and_then(|n| n.parse::<f64>().ok()) {
        Some(days) if days.is_finite() && (0.0..1e6).contains(&days) => {
            Some(Duration::from_secs_f64(days * 86_400.0))
        }
        _ => crate::model::build::parse_duration(s),
    };
    match ago {
        Some(d) => {
            Ok(crate::record::now_ms().saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
        }
        None => Err(format!(
            "`{s}` is neither an RFC 3339 time (`2026-12-05T09:00:00Z`) nor a duration (`90s`, `15m`, `1h`, `2d`)"
        )),
    }
}

pub fn run(args: Args) -> u8 {
    match args.command {
        DecisionsCommand::Log(a) => log(a),
    }
}

fn log(args: LogArgs) -> u8 {
    let query = LogQuery {
        run: args.run.clone(),
        since: args.since,
        limit: None,
    };
    let out = common::with_store(&args.store, common::Use::Read, async |store| {
        store.inbox().log(&query).await
    });
    let rows = match out {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return common::fail(e),
        Err(e) => return common::fail(e),
    };
    if args.jsonl {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        for d in &rows {
            let _ = writeln!(out, "{}", super::inbox::decision_json(d));
        }
        return super::exit::OK;
    }
    if rows.is_empty() {
        println!("no decisions recorded");
        return super::exit::OK;
    }
    for d in &rows {
        println!(
            "{}  {}  {} ({})  item {}  run {}  {}{}{}",
            format_ms(d.at),
            d.id,
            plain(&d.actor),
            d.via.as_str(),
            d.item_id,
            d.run_id,
            serde_json::to_string(&d.decision).unwrap_or_else(|_| Value::Null.to_string()),
            d.reason
                .as_deref()
                .map(|r| format!("  reason: {}", plain(r)))
                .unwrap_or_default(),
            d.bulk_id
                .as_deref()
                .map(|b| format!("  bulk {}", plain(b)))
                .unwrap_or_default(),
        );
    }
    super::exit::OK
}
