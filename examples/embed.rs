//! Switchyard as a library: load and lint a flow, register native agents (Rust functions the
//! flow calls as `kind: native`), run it recorded in the default SQLite store, and stream what
//! it does.
//!
//!   cargo run --example embed -- examples/embed.yaml '{"id": "t-1", "text": "the site is down"}'
//!
//! Prints each event as a JSON line on stderr and the run's output on stdout. The run is
//! recorded like one of `switchyard run`: `switchyard runs show RUN_ID` shows it, and a run
//! stopped part-way continues with `switchyard`'s own `resume` semantics through
//! `Switchyard::resume`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use switchyard::{ErrorKind, Flow, NativeCall, RunStatus, StepError, Switchyard};

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "examples/embed.yaml".into());
    let input: Value = match serde_json::from_str(
        &args
            .next()
            .unwrap_or_else(|| r#"{"id": "t-1", "text": "the site is down"}"#.into()),
    ) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: the input is not JSON: {e}");
            return ExitCode::from(2);
        }
    };

    // Loading lints: a flow with errors does not load, and the error renders every
    // diagnostic with its file, line and column, as `switchyard lint` does.
    let flow = match Flow::load(&path) {
        Ok(f) => f,
        Err(e) => {
            eprint!("{}", e.render(false, 100));
            return ExitCode::from(2);
        }
    };

    let store = std::env::var("SWITCHYARD_STORE").unwrap_or_else(|_| "sqlite:.switchyard/runs.db".into());
    let mut switchyard = match Switchyard::open(&store).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };

    // A pure function: no effect outside the run, so nothing is recorded before its calls.
    switchyard.register_pure("classify", |input: Value, _call: NativeCall| async move {
        let text = input["text"]
            .as_str()
            .ok_or_else(|| StepError::new(ErrorKind::Agent, "the input has no `text`"))?
            .to_lowercase();
        let category = if ["down", "outage", "500", "unreachable"]
            .iter()
            .any(|w| text.contains(w))
        {
            "outage"
        } else if ["charge", "invoice", "refund", "bill"]
            .iter()
            .any(|w| text.contains(w))
        {
            "billing"
        } else {
            "other"
        };
        Ok(json!({"category": category, "urgent": category == "outage"}))
    });

    // An agent with an effect (here a counter standing in for a pager's API): each attempt is
    // recorded as started before it is made, and the idempotency key is stable across retries
    // and resumes of the same step of the same run.
    let pages = Arc::new(AtomicU64::new(0));
    let counter = pages.clone();
    switchyard.register("pager", move |input: Value, call: NativeCall| {
        let counter = counter.clone();
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            eprintln!(
                "paging about ticket {} ({}), key {}",
                input["id"],
                input["category"],
                call.idempotency_key()
            );
            Ok(json!({"ticket": format!("PAGE-{n}")}))
        }
    });

    let mut events = switchyard.events();
    let printer = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let mut line = event.to_json();
            // The whole record is there for the application; a line per event is enough here.
            line.as_object_mut().map(|o| o.remove("record"));
            eprintln!("{line}");
        }
    });

    let outcome = match switchyard.run(&flow, input).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The stream ends with the run: the printer stops after its last event.
    let _ = printer.await;
    switchyard.close().await;

    match outcome.status {
        RunStatus::Succeeded => {
            println!("{}", outcome.output.unwrap_or(Value::Null));
            eprintln!("run {} succeeded in {} steps", outcome.run_id, outcome.steps);
            ExitCode::SUCCESS
        }
        status => {
            let why = outcome.error.map(|e| e.to_string()).unwrap_or_default();
            eprintln!("run {} ended {}: {why}", outcome.run_id, status.as_str());
            ExitCode::from(1)
        }
    }
}
