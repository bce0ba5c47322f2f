//! Riding out an API outage, for one session (`apiOutageTolerance`). The relay holds a request
//! whose answer was retryable (overloaded, rate limited, a 5xx, a connection that could not be
//! made) before any byte of that answer reached the CLI, and tries it again until the API is
//! back or the outage has lasted the tolerance: the CLI sees a slow answer, not a failure. What
//! the relay cannot hide (an answer cut after it began to stream) is recorded here too, so the
//! lifecycle can tell that the CLI ended on an API failure and continue its conversation.
//!
//! One [`ApiOutage`] lives as long as the session, across every CLI run of it (a resumed
//! conversation is the same session): the outage's clock does not restart with a new CLI.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// Said of a wait, for the engine's output stream and the transcript.
pub type OutageNotice = Box<dyn Fn(&str) + Send + Sync>;

/// One session's view of the API's failures.
pub struct ApiOutage {
    tolerance: Duration,
    stop: CancellationToken,
    notice: OutageNotice,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the current outage began (its first failure since the last answer that came).
    since: Option<Instant>,
    /// What the API last failed with.
    reason: String,
    /// Time requests were held, over the session's ended outages: each from its first failure
    /// to the answer that ended it (the failed attempts' round trips included, so the figure
    /// does not shrink with a slow API or a loaded engine).
    waited: Duration,
    /// Requests sent again after a retryable failure, over the session.
    retries: u32,
}

/// What the relay does after a retryable failure.
pub(crate) enum Hold {
    /// Wait until then, then send again.
    Until(Instant),
    /// Past the tolerance (or stopped): give the CLI the failure.
    GiveUp,
}

/// A session's counts, for its stats.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutageCounts {
    pub retries: u32,
    pub waited: Duration,
}

impl ApiOutage {
    /// `tolerance`: how long one outage may last before the session fails (zero: the relay
    /// holds nothing, as before). `stop`: the session's stop (a cancel ends a wait at once).
    pub fn new(tolerance: Duration, stop: CancellationToken, notice: OutageNotice) -> Arc<Self> {
        Arc::new(ApiOutage {
            tolerance,
            stop,
            notice,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A retryable failure (`reason`, e.g. "529 overloaded_error") of a request the CLI has not
    /// seen an answer to: when to send it again (`wait` from now, never past the tolerance),
    /// or give up.
    pub(crate) fn failed(&self, reason: &str, wait: Duration) -> Hold {
        let now = Instant::now();
        let mut s = self.state();
        let since = *s.since.get_or_insert(now);
        s.reason = reason.to_string();
        let deadline = since + self.tolerance;
        if self.tolerance.is_zero() || now >= deadline || self.stop.is_cancelled() {
            return Hold::GiveUp;
        }
        let until = (now + wait).min(deadline);
        s.retries += 1;
        drop(s);
        (self.notice)(&format!(
            "the model API failed ({reason}); the request is held and sent again in {:.1} s (outage {} s of {} s tolerated)",
            (until - now).as_secs_f64(),
            now.duration_since(since).as_secs(),
            self.tolerance.as_secs()
        ));
        Hold::Until(until)
    }

    /// Waits until `until`; false when the session was stopped meanwhile.
    pub(crate) async fn wait(&self, until: Instant) -> bool {
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => true,
            _ = self.stop.cancelled() => false,
        }
    }

    /// An answer came: the outage, if there was one, is over.
    pub(crate) fn answered(&self) {
        let mut s = self.state();
        if let Some(since) = s.since.take() {
            s.waited += since.elapsed();
            let reason = std::mem::take(&mut s.reason);
            drop(s);
            (self.notice)(&format!(
                "the model API answers again, after {} s ({reason})",
                since.elapsed().as_secs()
            ));
        }
    }

    /// The failures since the last answer were one request's own (the API answers others):
    /// no outage, nothing to resume; what they were is told (`text`).
    pub(crate) fn not_an_outage(&self, text: &str) {
        let mut s = self.state();
        if let Some(since) = s.since.take() {
            s.waited += since.elapsed();
            s.reason.clear();
        }
        drop(s);
        (self.notice)(text);
    }

    /// A request waits its turn in the fleet's pace (the API fails for the fleet, or its rate
    /// limit is spent): the session's outage begins, if it had not, and the wait counts toward
    /// the tolerance. Until when it may wait; `None` without a tolerance.
    pub(crate) fn queued(&self) -> Option<Instant> {
        if self.tolerance.is_zero() {
            return None;
        }
        let mut s = self.state();
        let since = *s.since.get_or_insert_with(Instant::now);
        if s.reason.is_empty() {
            s.reason =
                "waiting in the fleet's pace while the model API fails or its rate limit is spent"
                    .to_string();
        }
        Some(since + self.tolerance)
    }

    /// A failure the CLI saw (an answer cut after it began): the outage begins, if it had not.
    pub(crate) fn cut(&self, reason: &str) {
        let mut s = self.state();
        s.since.get_or_insert_with(Instant::now);
        s.reason = reason.to_string();
    }

    /// The outage under way, if any: what failed and for how long, and whether the session
    /// may still wait for it (within the tolerance).
    pub fn ongoing(&self) -> Option<(String, Duration, bool)> {
        let s = self.state();
        let since = s.since?;
        let lasted = since.elapsed();
        Some((s.reason.clone(), lasted, lasted < self.tolerance))
    }

    /// The tolerance (zero: off).
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// What the session's requests went through so far (an outage under way counts to now).
    pub fn counts(&self) -> OutageCounts {
        let s = self.state();
        OutageCounts {
            retries: s.retries,
            waited: s.waited + s.since.map_or(Duration::ZERO, |since| since.elapsed()),
        }
    }

    /// Tells the engine's stream (as the relay's own notices are told).
    pub fn notice(&self, text: &str) {
        (self.notice)(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage(tolerance: Duration) -> (Arc<ApiOutage>, Arc<Mutex<Vec<String>>>) {
        let said = Arc::new(Mutex::new(Vec::new()));
        let s = said.clone();
        let o = ApiOutage::new(
            tolerance,
            CancellationToken::new(),
            Box::new(move |t| s.lock().unwrap().push(t.to_string())),
        );
        (o, said)
    }

    #[test]
    fn a_failure_within_the_tolerance_is_held_and_an_answer_ends_the_outage() {
        let (o, said) = outage(Duration::from_secs(60));
        assert!(o.ongoing().is_none());
        let Hold::Until(until) = o.failed("529 overloaded_error", Duration::from_secs(2)) else {
            panic!("held")
        };
        assert!(until > Instant::now() + Duration::from_secs(1));
        let (reason, _, may_wait) = o.ongoing().unwrap();
        assert_eq!(reason, "529 overloaded_error");
        assert!(may_wait);
        o.answered();
        assert!(o.ongoing().is_none());
        assert_eq!(o.counts().retries, 1);
        let said = said.lock().unwrap();
        assert!(said[0].contains("529 overloaded_error") && said[0].contains("held"));
        assert!(said[1].contains("answers again"));
    }

    #[test]
    fn the_wait_never_goes_past_the_tolerance_and_a_zero_tolerance_holds_nothing() {
        let (o, _) = outage(Duration::from_millis(300));
        let Hold::Until(until) = o.failed("503", Duration::from_secs(30)) else {
            panic!("held")
        };
        assert!(until <= Instant::now() + Duration::from_millis(300));
        std::thread::sleep(Duration::from_millis(320));
        assert!(matches!(o.failed("503", Duration::ZERO), Hold::GiveUp));
        assert!(!o.ongoing().unwrap().2, "past the tolerance");
        let (off, said) = outage(Duration::ZERO);
        assert!(matches!(off.failed("529", Duration::ZERO), Hold::GiveUp));
        assert!(said.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_stop_ends_a_wait_at_once() {
        let stop = CancellationToken::new();
        let o = ApiOutage::new(Duration::from_secs(600), stop.clone(), Box::new(|_| {}));
        let Hold::Until(until) = o.failed("529", Duration::from_secs(300)) else {
            panic!("held")
        };
        let started = Instant::now();
        let waiting = tokio::spawn({
            let o = o.clone();
            async move { o.wait(until).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.cancel();
        assert!(!waiting.await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
