//! Every operation of a [`Group`]: the typed methods, their `_raw` forms for bindings to other
//! languages, and the byte-level one both call, which checks the arguments and runs the call on
//! the group's collectives ([`crate::algo::collectives`]).

use super::Group;
use crate::algo::engine::Call;
use crate::dtype::{Dtype, Element, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::wire::counts_digest;

/// A typed call on bytes: `input` and `output` viewed as the bytes of their elements (`bool`s
/// are normalised on the way back).
fn typed<T: Element, R>(input: &[T], output: &mut [T], f: impl FnOnce(&[u8], &mut [u8]) -> R) -> R {
    let input = T::as_bytes(input);
    T::with_bytes_mut(output, |out| f(&input, out))
}

/// A `Mismatch` of a variable-size collective, with this rank's counts (the peer's error shows
/// the peer's): two ranks whose counts differ see where.
fn showing_counts(e: Error, counts: &[usize]) -> Error {
    const SHOWN: usize = 16;
    match e {
        Error::Mismatch {
            rank,
            peer,
            op,
            detail,
        } => {
            let more = match counts.len() > SHOWN {
                true => format!(" and {} more", counts.len() - SHOWN),
                false => String::new(),
            };
            let shown = &counts[..counts.len().min(SHOWN)];
            Error::Mismatch {
                rank,
                peer,
                op,
                detail: format!("{detail}; this rank's counts are {shown:?}{more}"),
            }
        }
        other => other,
    }
}

/// `counts[0] + counts[1] + ...`, or `None` if it overflows.
fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |t, &c| t.checked_add(c))
}

impl Group {
    /// Element-wise sum over all ranks of `input` into `output` (same length).
    ///
    /// # Errors
    /// See [`Group::all_reduce`].
    pub fn all_sum<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce(input, output, ReduceOp::Sum)
    }

    /// Element-wise maximum over all ranks of `input` into `output` (same length).
    ///
    /// # Errors
    /// See [`Group::all_reduce`].
    pub fn all_max<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce(input, output, ReduceOp::Max)
    }

    /// Element-wise minimum over all ranks of `input` into `output` (same length).
    ///
    /// # Errors
    /// See [`Group::all_reduce`].
    pub fn all_min<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce(input, output, ReduceOp::Min)
    }

    /// Reduces `input` element-wise over all ranks with `op`; every rank receives the same
    /// result, bit for bit, in `output`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ or `op` does not apply to `T`
    /// ([`ReduceOp::applies_to`]); otherwise the transport errors of [`Error`] (`PeerLost`,
    /// `Timeout`, `Mismatch`, ...), after which the group is poisoned.
    pub fn all_reduce<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.all_reduce_bytes(Some(i), o, T::DTYPE, op)
        })
    }

    /// [`Group::all_reduce`] with the result written over `data`.
    ///
    /// # Errors
    /// As [`Group::all_reduce`].
    pub fn all_reduce_in_place<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        T::with_bytes_mut(data, |bytes| {
            self.all_reduce_bytes(None, bytes, T::DTYPE, op)
        })
    }

    /// [`Group::all_reduce`] over raw bytes holding elements of `dtype`, for bindings to other
    /// languages. `bool` bytes other than 0 and 1 count as true; the output holds 0 or 1.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the lengths differ or are not a whole number of elements;
    /// otherwise as [`Group::all_reduce`].
    pub fn all_reduce_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::AllReduce,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.all_reduce_bytes(Some(input), out, dtype, op),
        )
    }

    /// [`Group::all_reduce_raw`] with the result written over `data`.
    ///
    /// # Errors
    /// As [`Group::all_reduce_raw`].
    pub fn all_reduce_raw_in_place(
        &mut self,
        data: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        self.raw(Op::AllReduce, dtype, &[], ("data", data), |g, data| {
            g.all_reduce_bytes(None, data, dtype, op)
        })
    }

    fn all_reduce_bytes(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let which = Op::AllReduce;
        self.check_usable()?;
        if let Some(input) = input {
            self.check_len(
                which,
                "output",
                output.len(),
                input.len() / dtype.size(),
                dtype,
            )?;
        }
        let reducer = self.reducer(which, dtype, op)?;
        let call = self.call(which, dtype, op, output.len() / dtype.size());
        match input {
            Some(input) => self.copy_or_run(call, input, output, |c, i, o, call| {
                c.all_reduce(Some(i), o, &reducer, call)
            })?,
            None => self.run(call, |c, call| c.all_reduce(None, output, &reducer, call))?,
        }
        reducer.finish(output, self.size);
        Ok(())
    }

    /// Gathers every rank's `input` into `output`, which holds `size()` blocks of
    /// `input.len()` elements: block `r` is rank r's input.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `output.len() == size() * input.len()`; otherwise the
    /// transport errors of [`Error`], after which the group is poisoned.
    pub fn all_gather<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        typed(input, output, |i, o| self.all_gather_bytes(i, o, T::DTYPE))
    }

    /// [`Group::all_gather`] over raw bytes holding elements of `dtype`, for bindings to other
    /// languages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless both are whole numbers of elements and
    /// `output.len() == size() * input.len()`; otherwise as [`Group::all_gather`].
    pub fn all_gather_raw(&mut self, input: &[u8], output: &mut [u8], dtype: Dtype) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::AllGather,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.all_gather_bytes(input, out, dtype),
        )
    }

    fn all_gather_bytes(&mut self, input: &[u8], output: &mut [u8], dtype: Dtype) -> Result<()> {
        let op = Op::AllGather;
        self.check_usable()?;
        self.check_blocks(op, dtype, ("output", output.len()), ("input", input.len()))?;
        let call = self.call(op, dtype, ReduceOp::Sum, input.len() / dtype.size());
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.all_gather(i, o, call)
        })
    }

    /// Reduces `input` (`size()` blocks of `output.len()` elements) over all ranks with `op`
    /// and leaves block `rank()` of the result in `output`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `input.len() == size() * output.len()` and `op`
    /// applies to `T`; otherwise the transport errors of [`Error`], after which the group is
    /// poisoned.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.reduce_scatter_bytes(i, o, T::DTYPE, op)
        })
    }

    /// [`Group::reduce_scatter`] over raw bytes holding elements of `dtype`, for bindings to
    /// other languages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless both are whole numbers of elements and
    /// `input.len() == size() * output.len()`; otherwise as [`Group::reduce_scatter`].
    pub fn reduce_scatter_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::ReduceScatter,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.reduce_scatter_bytes(input, out, dtype, op),
        )
    }

    fn reduce_scatter_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let which = Op::ReduceScatter;
        self.check_usable()?;
        self.check_blocks(
            which,
            dtype,
            ("input", input.len()),
            ("output", output.len()),
        )?;
        let reducer = self.reducer(which, dtype, op)?;
        let call = self.call(which, dtype, op, output.len() / dtype.size());
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.reduce_scatter(i, o, &reducer, call)
        })?;
        reducer.finish(output, self.size);
        Ok(())
    }

    /// Copies `data` of rank `root` into `data` of every other rank (every rank passes the
    /// same length).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `root` out of range; otherwise the transport errors of
    /// [`Error`] (a rank whose length differs gives `Mismatch`), after which the group is
    /// poisoned.
    pub fn broadcast<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        T::with_bytes_mut(data, |d| self.broadcast_bytes(d, T::DTYPE, root))
    }

    /// [`Group::broadcast`] over raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `data` is a whole number of elements; otherwise as
    /// [`Group::broadcast`].
    pub fn broadcast_raw(&mut self, data: &mut [u8], dtype: Dtype, root: usize) -> Result<()> {
        self.raw(Op::Broadcast, dtype, &[], ("data", data), |g, d| {
            g.broadcast_bytes(d, dtype, root)
        })
    }

    fn broadcast_bytes(&mut self, data: &mut [u8], dtype: Dtype, root: usize) -> Result<()> {
        let op = Op::Broadcast;
        self.check_usable()?;
        self.check_root(op, root)?;
        let mut call = self.call(op, dtype, ReduceOp::Sum, data.len() / dtype.size());
        call.root = root;
        self.run(call, |c, call| c.broadcast(data, call))
    }

    /// Reduces `input` element-wise over all ranks with `op` into `output` of rank `root`
    /// (`input.len()` elements there; elsewhere `output` is not written and may be empty).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `root` out of range, an `output` of the wrong length
    /// (on the root: `input.len()`; elsewhere: 0 or `input.len()`), or an `op` that does not
    /// apply to `T`; otherwise the transport errors of [`Error`], after which the group is
    /// poisoned.
    pub fn reduce<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.reduce_bytes(i, o, T::DTYPE, op, root)
        })
    }

    /// [`Group::reduce`] over raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// As [`Group::reduce`], and whole numbers of elements.
    pub fn reduce_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(Op::Reduce, dtype, &buffers, ("output", output), |g, out| {
            g.reduce_bytes(input, out, dtype, op, root)
        })
    }

    fn reduce_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let which = Op::Reduce;
        self.check_usable()?;
        self.check_root(which, root)?;
        let count = input.len() / dtype.size();
        if self.rank == root || !output.is_empty() {
            self.check_len(which, "output", output.len(), count, dtype)?;
        }
        let reducer = self.reducer(which, dtype, op)?;
        let mut call = self.call(which, dtype, op, count);
        call.root = root;
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.reduce(i, o, &reducer, call)
        })?;
        if self.rank == root {
            reducer.finish(output, self.size);
        }
        Ok(())
    }

    /// Gathers every rank's `input` into `output` of rank `root`, which holds `size()` blocks
    /// of `input.len()` elements (block `r` is rank r's input); elsewhere `output` is not
    /// written and may be empty.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `root` out of range or an `output` of the wrong length
    /// (on the root `size() * input.len()`; elsewhere 0 or that); otherwise the transport
    /// errors of [`Error`], after which the group is poisoned.
    pub fn gather<T: Element>(&mut self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        typed(input, output, |i, o| {
            self.gather_bytes(i, o, T::DTYPE, root)
        })
    }

    /// [`Group::gather`] over raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// As [`Group::gather`], and whole numbers of elements.
    pub fn gather_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        root: usize,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(Op::Gather, dtype, &buffers, ("output", output), |g, out| {
            g.gather_bytes(input, out, dtype, root)
        })
    }

    fn gather_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        root: usize,
    ) -> Result<()> {
        let op = Op::Gather;
        self.check_usable()?;
        self.check_root(op, root)?;
        if self.rank == root || !output.is_empty() {
            self.check_blocks(op, dtype, ("output", output.len()), ("input", input.len()))?;
        }
        let mut call = self.call(op, dtype, ReduceOp::Sum, input.len() / dtype.size());
        call.root = root;
        self.copy_or_run(call, input, output, |c, i, o, call| c.gather(i, o, call))
    }

    /// Hands block `r` of `input` of rank `root` (`size()` blocks of `output.len()` elements)
    /// to rank r's `output`; elsewhere `input` is not read and may be empty.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `root` out of range or an `input` of the wrong length
    /// (on the root `size() * output.len()`; elsewhere 0 or that); otherwise the transport
    /// errors of [`Error`], after which the group is poisoned.
    pub fn scatter<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        root: usize,
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.scatter_bytes(i, o, T::DTYPE, root)
        })
    }

    /// [`Group::scatter`] over raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// As [`Group::scatter`], and whole numbers of elements.
    pub fn scatter_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        root: usize,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::Scatter,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.scatter_bytes(input, out, dtype, root),
        )
    }

    fn scatter_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        root: usize,
    ) -> Result<()> {
        let op = Op::Scatter;
        self.check_usable()?;
        self.check_root(op, root)?;
        if self.rank == root || !input.is_empty() {
            self.check_blocks(op, dtype, ("input", input.len()), ("output", output.len()))?;
        }
        let mut call = self.call(op, dtype, ReduceOp::Sum, output.len() / dtype.size());
        call.root = root;
        self.copy_or_run(call, input, output, |c, i, o, call| c.scatter(i, o, call))
    }

    /// Every rank sends block `d` of `input` (`size()` equal blocks) to rank d, and receives
    /// rank s's block for it into block `s` of `output` (the same length as `input`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless the lengths are equal and a multiple of `size()`;
    /// otherwise the transport errors of [`Error`], after which the group is poisoned.
    pub fn all_to_all<T: Element>(&mut self, input: &[T], output: &mut [T]) -> Result<()> {
        typed(input, output, |i, o| self.all_to_all_bytes(i, o, T::DTYPE))
    }

    /// [`Group::all_to_all`] over raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// As [`Group::all_to_all`], and whole numbers of elements.
    pub fn all_to_all_raw(&mut self, input: &[u8], output: &mut [u8], dtype: Dtype) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::AllToAll,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.all_to_all_bytes(input, out, dtype),
        )
    }

    fn all_to_all_bytes(&mut self, input: &[u8], output: &mut [u8], dtype: Dtype) -> Result<()> {
        let op = Op::AllToAll;
        self.check_usable()?;
        let count = input.len() / dtype.size();
        self.check_len(op, "output", output.len(), count, dtype)?;
        if !count.is_multiple_of(self.size) {
            return Err(self.invalid(
                op,
                format!(
                    "input has {count} elements, not {} equal blocks (use all_to_all_v)",
                    self.size
                ),
            ));
        }
        let call = self.call(op, dtype, ReduceOp::Sum, count / self.size);
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.all_to_all(i, o, call)
        })
    }

    /// Every rank sends `send_counts[d]` elements of `input` (in order: the first
    /// `send_counts[0]` to rank 0, ...) to rank d, and receives `recv_counts[s]` from rank s
    /// into `output` (in order of s). A rank's `send_counts[d]` must equal rank d's
    /// `recv_counts` of it; zeros are fine.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for counts that are not `size()` long or do not add up to
    /// the lengths, and in a group of one for `send_counts[0] != recv_counts[0]`;
    /// [`Error::Mismatch`] naming both ranks when a sender's count differs from
    /// its receiver's, found before any data moves; otherwise the transport errors of
    /// [`Error`], after which the group is poisoned.
    pub fn all_to_all_v<T: Element>(
        &mut self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.all_to_all_v_bytes(i, send_counts, o, recv_counts, T::DTYPE)
        })
    }

    /// [`Group::all_to_all_v`] over raw bytes holding elements of `dtype` (counts in elements).
    ///
    /// # Errors
    /// As [`Group::all_to_all_v`], and whole numbers of elements.
    pub fn all_to_all_v_raw(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        dtype: Dtype,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::AllToAllV,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.all_to_all_v_bytes(input, send_counts, out, recv_counts, dtype),
        )
    }

    fn all_to_all_v_bytes(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        dtype: Dtype,
    ) -> Result<()> {
        let op = Op::AllToAllV;
        self.check_usable()?;
        for (name, counts, buffer, len) in [
            ("send_counts", send_counts, "input", input.len()),
            ("recv_counts", recv_counts, "output", output.len()),
        ] {
            self.check_counts(op, name, counts)?;
            let sum = total(counts).unwrap_or(usize::MAX);
            self.check_len(op, buffer, len, sum, dtype)?;
        }
        if self.alone() {
            // This rank is its own sender: the counts it sends and receives must be one.
            let (sent, received) = (send_counts[0], recv_counts[0]);
            if sent != received {
                return Err(self.invalid(
                    op,
                    format!(
                        "send_counts[0] is {sent} but recv_counts[0] is {received}: a group \
                         of one sends itself what it receives"
                    ),
                ));
            }
            output.copy_from_slice(input);
            return Ok(());
        }
        let call = self.call(op, dtype, ReduceOp::Sum, 0);
        self.run(call, |c, call| {
            c.all_to_all_v(input, send_counts, output, recv_counts, dtype.size(), call)
        })
    }

    /// Gathers every rank's `input` into `output` (every rank's, in rank order) when the ranks
    /// contribute different lengths: `counts[r]` is rank r's, the same `counts` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `counts` has `size()` entries, `counts[rank()]` is
    /// `input.len()` and `output.len()` their sum; [`Error::Mismatch`] when ranks pass
    /// different counts; otherwise the transport errors of [`Error`], after which the group is
    /// poisoned.
    pub fn all_gather_v<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.all_gather_v_bytes(i, o, counts, T::DTYPE)
        })
    }

    /// [`Group::all_gather_v`] over raw bytes holding elements of `dtype` (counts in elements).
    ///
    /// # Errors
    /// As [`Group::all_gather_v`], and whole numbers of elements.
    pub fn all_gather_v_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        dtype: Dtype,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::AllGatherV,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.all_gather_v_bytes(input, out, counts, dtype),
        )
    }

    fn all_gather_v_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        dtype: Dtype,
    ) -> Result<()> {
        let op = Op::AllGatherV;
        self.check_usable()?;
        self.check_counts(op, "counts", counts)?;
        self.check_len(op, "input", input.len(), counts[self.rank], dtype)?;
        let sum = total(counts).unwrap_or(usize::MAX);
        self.check_len(op, "output", output.len(), sum, dtype)?;
        let call = self.counts_call(op, dtype, ReduceOp::Sum, counts, sum);
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.all_gather_v(i, o, counts, dtype.size(), call)
        })
        .map_err(|e| showing_counts(e, counts))
    }

    /// Reduces `input` (`counts[0] + counts[1] + ...` elements) over all ranks with `op` and
    /// leaves this rank's part of the result (`counts[rank()]` elements, after those of the
    /// ranks before it) in `output`: [`Group::reduce_scatter`] with parts of different
    /// lengths, the same `counts` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `counts` has `size()` entries that add up to
    /// `input.len()`, `output.len()` is `counts[rank()]` and `op` applies to `T`;
    /// [`Error::Mismatch`] when ranks pass different counts; otherwise the transport errors of
    /// [`Error`], after which the group is poisoned.
    pub fn reduce_scatter_v<T: Element>(
        &mut self,
        input: &[T],
        output: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        typed(input, output, |i, o| {
            self.reduce_scatter_v_bytes(i, o, counts, T::DTYPE, op)
        })
    }

    /// [`Group::reduce_scatter_v`] over raw bytes holding elements of `dtype` (counts in
    /// elements).
    ///
    /// # Errors
    /// As [`Group::reduce_scatter_v`], and whole numbers of elements.
    pub fn reduce_scatter_v_raw(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let buffers = [("input", input.len())];
        self.raw(
            Op::ReduceScatterV,
            dtype,
            &buffers,
            ("output", output),
            |g, out| g.reduce_scatter_v_bytes(input, out, counts, dtype, op),
        )
    }

    fn reduce_scatter_v_bytes(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let which = Op::ReduceScatterV;
        self.check_usable()?;
        self.check_counts(which, "counts", counts)?;
        let sum = total(counts).unwrap_or(usize::MAX);
        self.check_len(which, "input", input.len(), sum, dtype)?;
        self.check_len(which, "output", output.len(), counts[self.rank], dtype)?;
        let reducer = self.reducer(which, dtype, op)?;
        let call = self.counts_call(which, dtype, op, counts, sum);
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.reduce_scatter_v(i, o, counts, &reducer, call)
        })
        .map_err(|e| showing_counts(e, counts))?;
        reducer.finish(output, self.size);
        Ok(())
    }

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
        self.send_bytes(&T::as_bytes(data), dst, T::DTYPE, tag)
    }

    /// [`Group::send_tagged`] of raw bytes holding elements of `dtype`, for bindings to other
    /// languages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `data` is a whole number of elements; otherwise as
    /// [`Group::send`].
    pub fn send_raw(&mut self, data: &[u8], dst: usize, dtype: Dtype, tag: u32) -> Result<()> {
        self.check_usable()?;
        self.elements(Op::Send, "data", data.len(), dtype)?;
        self.send_bytes(data, dst, dtype, tag)
    }

    fn send_bytes(&mut self, data: &[u8], dst: usize, dtype: Dtype, tag: u32) -> Result<()> {
        self.check_usable()?;
        self.check_peer(Op::Send, dst)?;
        let call = self.p2p_call(Op::Send, dtype, data.len(), tag);
        self.run(call, |c, call| c.send(data, dst, call))
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
        T::with_bytes_mut(out, |bytes| self.recv_bytes(bytes, src, T::DTYPE, tag))
    }

    /// [`Group::recv_tagged`] into raw bytes holding elements of `dtype`, for bindings to
    /// other languages. `bool` bytes other than 0 and 1 that a sender sent arrive as 1.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `out` is a whole number of elements; otherwise as
    /// [`Group::recv`].
    pub fn recv_raw(&mut self, out: &mut [u8], src: usize, dtype: Dtype, tag: u32) -> Result<()> {
        self.raw(Op::Recv, dtype, &[], ("out", out), |g, out| {
            g.recv_bytes(out, src, dtype, tag)
        })
    }

    fn recv_bytes(&mut self, out: &mut [u8], src: usize, dtype: Dtype, tag: u32) -> Result<()> {
        self.check_usable()?;
        self.check_peer(Op::Recv, src)?;
        let call = self.p2p_call(Op::Recv, dtype, out.len(), tag);
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
        T::with_bytes_mut(out, |bytes| self.recv_any_bytes(bytes, T::DTYPE, tag))
    }

    /// [`Group::recv_any_tagged`] into raw bytes holding elements of `dtype`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `out` is a whole number of elements; otherwise as
    /// [`Group::recv_any`].
    pub fn recv_any_raw(&mut self, out: &mut [u8], dtype: Dtype, tag: u32) -> Result<usize> {
        let mut src = 0;
        self.raw(Op::Recv, dtype, &[], ("out", out), |g, out| {
            src = g.recv_any_bytes(out, dtype, tag)?;
            Ok(())
        })?;
        Ok(src)
    }

    fn recv_any_bytes(&mut self, out: &mut [u8], dtype: Dtype, tag: u32) -> Result<usize> {
        self.check_usable()?;
        if self.alone() {
            let why = "a group of one has no other rank to receive from".to_string();
            return Err(self.invalid(Op::Recv, why));
        }
        let call = self.p2p_call(Op::Recv, dtype, out.len(), tag);
        let mut src = 0;
        self.run(call, |c, call| {
            src = c.recv_any(out, call)?;
            Ok(())
        })?;
        Ok(src)
    }

    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    /// The transport errors of [`Error`], after which the group is poisoned.
    pub fn barrier(&mut self) -> Result<()> {
        self.check_usable()?;
        let call = self.call(Op::Barrier, Dtype::UInt8, ReduceOp::Sum, 0);
        self.run(call, |c, call| c.barrier(call))
    }

    /// The call of a variable-size collective over `counts` (adding up to `sum` elements):
    /// its headers carry the sum and the digest of the counts, which every rank must match.
    fn counts_call(
        &self,
        op: Op,
        dtype: Dtype,
        reduce: ReduceOp,
        counts: &[usize],
        sum: usize,
    ) -> Call {
        Call {
            counts: Some(counts_digest(counts)),
            ..self.call(op, dtype, reduce, sum)
        }
    }

    /// Checks that `counts` has an entry per rank.
    fn check_counts(&self, op: Op, name: &str, counts: &[usize]) -> Result<()> {
        if counts.len() == self.size {
            return Ok(());
        }
        Err(self.invalid(
            op,
            format!(
                "{name} has {} entries but the group has {} ranks",
                counts.len(),
                self.size
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_overflow_to_none_and_mismatches_show_the_counts() {
        assert_eq!(total(&[usize::MAX, 1]), None);
        let e = Error::Mismatch {
            rank: 0,
            peer: 1,
            op: Op::AllGatherV,
            detail: "they differ".into(),
        };
        let shown = showing_counts(e, &(0..20).collect::<Vec<_>>()).to_string();
        assert!(
            shown.contains("[0, 1, 2") && shown.contains("and 4 more"),
            "{shown}"
        );
    }
}
