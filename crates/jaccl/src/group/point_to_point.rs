//! Sends and receives between two ranks of a [`Group`], with tags, and from any source.

use super::Group;
use crate::algo::call::Call;
use crate::dtype::{Dtype, Element};
use crate::error::{Op, Result};
// The docs name the errors.
#[cfg(doc)]
use crate::error::Error;

impl Group {
    /// Sends `data` to rank `dst`, which must call [`Group::recv`] with the same length and
    /// type; any other rank of the group, whatever the topology (a connection to a rank that
    /// is not a ring neighbour is made the first time, and kept). Returns once the data is
    /// handed to the transport.
    ///
    /// Ranks may send before they receive, even in a cycle (every rank sends to the next,
    /// then receives from the one before): a rank waiting for its receiver to make room reads
    /// ahead, into memory, whatever its peers are sending it (up to 64 MiB per connection),
    /// and its later calls take those bytes first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `dst` that is this rank or out of range; otherwise the
    /// transport errors of [`Error`], after which the group is poisoned.
    pub fn send<T: Element>(&mut self, data: &[T], dst: usize) -> Result<()> {
        self.send_tagged(data, dst, 0)
    }

    /// [`Group::send`] with a tag the receiver must name too ([`Group::recv_tagged`]; plain
    /// `send` and `recv` use tag 0). Messages between two ranks still arrive in the order they
    /// were sent: tags are checked, not matched, so a receive whose tag differs from the next
    /// message's fails with [`Error::Mismatch`] naming both tags, rather than taking it. Tags
    /// are compared whole (all 32 bits).
    ///
    /// # Errors
    /// As [`Group::send`].
    pub fn send_tagged<T: Element>(&mut self, data: &[T], dst: usize, tag: u32) -> Result<()> {
        let bytes = T::as_bytes(data);
        self.send_piece_raw(&bytes, dst, T::DTYPE, tag, bytes.len())
    }

    /// [`Group::send_tagged`] of raw bytes holding elements of `dtype`, for bindings to other
    /// languages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `data` is a whole number of elements; otherwise as
    /// [`Group::send`].
    pub fn send_raw(&mut self, data: &[u8], dst: usize, dtype: Dtype, tag: u32) -> Result<()> {
        self.send_piece_raw(data, dst, dtype, tag, data.len())
    }

    /// [`Group::send_raw`] of one piece of a message of `message` bytes that travels in
    /// several calls, for bindings that interleave the pieces of several messages (the torch
    /// backend does, so that a ring of sends cannot wait for itself). The receiver takes it
    /// with [`Group::recv_piece_raw`] (or [`Group::recv_any_piece_raw`]) naming the same
    /// `message`: every piece carries it, so a receiver whose message differs fails with
    /// [`Error::Mismatch`] at the first piece, even when the pieces agree.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `data` and `message` are whole numbers of elements
    /// and `message` is at least `data`; otherwise as [`Group::send`].
    pub fn send_piece_raw(
        &mut self,
        data: &[u8],
        dst: usize,
        dtype: Dtype,
        tag: u32,
        message: usize,
    ) -> Result<()> {
        self.check_usable()?;
        self.elements(Op::Send, "data", data.len(), dtype)?;
        self.check_piece(Op::Send, data.len(), message, dtype)?;
        self.check_peer(Op::Send, dst)?;
        let call = self.p2p_call(Op::Send, dtype, data.len(), message, tag);
        self.run(call, |c, call| c.send(data, dst, call))
    }

    /// Checks that a piece of `bytes` can be part of a message of `message` bytes of `dtype`
    /// (the piece's own length is checked with the call's other buffers).
    fn check_piece(&self, op: Op, bytes: usize, message: usize, dtype: Dtype) -> Result<()> {
        self.elements(op, "message", message, dtype)?;
        if bytes > message {
            let why = format!("a piece of {bytes} bytes of a message of {message} bytes");
            return Err(self.invalid(op, why));
        }
        Ok(())
    }

    /// Receives into `out` what rank `src` sends with [`Group::send`] (same length and type).
    ///
    /// # Errors
    /// As [`Group::send`]; a sender whose length, type or tag differs gives
    /// [`Error::Mismatch`].
    pub fn recv<T: Element>(&mut self, out: &mut [T], src: usize) -> Result<()> {
        self.recv_tagged(out, src, 0)
    }

    /// Receives into `out` what rank `src` sends with [`Group::send_tagged`] and the same
    /// `tag` (see there: tags are checked, not matched).
    ///
    /// # Errors
    /// As [`Group::recv`].
    pub fn recv_tagged<T: Element>(&mut self, out: &mut [T], src: usize, tag: u32) -> Result<()> {
        T::with_bytes_mut(out, |bytes| {
            let call = self.p2p_call(Op::Recv, T::DTYPE, bytes.len(), bytes.len(), tag);
            self.recv_bytes(bytes, src, call)
        })
    }

    /// [`Group::recv_tagged`] into raw bytes holding elements of `dtype`, for bindings to
    /// other languages. `bool` bytes other than 0 and 1 that a sender sent arrive as 1.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `out` is a whole number of elements; otherwise as
    /// [`Group::recv`].
    pub fn recv_raw(&mut self, out: &mut [u8], src: usize, dtype: Dtype, tag: u32) -> Result<()> {
        let message = out.len();
        self.recv_piece_raw(out, src, dtype, tag, message)
    }

    /// Receives into `out` a piece of a message of `message` bytes that rank `src` sends with
    /// [`Group::send_piece_raw`] (see there).
    ///
    /// # Errors
    /// As [`Group::send_piece_raw`], with `out` for `data`, and as [`Group::recv`].
    pub fn recv_piece_raw(
        &mut self,
        out: &mut [u8],
        src: usize,
        dtype: Dtype,
        tag: u32,
        message: usize,
    ) -> Result<()> {
        self.check_piece(Op::Recv, out.len(), message, dtype)?;
        self.raw(Op::Recv, dtype, &[], ("out", out), |g, out| {
            let call = g.p2p_call(Op::Recv, dtype, out.len(), message, tag);
            g.recv_bytes(out, src, call)
        })
    }

    /// Runs `call`, a receive into `out` from `src`.
    fn recv_bytes(&mut self, out: &mut [u8], src: usize, call: Call) -> Result<()> {
        self.check_usable()?;
        self.check_peer(Op::Recv, src)?;
        self.run(call, |c, call| c.recv(out, src, call))
    }

    /// Receives into `out` the next message any other rank sends to this one with
    /// [`Group::send`] (same length and type, tag 0), and returns the sender's rank, as
    /// `MPI_Recv` from `MPI_ANY_SOURCE`. Of several messages that have begun to arrive, it
    /// takes the first in a round of the ranks that starts after the sender of this rank's
    /// previous `recv_any` (so senders are taken in turn, and none starves); messages from one
    /// rank still arrive in the order they were sent. The whole message is then received, and
    /// its header checked, as [`Group::recv`] does. A rank waiting here can be reached by
    /// every other: links to ranks off the ring that it would open itself are opened first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] in a group of one; as [`Group::recv`] (a sender whose
    /// length, type or tag differs gives [`Error::Mismatch`]); [`Error::PeerLost`] once every
    /// other rank has left the group.
    pub fn recv_any<T: Element>(&mut self, out: &mut [T]) -> Result<usize> {
        self.recv_any_tagged(out, 0)
    }

    /// [`Group::recv_any`] of a message sent with [`Group::send_tagged`] and this `tag`
    /// (checked, not matched: the message taken must have it).
    ///
    /// # Errors
    /// As [`Group::recv_any`].
    pub fn recv_any_tagged<T: Element>(&mut self, out: &mut [T], tag: u32) -> Result<usize> {
        T::with_bytes_mut(out, |bytes| {
            let call = self.p2p_call(Op::Recv, T::DTYPE, bytes.len(), bytes.len(), tag);
            self.recv_any_bytes(bytes, call)
        })
    }

    /// [`Group::recv_any_tagged`] into raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `out` is a whole number of elements; otherwise as
    /// [`Group::recv_any`].
    pub fn recv_any_raw(&mut self, out: &mut [u8], dtype: Dtype, tag: u32) -> Result<usize> {
        let message = out.len();
        self.recv_any_piece_raw(out, dtype, tag, message)
    }

    /// [`Group::recv_any_raw`] of the first piece of a message of `message` bytes (see
    /// [`Group::send_piece_raw`]); the later pieces come from the sender it returns.
    ///
    /// # Errors
    /// As [`Group::recv_piece_raw`] and [`Group::recv_any`].
    pub fn recv_any_piece_raw(
        &mut self,
        out: &mut [u8],
        dtype: Dtype,
        tag: u32,
        message: usize,
    ) -> Result<usize> {
        self.check_piece(Op::Recv, out.len(), message, dtype)?;
        let mut src = 0;
        self.raw(Op::Recv, dtype, &[], ("out", out), |g, out| {
            let call = g.p2p_call(Op::Recv, dtype, out.len(), message, tag);
            src = g.recv_any_bytes(out, call)?;
            Ok(())
        })?;
        Ok(src)
    }

    /// Runs `call`, a receive into `out` from any rank; returns the sender.
    fn recv_any_bytes(&mut self, out: &mut [u8], call: Call) -> Result<usize> {
        self.check_usable()?;
        if self.alone() {
            let why = "a group of one has no other rank to receive from".to_string();
            return Err(self.invalid(Op::Recv, why));
        }
        let mut src = 0;
        self.run(call, |c, call| {
            src = c.recv_any(out, call)?;
            Ok(())
        })?;
        Ok(src)
    }
}
