//! Switchyard as a library, a run that waits for a person: run a flow that stops at an
//! `interrupt` step, read what it waits for from the run's outcome (the question and the
//! schema a decision must match), and resume it with a decision.
//!
//!   cargo run --example approve -- '{"customer": "C-9", "amount": 40}' '{"approved": true}'
//!
//! Without a decision on the command line, a rule stands in for the person: amounts up to 100
//! are approved. Prints the question and the events of each call on stderr, the output on
//! stdout. Everything here is imported from the crate root, as an application would.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use switchyard::{
    DecisionRow, Event, Flow, NativeCall, Question, ResumeOptions, RunOutcome, RunStatus, Switchyard,
    WaitingFor,
};

/// What [`approve`] saw: the question the run stopped at, the resumed run's outcome, the
/// events of the two calls (each stream read to its end) and the refunds the native agent
/// made.
pub struct Approved {
    pub waiting: WaitingFor,
    pub outcome: RunOutcome,
    pub events: Vec<Vec<Event>>,
    pub refunds: Vec<Value>,
    /// The decisions the inbox recorded for the run: the one given here, via `library`.
    pub decisions: Vec<DecisionRow>,
}

/// Runs the flow at `path` on `input`, recorded in the store at `store`; it stops at its
/// `interrupt`, and `decide` answers the question; the run resumes with that decision.
pub async fn approve(
    path: &str,
    store: &str,
    input: Value,
    decide: impl Fn(&WaitingFor) -> Value,
) -> Result<Approved, String> {
    let flow = Flow::load(path).map_err(|e| e.render(false, 100))?;
    let mut switchyard = Switchyard::open(store).await.map_err(|e| e.to_string())?;

    // The refund: an effect outside the run, so each attempt is recorded before it is made.
    let refunds = Arc::new(Mutex::new(Vec::new()));
    let made = refunds.clone();
    switchyard.register("refund", move |input: Value, call: NativeCall| {
        let made = made.clone();
        async move {
            made.lock().expect("not poisoned").push(input);
            Ok(json!({"refund_id": format!("R-{}", call.idempotency_key())}))
        }
    });

    let mut events = Vec::new();
    // The first call: it stops at the question. Its event stream ends with it.
    let first = watch(&switchyard);
    let stopped = switchyard.run(&flow, input).await.map_err(|e| e.to_string())?;
    events.push(first.await.map_err(|e| e.to_string())?);
    if stopped.status != RunStatus::Interrupted {
        return Err(format!(
            "the run ended {} without asking",
            stopped.status.as_str()
        ));
    }
    let waiting = stopped
        .waiting
        .clone()
        .ok_or("the run stopped `interrupted` but waits for nothing")?;
    if let Question::Interrupt(q) = &waiting.question {
        eprintln!(
            "run {} asks at step `{}`: {}",
            stopped.run_id,
            waiting.step,
            q.prompt.as_deref().unwrap_or("(no prompt)")
        );
        if let Some(schema) = &q.schema {
            eprintln!("  the decision must match {schema}");
        }
    }

    // The second call: the decision given to the run that stopped (the root run).
    let decision = decide(&waiting);
    eprintln!("decision: {decision}");
    let second = watch(&switchyard);
    let outcome = switchyard
        .resume(
            &flow,
            &stopped.run_id,
            ResumeOptions::default().decision(decision),
            Default::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    events.push(second.await.map_err(|e| e.to_string())?);
    // The decision is on record, as the inbox keeps it: who, how, what and when.
    let decisions = switchyard
        .decisions(&stopped.run_id)
        .await
        .map_err(|e| e.to_string())?;
    for d in &decisions {
        eprintln!(
            "decided by {} via {} at {} ms: {}",
            d.actor,
            d.via.as_str(),
            d.at,
            d.decision
        );
    }
    switchyard.close().await;
    let refunds = refunds.lock().expect("not poisoned").clone();
    Ok(Approved {
        waiting,
        outcome,
        events,
        refunds,
        decisions,
    })
}

/// A task reading the event stream of the next call to its end (the stream closes after the
/// call's last event), printing each event.
fn watch(switchyard: &Switchyard) -> tokio::task::JoinHandle<Vec<Event>> {
    let mut stream = switchyard.events();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(event) = stream.next().await {
            let mut line = event.to_json();
            line.as_object_mut().map(|o| o.remove("record"));
            eprintln!("  {line}");
            seen.push(event);
        }
        seen
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let input = args
        .next()
        .unwrap_or_else(|| r#"{"customer": "C-9", "amount": 40}"#.into());
    let given = args.next();
    let parse = |text: &str, what: &str| {
        serde_json::from_str::<Value>(text).map_err(|e| format!("the {what} is not JSON: {e}"))
    };
    let input = match parse(&input, "input") {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let decision = match given.as_deref().map(|d| parse(d, "decision")).transpose() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let amount = input["amount"].as_f64().unwrap_or(f64::INFINITY);
    let decide = |_: &WaitingFor| {
        decision
            .clone()
            .unwrap_or_else(|| json!({"approved": amount <= 100.0, "note": "by the rule of 100"}))
    };
    let store = std::env::var("SWITCHYARD_STORE").unwrap_or_else(|_| "memory".into());
    match approve("examples/approve.yaml", &store, input, decide).await {
        Ok(done) if done.outcome.status == RunStatus::Succeeded => {
            println!("{}", done.outcome.output.unwrap_or(Value::Null));
            ExitCode::SUCCESS
        }
        Ok(done) => {
            let why = done.outcome.error.map(|e| e.to_string()).unwrap_or_default();
            eprintln!(
                "run {} ended {}: {why}",
                done.outcome.run_id,
                done.outcome.status.as_str()
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
