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
//!
//! **Across processes** (SPEC §12: the workers of one store together never send more than a
//! limit) the registry can be given [`SharedLimits`] ([`Providers::share`]): a limiter kept in
//! the database the workers share, which `worker` installs and `run`/`batch` never do (they
//! keep exactly the behaviour above). It is a database-backed limiter, not a division of each
//! limit into per-worker shares: shares go unused while their worker is idle and must be
//! divided again as workers come and go; the database sees every request of every worker.
//! With it, a request still takes its local place first (the semaphore, the pacing and the
//! window above: they keep holding per process), then:
//!
//! - **`max_concurrency`**: a slot of the provider's shared slots, leased to the worker
//!   (renewed by its heartbeat, so a dead worker's slots come back after its `--lease`),
//!   asked for at once, then, while all are held, polled for by one waiting request of the
//!   process at a time with a short backoff ([`SLOT_POLL_MIN`] to [`SLOT_POLL_MAX`],
//!   jittered), and given back when the [`Admission`] is dropped (in the background; the worker waits for those before
//!   it exits; the request's local permit is released only then, and a request of the same
//!   process waiting for a slot asks at once);
//! - **rates** (`requests_per_minute`, and `tokens_per_minute` under its own key): GCRA on the
//!   database's clock. One statement reserves the next `60.5 s / rpm` (or `n × 60.5 s / tpm`,
//!   the local limiter's unit) after the last reservation of any worker, and returns the
//!   reservation's start with the database's `now`; the request waits by the difference on
//!   the local clock before it is sent. Requests of all workers thus start at least one unit
//!   apart on the database's clock, and differences in the statements' network delay are the
//!   only slack: in any second at most `ceil(rps) + 1` requests start. A settled token
//!   reservation moves the shared pace by the difference with the next reservation.
//!
//! A 429's pause stays local: each worker finds it out for itself (at the cost of one
//! rejected request per worker). When the database fails (or takes longer than
//! [`SHARED_TIMEOUT`]) while admitting, the request goes ahead under the local limits alone,
//! and the first such failure is logged as a warning (the recovery once more, as info): a
//! flaky database slows nothing down and fails no call, at the price of the cross-worker
//! promise while it is down.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::model::StructuredOutput;
use crate::plan::ProviderPlan;
use crate::record::Usage;
use crate::record::cost::Cost;

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

/// The longest a shared limit's database statement may take before the request goes ahead
/// under the local limits alone.
pub const SHARED_TIMEOUT: Duration = Duration::from_secs(2);
/// The first wait before asking again for a shared `max_concurrency` slot, all being held.
pub const SLOT_POLL_MIN: Duration = Duration::from_millis(20);
/// The longest wait between two asks for a shared slot.
pub const SLOT_POLL_MAX: Duration = Duration::from_millis(100);

/// A future of a [`SharedLimits`] call: owns what it needs, and fails with a message.
pub type SharedFuture<T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'static>>;

/// Provider limits held with other processes (the workers of one store, SPEC §12). Keys are
/// provider keys ([`provider_key`]), with a suffix for each rate (`requests`, `tokens`).
pub trait SharedLimits: Send + Sync {
    /// Reserves the next `cost` of rate `key`'s pace, after moving it by `adjust_us` (a
    /// settled reservation; negative gives time back), and returns how long from now the
    /// reserved span starts.
    fn pace(&self, key: &str, cost: Duration, adjust_us: i64) -> SharedFuture<Duration>;
    /// Claims one of `key`'s `max` concurrency slots if one is free now.
    fn try_slot(&self, key: &str, max: u64) -> SharedFuture<Option<u64>>;
    /// Gives slot `slot` of `key` back. The registry spawns the future (an admission is
    /// dropped in sync code); the implementation may count it as on its way from this call.
    fn release_slot(&self, key: &str, slot: u64) -> SharedFuture<()>;
}

/// The process-wide registry of providers.
#[derive(Default)]
pub struct Providers {
    map: Mutex<HashMap<String, Arc<ProviderState>>>,
    shared: OnceLock<Arc<dyn SharedLimits>>,
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
        if let Some(shared) = self.shared.get() {
            let _ = state.shared.set(shared.clone());
        }
        map.insert(key, state.clone());
        state
    }

    /// Holds every provider's limits with other processes through `shared` from now on, the
    /// providers known already included. Once per process: false (and nothing changes) when
    /// limits are shared already.
    pub fn share(&self, shared: Arc<dyn SharedLimits>) -> bool {
        let map = self.map.lock().expect("provider registry lock");
        if self.shared.set(shared.clone()).is_err() {
            return false;
        }
        for s in map.values() {
            let _ = s.shared.set(shared.clone());
        }
        true
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
    concurrency: Option<Arc<Semaphore>>,
    /// First come, first served: held by the caller waiting for rate capacity.
    gate: tokio::sync::Mutex<()>,
    rate: Mutex<Rate>,
    requests: AtomicU64,
    rate_limited: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    /// Cost in units of 10⁻⁹ USD.
    cost_nano: AtomicU64,
    /// Responses without `usage`: their cost is unknown, not in `cost_nano`.
    cost_unknown: AtomicU64,
    /// Requests given up on while the server may still answer them (past their timeout,
    /// or cancelled): their tokens are unknown, so the cost counted is a lower bound.
    abandoned: AtomicU64,
    /// The structured-output form this provider was found to need (a server that refused
    /// `json_schema`), for the calls after the one that found out.
    learned_form: Mutex<Option<StructuredOutput>>,
    /// Limits held with other processes, when the process shares them ([`Providers::share`]).
    shared: OnceLock<Arc<dyn SharedLimits>>,
    /// Held by the request polling for a shared slot while all are held: one poller of this
    /// provider per process, whatever its `max_concurrency`, first come first served.
    slot_gate: tokio::sync::Mutex<()>,
    /// Told when a slot this process held was given back: its waiting request asks again at
    /// once instead of at its next poll.
    slot_freed: Arc<tokio::sync::Notify>,
    /// The shared limits failed on the last try: the local limits alone hold.
    shared_down: AtomicBool,
    /// Token time settled since the last shared token reservation, in microseconds: what the
    /// next one moves the shared pace by.
    shared_token_adjust: AtomicI64,
}

/// A request's place: its concurrency permit (released when dropped), its shared slot (given
/// back when dropped) and its token reservation (settled by [`ProviderState::settle`]).
pub struct Admission {
    /// The permit, when no shared slot holds it.
    _permit: Option<OwnedSemaphorePermit>,
    _slot: Option<SlotGuard>,
    pub reserved_tokens: u64,
    id: u64,
}

/// A shared concurrency slot, given back when dropped.
struct SlotGuard {
    shared: Arc<dyn SharedLimits>,
    key: String,
    slot: u64,
    freed: Arc<tokio::sync::Notify>,
    /// The request's local permit, released only once the slot is back: a request of this
    /// process taking the permit would otherwise find every slot held, this one included.
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        give_back(
            &self.shared,
            &self.key,
            self.slot,
            self.freed.clone(),
            self.permit.take(),
        );
    }
}

/// Gives a shared slot back in the background, then releases `permit` and tells this
/// process's waiting request. Without a runtime to do it on, the slot's lease runs out instead.
fn give_back(
    shared: &Arc<dyn SharedLimits>,
    key: &str,
    slot: u64,
    freed: Arc<tokio::sync::Notify>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let release = shared.release_slot(key, slot);
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = release.await;
            drop(permit);
            freed.notify_waiters();
        });
    }
}

impl ProviderState {
    pub fn new(key: String, limits: Limits) -> ProviderState {
        let window = |per_minute: Option<u64>| per_minute.filter(|n| *n > 0).map(Window::new);
        ProviderState {
            key,
            concurrency: limits.max_concurrency.filter(|n| *n > 0).map(|n| {
                Arc::new(Semaphore::new(
                    usize::try_from(n)
                        .unwrap_or(usize::MAX)
                        .min(Semaphore::MAX_PERMITS),
                ))
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
            cost_unknown: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            learned_form: Mutex::new(None),
            shared: OnceLock::new(),
            slot_gate: tokio::sync::Mutex::new(()),
            slot_freed: Arc::default(),
            shared_down: AtomicBool::new(false),
            shared_token_adjust: AtomicI64::new(0),
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
    /// (estimated) tokens, in arrival order; with [`SharedLimits`], for a shared slot after the
    /// permit and for the shared pace after the local one. Dropping the future gives up the
    /// place.
    pub async fn admit(&self, tokens: u64) -> Admission {
        let mut permit = match &self.concurrency {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .expect("provider semaphores are never closed"),
            ),
            None => None,
        };
        let shared = self.shared.get();
        let slot = match (shared, self.limits.max_concurrency) {
            (Some(shared), Some(max)) if max > 0 => self.shared_slot(shared, max).await,
            _ => None,
        };
        let slot = slot.map(|mut g| {
            g.permit = permit.take();
            g
        });
        let (id, reserved) = {
            let _turn = self.gate.lock().await;
            loop {
                let now = Instant::now();
                let wait = {
                    let mut rate = self.rate.lock().expect("provider rate lock");
                    match rate.wait(now, tokens) {
                        None => break rate.admit(now, tokens),
                        Some(at) => at,
                    }
                };
                tokio::time::sleep_until(wait).await;
            }
        };
        // Outside the local turn: the process's reservations go to the database side by side
        // (the database orders them), not one round trip after another.
        if let Some(shared) = shared {
            self.shared_pace(shared, reserved).await;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        Admission {
            _permit: permit,
            _slot: slot,
            reserved_tokens: reserved,
            id,
        }
    }

    /// Settles a request's token reservation to what the provider reported (`None`: unknown,
    /// the estimate stands) and counts its usage.
    pub fn settle(&self, admission: &Admission, actual: Option<u64>) {
        if let Some(actual) = actual {
            let mut rate = self.rate.lock().expect("provider rate lock");
            rate.settle(admission.id, admission.reserved_tokens, actual);
            if self.shared.get().is_some()
                && let Some(tpm) = self.limits.tokens_per_minute.filter(|n| *n > 0)
            {
                let unit = per_unit(tpm).as_micros() as f64;
                let actual = actual.min(tpm);
                let delta = (actual as f64 - admission.reserved_tokens as f64) * unit;
                self.shared_token_adjust
                    .fetch_add(delta.round() as i64, Ordering::Relaxed);
            }
        }
    }

    /// A shared concurrency slot: asked for at once, then, while all are held, polled for by
    /// one waiting request of the process at a time (a process waiting with many requests
    /// asks the database no more often than with one). `None` when the shared limits fail
    /// (the local permit alone holds).
    async fn shared_slot(&self, shared: &Arc<dyn SharedLimits>, max: u64) -> Option<SlotGuard> {
        let mut turn = None;
        let mut pause = SLOT_POLL_MIN;
        loop {
            // Listening before asking: a slot given back while the claim is on its way wakes
            // the wait after it.
            let freed = self.slot_freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.claim_slot(shared, max).await {
                Ok(Some(slot)) => {
                    self.shared_up();
                    return Some(SlotGuard {
                        shared: shared.clone(),
                        key: self.key.clone(),
                        slot,
                        freed: self.slot_freed.clone(),
                        permit: None,
                    });
                }
                Ok(None) if turn.is_none() => {
                    self.shared_up();
                    // Waits to be the one poller, then asks again at once.
                    turn = Some(self.slot_gate.lock().await);
                }
                Ok(None) => {
                    tokio::select! {
                        _ = tokio::time::sleep(jitter(pause)) => {
                            pause = (pause * 2).min(SLOT_POLL_MAX);
                        }
                        _ = freed => pause = SLOT_POLL_MIN,
                    }
                }
                Err(e) => {
                    self.shared_failed(&e);
                    return None;
                }
            }
        }
    }

    /// One claim of a shared slot, on a task of its own: when the caller stops waiting while
    /// the database claims a slot, the task gives it back instead of leaking it.
    async fn claim_slot(&self, shared: &Arc<dyn SharedLimits>, max: u64) -> Result<Option<u64>, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let claim = shared.try_slot(&self.key, max);
        let (owner, key, told) = (shared.clone(), self.key.clone(), self.slot_freed.clone());
        tokio::spawn(async move {
            let got = tokio::time::timeout(SHARED_TIMEOUT, claim).await;
            if let Err(Ok(Ok(Some(slot)))) = tx.send(got) {
                give_back(&owner, &key, slot, told, None);
            }
        });
        match rx.await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(format!("no answer within {SHARED_TIMEOUT:?}")),
            Err(_) => Err("the claim's task ended".into()),
        }
    }

    /// Waits for the shared pace of each rate limit: one reservation per limit (at once), then
    /// the longest wait.
    async fn shared_pace(&self, shared: &Arc<dyn SharedLimits>, tokens: u64) {
        let requests = self
            .limits
            .requests_per_minute
            .filter(|n| *n > 0)
            .map(|rpm| shared.pace(&format!("{} requests", self.key), per_unit(rpm), 0));
        let tokens = self.limits.tokens_per_minute.filter(|n| *n > 0).map(|tpm| {
            let cost = per_unit(tpm).saturating_mul(u32::try_from(tokens.min(tpm)).unwrap_or(u32::MAX));
            let adjust = self.shared_token_adjust.swap(0, Ordering::Relaxed);
            shared.pace(&format!("{} tokens", self.key), cost, adjust)
        });
        let within = |f: Option<SharedFuture<Duration>>| async move {
            match f {
                None => Ok(Duration::ZERO),
                Some(f) => tokio::time::timeout(SHARED_TIMEOUT, f)
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {SHARED_TIMEOUT:?}"))),
            }
        };
        if requests.is_none() && tokens.is_none() {
            return;
        }
        let (a, b) = tokio::join!(within(requests), within(tokens));
        match a.and_then(|a| b.map(|b| a.max(b))) {
            Ok(wait) => {
                self.shared_up();
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            Err(e) => self.shared_failed(&e),
        }
    }

    fn shared_failed(&self, error: &str) {
        if !self.shared_down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                provider = %self.key, error,
                "shared provider limits are unavailable: requests go ahead under this process's limits alone"
            );
        }
    }

    fn shared_up(&self) {
        if self.shared_down.swap(false, Ordering::Relaxed) {
            tracing::info!(provider = %self.key, "shared provider limits are back");
        }
    }

    /// Records the usage and cost of a finished request.
    pub fn count(&self, usage: Usage) {
        self.input_tokens.fetch_add(usage.input_tokens, Ordering::Relaxed);
        self.output_tokens
            .fetch_add(usage.output_tokens, Ordering::Relaxed);
        self.cost_nano
            .fetch_add(usage.cost_usd.nanos(), Ordering::Relaxed);
        self.cost_unknown
            .fetch_add(usage.cost_unknown_calls, Ordering::Relaxed);
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
                cost_usd: Cost::from_nanos(self.cost_nano.load(Ordering::Relaxed)),
                cost_unknown_calls: self.cost_unknown.load(Ordering::Relaxed),
            },
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}

/// The cost of `input` and `output` tokens of `model` at `plan`'s `prices` (USD per million
/// tokens, so a token costs `price × 1000` nano-dollars), rounded to the nano-dollar once per
/// call; 0 for a model without a price (or a negative one, which lint refuses).
pub fn cost_usd(plan: &ProviderPlan, model: &str, input: u64, output: u64) -> Cost {
    plan.prices.get(model).map_or(Cost::ZERO, |(i, o)| {
        Cost::from_nanos_f64((input as f64 * i + output as f64 * o) * 1e3).unwrap_or(Cost::ZERO)
    })
}

/// The usage of one response that reported `input` and `output` tokens (`None`: not
/// reported). A response without both counts is a call of unknown cost (SPEC §6.1), unless
/// the provider sets `assume_tokens_per_call`: the call then counts as that many output
/// tokens priced at the dearer of the model's two prices, so that the assumption bounds the
/// cost from above rather than guessing it.
pub fn response_usage(plan: &ProviderPlan, model: &str, input: Option<u64>, output: Option<u64>) -> Usage {
    match (input, output, plan.assume_tokens_per_call) {
        (Some(i), Some(o), _) => Usage {
            input_tokens: i,
            output_tokens: o,
            cost_usd: cost_usd(plan, model, i, o),
            cost_unknown_calls: 0,
        },
        (_, _, Some(n)) => Usage {
            input_tokens: 0,
            output_tokens: n,
            cost_usd: plan.prices.get(model).map_or(Cost::ZERO, |(i, o)| {
                Cost::from_nanos_f64(n as f64 * i.max(*o) * 1e3).unwrap_or(Cost::ZERO)
            }),
            cost_unknown_calls: 0,
        },
        (i, o, None) => Usage {
            input_tokens: i.unwrap_or(0),
            output_tokens: o.unwrap_or(0),
            cost_usd: cost_usd(plan, model, i.unwrap_or(0), o.unwrap_or(0)),
            cost_unknown_calls: 1,
        },
    }
}

/// The time one unit of a per-minute limit costs: the local window's unit, `(60 s + MARGIN) /
/// per_minute`, so shared and local pacing agree.
fn per_unit(per_minute: u64) -> Duration {
    (Duration::from_secs(60) + MARGIN).div_f64(per_minute as f64)
}

/// `d` give or take half of it, so pollers of one slot do not ask in step.
fn jitter(d: Duration) -> Duration {
    use rand::{Rng, SeedableRng};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let seed =
        u64::from(now) ^ SEQ.fetch_add(1, Ordering::Relaxed).rotate_left(32) ^ u64::from(std::process::id());
    d.mul_f64(rand::rngs::SmallRng::seed_from_u64(seed).random_range(0.5..1.5))
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
            unit: per_unit(per_minute),
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
            assume_tokens_per_call: None,
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

    /// Shared limits kept in memory on tokio's clock, standing in for the database: states
    /// given the same [`Fake`] behave as the workers of one store.
    #[derive(Clone, Default)]
    struct Fake(Arc<FakeState>);

    #[derive(Default)]
    struct FakeState {
        due: Mutex<HashMap<String, Instant>>,
        held: Mutex<Vec<(String, u64)>>,
        fail: AtomicBool,
        claim_delay: Mutex<Duration>,
    }

    impl SharedLimits for Fake {
        fn pace(&self, key: &str, cost: Duration, adjust_us: i64) -> SharedFuture<Duration> {
            let (f, key) = (self.0.clone(), key.to_string());
            Box::pin(async move {
                if f.fail.load(Ordering::Relaxed) {
                    return Err("the database is down".into());
                }
                let now = Instant::now();
                let mut due = f.due.lock().unwrap();
                let d = due.entry(key).or_insert(now);
                let moved = if adjust_us >= 0 {
                    *d + Duration::from_micros(adjust_us as u64)
                } else {
                    d.checked_sub(Duration::from_micros(adjust_us.unsigned_abs()))
                        .unwrap_or(now)
                };
                let start = moved.max(now);
                *d = start + cost;
                Ok(start - now)
            })
        }

        fn try_slot(&self, key: &str, max: u64) -> SharedFuture<Option<u64>> {
            let (f, key) = (self.0.clone(), key.to_string());
            Box::pin(async move {
                let delay = *f.claim_delay.lock().unwrap();
                tokio::time::sleep(delay).await;
                if f.fail.load(Ordering::Relaxed) {
                    return Err("the database is down".into());
                }
                let mut held = f.held.lock().unwrap();
                let free = (0..max).find(|s| !held.iter().any(|(k, h)| *k == key && h == s));
                if let Some(s) = free {
                    held.push((key, s));
                }
                Ok(free)
            })
        }

        fn release_slot(&self, key: &str, slot: u64) -> SharedFuture<()> {
            self.0
                .held
                .lock()
                .unwrap()
                .retain(|(k, s)| !(k == key && *s == slot));
            Box::pin(async { Ok(()) })
        }
    }

    fn shared_state(fake: &Fake, p: &ProviderPlan) -> Arc<ProviderState> {
        let state = Arc::new(ProviderState::new(provider_key(p), Limits::of(p)));
        assert!(state.shared.set(Arc::new(fake.clone())).is_ok());
        state
    }

    #[tokio::test(start_paused = true)]
    async fn processes_sharing_limits_are_paced_together() {
        let fake = Fake::default();
        let p = plan("p", Some(600), None);
        let states = [shared_state(&fake, &p), shared_state(&fake, &p)];
        let times = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..40 {
            let (state, times) = (states[i % 2].clone(), times.clone());
            tasks.spawn(async move {
                let _a = state.admit(1).await;
                times.lock().unwrap().push(Instant::now());
            });
        }
        while tasks.join_next().await.is_some() {}
        let mut times = times.lock().unwrap().clone();
        times.sort();
        // Each alone would admit ten a second; together they admit ten a second (tokio's
        // timers round each deadline up to the millisecond).
        let unit = per_unit(600) - Duration::from_millis(1);
        for w in times.windows(2) {
            assert!(w[1] - w[0] >= unit, "{:?} apart", w[1] - w[0]);
        }
        let secs: Vec<(Instant, u64)> = times.iter().map(|t| (*t, 1)).collect();
        assert!(max_in_window(&secs, Duration::from_secs(1)) <= 10);
    }

    #[tokio::test(start_paused = true)]
    async fn shared_token_time_settles_with_the_next_reservation() {
        let fake = Fake::default();
        let p = plan("t", None, Some(6000));
        let state = shared_state(&fake, &p);
        // 600 tokens reserved (6 s of pace), 60 used: the next request waits 0.6 s, not 6.
        let a = state.admit(600).await;
        state.settle(&a, Some(60));
        let other = shared_state(&fake, &p);
        let t0 = Instant::now();
        let _b = other.admit(60).await;
        assert!(
            Instant::now() - t0 >= Duration::from_secs(6),
            "another process has not heard of the settlement yet"
        );
        let t0 = Instant::now();
        let _c = state.admit(60).await;
        let waited = Instant::now() - t0;
        assert!(waited <= Duration::from_secs(1), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn shared_slots_cap_concurrency_across_processes_and_are_given_back() {
        let fake = Fake::default();
        let mut p = plan("c", None, None);
        p.max_concurrency = Some(1);
        let (a, b) = (shared_state(&fake, &p), shared_state(&fake, &p));
        let first = a.admit(1).await;
        let second = tokio::time::timeout(Duration::from_secs(1), b.admit(1)).await;
        assert!(second.is_err(), "the other process waits for the one slot");
        drop(first);
        assert!(fake.0.held.lock().unwrap().is_empty());
        let second = tokio::time::timeout(SLOT_POLL_MAX * 2, b.admit(1)).await;
        assert!(second.is_ok(), "the slot given back is found by the next poll");
        drop(second);
        // An admission given up while its claim is on the way does not keep the slot.
        *fake.0.claim_delay.lock().unwrap() = Duration::from_millis(50);
        let given_up = tokio::time::timeout(Duration::from_millis(10), a.admit(1)).await;
        assert!(given_up.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(fake.0.held.lock().unwrap().is_empty(), "claimed, then given back");
    }

    #[tokio::test(start_paused = true)]
    async fn failing_shared_limits_fall_back_to_local_ones() {
        let fake = Fake::default();
        fake.0.fail.store(true, Ordering::Relaxed);
        let mut p = plan("f", Some(60), None);
        p.max_concurrency = Some(1);
        let state = shared_state(&fake, &p);
        let t0 = Instant::now();
        let a = state.admit(1).await;
        assert_eq!(Instant::now(), t0, "admitted at once under the local limits");
        assert!(state.shared_down.load(Ordering::Relaxed));
        drop(a);
        // The local pace still holds: one a second.
        let _b = state.admit(1).await;
        assert!(Instant::now() - t0 >= Duration::from_secs(1));
        fake.0.fail.store(false, Ordering::Relaxed);
        drop(_b);
        let _c = state.admit(1).await;
        assert!(
            !state.shared_down.load(Ordering::Relaxed),
            "back once the store answers"
        );
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
        assert_eq!(cost, Cost::from_usd(1.5).unwrap());
        assert_eq!(cost_usd(&p, "unpriced", 1000, 1000), Cost::ZERO);
        a.count(Usage {
            input_tokens: 10,
            output_tokens: 5,
            cost_usd: Cost::from_nanos(15_000),
            cost_unknown_calls: 2,
        });
        assert_eq!(reg.totals().usage.input_tokens, 10);
        let stats = reg.stats();
        assert_eq!(stats.len(), 2);
        let (key, s) = &stats[1];
        assert_eq!(key, "p http://127.0.0.1:9/v1");
        assert_eq!((s.usage.input_tokens, s.usage.output_tokens), (10, 5));
        assert_eq!(s.usage.cost_usd, Cost::from_nanos(15_000));
        assert_eq!(s.usage.cost_unknown_calls, 2);
    }

    #[test]
    fn a_response_without_usage_has_an_unknown_cost_unless_tokens_are_assumed() {
        let mut p = plan("p", None, None);
        let known = response_usage(&p, "m", Some(1_000_000), Some(500_000));
        assert!(known.cost_usd == Cost::from_usd(1.5).unwrap() && known.cost_unknown_calls == 0);
        for (i, o) in [(None, None), (Some(10), None), (None, Some(10))] {
            let u = response_usage(&p, "m", i, o);
            assert_eq!(u.cost_unknown_calls, 1, "{i:?} {o:?}");
        }
        p.assume_tokens_per_call = Some(1_000_000);
        let assumed = response_usage(&p, "m", None, None);
        // Priced at the dearer of the two prices ($0.5 and $2 per million).
        assert_eq!(
            (assumed.output_tokens, assumed.cost_unknown_calls),
            (1_000_000, 0)
        );
        assert_eq!(assumed.cost_usd, Cost::from_usd(2.0).unwrap());
        // Reported usage wins over the assumption.
        assert_eq!(response_usage(&p, "m", Some(1), Some(2)).output_tokens, 2);
    }
}
