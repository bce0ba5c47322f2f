//! The wall clock in Unix milliseconds, the one unit the adapter writes times in: the
//! transcript's and the audit record's entries, a checkout's record, the session registry's
//! start times. One helper, so that they all agree on what a time before the epoch is.

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` in milliseconds since the Unix epoch; 0 for a time before it (a clock set back that far
/// is no reason to fail a session).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_time_is_its_milliseconds_since_the_epoch_and_one_before_it_is_zero() {
        let t = UNIX_EPOCH + Duration::from_micros(1_795_000_000_123_999);
        assert_eq!(unix_ms(t), 1_795_000_000_123);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        let (before, now, after) = (
            unix_ms(SystemTime::now()),
            now_ms(),
            unix_ms(SystemTime::now()),
        );
        assert!(before <= now && now <= after);
    }
}
