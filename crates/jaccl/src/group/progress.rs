//! Nonblocking operations: a progress thread per group runs the operations started with
//! [`crate::Group::start`] in the order they were started, while the caller's thread goes on; a
//! [`Request`] is the caller's handle on one of them.
//!
//! The thread is made on the first [`crate::Group::start`] and runs each operation on a view of the
//! group that shares its state (`Group::progress_view`). A blocking call waits until every
//! operation started before it has finished, then runs on the caller's thread, so operations
//! of one group run in the order they were started, blocking ones included, and a blocking
//! call costs nothing extra when none is outstanding. The thread never spins and yields its
//! CPU for at most 50 µs before it sleeps (`WaitPolicy::in_background`): the caller's thread
//! computes beside it, and a thread that keeps yielding stays runnable and takes its share of
//! a core from it.
//!
//! Dropping the group stops the operation running (it fails with [`Error::Closed`]; aborting
//! it, with [`Error::Aborted`]), fails those not started, and joins the thread before the
//! group's memory goes: an operation owns its buffers, so none outlives them.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;

/// An operation for the progress thread: it runs on the thread's view `V` of the group and
/// completes its request.
pub(super) type Job<V> = Box<dyn FnOnce(&mut V) + Send>;

/// The progress thread of a group, once made; it runs operations on its view `V` of it.
pub(super) struct Progress<V> {
    jobs: Option<Sender<Job<V>>>,
    thread: Option<JoinHandle<()>>,
    outstanding: Arc<Outstanding>,
}

/// How many started operations have not finished yet, and a wake-up when that changes.
#[derive(Default)]
pub(super) struct Outstanding {
    count: Mutex<usize>,
    changed: Condvar,
}

impl Outstanding {
    fn count(&self) -> MutexGuard<'_, usize> {
        // The lock guards a counter only: a panic elsewhere cannot leave it inconsistent.
        self.count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self) {
        *self.count() += 1;
    }

    fn finish(&self) {
        let mut count = self.count();
        *count = count.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Returns once no started operation is left.
    pub(super) fn settle(&self) {
        let mut count = self.count();
        while *count > 0 {
            count = self
                .changed
                .wait(count)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

impl<V: Send + 'static> Progress<V> {
    /// Starts the thread (named after `rank`), which runs each job on `view`.
    pub(super) fn spawn(mut view: V, rank: usize) -> std::io::Result<Progress<V>> {
        let (jobs, queue): (Sender<Job<V>>, Receiver<Job<V>>) = mpsc::channel();
        let outstanding = Arc::new(Outstanding::default());
        let done = Arc::clone(&outstanding);
        let thread = std::thread::Builder::new()
            .name(format!("jaccl-progress-{rank}"))
            .spawn(move || {
                for job in queue {
                    job(&mut view);
                    done.finish();
                }
            })?;
        Ok(Progress {
            jobs: Some(jobs),
            thread: Some(thread),
            outstanding,
        })
    }

    /// Queues `job`; false if the thread is gone (it ended with a panic).
    pub(super) fn submit(&self, job: Job<V>) -> bool {
        self.outstanding.add();
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            self.outstanding.finish();
        }
        sent
    }

    /// Returns once every operation started so far has finished.
    pub(super) fn settle(&self) {
        self.outstanding.settle();
    }

    /// Lets the thread run what is queued (each fails at once if the group is closing) and
    /// end, and waits for it.
    pub(super) fn join(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The handle of an operation started with [`crate::Group::start`]: wait for it to get what the
/// operation returned (the buffers it was given back, typically) or its error.
///
/// Dropping a request does not stop the operation; its result is then dropped with it.
#[must_use = "an operation's error is only seen through its request"]
pub struct Request<R> {
    slot: Arc<Slot<R>>,
}

struct Slot<R> {
    result: Mutex<Option<Result<R>>>,
    done: Condvar,
}

impl<R> Slot<R> {
    fn result(&self) -> MutexGuard<'_, Option<Result<R>>> {
        // Holds a value only: a panic elsewhere cannot leave it inconsistent.
        self.result
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn complete(&self, result: Result<R>) {
        *self.result() = Some(result);
        self.done.notify_all();
    }
}

impl<R> Request<R> {
    /// A request and the function that completes it.
    pub(super) fn new() -> (Request<R>, impl FnOnce(Result<R>) + Send + 'static)
    where
        R: Send + 'static,
    {
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        let completer = Arc::clone(&slot);
        (Request { slot }, move |r| completer.complete(r))
    }

    /// A request that is already complete.
    pub(super) fn completed(result: Result<R>) -> Request<R>
    where
        R: Send + 'static,
    {
        let (request, complete) = Request::new();
        complete(result);
        request
    }

    /// Whether the operation has finished (then [`Request::wait`] returns at once).
    pub fn is_done(&self) -> bool {
        self.slot.result().is_some()
    }

    /// Waits up to `timeout` for the operation to finish; returns whether it has.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut result = self.slot.result();
        while result.is_none() {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return false;
            }
            result = match self.slot.done.wait_timeout(result, left) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }

    /// A copy of what the operation returned, once it has finished (for a request that
    /// several threads look at, as bindings to other languages keep them).
    pub fn outcome(&self) -> Option<Result<R>>
    where
        R: Clone,
    {
        self.slot.result().clone()
    }

    /// Waits for the operation to finish and returns what it returned.
    ///
    /// # Errors
    /// The operation's error: the errors of the group's blocking calls (after a failure
    /// while data moved, the group is poisoned and the later operations fail with the same
    /// error), or [`Error::Closed`] if the group was dropped before the operation finished.
    pub fn wait(self) -> Result<R> {
        let mut result = self.slot.result();
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            result = self
                .slot
                .done
                .wait(result)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

impl<R> std::fmt::Debug for Request<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("done", &self.is_done())
            .finish()
    }
}
