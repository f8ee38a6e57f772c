//! LLM providers as the process shares them (SPEC §6.1): one [`ProviderState`] per provider
//! identity — its name and `base_url` — in a process-wide registry ([`Providers::global`]),
//! whatever run, flow or batch item calls it. Each holds the provider's `max_concurrency`
//! semaphore, its rate limiter (`requests_per_minute`, `tokens_per_minute`) and counters of
//! what went through it (requests, 429s, tokens, cost).
//!
//! The limiter makes callers **wait** for capacity, never fail. It admits requests one at a
//! time, first come first served, and keeps two promises per limit, over tokio time (so paused
//! time in tests drives it):
//!
//! - **pacing**: admissions are spread evenly — at most one request per `60s / rpm`, and a
//!   request of `n` tokens waits `n × 60s / tpm` after the one before it — so a provider never
//!   sees a burst (providers often enforce their per-minute limits over shorter periods);
//! - **a sliding window**: in any window of a minute (plus [`MARGIN`], slack for network
//!   delay), the requests admitted and the tokens they reserved never exceed the limit.
//!
//! Tokens are reserved before a request as an estimate (the caller's; the `llm` agent uses the
//! request's size and `max_tokens`) and settled to the provider's reported usage after it. A
//! 429 with `Retry-After` pauses the whole provider ([`ProviderState::pause_for`]), so that
//! five hundred runs do not each find out for themselves.
//!
//! A provider also remembers what calls found out about it: the structured-output form its
//! server needs ([`ProviderState::learn_form`]) and how many requests were abandoned with
//! their tokens unknown ([`ProviderState::abandon`]).
//!
//! A provider's limits are fixed by the first plan that names it; a later plan naming the
//! same provider with other limits gets a warning and shares the first limits.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::model::StructuredOutput;
use crate::plan::ProviderPlan;
use crate::runtime::record::Usage;

/// Slack added to each limit's minute: a request admitted at `t` may reach the provider a
/// little later than the one admitted after it, and the provider counts arrivals.
pub const MARGIN: Duration = Duration::from_millis(500);

/// The limits of one provider.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    pub max_concurrency: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

impl Limits {
    pub fn of(plan: &ProviderPlan) -> Limits {
        Limits {
            max_concurrency: plan.max_concurrency,
            requests_per_minute: plan.requests_per_minute,
            tokens_per_minute: plan.tokens_per_minute,
        }
    }
}

/// The process-wide registry of providers.
#[derive(Default)]
pub struct Providers {
    map: Mutex<HashMap<String, Arc<ProviderState>>>,
}

impl Providers {
    /// The registry every run in this process uses.
    pub fn global() -> &'static Providers {
        static GLOBAL: OnceLock<Providers> = OnceLock::new();
        GLOBAL.get_or_init(Providers::default)
    }

    /// The shared state of `plan`'s provider, created with `plan`'s limits on first use.
    pub fn get(&self, plan: &ProviderPlan) -> Arc<ProviderState> {
        let key = provider_key(plan);
        let mut map = self.map.lock().expect("provider registry lock");
        if let Some(s) = map.get(&key) {
            let limits = Limits::of(plan);
            if s.limits != limits {
                tracing::warn!(
                    provider = %plan.name, base_url = %plan.base_url,
                    "provider defined again with other limits; the first definition's limits apply"
                );
            }
            return s.clone();
        }
        let state = Arc::new(ProviderState::new(key.clone(), Limits::of(plan)));
        map.insert(key, state.clone());
        state
    }

    /// What went through every provider so far, added up: the process's LLM requests, 429s,
    /// tokens and cost (a batch's progress line reads it while runs are in flight).
    pub fn totals(&self) -> ProviderStats {
        let map = self.map.lock().expect("provider registry lock");
        let mut t = ProviderStats::default();
        for s in map.values() {
            let s = s.stats();
            t.requests += s.requests;
            t.rate_limited += s.rate_limited;
            t.abandoned += s.abandoned;
            t.usage.add(s.usage);
        }
        t
    }

    /// What went through each provider so far, by provider key (`name base_url`), sorted.
    pub fn stats(&self) -> Vec<(String, ProviderStats)> {
        let map = self.map.lock().expect("provider registry lock");
        let mut v: Vec<_> = map.iter().map(|(k, s)| (k.clone(), s.stats())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// A provider's identity in the registry: its name and its base URL.
pub fn provider_key(plan: &ProviderPlan) -> String {
    format!("{} {}", plan.name, plan.base_url.trim_end_matches('/'))
}

/// Counters of one provider, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProviderStats {
    /// Requests sent (retries and repairs included).
    pub requests: u64,
    /// Responses with status 429.
    pub rate_limited: u64,
    pub usage: Usage,
    /// Requests abandoned with their tokens unknown ([`ProviderState::abandon`]): `usage`
    /// is a lower bound when this is not 0.
    pub abandoned: u64,
}

/// One provider, shared by every run in the process.
pub struct ProviderState {
    pub key: String,
    pub limits: Limits,
    concurrency: Option<Semaphore>,
    /// First come, first served: held by the caller waiting for rate capacity.
    gate: tokio::sync::Mutex<()>,
    rate: Mutex<Rate>,
    requests: AtomicU64,
    rate_limited: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    /// Cost in units of 10⁻⁹ USD.
    cost_nano: AtomicU64,
    /// Requests given up on while the server may still answer them (past their timeout,
    /// or cancelled): their tokens are unknown, so the cost counted is a lower bound.
    abandoned: AtomicU64,
    /// The structured-output form this provider was found to need (a server that refused
    /// `json_schema`), for the calls after the one that found out.
    learned_form: Mutex<Option<StructuredOutput>>,
}

/// A request's place: its concurrency permit (released when dropped) and its token
/// reservation (settled by [`ProviderState::settle`]).
pub struct Admission<'a> {
    _permit: Option<SemaphorePermit<'a>>,
    pub reserved_tokens: u64,
    id: u64,
}

impl ProviderState {
    pub fn new(key: String, limits: Limits) -> ProviderState {
        let window = |per_minute: Option<u64>| per_minute.filter(|n| *n > 0).map(Window::new);
        ProviderState {
            key,
            concurrency: limits.max_concurrency.filter(|n| *n > 0).map(|n| {
                Semaphore::new(
                    usize::try_from(n)
                        .unwrap_or(usize::MAX)
                        .min(Semaphore::MAX_PERMITS),
                )
            }),
            gate: tokio::sync::Mutex::new(()),
            rate: Mutex::new(Rate {
                paused_until: None,
                requests: window(limits.requests_per_minute),
                tokens: window(limits.tokens_per_minute),
                next_id: 0,
            }),
            limits,
            requests: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            input_tokens: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            cost_nano: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            learned_form: Mutex::new(None),
        }
    }

    /// The structured-output form a call of this provider found it needs, if any.
    pub fn learned_form(&self) -> Option<StructuredOutput> {
        *self.learned_form.lock().expect("provider form lock")
    }

    /// Remembers that this provider needs `form` for structured output.
    pub fn learn_form(&self, form: StructuredOutput) {
        *self.learned_form.lock().expect("provider form lock") = Some(form);
    }

    /// Counts a request given up on while the server may still answer it.
    pub fn abandon(&self) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits for a concurrency permit, then for rate capacity for one request of `tokens`
    /// (estimated) tokens, in arrival order. Dropping the future gives up the place.
    pub async fn admit(&self, tokens: u64) -> Admission<'_> {
        let permit = match &self.concurrency {
            Some(s) => Some(s.acquire().await.expect("provider semaphores are never closed")),
            None => None,
        };
        let _turn = self.gate.lock().await;
        loop {
            let now = Instant::now();
            let wait = {
                let mut rate = self.rate.lock().expect("provider rate lock");
                match rate.wait(now, tokens) {
                    None => {
                        let (id, reserved) = rate.admit(now, tokens);
                        self.requests.fetch_add(1, Ordering::Relaxed);
                        return Admission {
                            _permit: permit,
                            reserved_tokens: reserved,
                            id,
                        };
                    }
                    Some(at) => at,
                }
            };
            tokio::time::sleep_until(wait).await;
        }
    }

    /// Settles a request's token reservation to what the provider reported (`None`: unknown,
    /// the estimate stands) and counts its usage.
    pub fn settle(&self, admission: &Admission<'_>, actual: Option<u64>) {
        if let Some(actual) = actual {
            let mut rate = self.rate.lock().expect("provider rate lock");
            rate.settle(admission.id, admission.reserved_tokens, actual);
        }
    }

    /// Records the usage and cost of a finished request.
    pub fn count(&self, usage: Usage) {
        self.input_tokens.fetch_add(usage.input_tokens, Ordering::Relaxed);
        self.output_tokens
            .fetch_add(usage.output_tokens, Ordering::Relaxed);
        let nano = (usage.cost_usd * 1e9).round();
        if nano.is_finite() && nano > 0.0 {
            self.cost_nano.fetch_add(nano as u64, Ordering::Relaxed);
        }
    }

    /// A 429: no request is admitted before `wait` has passed.
    pub fn pause_for(&self, wait: Duration) {
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + wait;
        let mut rate = self.rate.lock().expect("provider rate lock");
        if rate.paused_until.is_none_or(|p| p < until) {
            rate.paused_until = Some(until);
        }
    }

    pub fn stats(&self) -> ProviderStats {
        ProviderStats {
            requests: self.requests.load(Ordering::Relaxed),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
            usage: Usage {
                input_tokens: self.input_tokens.load(Ordering::Relaxed),
                output_tokens: self.output_tokens.load(Ordering::Relaxed),
                cost_usd: self.cost_nano.load(Ordering::Relaxed) as f64 / 1e9,
            },
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// The cost of `input` and `output` tokens of `model` at `plan`'s `prices` (USD per million
/// tokens); 0 for a model without a price.
pub fn cost_usd(plan: &ProviderPlan, model: &str, input: u64, output: u64) -> f64 {
    plan.prices
        .get(model)
        .map_or(0.0, |(i, o)| (input as f64 * i + output as f64 * o) / 1e6)
}

struct Rate {
    paused_until: Option<Instant>,
    requests: Option<Window>,
    tokens: Option<Window>,
    next_id: u64,
}

impl Rate {
    /// When a request of `tokens` tokens may be admitted, if not now.
    fn wait(&mut self, now: Instant, tokens: u64) -> Option<Instant> {
        let mut at = self.paused_until.filter(|p| *p > now);
        for (w, n) in [(&mut self.requests, 1), (&mut self.tokens, tokens)] {
            if let Some(w) = w
                && let Some(t) = w.wait(now, n)
            {
                at = Some(at.map_or(t, |a| a.max(t)));
            }
        }
        at
    }

    fn admit(&mut self, now: Instant, tokens: u64) -> (u64, u64) {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(w) = &mut self.requests {
            w.admit(now, id, 1);
        }
        let reserved = match &mut self.tokens {
            Some(w) => w.admit(now, id, tokens),
            None => tokens,
        };
        (id, reserved)
    }

    fn settle(&mut self, id: u64, reserved: u64, actual: u64) {
        if let Some(w) = &mut self.tokens {
            w.settle(id, reserved, actual);
        }
    }
}

/// One per-minute limit: GCRA pacing plus an exact sliding-window log.
struct Window {
    capacity: u64,
    period: Duration,
    /// The time one unit costs: `period / capacity`.
    unit: Duration,
    /// When the next admission may happen (pacing).
    next: Option<Instant>,
    /// Admissions still in the window: (time, id, amount), oldest first.
    log: VecDeque<(Instant, u64, u64)>,
    used: u64,
}

impl Window {
    fn new(per_minute: u64) -> Window {
        let period = Duration::from_secs(60) + MARGIN;
        Window {
            capacity: per_minute,
            period,
            unit: period.div_f64(per_minute as f64),
            next: None,
            log: VecDeque::new(),
            used: 0,
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(t, _, n)) = self.log.front() {
            if t + self.period > now {
                break;
            }
            self.log.pop_front();
            self.used -= n;
        }
    }

    /// A request of more than the whole limit is counted as the whole limit: it waits for an
    /// empty window instead of forever.
    fn amount(&self, n: u64) -> u64 {
        n.min(self.capacity)
    }

    fn wait(&mut self, now: Instant, n: u64) -> Option<Instant> {
        self.expire(now);
        let n = self.amount(n);
        let mut at = self.next.filter(|t| *t > now);
        if self.used + n > self.capacity {
            // The earliest time enough of the log has left the window.
            let mut freed = 0;
            let need = self.used + n - self.capacity;
            for &(t, _, m) in &self.log {
                freed += m;
                if freed >= need {
                    let t = t + self.period;
                    at = Some(at.map_or(t, |a| a.max(t)));
                    break;
                }
            }
        }
        at
    }

    fn admit(&mut self, now: Instant, id: u64, n: u64) -> u64 {
        let n = self.amount(n);
        self.log.push_back((now, id, n));
        self.used += n;
        let start = self.next.map_or(now, |t| t.max(now));
        self.next = Some(start + self.unit.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX)));
        n
    }

    /// Replaces a reservation by what it really cost; pacing moves by the difference.
    fn settle(&mut self, id: u64, reserved: u64, actual: u64) {
        let actual = self.amount(actual);
        if let Some(e) = self.log.iter_mut().find(|e| e.1 == id) {
            self.used = self.used - e.2 + actual;
            e.2 = actual;
        }
        if let Some(next) = &mut self.next {
            if actual > reserved {
                *next += self
                    .unit
                    .saturating_mul(u32::try_from(actual - reserved).unwrap_or(u32::MAX));
            } else {
                let back = self
                    .unit
                    .saturating_mul(u32::try_from(reserved - actual).unwrap_or(u32::MAX));
                *next = next.checked_sub(back).unwrap_or(*next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, rpm: Option<u64>, tpm: Option<u64>) -> ProviderPlan {
        ProviderPlan {
            name: name.into(),
            base_url: "http://127.0.0.1:9/v1".into(),
            api_key: None,
            headers: Vec::new(),
            max_concurrency: None,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            prices: [("m".to_string(), (0.5, 2.0))].into_iter().collect(),
            timeout: None,
            structured_output: None,
        }
    }

    /// The most admissions (or tokens) in any window of `period` starting at an admission.
    fn max_in_window(times: &[(Instant, u64)], period: Duration) -> u64 {
        let mut best = 0;
        for (i, &(t0, _)) in times.iter().enumerate() {
            let sum: u64 = times[i..]
                .iter()
                .take_while(|(t, _)| *t < t0 + period)
                .map(|(_, n)| n)
                .sum();
            best = best.max(sum);
        }
        best
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_paced_and_never_exceed_the_minute() {
        let state = Arc::new(ProviderState::new(
            "p".into(),
            Limits::of(&plan("p", Some(60), None)),
        ));
        let start = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..150 {
            let (state, times) = (state.clone(), times.clone());
            tasks.spawn(async move {
                let _a = state.admit(1).await;
                times.lock().unwrap().push((Instant::now(), 1));
            });
        }
        while tasks.join_next().await.is_some() {}
        let mut times = times.lock().unwrap().clone();
        times.sort();
        assert_eq!(times.len(), 150);
        assert!(max_in_window(&times, Duration::from_secs(60)) <= 60);
        // Evenly paced: one per (60s + margin) / 60, so 150 take 149 intervals.
        let took = times.last().unwrap().0 - start;
        let unit = (Duration::from_secs(60) + MARGIN) / 60;
        assert!(
            took >= unit * 149 && took <= unit * 149 + Duration::from_millis(200),
            "tokio's timers round each wait up to the millisecond: {took:?}"
        );
        assert_eq!(state.stats().requests, 150);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_limited_by_reservation_and_settled() {
        let state = ProviderState::new("p".into(), Limits::of(&plan("p", None, Some(1000))));
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..10 {
            let a = state.admit(300).await;
            times.push((Instant::now(), 300));
            state.settle(&a, Some(300));
        }
        assert!(max_in_window(&times, Duration::from_secs(60)) <= 1000);
        assert!(
            Instant::now() - start >= Duration::from_secs(150),
            "{:?}",
            Instant::now() - start
        );

        // A request settled below its reservation gives the difference back to pacing.
        let state = ProviderState::new("q".into(), Limits::of(&plan("q", None, Some(600))));
        let a = state.admit(600).await;
        state.settle(&a, Some(60));
        let t0 = Instant::now();
        let _b = state.admit(60).await;
        assert!(
            Instant::now() - t0 <= Duration::from_secs(7),
            "{:?}",
            Instant::now() - t0
        );

        // A request larger than the whole limit waits for an empty window, not forever.
        let state = ProviderState::new("r".into(), Limits::of(&plan("r", None, Some(100))));
        let _a = state.admit(5000).await;
        let t0 = Instant::now();
        let _b = state.admit(5000).await;
        assert!(Instant::now() - t0 <= Duration::from_secs(61));
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_pauses_every_caller() {
        let state = ProviderState::new("p".into(), Limits::default());
        let _a = state.admit(1).await;
        state.pause_for(Duration::from_secs(5));
        let t0 = Instant::now();
        let _b = state.admit(1).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(5));
        assert_eq!(state.stats().rate_limited, 1);
    }

    #[tokio::test]
    async fn concurrency_is_capped() {
        let mut p = plan("c", None, None);
        p.max_concurrency = Some(2);
        let state = ProviderState::new("c".into(), Limits::of(&p));
        let a = state.admit(1).await;
        let _b = state.admit(1).await;
        let third = tokio::time::timeout(Duration::from_millis(20), state.admit(1)).await;
        assert!(third.is_err(), "a third request waits while two are in flight");
        drop(a);
        let third = tokio::time::timeout(Duration::from_millis(200), state.admit(1)).await;
        assert!(third.is_ok());
    }

    #[test]
    fn registry_shares_by_name_and_base_url_and_counts_cost() {
        let reg = Providers::default();
        let a = reg.get(&plan("p", Some(10), None));
        let b = reg.get(&plan("p", Some(99), None));
        assert!(Arc::ptr_eq(&a, &b), "same name and base_url: one provider");
        assert_eq!(
            b.limits.requests_per_minute,
            Some(10),
            "the first definition's limits"
        );
        let c = reg.get(&plan("other", Some(10), None));
        assert!(!Arc::ptr_eq(&a, &c));
        let p = plan("p", None, None);
        let cost = cost_usd(&p, "m", 1_000_000, 500_000);
        assert!((cost - 1.5).abs() < 1e-12);
        assert_eq!(cost_usd(&p, "unpriced", 1000, 1000), 0.0);
        a.count(Usage {
            input_tokens: 10,
            output_tokens: 5,
            cost_usd: 0.000_015,
        });
        assert_eq!(reg.totals().usage.input_tokens, 10);
        let stats = reg.stats();
        assert_eq!(stats.len(), 2);
        let (key, s) = &stats[1];
        assert_eq!(key, "p http://127.0.0.1:9/v1");
        assert_eq!((s.usage.input_tokens, s.usage.output_tokens), (10, 5));
        assert!((s.usage.cost_usd - 0.000_015).abs() < 1e-12);
    }
}
