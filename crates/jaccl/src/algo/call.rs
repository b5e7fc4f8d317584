//! A call as the algorithms see it: what the caller asked for (named in errors and headers),
//! and the caller's buffers.

use std::time::Duration;

use super::plan::{Buf, Span};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op};
use crate::op_header::{Digest, Header, Kind, rooted_history};
use crate::wait::WaitPolicy;

/// What the caller asked for: names the operation in errors and headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) op: Op,
    pub(crate) dtype: Dtype,
    pub(crate) reduce: ReduceOp,
    /// Elements, as in the header (the sum of the counts for the variable-size collectives).
    pub(crate) count: usize,
    /// The root of a rooted collective; a send's or receive's tag (0 otherwise).
    pub(crate) root: usize,
    /// The digest of the counts of a variable-size collective whose ranks must agree on them.
    pub(crate) counts: Option<Digest>,
    /// A send's or receive's whole message in elements (see [`Header::message`]); 0 for the
    /// collectives.
    pub(crate) message: usize,
    /// The call's number among its group's collectives (0 for point to point): every rank
    /// counts the same calls, so that a message no rank read in an earlier call is told from
    /// this call's ([`Header::number`]).
    pub(crate) number: u32,
    /// The digest of the group's rooted collectives before this one
    /// ([`crate::op_header::rooted_history`]; zeros before the first).
    pub(crate) history: Digest,
    pub(crate) timeout: Duration,
    pub(crate) wait: WaitPolicy,
    /// Whether waits ask the caller's interrupt check (not on the progress thread).
    pub(crate) interruptible: bool,
}

impl Call {
    /// The header of this call, as operation `seq` on a connection, sent by `sender`.
    pub(crate) fn header(&self, seq: u32, sender: usize) -> Header {
        let kind = Kind::of(self.op);
        Header {
            seq,
            number: self.number,
            kind,
            dtype: self.dtype,
            reduce: self.reduce,
            sender: crate::op_header::to_u32(sender),
            count: self.count as u64,
            root: crate::op_header::to_u32(self.root),
            counts: self.counts,
            message: self.message as u64,
            history: kind.has_history().then_some(self.history),
        }
    }

    /// Whether the call is a collective (which every rank counts), not a send or receive.
    pub(crate) fn is_collective(&self) -> bool {
        !matches!(self.op, Op::Send | Op::Recv)
    }

    /// The error for a wait that saw no progress for the timeout.
    pub(crate) fn timed_out(&self) -> Error {
        Error::Timeout {
            rank: self.rank,
            op: self.op,
            after: self.timeout,
        }
    }
}

/// What a group counts of its calls, alike on every rank: the number of its next collective
/// and the digest of its rooted ones so far ([`Call::number`], [`Call::history`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallNumbers {
    collectives: u32,
    rooted: Digest,
}

impl CallNumbers {
    /// `call` as the group's next: numbered (point to point: 0), with the digest of the
    /// rooted calls before it.
    pub(crate) fn number(&self, call: Call) -> Call {
        Call {
            number: if call.is_collective() {
                self.collectives
            } else {
                0
            },
            history: self.rooted,
            ..call
        }
    }

    /// Counts `call` ([`CallNumbers::number`]'s) as run, unless `refused` for its arguments
    /// (nothing sent: its retry is the same call). With `direct` collectives, which check
    /// roots their own way and whose headers carry no digest, the digest stays as it is.
    pub(crate) fn count(&mut self, call: &Call, refused: bool, direct: bool) {
        if !call.is_collective() || refused {
            return;
        }
        self.collectives = self.collectives.wrapping_add(1);
        if Kind::of(call.op).rooted() && !direct {
            let header = call.header(0, call.rank);
            self.rooted = rooted_history(&call.history, call.number, &header);
        }
    }
}

/// The caller's buffers, as bytes. `input` is `None` when the call is in place.
pub(crate) struct Buffers<'a> {
    pub(crate) input: Option<&'a [u8]>,
    pub(crate) output: &'a mut [u8],
}

impl<'a> Buffers<'a> {
    pub(crate) fn new(input: Option<&'a [u8]>, output: &'a mut [u8]) -> Buffers<'a> {
        Buffers { input, output }
    }

    /// No buffers: for a plan that only sends headers.
    pub(crate) fn none() -> Buffers<'static> {
        Buffers::new(None, &mut [])
    }

    pub(super) fn read(&self, span: Span) -> &[u8] {
        let buf = match (span.buf, self.input) {
            (Buf::Input, Some(input)) => input,
            _ => &*self.output,
        };
        &buf[span.off..span.off + span.len]
    }
}
