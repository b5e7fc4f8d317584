//! [`Guarded`]: the group behind the bindings' lock. A panic in a call (a bug in jaccl) closes
//! the group instead of poisoning the lock, so that later calls raise a `jaccl.Error` saying
//! so and `close()` still works; and `close()` can end a group while a call is in flight.
//!
//! Generic over what it guards so that its tests run without a job.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::thread::ThreadId;

/// A value (the group) that one call at a time uses; gone once closed or after a panic.
pub(crate) struct Guarded<G> {
    inner: Mutex<Option<G>>,
    /// The internal error of the first panic in a call (blocking or on the progress thread,
    /// which sets it through [`Guarded::broken`]): every later call fails with it.
    broken: Arc<OnceLock<Internal>>,
    /// The thread in a call now (holding `inner`).
    busy: Mutex<Option<ThreadId>>,
    /// `close` was asked for by the thread in a call (a Python signal handler run while the
    /// call waited): the call drops the value as it returns.
    close_on_return: AtomicBool,
}

/// What a panic in a call left: the message of the `jaccl.Error` every later call raises.
#[derive(Debug, Clone)]
pub(crate) struct Internal {
    /// `None` before the group has one (`init`).
    pub(crate) rank: Option<usize>,
    pub(crate) op: &'static str,
    pub(crate) message: String,
}

/// Why a call cannot run.
#[derive(Debug)]
pub(crate) enum Unusable {
    Closed,
    Broken(Internal),
}

impl<G> Guarded<G> {
    pub(crate) fn new(value: G) -> Guarded<G> {
        Guarded {
            inner: Mutex::new(Some(value)),
            broken: Arc::default(),
            busy: Mutex::new(None),
            close_on_return: AtomicBool::new(false),
        }
    }

    /// Where an operation on the progress thread records its panic.
    pub(crate) fn broken(&self) -> Arc<OnceLock<Internal>> {
        Arc::clone(&self.broken)
    }

    /// Runs `f` on the value, after the calls of other threads (`op` on `rank`: for the
    /// error of a panic). A panic in `f` drops the value (its connections close: the peers
    /// see this rank leave) and fails this call and every later one with [`Unusable::Broken`].
    pub(crate) fn with<R>(
        &self,
        rank: usize,
        op: &'static str,
        f: impl FnOnce(&mut G) -> R,
    ) -> Result<R, Unusable> {
        if let Some(internal) = self.broken.get() {
            return Err(Unusable::Broken(internal.clone()));
        }
        let mut slot = self.lock();
        let Some(value) = slot.as_mut() else {
            return Err(Unusable::Closed);
        };
        self.set_busy(Some(std::thread::current().id()));
        let result = catch(Some(rank), op, || f(value));
        self.set_busy(None);
        match result {
            Ok(result) => {
                if self.close_on_return.load(Ordering::Acquire) {
                    drop(slot.take());
                }
                Ok(result)
            }
            Err(internal) => {
                let internal = self.broken.get_or_init(|| internal).clone();
                // Dropping a value left half-updated may panic in turn: that is contained too.
                let value = slot.take();
                let _ = catch_unwind(AssertUnwindSafe(|| drop(value)));
                Err(Unusable::Broken(internal))
            }
        }
    }

    /// Drops the value (later calls fail with [`Unusable::Closed`]). With a call in flight,
    /// `stop` first makes it end (an abort), then this waits for it, unless this thread is the
    /// one in the call (a signal handler's close), which then drops the value as it returns.
    pub(crate) fn close(&self, stop: impl FnOnce()) {
        let mut slot = match self.inner.try_lock() {
            Ok(slot) => slot,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                stop();
                if *self.busy_thread() == Some(std::thread::current().id()) {
                    self.close_on_return.store(true, Ordering::Release);
                    return;
                }
                self.lock()
            }
        };
        drop(slot.take());
    }

    /// The lock. `with` catches the panics of calls, so a poisoned lock guards a value in
    /// the state the last call left it, which the next call checks as usual.
    fn lock(&self) -> MutexGuard<'_, Option<G>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn busy_thread(&self) -> MutexGuard<'_, Option<ThreadId>> {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_busy(&self, thread: Option<ThreadId>) {
        *self.busy_thread() = thread;
    }
}

/// Runs `f`; a panic becomes the internal error of `op` on `rank`.
pub(crate) fn catch<R>(
    rank: Option<usize>,
    op: &'static str,
    f: impl FnOnce() -> R,
) -> Result<R, Internal> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let on = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
        let what = panic_message(&*panic);
        let message = match op {
            "init" => format!(
                "{on}init: internal error: jaccl panicked ({what}); no group was formed (a bug \
                 in jaccl: please report it)"
            ),
            _ => format!(
                "{on}{op}: internal error: jaccl panicked ({what}); the group is closed and every \
                 later call raises this error (a bug in jaccl: please report it)"
            ),
        };
        Internal { rank, op, message }
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Records that it was dropped (a group closing its connections).
    struct Probe(Arc<AtomicBool>);

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    fn probe() -> (Guarded<Probe>, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        (Guarded::new(Probe(Arc::clone(&dropped))), dropped)
    }

    #[test]
    fn a_panic_closes_the_value_and_every_later_call_names_it_without_poisoning() {
        let (guarded, dropped) = probe();
        assert_eq!(guarded.with(2, "all_reduce", |_| 7).ok(), Some(7));
        let failed = guarded.with(2, "all_to_all_v", |_| -> i32 {
            panic!("index out of range")
        });
        let Err(Unusable::Broken(internal)) = failed else {
            panic!("expected the internal error, got {failed:?}");
        };
        let message = &internal.message;
        assert!(
            message.starts_with("rank 2: all_to_all_v: internal error"),
            "{message}"
        );
        assert!(message.contains("index out of range"), "{message}");
        assert!(dropped.load(Ordering::Acquire), "the value was not dropped");
        let later = guarded.with(2, "barrier", |_| ());
        assert!(
            matches!(&later, Err(Unusable::Broken(i)) if i.op == "all_to_all_v"),
            "{later:?}"
        );
        // Neither lock is poisoned: close returns without stopping anything.
        guarded.close(|| panic!("no call is in flight"));
    }

    #[test]
    fn close_from_another_thread_stops_the_call_in_flight_and_waits_for_it() {
        let (guarded, dropped) = probe();
        let (stop, stopped) = mpsc::channel::<()>();
        let (entered, in_call) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let guarded = &guarded;
            let call = s.spawn(move || {
                guarded.with(0, "recv", |_| {
                    entered.send(()).unwrap();
                    // A call blocked until it is stopped (by the abort, in the bindings).
                    stopped.recv_timeout(Duration::from_secs(60)).is_ok()
                })
            });
            in_call.recv().unwrap();
            guarded.close(|| stop.send(()).unwrap());
            assert!(
                dropped.load(Ordering::Acquire),
                "close returned before the drop"
            );
            assert!(
                matches!(call.join().unwrap(), Ok(true)),
                "the call was not stopped"
            );
        });
        assert!(matches!(
            guarded.with(0, "recv", |_| ()),
            Err(Unusable::Closed)
        ));
    }

    #[test]
    fn close_from_within_a_call_ends_the_value_as_the_call_returns() {
        let (guarded, dropped) = probe();
        let stopped = AtomicBool::new(false);
        let result = guarded.with(0, "barrier", |_| {
            guarded.close(|| stopped.store(true, Ordering::Release));
            dropped.load(Ordering::Acquire)
        });
        assert!(matches!(result, Ok(false)), "dropped while the call ran");
        assert!(stopped.load(Ordering::Acquire) && dropped.load(Ordering::Acquire));
        assert!(matches!(
            guarded.with(0, "barrier", |_| ()),
            Err(Unusable::Closed)
        ));
    }
}
