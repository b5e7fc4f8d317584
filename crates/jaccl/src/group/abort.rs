//! [`AbortHandle`]: stops a group's operations from any thread.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{Family, Group};
use crate::error::Error;
use crate::liveness::Liveness;
use crate::transport::listener::JobListener;
use crate::transport::questions::Revoker;

/// How long telling one member of a revocation may take.
const TELL_WITHIN: Duration = Duration::from_secs(1);

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
    /// Where the other members are told of a revocation.
    job: Option<Arc<JobListener>>,
    group: u64,
    job_rank: Arc<[usize]>,
}

impl AbortHandle {
    /// Aborts the group (see [`AbortHandle`]).
    pub fn abort(&self) {
        let _ = self.failure.set(Error::Aborted { rank: self.rank });
        if let Some(liveness) = &self.liveness {
            liveness.abort();
        }
    }

    /// Revokes the group on every member ([`Group::revoke`]): at once here, and on the others
    /// as soon as a thread of this rank has told their listeners. Idempotent, non-blocking.
    pub fn revoke(&self) {
        let Some(liveness) = &self.liveness else {
            let _ = self.failure.set(Error::Revoked {
                rank: self.rank,
                by: self.rank,
            });
            return;
        };
        let first = liveness.revoke(self.rank);
        // The first revocation names the group's revoker everywhere (another's may have
        // come in just before).
        let by = liveness.revoked_by().unwrap_or(self.rank);
        let _ = self.failure.set(Error::Revoked {
            rank: self.rank,
            by,
        });
        if !first {
            return;
        }
        if let Some(job) = &self.job {
            let me = self.job_rank.get(self.rank).copied();
            let others: Vec<usize> = self
                .job_rank
                .iter()
                .copied()
                .filter(|&r| Some(r) != me)
                .collect();
            job.tell_revoked(&others, self.group, TELL_WITHIN);
        }
    }

    /// The error that poisoned the group, if one did (every later call fails with it): an
    /// abort, a revocation, or a failure while data moved. Read without waiting for the
    /// operation in flight (for watchdogs: torchft's `errored()`).
    pub fn failure(&self) -> Option<Error> {
        self.failure.get().cloned()
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
            job: self.family.job.clone(),
            group: self.family.id,
            job_rank: Arc::clone(&self.family.job_rank),
        }
    }

    /// Revokes this group on every member, as MPI's `MPIX_Comm_revoke` does: the operation in
    /// flight on any member (blocking, or started with [`Group::start`]) stops at its next
    /// wait, which the revocation wakes, and every later call fails, each with
    /// [`Error::Revoked`] naming this rank. Non-blocking (the others are told from a thread of
    /// this rank, through their job listeners, which answer while their application
    /// computes) and idempotent; from another thread, use [`AbortHandle::revoke`]. A
    /// revoked group can still [`Group::agree`] and [`Group::shrink`]; its sub-groups are
    /// groups of their own and are not revoked with it. A member that forms the group after
    /// the revocation was sent does not hear of it, and fails at its first call on the
    /// revoker's closed connections instead.
    pub fn revoke(&self) {
        self.abort_handle().revoke();
    }
}

/// What a member's revocation of the group of `rank` in `family` calls: it poisons the group
/// with [`Error::Revoked`] and stops its operation in flight; registered with the job's
/// listener for as long as the group keeps it.
pub(super) fn revoker(
    rank: usize,
    family: &Family,
    failure: &Arc<OnceLock<Error>>,
    liveness: &Arc<Liveness>,
) -> Option<Revoker> {
    let job = family.job.as_ref()?;
    let (failure, liveness) = (Arc::clone(failure), Arc::clone(liveness));
    let job_rank = Arc::clone(&family.job_rank);
    let revoke: Revoker = Arc::new(move |by_job_rank: usize| {
        let Some(by) = job_rank.iter().position(|&r| r == by_job_rank) else {
            return;
        };
        liveness.revoke(by);
        let by = liveness.revoked_by().unwrap_or(by);
        let _ = failure.set(Error::Revoked { rank, by });
    });
    job.answers().on_revoke(family.id, &revoke);
    Some(revoke)
}
