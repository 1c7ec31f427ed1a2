//! A solve's time: one clock started when the solve begins, and the time rules its stages
//! use (a share of the whole limit counted from the start, or a share of what is left).
//! Every rule saturates: a limit too large for a [`Duration`] (or infinite) means no limit,
//! and a zero or negative one means no time, never a panic or a wrapped clock.

use std::time::{Duration, Instant};

/// About a century: the deadline of a limit too large to be a time.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The time of one solve: its start and its limit in seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    start: Instant,
    limit_s: f64,
}

/// What was left of a [`Budget`] at one moment: rules that take a share of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Left {
    /// When it was read.
    pub at: Instant,
    /// Seconds left then (negative past the limit).
    pub seconds: f64,
}

/// `at` plus `seconds` (none where not positive), or far in the future where that is not a
/// time.
fn after(at: Instant, seconds: f64) -> Instant {
    let seconds = if seconds.is_nan() {
        0.0
    } else {
        seconds.max(0.0)
    };
    Duration::try_from_secs_f64(seconds)
        .ok()
        .and_then(|d| at.checked_add(d))
        .unwrap_or_else(|| at.checked_add(FAR).unwrap_or(at))
}

impl Budget {
    /// A budget of `limit_s` seconds starting now.
    pub fn start(limit_s: f64) -> Self {
        Self::starting_at(Instant::now(), limit_s)
    }

    /// A budget of `limit_s` seconds that started at `start`.
    pub fn starting_at(start: Instant, limit_s: f64) -> Self {
        Self { start, limit_s }
    }

    /// When the solve began.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// The deadline at `share` of the limit from the start (`0.25`: a quarter of the way).
    pub fn by_share(&self, share: f64) -> Instant {
        after(self.start, self.limit_s * share)
    }

    /// What is left now.
    pub fn left(&self) -> Left {
        let at = Instant::now();
        Left {
            at,
            seconds: self.limit_s - at.duration_since(self.start).as_secs_f64(),
        }
    }
}

impl Left {
    /// Seconds of `share` of what was left (negative past the limit, as the time left).
    pub fn share_s(&self, share: f64) -> f64 {
        self.seconds * share
    }

    /// The deadline `share` of what was left after it was read.
    pub fn deadline(&self, share: f64) -> Instant {
        after(self.at, self.seconds * share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_the_limit_count_from_the_start() {
        let start = Instant::now();
        let b = Budget::starting_at(start, 60.0);
        assert_eq!(b.by_share(0.25), start + Duration::from_secs(15));
        assert_eq!(b.by_share(0.0), start);
        let left = Left {
            at: start,
            seconds: 10.0,
        };
        assert_eq!(left.deadline(0.5), start + Duration::from_secs(5));
        assert_eq!(left.share_s(0.5), 5.0);
    }

    #[test]
    fn huge_and_infinite_limits_mean_no_limit() {
        let start = Instant::now();
        for limit in [f64::INFINITY, f64::MAX, 1e300, 1e20] {
            let b = Budget::starting_at(start, limit);
            let d = b.by_share(0.25);
            assert!(d >= start + Duration::from_secs(365 * 24 * 3600), "{limit}");
            assert!(b.left().deadline(0.5) > start + Duration::from_secs(365 * 24 * 3600));
        }
    }

    #[test]
    fn zero_negative_and_nan_limits_mean_no_time() {
        let start = Instant::now();
        for limit in [0.0, -5.0, f64::NEG_INFINITY, f64::NAN] {
            let b = Budget::starting_at(start, limit);
            assert_eq!(b.by_share(0.6), start, "{limit}");
            let left = b.left();
            assert!(left.deadline(0.1) <= Instant::now(), "{limit}");
        }
    }
}
