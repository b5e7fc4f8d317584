//! The one error type of the library, grouped by whose fault it is.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// The operation during which an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Group creation: configuration, bootstrap, connection set-up.
    Init,
    /// `all_sum`, `all_max`, `all_min`, `all_reduce*`.
    AllReduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `send`.
    Send,
    /// `recv`.
    Recv,
    /// `barrier`.
    Barrier,
    /// `broadcast`.
    Broadcast,
    /// `reduce`.
    Reduce,
    /// `gather`.
    Gather,
    /// `scatter`.
    Scatter,
    /// `all_to_all`.
    AllToAll,
    /// `all_to_all_v`.
    AllToAllV,
    /// `all_gather_v`.
    AllGatherV,
    /// `reduce_scatter_v`.
    ReduceScatterV,
    /// `split` and `subgroup`: forming a sub-group.
    Split,
    /// `agree`: agreeing on a flag and on the ranks alive.
    Agree,
    /// `shrink` and `shrink_excluding`: forming the group of the ranks alive.
    Shrink,
    /// `grow`, and `init` joining a running group: forming the group with new processes.
    Grow,
}

impl Op {
    /// The name used in messages, e.g. `all_reduce`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Init => "init",
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Barrier => "barrier",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
            Op::AllToAll => "all_to_all",
            Op::AllToAllV => "all_to_all_v",
            Op::AllGatherV => "all_gather_v",
            Op::ReduceScatterV => "reduce_scatter_v",
            Op::Split => "split",
            Op::Agree => "agree",
            Op::Shrink => "shrink",
            Op::Grow => "grow",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can go wrong. Each variant says whose fault it is and carries the rank that
/// reports it, so a log line from any rank is self-explanatory.
///
/// After an error that happened while data was moving (`PeerLost`, `Timeout`, `Mismatch`,
/// `Deadlock`, `Protocol`, `Interrupted`, `Io`) the group is *poisoned*: it has closed its connections (so its peers fail
/// promptly too) and every later call returns the same error at once. Create a new group to go on.
/// Argument errors are found before any data moves and leave the group usable.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A peer closed its connections (it exited, crashed, or its group failed) while this rank
    /// still needed it.
    #[error("rank {rank}: {op}: lost rank {peer}: {cause}")]
    PeerLost {
        /// The rank reporting the error.
        rank: usize,
        /// The rank whose connection went away.
        peer: usize,
        /// The operation that was running.
        op: Op,
        /// What the transport saw (end of stream, connection reset, ...).
        cause: String,
    },
    /// No data moved for the configured timeout: a peer is stopped, far too slow, or waiting in
    /// another operation. The message says "timed out" and "timeout", the words that
    /// frameworks' tools and users' scripts look for (PyTorch's tests match " timeout ").
    #[error(
        "rank {rank}: {op}: timed out after {after:?} without progress (the operation timeout of Config::timeout / JACCL_TIMEOUT: a peer is stopped, overloaded, or not in this operation)"
    )]
    Timeout {
        /// The rank reporting the error.
        rank: usize,
        /// The operation that was running.
        op: Op,
        /// How long the operation waited without progress.
        after: Duration,
    },
    /// Ranks called different collectives, or the same one with different types, reductions or
    /// lengths. Found from the small header every operation sends before its data.
    #[error("rank {rank}: {op}: rank {peer} disagrees: {detail}")]
    Mismatch {
        /// The rank reporting the error.
        rank: usize,
        /// The rank whose call differs.
        peer: usize,
        /// The operation this rank called.
        op: Op,
        /// Both calls, side by side.
        detail: String,
    },
    /// Every rank waits for another and no data is on its way to any of them, so no call can
    /// ever finish: the program's calls do not match up (for example, two ranks that both
    /// call `recv` from each other before they `send`). Found by the coordinator from what
    /// each rank's waiting call reports through the heartbeat ([`crate::Config::liveness`]),
    /// within about two beats, instead of waiting for the operation timeout.
    #[error("rank {rank}: {op}: deadlock: {detail}")]
    Deadlock {
        /// The rank reporting the error.
        rank: usize,
        /// The operation this rank was in.
        op: Op,
        /// What each rank waits for.
        detail: String,
    },
    /// The connection with a peer broke its protocol: bytes that are not jaccl's (corruption,
    /// a foreign program, a stream that lost its framing), or a transport failure that is not
    /// the peer going away (an RDMA completion with an error status, named by the library).
    #[error("rank {rank}: {op}: protocol error with rank {peer}: {detail}")]
    Protocol {
        /// The rank reporting the error.
        rank: usize,
        /// The rank that sent the bytes.
        peer: usize,
        /// The operation that was running.
        op: Op,
        /// What was wrong.
        detail: String,
    },
    /// The caller's interrupt check ([`crate::Group::interrupt_when`]) asked a waiting
    /// operation to stop (Ctrl-C in the Python bindings). The operation stopped half-way.
    #[error("rank {rank}: {op}: interrupted while waiting for the other ranks")]
    Interrupted {
        /// The rank reporting the error.
        rank: usize,
        /// The operation that was running.
        op: Op,
    },
    /// The group was dropped while this operation, started with [`crate::Group::start`], was
    /// running or waiting to run: it stopped half-way or never started.
    #[error("rank {rank}: the group was dropped before the operation finished")]
    Closed {
        /// The rank reporting the error.
        rank: usize,
    },
    /// The group was aborted from any thread ([`crate::AbortHandle::abort`]): the operation
    /// in flight stopped at its next wait (half-way: the group is poisoned) and every later
    /// call fails with this error.
    #[error("rank {rank}: the group was aborted (AbortHandle::abort); it can no longer be used")]
    Aborted {
        /// The rank reporting the error.
        rank: usize,
    },
    /// A member revoked the group ([`crate::Group::revoke`]): the operation in flight stopped
    /// at its next wait and every later call fails with this error. The group can still
    /// agree and shrink ([`crate::Group::shrink`]).
    #[error("rank {rank}: the group was revoked by rank {by}")]
    Revoked {
        /// The rank reporting the error.
        rank: usize,
        /// The rank that revoked the group.
        by: usize,
    },
    /// The other ranks agreed on the ranks alive without this one (they took it for lost: it
    /// was stopped or unreachable for the liveness window), or left it out of a shrink: it is
    /// not in the group they formed.
    #[error("rank {rank}: {op}: the other ranks went on without this rank: {detail}")]
    LeftOut {
        /// The rank reporting the error.
        rank: usize,
        /// The operation that was running.
        op: Op,
        /// What the others decided.
        detail: String,
    },
    /// Start-up failed: the coordinator is unreachable or refused us, a rank did not join in
    /// time, ranks disagree on the configuration, or data connections could not be made.
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// The configuration is invalid: a bad environment variable, builder value or file. The
    /// message names the variable (or setting) and the value.
    #[error("configuration error: {0}")]
    Config(String),
    /// The caller passed arguments that cannot work (buffer lengths, ranks). Nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The request is valid but not available here (e.g. a transport this build or machine lacks).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An operating-system error that is not a lost peer.
    #[error("rank {rank}: I/O error: {context}: {source}")]
    Io {
        /// The rank reporting the error.
        rank: usize,
        /// What failed (`listening for data connections`, `all_reduce: poll`...).
        context: String,
        /// The operating system's error as it was reported (its kind, its code:
        /// [`Error::raw_os_error`]).
        #[source]
        source: Arc<io::Error>,
    },
}

impl Error {
    /// This error of a sub-group's operation, as the group it serves reports it: its ranks
    /// are that group's (`rank_in_group` maps them), its operation is `in_op`, and its text
    /// (which may name ranks of the sub-group) says which sub-group it comes from: `within`.
    pub(crate) fn seen_from(
        self,
        in_op: Op,
        rank_in_group: impl Fn(usize) -> usize,
        within: &str,
    ) -> Error {
        let map = &rank_in_group;
        let noted = |text: String| format!("{text} ({within})");
        match self {
            Error::PeerLost {
                rank, peer, cause, ..
            } => Error::PeerLost {
                rank: map(rank),
                peer: map(peer),
                op: in_op,
                cause: noted(cause),
            },
            Error::Timeout { rank, after, .. } => Error::Timeout {
                rank: map(rank),
                op: in_op,
                after,
            },
            Error::Mismatch {
                rank, peer, detail, ..
            } => Error::Mismatch {
                rank: map(rank),
                peer: map(peer),
                op: in_op,
                detail: noted(detail),
            },
            Error::Deadlock { rank, detail, .. } => Error::Deadlock {
                rank: map(rank),
                op: in_op,
                detail: noted(detail),
            },
            Error::Protocol {
                rank, peer, detail, ..
            } => Error::Protocol {
                rank: map(rank),
                peer: map(peer),
                op: in_op,
                detail: noted(detail),
            },
            Error::Interrupted { rank, .. } => Error::Interrupted {
                rank: map(rank),
                op: in_op,
            },
            Error::Closed { rank } => Error::Closed { rank: map(rank) },
            Error::Aborted { rank } => Error::Aborted { rank: map(rank) },
            Error::Revoked { rank, by } => Error::Revoked {
                rank: map(rank),
                by: map(by),
            },
            Error::LeftOut { rank, detail, .. } => Error::LeftOut {
                rank: map(rank),
                op: in_op,
                detail: noted(detail),
            },
            Error::Io {
                rank,
                context,
                source,
            } => Error::Io {
                rank: map(rank),
                context: noted(context),
                source,
            },
            other => other,
        }
    }

    /// Wraps an I/O error with what failed (`what`, on `rank`), keeping the error itself.
    pub(crate) fn io(rank: usize, what: impl fmt::Display, err: io::Error) -> Error {
        Error::Io {
            rank,
            context: what.to_string(),
            source: Arc::new(err),
        }
    }

    /// The rank that reports the error, for the errors that happen in a group (`None` for
    /// start-up, configuration and argument errors, whose messages name the rank where known).
    pub fn rank(&self) -> Option<usize> {
        match self {
            Error::PeerLost { rank, .. }
            | Error::Timeout { rank, .. }
            | Error::Mismatch { rank, .. }
            | Error::Deadlock { rank, .. }
            | Error::Protocol { rank, .. }
            | Error::Interrupted { rank, .. }
            | Error::Closed { rank }
            | Error::Aborted { rank }
            | Error::Io { rank, .. } => Some(*rank),
            _ => None,
        }
    }

    /// The other rank the error is about: the one lost, the one that disagrees, the one that
    /// broke the protocol.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::PeerLost { peer, .. }
            | Error::Mismatch { peer, .. }
            | Error::Protocol { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// The operation that was running.
    pub fn op(&self) -> Option<Op> {
        match self {
            Error::PeerLost { op, .. }
            | Error::Timeout { op, .. }
            | Error::Mismatch { op, .. }
            | Error::Deadlock { op, .. }
            | Error::Protocol { op, .. }
            | Error::Interrupted { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// The operating system's error of an [`Error::Io`], as it was reported (also its
    /// [`std::error::Error::source`], as an `Arc<io::Error>`).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The operating system's error code of an [`Error::Io`] (`ENOMEM` from registering RDMA
    /// memory, `EMFILE`...), where it has one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.io_error().and_then(io::Error::raw_os_error)
    }

    /// The message of a `Config` error without its prefix (for re-wording), else the whole.
    pub(crate) fn detail(&self) -> String {
        match self {
            Error::Config(msg) => msg.clone(),
            other => other.to_string(),
        }
    }

    /// True for errors found before any data moved; they do not poison the group.
    pub(crate) fn is_local_argument_error(&self) -> bool {
        matches!(self, Error::InvalidArgument(_) | Error::Unsupported(_))
    }
}

/// Why waiting for `rank` fails after it dropped its group (every transport says the same).
pub(crate) fn left_the_group(rank: usize) -> String {
    format!("rank {rank} left the group (it dropped it)")
}

/// `Result` with jaccl's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn io_errors_keep_their_code_and_source_and_accessors_name_the_ranks() {
        let e = Error::io(3, "listening", io::Error::from_raw_os_error(24));
        assert_eq!(e.raw_os_error(), Some(24));
        assert_eq!(e.rank(), Some(3));
        let source = e.source().and_then(|s| s.downcast_ref::<Arc<io::Error>>());
        assert_eq!(source.and_then(|s| s.raw_os_error()), Some(24));
        assert!(e.io_error().is_some());
        assert!(
            e.to_string().starts_with("rank 3: I/O error: listening: "),
            "{e}"
        );
        let lost = Error::PeerLost {
            rank: 1,
            peer: 2,
            op: Op::Barrier,
            cause: "gone".into(),
        };
        assert_eq!(
            (lost.rank(), lost.peer(), lost.op()),
            (Some(1), Some(2), Some(Op::Barrier))
        );
        let config = Error::Config("x".into());
        assert_eq!(
            (config.rank(), config.peer(), config.op()),
            (None, None, None)
        );
    }
}
