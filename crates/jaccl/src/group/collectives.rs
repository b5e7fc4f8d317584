//! The collectives of a [`Group`] in which every rank gives and takes blocks of one size: the
//! typed methods, their `_raw` forms for bindings to other languages, and the byte-level one
//! both call, which checks the arguments and runs the call on the group's collectives
//! ([`crate::algo::collectives`]). The variable-size ones are in `uneven.rs`, sends and
//! receives in `point_to_point.rs`.

use super::Group;
use super::forms::{typed, typed_and_raw};
use super::levels::goes_in_two_levels;
use crate::algo::collectives::Collectives;
use crate::dtype::{Dtype, Element, ReduceOp};
use crate::error::{Op, Result};
// The docs name the errors.
#[cfg(doc)]
use crate::error::Error;

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

    /// [`Group::all_reduce`] with the result written over `data`.
    ///
    /// # Errors
    /// As [`Group::all_reduce`].
    pub fn all_reduce_in_place<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        T::with_bytes_mut(data, |bytes| {
            self.all_reduce_bytes(None, bytes, T::DTYPE, op)
        })
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

    typed_and_raw! {
        /// Reduces `input` element-wise over all ranks with `op`; every rank receives the same
        /// result, bit for bit, in `output`.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] if the lengths differ or `op` does not apply to `T`
        /// ([`ReduceOp::applies_to`]); otherwise the transport errors of [`Error`] (`PeerLost`,
        /// `Timeout`, `Mismatch`, ...), after which the group is poisoned.
        fn all_reduce(op: ReduceOp);
        /// [`Group::all_reduce`] over raw bytes holding elements of `dtype`, for bindings to other
        /// languages. `bool` bytes other than 0 and 1 count as true; the output holds 0 or 1.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] if the lengths differ or are not a whole number of elements;
        /// otherwise as [`Group::all_reduce`].
        fn all_reduce_raw;
        Op::AllReduce => all_reduce_bytes
    }

    /// `input`: `None` in place (`Option<&[u8]>` is `From<&[u8]>`, for the typed forms).
    fn all_reduce_bytes<'i>(
        &mut self,
        input: impl Into<Option<&'i [u8]>>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        let (which, input) = (Op::AllReduce, input.into());
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
        if goes_in_two_levels(&self.hosts, which, output.len()) {
            self.in_two_levels(call, |l, call| l.all_reduce(input, output, dtype, op, call))?;
        } else {
            match input {
                Some(input) => self.copy_or_run(call, input, output, |c, i, o, call| {
                    c.all_reduce(Some(i), o, &reducer, call)
                })?,
                None => self.run(call, |c, call| c.all_reduce(None, output, &reducer, call))?,
            }
        }
        reducer.finish(output, self.size);
        Ok(())
    }

    typed_and_raw! {
        /// Gathers every rank's `input` into `output`, which holds `size()` blocks of
        /// `input.len()` elements: block `r` is rank r's input.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless `output.len() == size() * input.len()`; otherwise the
        /// transport errors of [`Error`], after which the group is poisoned.
        fn all_gather();
        /// [`Group::all_gather`] over raw bytes holding elements of `dtype`, for bindings to other
        /// languages.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless both are whole numbers of elements and
        /// `output.len() == size() * input.len()`; otherwise as [`Group::all_gather`].
        fn all_gather_raw;
        Op::AllGather => all_gather_bytes
    }

    fn all_gather_bytes(&mut self, input: &[u8], output: &mut [u8], dtype: Dtype) -> Result<()> {
        let op = Op::AllGather;
        self.check_usable()?;
        self.check_blocks(op, dtype, ("output", output.len()), ("input", input.len()))?;
        let call = self.call(op, dtype, ReduceOp::Sum, input.len() / dtype.size());
        if goes_in_two_levels(&self.hosts, op, output.len()) {
            return self.in_two_levels(call, |l, call| l.all_gather(input, output, dtype, call));
        }
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.all_gather(i, o, call)
        })
    }

    typed_and_raw! {
        /// Reduces `input` (`size()` blocks of `output.len()` elements) over all ranks with `op`
        /// and leaves block `rank()` of the result in `output`.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless `input.len() == size() * output.len()` and `op`
        /// applies to `T`; otherwise the transport errors of [`Error`], after which the group is
        /// poisoned.
        fn reduce_scatter(op: ReduceOp);
        /// [`Group::reduce_scatter`] over raw bytes holding elements of `dtype`, for bindings to
        /// other languages.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless both are whole numbers of elements and
        /// `input.len() == size() * output.len()`; otherwise as [`Group::reduce_scatter`].
        fn reduce_scatter_raw;
        Op::ReduceScatter => reduce_scatter_bytes
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
        if goes_in_two_levels(&self.hosts, which, input.len()) {
            self.in_two_levels(call, |l, call| {
                l.reduce_scatter(input, output, dtype, op, call)
            })?;
        } else {
            self.copy_or_run(call, input, output, |c, i, o, call| {
                c.reduce_scatter(i, o, &reducer, call)
            })?;
        }
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
        if goes_in_two_levels(&self.hosts, op, data.len()) {
            return self.in_two_levels(call, |l, call| l.broadcast(data, dtype, call));
        }
        self.agree_before_trees(call)?;
        self.run(call, |c, call| c.broadcast(data, call))
    }

    typed_and_raw! {
        /// Reduces `input` element-wise over all ranks with `op` into `output` of rank `root`
        /// (`input.len()` elements there; elsewhere `output` is not written and may be empty).
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] for a `root` out of range, an `output` of the wrong length
        /// (on the root: `input.len()`; elsewhere: 0 or `input.len()`), or an `op` that does not
        /// apply to `T`; otherwise the transport errors of [`Error`], after which the group is
        /// poisoned.
        fn reduce(op: ReduceOp, root: usize);
        /// [`Group::reduce`] over raw bytes holding elements of `dtype`.
        ///
        /// # Errors
        /// As [`Group::reduce`], and whole numbers of elements.
        fn reduce_raw;
        Op::Reduce => reduce_bytes
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
        if goes_in_two_levels(&self.hosts, which, input.len()) {
            self.in_two_levels(call, |l, call| l.reduce(input, output, dtype, op, call))?;
        } else {
            self.agree_before_trees(call)?;
            self.copy_or_run(call, input, output, |c, i, o, call| {
                c.reduce(i, o, &reducer, call)
            })?;
        }
        if self.rank == root {
            reducer.finish(output, self.size);
        }
        Ok(())
    }

    typed_and_raw! {
        /// Gathers every rank's `input` into `output` of rank `root`, which holds `size()` blocks
        /// of `input.len()` elements (block `r` is rank r's input); elsewhere `output` is not
        /// written and may be empty.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] for a `root` out of range or an `output` of the wrong length
        /// (on the root `size() * input.len()`; elsewhere 0 or that); otherwise the transport
        /// errors of [`Error`], after which the group is poisoned.
        fn gather(root: usize);
        /// [`Group::gather`] over raw bytes holding elements of `dtype`.
        ///
        /// # Errors
        /// As [`Group::gather`], and whole numbers of elements.
        fn gather_raw;
        Op::Gather => gather_bytes
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
        self.copy_or_run(call, input, output, Collectives::gather)
    }

    typed_and_raw! {
        /// Hands block `r` of `input` of rank `root` (`size()` blocks of `output.len()` elements)
        /// to rank r's `output`; elsewhere `input` is not read and may be empty.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] for a `root` out of range or an `input` of the wrong length
        /// (on the root `size() * output.len()`; elsewhere 0 or that); otherwise the transport
        /// errors of [`Error`], after which the group is poisoned.
        fn scatter(root: usize);
        /// [`Group::scatter`] over raw bytes holding elements of `dtype`.
        ///
        /// # Errors
        /// As [`Group::scatter`], and whole numbers of elements.
        fn scatter_raw;
        Op::Scatter => scatter_bytes
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
        self.copy_or_run(call, input, output, Collectives::scatter)
    }

    typed_and_raw! {
        /// Every rank sends block `d` of `input` (`size()` equal blocks) to rank d, and receives
        /// rank s's block for it into block `s` of `output` (the same length as `input`).
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless the lengths are equal and a multiple of `size()`;
        /// otherwise the transport errors of [`Error`], after which the group is poisoned.
        fn all_to_all();
        /// [`Group::all_to_all`] over raw bytes holding elements of `dtype`.
        ///
        /// # Errors
        /// As [`Group::all_to_all`], and whole numbers of elements.
        fn all_to_all_raw;
        Op::AllToAll => all_to_all_bytes
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
        self.run(call, Collectives::barrier)
    }
}
