//! The collectives of a [`Group`] in which every rank gives and takes blocks of one size: the
//! typed methods, their `_raw` forms for bindings to other languages, and the byte-level one
//! both call, which checks the arguments and runs the call on the group's collectives
//! ([`crate::algo::collectives`]). The variable-size ones are in `uneven.rs`, sends and
//! receives in `point_to_point.rs`.

use super::Group;
use crate::dtype::{Dtype, Element, ReduceOp};
use crate::error::{Op, Result};
// The docs name the errors.
#[cfg(doc)]
use crate::error::Error;

/// A typed call on bytes: `input` and `output` viewed as the bytes of their elements (`bool`s
/// are normalised on the way back).
pub(super) fn typed<T: Element, R>(
    input: &[T],
    output: &mut [T],
    f: impl FnOnce(&[u8], &mut [u8]) -> R,
) -> R {
    let input = T::as_bytes(input);
    T::with_bytes_mut(output, |out| f(&input, out))
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

    /// Returns once every rank has entered the barrier.
    ///
    /// # Errors
    /// The transport errors of [`Error`], after which the group is poisoned.
    pub fn barrier(&mut self) -> Result<()> {
        self.check_usable()?;
        let call = self.call(Op::Barrier, Dtype::UInt8, ReduceOp::Sum, 0);
        self.run(call, |c, call| c.barrier(call))
    }
}
