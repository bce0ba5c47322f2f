//! One rate limit for the whole fleet. Every session's model requests pass through a relay of
//! this process, so the relays pace them together, per account (upstream and credential) and
//! model, from what the API says (the API's rate limits are per model, and an overload is too:
//! one model's `529`s or spent budget must not slow another's traffic; the model is keyed
//! without its snapshot date, `claude-sonnet-4-5-20250929` as `claude-sonnet-4-5`, since the
//! API counts a model's snapshots together): a `429` halves the requests allowed in flight and holds every new
//! one for its `retry-after`; an overload or an outage (`529`, a `5xx`, no connection) lets one
//! request probe at a time until an answer comes, then lets everyone go at once; the
//! `anthropic-ratelimit-*-remaining`/`-reset` headers of each answer are a budget spent
//! request by request until the reset, so the fleet waits for the reset instead of running into
//! the `429`. Successes grow the allowance back (doubling up to where it last failed, then one
//! at a time), as TCP does. Without it (`fleetPacing: false`) each CLI finds the limit alone.
//!
//! "In flight" is a request awaiting the head of its answer: a streamed answer that has begun
//! no longer counts (the API rates requests and tokens, not open streams).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::sync::Notify;

/// Requests in flight per account at most (a fleet of CLIs makes a few each).
const MAX_IN_FLIGHT: f64 = 256.0;
/// How long a probe waits after a failure without a `retry-after`: the recovery is seen within
/// this (the target: the next request within 2 s of the API's recovery).
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// While the API fails, a probe whose answer's head has not come after this no longer holds
/// the next one back: one request that never answers must not hold the fleet (issue 49).
pub(super) const PROBE_BOUND: Duration = Duration::from_secs(5);
/// A `retry-after` or a reset further away than this is taken as this (a clock skew or a
/// nonsense value must not park the fleet).
const LONGEST_HOLD: Duration = Duration::from_secs(300);
/// How long a new window's budget is taken to last before an answer says (the API's limits
/// are per minute).
const WINDOW_GUESS: Duration = Duration::from_secs(60);

static FLEET: LazyLock<Mutex<HashMap<u64, Arc<Pace>>>> = LazyLock::new(Default::default);

/// The pace of one account, shared by every relay of the process sending to it.
pub(super) struct Pace {
    state: Mutex<PaceState>,
    changed: Notify,
}

struct PaceState {
    /// Requests allowed in flight.
    limit: f64,
    /// Where the allowance stops doubling (half of where it last hit a `429`).
    threshold: f64,
    in_flight: usize,
    /// Nothing is sent before this (a `retry-after`, a probe's turn).
    blocked_until: Option<Instant>,
    /// The API is failing: one request at a time probes it.
    down: bool,
    /// When the last probe was let go (while `down`).
    probed: Option<Instant>,
    /// Answers that came, ever (a request's own failures are told apart by it).
    answered: u64,
    /// Requests left until `reset`, as the answers said (the least of those of one window:
    /// answers come out of order, and requests in flight spend it too).
    remaining: Option<(u64, Instant)>,
    /// The requests one window allows (`anthropic-ratelimit-requests-limit`): the budget a
    /// window starts with, so the first requests after a reset do not run into the limit.
    window: Option<u64>,
}

/// A request's place in flight; gone when its answer's head came (or it failed).
pub(super) struct Permit {
    pace: Arc<Pace>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.pace.lock().in_flight -= 1;
        self.pace.changed.notify_waiters();
    }
}

/// An account: `origin` + `credential`, hashed (the secret is not kept here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Account(u64);

pub(super) fn account(origin: &str, credential: &str) -> Account {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (origin, credential).hash(&mut h);
    Account(h.finish())
}

/// A model as the API's limits count it: its id without a snapshot date (`-YYYYMMDD`).
fn model_class(model: Option<&str>) -> &str {
    let model = model.unwrap_or("");
    match model.rsplit_once('-') {
        Some((class, date)) if date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit()) => class,
        _ => model,
    }
}

/// The pace of `model` on `account`.
pub(super) fn pace_for(account: Account, model: Option<&str>) -> Arc<Pace> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (account.0, model_class(model)).hash(&mut h);
    let mut fleet = FLEET.lock().unwrap_or_else(|e| e.into_inner());
    fleet
        .entry(h.finish())
        .or_insert_with(|| {
            Arc::new(Pace {
                state: Mutex::new(PaceState {
                    limit: MAX_IN_FLIGHT,
                    threshold: MAX_IN_FLIGHT,
                    in_flight: 0,
                    blocked_until: None,
                    down: false,
                    probed: None,
                    answered: 0,
                    remaining: None,
                    window: None,
                }),
                changed: Notify::new(),
            })
        })
        .clone()
}

/// How an answer (or its absence) is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// Any answer but those below (a `400` is the request's fault, not the API's state).
    Came,
    /// `429`.
    RateLimited,
    /// `529`, a `5xx`, no connection.
    Failing,
}

impl Answer {
    pub(super) fn of(status: StatusCode) -> Answer {
        match status.as_u16() {
            429 => Answer::RateLimited,
            408 | 500 | 502 | 503 | 504 | 529 => Answer::Failing,
            _ => Answer::Came,
        }
    }
}

impl Pace {
    fn lock(&self) -> std::sync::MutexGuard<'_, PaceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the request's turn.
    pub(super) async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let wake = {
                let mut s = self.lock();
                let now = Instant::now();
                // Asleep until the hung probe's bound, if that comes first.
                let probe_due = s
                    .probed
                    .filter(|_| s.down && s.in_flight > 0)
                    .map(|p| p + PROBE_BOUND);
                if let Some((left, reset)) = s.remaining {
                    if reset <= now {
                        // A new window: its budget, until an answer says when it resets.
                        s.remaining = s.window.map(|w| (w, now + WINDOW_GUESS));
                    } else if left == 0 {
                        s.blocked_until = Some(s.blocked_until.map_or(reset, |b| b.max(reset)));
                    }
                }
                match s.blocked_until.filter(|b| *b > now) {
                    Some(until) => Some(until),
                    None => {
                        let allowed = if s.down { 1.0 } else { s.limit.floor() };
                        // A probe that hangs past its bound lets the next one go.
                        let probe_hung = s.down
                            && s.probed
                                .is_some_and(|p| now.duration_since(p) >= PROBE_BOUND);
                        if (s.in_flight as f64) < allowed || probe_hung {
                            s.in_flight += 1;
                            if let Some((left, _)) = &mut s.remaining {
                                *left = left.saturating_sub(1);
                            }
                            if s.down {
                                // The next probe waits its turn even when this one hangs.
                                s.blocked_until = Some(now + PROBE_INTERVAL);
                                s.probed = Some(now);
                            }
                            return Permit { pace: self.clone() };
                        }
                        probe_due
                    }
                }
            };
            match wake {
                Some(until) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until.into()) => {}
                        _ = &mut changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// How many answers came so far.
    pub(super) fn answered(&self) -> u64 {
        self.lock().answered
    }

    /// Learns from an answer's status and headers (`None`: no answer, the connection failed).
    /// Returns how long this request should wait before it is sent again.
    pub(super) fn learn(&self, answer: Answer, headers: Option<&HeaderMap>) -> Duration {
        let now = Instant::now();
        let after = headers.and_then(retry_after);
        let mut s = self.lock();
        if let Some(h) = headers {
            if let Some((left, reset, window)) = remaining(h, now) {
                s.remaining = match s.remaining {
                    // The same window (its reset within a second): the least said of it.
                    Some((known, at)) if at.max(reset) - at.min(reset) < Duration::from_secs(1) => {
                        Some((known.min(left), at.min(reset)))
                    }
                    _ => Some((left, reset)),
                };
                s.window = window.or(s.window);
            }
        }
        let wait = match answer {
            Answer::Came => {
                s.answered += 1;
                if s.down {
                    s.down = false;
                    s.probed = None;
                    s.blocked_until = None;
                } else if s.limit < s.threshold {
                    s.limit = (s.limit + 1.0).min(MAX_IN_FLIGHT);
                } else {
                    s.limit = (s.limit + 1.0 / s.limit).min(MAX_IN_FLIGHT);
                }
                Duration::ZERO
            }
            Answer::RateLimited => {
                s.threshold = (s.limit / 2.0).max(1.0);
                s.limit = s.threshold;
                let wait = after.unwrap_or(PROBE_INTERVAL);
                // Nothing is left of this window, whatever an earlier answer said.
                s.remaining = Some((0, now + wait));
                wait
            }
            Answer::Failing => {
                s.down = true;
                after.unwrap_or(PROBE_INTERVAL)
            }
        };
        if !wait.is_zero() {
            let until = now + wait;
            s.blocked_until = Some(s.blocked_until.map_or(until, |b| b.max(until)));
        }
        drop(s);
        self.changed.notify_waiters();
        wait
    }
}

/// The answer's `retry-after-ms` or `retry-after` (seconds or an HTTP date), bounded.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let wait = if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        Duration::try_from_secs_f64(ms / 1000.0).ok()?
    } else {
        let v = text("retry-after")?;
        match v.parse::<f64>() {
            Ok(secs) => Duration::try_from_secs_f64(secs).ok()?,
            Err(_) => httpdate::parse_http_date(v)
                .ok()?
                .duration_since(SystemTime::now())
                .unwrap_or_default(),
        }
    };
    Some(wait.min(LONGEST_HOLD))
}

/// The tightest of the answer's `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}`
/// budgets: (requests left, when it resets, the requests a window allows). A token budget at
/// zero counts as no request left.
fn remaining(headers: &HeaderMap, now: Instant) -> Option<(u64, Instant, Option<u64>)> {
    let text = |name: String| headers.get(name)?.to_str().ok().map(str::trim);
    let window = text("anthropic-ratelimit-requests-limit".into()).and_then(|v| v.parse().ok());
    ["requests", "tokens", "input-tokens", "output-tokens"]
        .iter()
        .filter_map(|kind| {
            let left: u64 = text(format!("anthropic-ratelimit-{kind}-remaining"))?
                .parse()
                .ok()?;
            let reset = rfc3339(text(format!("anthropic-ratelimit-{kind}-reset"))?)?;
            let wait = reset
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .min(LONGEST_HOLD);
            // Tokens left say nothing of how many requests fit, only whether any does.
            let left = if *kind == "requests" || left == 0 {
                left
            } else {
                u64::MAX
            };
            Some((left, now + wait))
        })
        .min_by_key(|(left, _)| *left)
        .map(|(left, reset)| (left, reset, window))
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as a time.
fn rfc3339(v: &str) -> Option<SystemTime> {
    let b = v.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| v.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &v[19..];
    // The fraction counts: a reset read as its whole second would come up to a second early.
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        for (i, d) in frac.bytes().take(digits.min(9)).enumerate() {
            nanos += u32::from(d - b'0') * 10u32.pow(8 - i as u32);
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let sign = if &o[..1] == "-" { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Arc<Pace> {
        pace_for(
            account("http://test", &uuid::Uuid::new_v4().to_string()),
            None,
        )
    }

    #[test]
    fn each_model_of_an_account_has_its_own_pace_and_its_snapshots_share_it() {
        let a = account("http://test", &uuid::Uuid::new_v4().to_string());
        let opus = pace_for(a, Some("claude-opus-4-1"));
        assert!(Arc::ptr_eq(
            &opus,
            &pace_for(a, Some("claude-opus-4-1-20250805"))
        ));
        assert!(!Arc::ptr_eq(&opus, &pace_for(a, Some("claude-sonnet-4-5"))));
        assert!(!Arc::ptr_eq(
            &opus,
            &pace_for(account("http://other", "k"), Some("claude-opus-4-1"))
        ));
        assert_eq!(
            model_class(Some("claude-3-5-haiku-latest")),
            "claude-3-5-haiku-latest"
        );
        assert_eq!(model_class(None), "");
        // One model failing leaves another's requests free to go.
        opus.learn(Answer::Failing, None);
        assert!(opus.lock().down);
        assert!(!pace_for(a, Some("claude-sonnet-4-5")).lock().down);
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn retry_after_is_read_in_milliseconds_seconds_or_as_a_date_and_bounded() {
        let ms = retry_after(&headers(&[("retry-after-ms", "1500")])).unwrap();
        assert_eq!(ms, Duration::from_millis(1500));
        let s = retry_after(&headers(&[("retry-after", "7")])).unwrap();
        assert_eq!(s, Duration::from_secs(7));
        let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let d = retry_after(&headers(&[("retry-after", &date)])).unwrap();
        assert!(d > Duration::from_secs(25) && d <= Duration::from_secs(30));
        let far = retry_after(&headers(&[("retry-after", "999999")])).unwrap();
        assert_eq!(far, LONGEST_HOLD);
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
    }

    #[test]
    fn rfc3339_times_keep_their_fraction() {
        let t = rfc3339("1970-01-02T00:00:01Z").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(86_401));
        let z = rfc3339("2026-11-26T15:00:00.123Z").unwrap();
        let plus = rfc3339("2026-11-26T16:00:00+01:00").unwrap();
        assert_eq!(z, plus + Duration::from_millis(123));
        let fine = rfc3339("2026-11-26T15:00:00.1234567891Z").unwrap();
        assert_eq!(fine, plus + Duration::from_nanos(123_456_789));
        assert_eq!(rfc3339("2026-13-01T00:00:00Z"), None);
        assert_eq!(rfc3339("yesterday"), None);
    }

    #[tokio::test]
    async fn a_429_holds_every_new_request_for_its_retry_after_and_halves_the_allowance() {
        let pace = fresh();
        let wait = pace.learn(
            Answer::RateLimited,
            Some(&headers(&[("retry-after-ms", "300")])),
        );
        assert_eq!(wait, Duration::from_millis(300));
        let started = Instant::now();
        let _p = pace.acquire().await;
        assert!(started.elapsed() >= Duration::from_millis(280));
        assert_eq!(pace.lock().limit, MAX_IN_FLIGHT / 2.0);
    }

    #[tokio::test]
    async fn while_the_api_fails_one_request_probes_and_an_answer_lets_everyone_go() {
        let pace = fresh();
        pace.learn(Answer::Failing, None);
        // Past the probe interval: one probe goes, the others wait for its answer.
        tokio::time::sleep(PROBE_INTERVAL).await;
        let probe = pace.acquire().await;
        let waiting: Vec<_> = (0..4)
            .map(|_| {
                let p = pace.clone();
                tokio::spawn(async move { p.acquire().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(waiting.iter().all(|w| !w.is_finished()));
        pace.learn(Answer::Came, None);
        drop(probe);
        let started = Instant::now();
        for w in waiting {
            w.await.unwrap();
        }
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    #[tokio::test]
    async fn a_probe_that_never_answers_holds_the_next_one_back_only_for_its_bound() {
        let pace = fresh();
        pace.learn(Answer::Failing, None);
        tokio::time::sleep(PROBE_INTERVAL).await;
        // The probe hangs (its permit is never given back).
        let _hung = pace.acquire().await;
        let started = Instant::now();
        let next = pace.clone();
        let second = tokio::spawn(async move { next.acquire().await });
        tokio::time::sleep(PROBE_BOUND - Duration::from_millis(500)).await;
        assert!(
            !second.is_finished(),
            "one probe at a time while it may still answer"
        );
        let _second = tokio::time::timeout(Duration::from_secs(2), second)
            .await
            .expect("past the bound the next probe goes")
            .unwrap();
        assert!(started.elapsed() >= PROBE_BOUND - Duration::from_millis(50));
        // Its answer lets everyone go at once, the hung one still in flight.
        pace.learn(Answer::Came, None);
        let many = (0..4).map(|_| pace.acquire());
        tokio::time::timeout(Duration::from_millis(500), futures::future::join_all(many))
            .await
            .expect("everyone goes once an answer came");
    }

    #[tokio::test]
    async fn a_spent_request_budget_waits_for_its_reset_instead_of_a_429() {
        let pace = fresh();
        let reset = SystemTime::now() + Duration::from_secs(2);
        let reset = httpdate_rfc3339(reset);
        pace.learn(
            Answer::Came,
            Some(&headers(&[
                ("anthropic-ratelimit-requests-remaining", "1"),
                ("anthropic-ratelimit-requests-reset", &reset),
            ])),
        );
        let first = Instant::now();
        drop(pace.acquire().await);
        assert!(first.elapsed() < Duration::from_millis(100), "one left");
        drop(pace.acquire().await);
        assert!(
            first.elapsed() >= Duration::from_millis(900),
            "none left: waits for the reset"
        );
    }

    #[tokio::test]
    async fn answers_out_of_order_leave_the_least_of_a_window_and_a_new_window_starts_with_its_limit(
    ) {
        let pace = fresh();
        let reset = httpdate_rfc3339(SystemTime::now() + Duration::from_secs(1));
        for left in ["0", "3"] {
            pace.learn(
                Answer::Came,
                Some(&headers(&[
                    ("anthropic-ratelimit-requests-limit", "2"),
                    ("anthropic-ratelimit-requests-remaining", left),
                    ("anthropic-ratelimit-requests-reset", &reset),
                ])),
            );
        }
        assert_eq!(pace.lock().remaining.map(|r| r.0), Some(0));
        let started = Instant::now();
        let (a, b) = (pace.acquire().await, pace.acquire().await);
        assert!(
            started.elapsed() >= Duration::from_millis(500),
            "waited for the reset, {:?} after",
            started.elapsed()
        );
        // The new window's two are spent: a third waits.
        let third = tokio::time::timeout(Duration::from_millis(300), pace.acquire()).await;
        assert!(third.is_err());
        drop((a, b));
    }

    /// `t` as RFC 3339 (UTC).
    fn httpdate_rfc3339(t: SystemTime) -> String {
        crate::logging::iso8601(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
    }
}
