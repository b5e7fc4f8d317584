//! [`AbortHandle`]: stops a group's operations from any thread.

use std::sync::{Arc, OnceLock};

use super::Group;
use crate::error::Error;
use crate::liveness::Liveness;

/// Stops a [`Group`]'s operations from any thread, while another thread may be blocked in one
/// ([`Group::abort_handle`]). For watchdogs (torchft's `abort()`), Python's `close()` from
/// another thread, and shutdown paths that must not wait for a stuck peer.
///
/// After [`AbortHandle::abort`], the operation in flight (blocking or started with
/// [`Group::start`]) stops at its next wait, which the abort wakes, and fails with
/// [`Error::Aborted`], and the group closes its connections as after any failure (so its peers
/// fail promptly with [`Error::PeerLost`]); every later call fails with [`Error::Aborted`] at
/// once (with no operation in flight, the connections close when the group is dropped). An
/// operation that needs no wait may still finish first. Aborting is idempotent.
#[derive(Clone)]
pub struct AbortHandle {
    rank: usize,
    failure: Arc<OnceLock<Error>>,
    liveness: Option<Arc<Liveness>>,
}

impl AbortHandle {
    /// Aborts the group (see [`AbortHandle`]).
    pub fn abort(&self) {
        let _ = self.failure.set(Error::Aborted { rank: self.rank });
        if let Some(liveness) = &self.liveness {
            liveness.abort();
        }
    }

    /// Whether [`AbortHandle::abort`] was called on a handle of this group.
    pub fn is_aborted(&self) -> bool {
        matches!(self.failure.get(), Some(Error::Aborted { .. }))
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("rank", &self.rank)
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

impl Group {
    /// A handle that aborts this group from any thread ([`AbortHandle`]), even while this
    /// thread is blocked in one of its operations.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            rank: self.rank,
            failure: Arc::clone(&self.failure),
            liveness: self.liveness.clone(),
        }
    }
}
