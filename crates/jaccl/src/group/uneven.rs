//! The variable-size collectives of a [`Group`] (`all_to_all_v`, `all_gather_v`,
//! `reduce_scatter_v`): every rank passes the counts of the blocks, and the ranks must agree on
//! them exactly (their headers carry the counts' SHA-256 digest).

use super::Group;
use super::forms::{typed, typed_and_raw};
use crate::algo::call::Call;
use crate::dtype::{Dtype, Element, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::op_header::counts_digest;

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

    typed_and_raw! {
        /// Gathers every rank's `input` into `output` (every rank's, in rank order) when the
        /// ranks contribute different lengths: `counts[r]` is rank r's, the same `counts` on
        /// every rank.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless `counts` has `size()` entries, `counts[rank()]` is
        /// `input.len()` and `output.len()` their sum; [`Error::Mismatch`] when ranks pass
        /// different counts; otherwise the transport errors of [`Error`], after which the group
        /// is poisoned.
        fn all_gather_v(counts: &[usize]);
        /// [`Group::all_gather_v`] over raw bytes holding elements of `dtype` (counts in
        /// elements).
        ///
        /// # Errors
        /// As [`Group::all_gather_v`], and whole numbers of elements.
        fn all_gather_v_raw;
        Op::AllGatherV => all_gather_v_bytes
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

    typed_and_raw! {
        /// Reduces `input` (`counts[0] + counts[1] + ...` elements) over all ranks with `op`
        /// and leaves this rank's part of the result (`counts[rank()]` elements, after those of
        /// the ranks before it) in `output`: [`Group::reduce_scatter`] with parts of different
        /// lengths, the same `counts` on every rank.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] unless `counts` has `size()` entries that add up to
        /// `input.len()`, `output.len()` is `counts[rank()]` and `op` applies to `T`;
        /// [`Error::Mismatch`] when ranks pass different counts; otherwise the transport errors
        /// of [`Error`], after which the group is poisoned.
        fn reduce_scatter_v(counts: &[usize], op: ReduceOp);
        /// [`Group::reduce_scatter_v`] over raw bytes holding elements of `dtype` (counts in
        /// elements).
        ///
        /// # Errors
        /// As [`Group::reduce_scatter_v`], and whole numbers of elements.
        fn reduce_scatter_v_raw;
        Op::ReduceScatterV => reduce_scatter_v_bytes
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
