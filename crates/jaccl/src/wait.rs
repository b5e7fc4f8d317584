//! How a rank waits for its peers: spin, then yield the CPU, then sleep.
//!
//! Shared memory answers in a fraction of a microsecond, but only if the waiting rank is looking
//! at the right moment; a sleeping rank pays a wake-up (tens of µs on a VM). So a rank spins
//! first, then offers its CPU to other runnable processes with `sched_yield` between checks, and
//! only then sleeps in `poll(2)` on its doorbell. With a core per rank, spinning gives the
//! cache-line round trip; with more ranks than cores, a spinning rank takes the core the rank it
//! waits for needs (a whole scheduler slice, 4 ms, per hop), so the automatic policy yields at
//! once. Links that cost a system call to re-check (TCP) yield for at most [`SYSCALL_YIELD`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a wait that no link of its own watches asks, at least every tenth of a second,
/// whether to go on: its error ends the wait. Forming a sub-group asks its parent's liveness
/// (a member lost or gone), abort, close and interrupt.
pub(crate) type GoOn = Arc<dyn Fn() -> crate::error::Result<()> + Send + Sync>;

/// How a rank waits for shared-memory peers: busy-wait for `spin` after the last progress, then
/// give the CPU away between checks (`sched_yield`) until `spin + yield_for` has passed, then
/// sleep until woken. [`Config::wait`](crate::Config::wait) / `JACCL_WAIT` set it; by default
/// ([`WaitPolicy::auto`]) it depends on whether every rank of this machine (its host, and the
/// hosts that are namespaces or containers of the same kernel) has a CPU of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitPolicy {
    /// How long to busy-wait.
    pub spin: Duration,
    /// How long to yield the CPU between checks after spinning, before sleeping.
    pub yield_for: Duration,
}

impl WaitPolicy {
    /// Sleep as soon as nothing moves (the least CPU, the most latency).
    pub const SLEEP: WaitPolicy = WaitPolicy {
        spin: Duration::ZERO,
        yield_for: Duration::ZERO,
    };

    /// The measured default for `ranks` ranks on a machine with `cpus` CPUs (docs/algorithms.md,
    /// "Waiting"). With a CPU per rank, spin long enough to catch a peer that is a few µs behind;
    /// with more ranks than CPUs, never spin: yield, so the peer can run.
    pub fn auto(ranks: usize, cpus: usize) -> WaitPolicy {
        if ranks <= cpus {
            WaitPolicy {
                spin: Duration::from_micros(100),
                yield_for: Duration::from_millis(2),
            }
        } else {
            WaitPolicy {
                spin: Duration::ZERO,
                yield_for: Duration::from_millis(2),
            }
        }
    }
}

impl WaitPolicy {
    /// The policy for operations on the progress thread (nonblocking ones): the caller's own
    /// thread computes beside it, and peers may be computing too, so it neither spins nor
    /// yields for longer than [`SYSCALL_YIELD`] before it sleeps, whatever this policy says: a
    /// waiting thread that yields stays runnable and takes its share of a core from the threads
    /// that compute (docs/algorithms.md, "Nonblocking operations").
    pub(crate) fn in_background(self) -> WaitPolicy {
        WaitPolicy {
            spin: Duration::ZERO,
            yield_for: self.yield_for.min(SYSCALL_YIELD),
        }
    }
}

impl fmt::Display for WaitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spin={},yield={}",
            humantime::format_duration(self.spin),
            humantime::format_duration(self.yield_for)
        )
    }
}

impl FromStr for WaitPolicy {
    type Err = String;

    /// `sleep`, `spin=50us`, `yield=2ms`, or both separated by a comma (`spin=20us,yield=1ms`);
    /// a phase not named lasts 0.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("sleep") {
            return Ok(WaitPolicy::SLEEP);
        }
        let mut policy = WaitPolicy::SLEEP;
        for part in s.split(',').map(str::trim) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                format!("'{part}' is not key=duration (expected e.g. spin=50us,yield=2ms or sleep)")
            })?;
            let duration = humantime::parse_duration(value.trim())
                .map_err(|e| format!("'{value}' is not a duration ({e})"))?;
            match key.trim().to_ascii_lowercase().as_str() {
                "spin" => policy.spin = duration,
                "yield" => policy.yield_for = duration,
                other => {
                    return Err(format!(
                        "unknown phase '{other}' (expected spin and/or yield)"
                    ));
                }
            }
        }
        Ok(policy)
    }
}

/// What to do after a check found nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Check again (the backoff spun or yielded).
    Retry,
    /// Sleep until woken, at most this long.
    Sleep(Duration),
    /// The timeout passed without progress.
    TimedOut,
}

/// One wait: tracks the time since the last progress and applies a [`WaitPolicy`]. The clock
/// is read only once a wait outlasts its first [`CLOCK_EVERY`] spins (a peer a cache-line
/// round trip away answers before), then every [`CLOCK_EVERY`] checks.
pub(crate) struct Backoff {
    policy: WaitPolicy,
    timeout: Duration,
    /// Since when nothing moved; `None` until the clock is first read.
    since: Option<Instant>,
    /// Checks since the clock was last read.
    unclocked: u32,
}

const CLOCK_EVERY: u32 = 32;

/// The longest yield phase of a wait on links that need a system call to re-check (TCP). Short:
/// ranks yielding for the policy's 2 ms in system calls, 8 ranks on 2 CPUs and two tests at
/// once, kept heartbeat threads off the CPU for over 500 ms (the tests' liveness window), while
/// 50 µs already gives most of the gain (4 ranks on 2 CPUs, 8 B all-reduce: 77 µs sleeping at
/// once, 42 µs with 50 µs of yield, 39 µs with 1 ms; docs/algorithms.md, "Waiting").
pub(crate) const SYSCALL_YIELD: Duration = Duration::from_micros(50);

impl Backoff {
    pub(crate) fn new(policy: WaitPolicy, timeout: Duration) -> Backoff {
        Backoff {
            policy,
            timeout,
            since: None,
            unclocked: 0,
        }
    }

    /// Something moved: the timeout and the spin phase start again.
    pub(crate) fn progressed(&mut self) {
        self.since = None;
        self.unclocked = 0;
    }

    /// Nothing moved. `in_memory`: re-checking costs no system call. Links that need one (TCP)
    /// yield for at most [`SYSCALL_YIELD`] of the policy's yield phase.
    pub(crate) fn idle(&mut self, in_memory: bool) -> Idle {
        if self.unclocked < CLOCK_EVERY && !self.policy.spin.is_zero() {
            self.unclocked += 1;
            std::hint::spin_loop();
            return Idle::Retry;
        }
        self.unclocked = 0;
        let idle = self.since.get_or_insert_with(Instant::now).elapsed();
        if idle >= self.timeout {
            return Idle::TimedOut;
        }
        if idle < self.policy.spin {
            std::hint::spin_loop();
            return Idle::Retry;
        }
        let yield_for = match in_memory {
            true => self.policy.yield_for,
            false => self.policy.yield_for.min(SYSCALL_YIELD),
        };
        if idle < self.policy.spin.saturating_add(yield_for) {
            rustix::thread::sched_yield();
            return Idle::Retry;
        }
        Idle::Sleep(self.timeout - idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print() {
        let p: WaitPolicy = "spin=20us,yield=1ms".parse().unwrap();
        assert_eq!(p.spin, Duration::from_micros(20));
        assert_eq!(p.yield_for, Duration::from_millis(1));
        assert_eq!(p.to_string().parse::<WaitPolicy>(), Ok(p));
        assert_eq!("sleep".parse::<WaitPolicy>(), Ok(WaitPolicy::SLEEP));
        assert_eq!(
            "yield=5ms".parse::<WaitPolicy>().unwrap().spin,
            Duration::ZERO
        );
        assert!("spin".parse::<WaitPolicy>().is_err());
        assert!("spin=fast".parse::<WaitPolicy>().is_err());
        assert!("nap=1s".parse::<WaitPolicy>().is_err());
    }

    #[test]
    fn background_waits_never_spin_and_yield_briefly() {
        for policy in [
            WaitPolicy::auto(2, 2),
            WaitPolicy::auto(8, 2),
            WaitPolicy::SLEEP,
        ] {
            let bg = policy.in_background();
            assert_eq!(bg.spin, Duration::ZERO);
            assert_eq!(bg.yield_for, policy.yield_for.min(SYSCALL_YIELD));
        }
    }

    #[test]
    fn oversubscribed_ranks_never_spin() {
        assert_eq!(WaitPolicy::auto(8, 2).spin, Duration::ZERO);
        assert!(WaitPolicy::auto(2, 2).spin > Duration::ZERO);
    }

    #[test]
    fn links_that_need_a_system_call_yield_only_briefly() {
        let yield_only = WaitPolicy {
            spin: Duration::ZERO,
            yield_for: Duration::from_secs(5),
        };
        let mut b = Backoff::new(yield_only, Duration::from_secs(5));
        assert_eq!(b.idle(false), Idle::Retry);
        std::thread::sleep(SYSCALL_YIELD);
        assert!(matches!(b.idle(false), Idle::Sleep(_)));
        assert_eq!(b.idle(true), Idle::Retry);
        let mut b = Backoff::new(WaitPolicy::auto(1, 1), Duration::from_secs(5));
        assert_eq!(b.idle(false), Idle::Retry);
        let mut b = Backoff::new(WaitPolicy::SLEEP, Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(b.idle(true), Idle::TimedOut);
    }
}
