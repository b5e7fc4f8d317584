//! A call as the algorithms see it: what the caller asked for (named in errors and headers),
//! and the caller's buffers.

use std::time::Duration;

use super::plan::{Buf, Span};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op};
use crate::op_header::{Digest, Header, Kind};
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
    pub(crate) timeout: Duration,
    pub(crate) wait: WaitPolicy,
    /// Whether waits ask the caller's interrupt check (not on the progress thread).
    pub(crate) interruptible: bool,
}

impl Call {
    /// The header of this call, as operation `seq` on a connection, sent by `sender`.
    pub(crate) fn header(&self, seq: u32, sender: usize) -> Header {
        Header {
            seq,
            number: self.number,
            kind: Kind::of(self.op),
            dtype: self.dtype,
            reduce: self.reduce,
            sender: crate::op_header::to_u32(sender),
            count: self.count as u64,
            root: crate::op_header::to_u32(self.root),
            counts: self.counts,
            message: self.message as u64,
        }
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
