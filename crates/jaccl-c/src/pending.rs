//! The calling thread's batch as it fills (`batch` runs it): how deep `jaccl_batch_begin`
//! calls nest, and the sends and receives queued meanwhile. Below the entry points, so that
//! every one of them can ask whether a batch is open.

use std::cell::RefCell;

use crate::errors::{Failure, invalid};
use crate::operation::{Kind, Operation};

/// A queued send or receive.
pub(crate) struct Queued {
    /// The address of its communicator (alive until the batch ends, by the header's rule).
    pub(crate) comm: usize,
    pub(crate) kind: Kind,
    pub(crate) op: &'static str,
    pub(crate) call: Box<dyn Operation>,
}

/// The calling thread's batch.
#[derive(Default)]
struct Batch {
    depth: usize,
    queued: Vec<Queued>,
}

thread_local! {
    static BATCH: RefCell<Batch> = RefCell::default();
}

/// Whether the calling thread is inside a batch.
pub(crate) fn is_open() -> bool {
    BATCH.with(|b| b.borrow().depth > 0)
}

/// An error unless the calling thread is outside a batch: `op` (of `rank`) cannot wait for
/// its end.
pub(crate) fn outside(rank: usize, op: &str) -> Result<(), Failure> {
    match is_open() {
        false => Ok(()),
        true => Err(invalid(
            Some(rank),
            op,
            "only jaccl_send and jaccl_recv may be called between jaccl_batch_begin and \
             jaccl_batch_end",
        )),
    }
}

/// Queues a send or receive for the end of the calling thread's batch.
pub(crate) fn queue(queued: Queued) {
    BATCH.with(|b| b.borrow_mut().queued.push(queued));
}

/// Opens a batch, or one more level of it.
pub(crate) fn begin() {
    BATCH.with(|b| b.borrow_mut().depth += 1);
}

/// Closes a level: the outermost gives what was queued, an inner one nothing; `None` if no
/// batch was open.
pub(crate) fn end() -> Option<Vec<Queued>> {
    BATCH.with(|b| {
        let mut batch = b.borrow_mut();
        batch.depth = batch.depth.checked_sub(1)?;
        Some(match batch.depth {
            0 => std::mem::take(&mut batch.queued),
            _ => Vec::new(),
        })
    })
}
