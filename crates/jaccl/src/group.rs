//! [`Group`]: validates each call, dispatches it to the algorithm, and poisons itself when an
//! operation fails half-way.

use std::time::Duration;

use crate::algo::collectives::Collectives;
use crate::algo::engine::Call;
use crate::config::{Config, Topology, Transport};
use crate::connect::{self, Connected};
use crate::dtype::{Dtype, Element, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::liveness::Heartbeat;
use crate::reduce::Reducer;
use crate::wait::WaitPolicy;

/// A set of ranks that run collectives together. Create one per process with [`crate::init`]
/// or [`crate::init_with`]; every rank must call the same operations, in the same order, with
/// matching lengths, types and reductions.
///
/// All operations block until this rank's part is done. They take `&mut self`: one operation at
/// a time per group.
///
/// Dropping a group closes its connections and says goodbye: a peer that waits for this rank
/// then fails with [`Error::PeerLost`] saying that it left the group. Rank 0's drop goes on
/// passing such news between the others until they have all left too, for at most half a
/// second, so that each can name the first cause of a failure.
pub struct Group {
    rank: usize,
    size: usize,
    wires: usize,
    /// Whether this rank has links to every other rank (kept after a failure, for reports).
    mesh: bool,
    timeout: Duration,
    wait: WaitPolicy,
    state: State,
}

enum State {
    /// A group of one: every collective is a local copy.
    Alone,
    Connected(Box<Connected>),
    /// An operation failed while data was moving; the connections are closed. The heartbeat
    /// lives on until the group is dropped: it told the others why this rank failed, and at
    /// rank 0 it goes on passing news between them.
    Failed {
        error: Error,
        _heartbeat: Option<Heartbeat>,
    },
}

/// How long a failed call waits for the heartbeat to explain it: a verdict, or its peer's
/// goodbye.
const VERDICT_GRACE: Duration = Duration::from_millis(500);

impl Group {
    pub(crate) fn new(config: Config) -> Result<Group> {
        config.validate()?;
        let (state, wires, wait, mesh) = if config.size == 1 {
            (State::Alone, 0, WaitPolicy::SLEEP, false)
        } else {
            let connected = connect::connect(&config)?;
            let (wait, mesh) = (connected.wait, connected.collectives.geometry().mesh);
            (
                State::Connected(Box::new(connected)),
                config.wire_count(),
                wait,
                mesh,
            )
        };
        tracing::debug!(rank = config.rank, size = config.size, "jaccl group ready");
        Ok(Group {
            rank: config.rank,
            size: config.size,
            wires,
            mesh,
            timeout: config.timeout,
            wait,
            state,
        })
    }

    /// This process's rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The transport to each peer this rank has links to, as `(rank, transport)`: the left
    /// ring neighbour (`rank − 1`), then the right one (`rank + 1`) if it is another rank, then
    /// with the mesh every other rank in rank order. To a neighbour: shared memory
    /// ([`Transport::Shm`]) on this host, RDMA where both ends have a device that reaches the
    /// other, TCP otherwise, unless [`Config::transport`] forced one; the mesh's other links
    /// are TCP. Empty for a group of one, which needs none.
    pub fn transport(&self) -> Vec<(usize, Transport)> {
        match &self.state {
            State::Connected(c) => c.peers.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether every rank shares memory with this one, so collectives read each other's data
    /// directly instead of passing it around the ring.
    pub fn shares_memory_with_all(&self) -> bool {
        matches!(&self.state, State::Connected(c) if c.collectives.shares_memory_with_all())
    }

    /// How ranks wait for their peers in this group (see [`Config::wait`]).
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    /// The topology in use ([`Topology::Ring`] or [`Topology::Mesh`]); `None` for a group of
    /// one.
    pub fn topology(&self) -> Option<Topology> {
        match &self.state {
            State::Alone => None,
            _ if self.mesh => Some(Topology::Mesh),
            _ => Some(Topology::Ring),
        }
    }

    /// Makes every wait of this group ask `check`, at least every 100 ms while it sleeps, whether
    /// to stop; when `check` answers true, the operation fails with [`Error::Interrupted`]
    /// (and, having stopped half-way, poisons the group). Bindings use it to honour Ctrl-C
    /// while a call waits for slow peers; `check` runs on the calling thread.
    pub fn interrupt_when(&mut self, check: impl Fn() -> bool + Send + Sync + 'static) {
        if let State::Connected(c) = &self.state {
            c.liveness.set_interrupt(Some(std::sync::Arc::new(check)));
        }
    }

    /// Parallel connections to each ring neighbour (0 for a group of one).
    pub fn wires(&self) -> usize {
        self.wires
    }

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
    /// [`Error::InvalidArgument`] if the lengths differ; otherwise the transport errors of
    /// [`Error`] (`PeerLost`, `Timeout`, `Mismatch`, ...), after which the group is poisoned.
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
    /// The transport errors of [`Error`], after which the group is poisoned.
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
    /// [`Error::InvalidArgument`] unless `input.len() == size() * output.len()`; otherwise the
    /// transport errors of [`Error`], after which the group is poisoned.
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
        let call = self.call(which, dtype, op, output.len() / dtype.size());
        let reducer = Reducer::new(dtype, op);
        self.copy_or_run(call, input, output, |c, i, o, call| {
            c.reduce_scatter(i, o, &reducer, call)
        })
    }

    /// Sends `data` to rank `dst`, which must call [`Group::recv`] with the same length and
    /// type. With the ring topology `dst` must be a neighbour (`rank ± 1`); with the mesh it
    /// may be any other rank. Returns once the data is handed to the transport.
    ///
    /// Ranks may send before they receive, even in a cycle (every rank sends to the next,
    /// then receives from the one before; with the mesh, to all others): a rank waiting for its
    /// receiver to make room reads ahead, into memory, whatever its peers are sending it, and
    /// its later calls take those bytes first. Only bytes a peer has already sent are read, so
    /// this buffers at most what the program sends before it receives.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `dst` that is this rank, out of range, or not a
    /// neighbour; otherwise the transport errors of [`Error`], after which the group is
    /// poisoned.
    pub fn send<T: Element>(&mut self, data: &[T], dst: usize) -> Result<()> {
        self.send_bytes(&T::as_bytes(data), dst, T::DTYPE)
    }

    /// [`Group::send`] of raw bytes holding elements of `dtype`, for bindings to other
    /// languages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `data` is a whole number of elements; otherwise as
    /// [`Group::send`].
    pub fn send_raw(&mut self, data: &[u8], dst: usize, dtype: Dtype) -> Result<()> {
        self.check_usable()?;
        self.elements(Op::Send, "data", data.len(), dtype)?;
        self.send_bytes(data, dst, dtype)
    }

    fn send_bytes(&mut self, data: &[u8], dst: usize, dtype: Dtype) -> Result<()> {
        self.check_usable()?;
        self.check_peer(Op::Send, dst)?;
        let call = self.call(Op::Send, dtype, ReduceOp::Sum, data.len() / dtype.size());
        self.run(call, |c, call| c.send(data, dst, call))
    }

    /// Receives into `out` what rank `src` sends with [`Group::send`] (same length and type).
    ///
    /// # Errors
    /// As [`Group::send`]; a sender whose length or type differs gives [`Error::Mismatch`].
    pub fn recv<T: Element>(&mut self, out: &mut [T], src: usize) -> Result<()> {
        T::with_bytes_mut(out, |bytes| self.recv_bytes(bytes, src, T::DTYPE))
    }

    /// [`Group::recv`] into raw bytes holding elements of `dtype`, for bindings to other
    /// languages. `bool` bytes other than 0 and 1 that a sender sent arrive as 1.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `out` is a whole number of elements; otherwise as
    /// [`Group::recv`].
    pub fn recv_raw(&mut self, out: &mut [u8], src: usize, dtype: Dtype) -> Result<()> {
        self.raw(Op::Recv, dtype, &[], ("out", out), |g, out| {
            g.recv_bytes(out, src, dtype)
        })
    }

    fn recv_bytes(&mut self, out: &mut [u8], src: usize, dtype: Dtype) -> Result<()> {
        self.check_usable()?;
        self.check_peer(Op::Recv, src)?;
        let call = self.call(Op::Recv, dtype, ReduceOp::Sum, out.len() / dtype.size());
        self.run(call, |c, call| c.recv(out, src, call))
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

    fn all_reduce_bytes(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_usable()?;
        if let Some(input) = input
            && input.len() != output.len()
        {
            let count = |bytes: usize| bytes / dtype.size();
            return Err(self.invalid(
                Op::AllReduce,
                format!(
                    "input has {} elements but output has {} (they must be equal)",
                    count(input.len()),
                    count(output.len())
                ),
            ));
        }
        let call = self.call(Op::AllReduce, dtype, op, output.len() / dtype.size());
        let reducer = Reducer::new(dtype, op);
        match input {
            Some(input) => self.copy_or_run(call, input, output, |c, i, o, call| {
                c.all_reduce(Some(i), o, &reducer, call)
            }),
            None => self.run(call, |c, call| c.all_reduce(None, output, &reducer, call)),
        }
    }

    fn call(&self, op: Op, dtype: Dtype, reduce: ReduceOp, count: usize) -> Call {
        Call {
            rank: self.rank,
            op,
            dtype,
            reduce,
            count,
            timeout: self.timeout,
            wait: self.wait,
        }
    }

    /// A raw call: checks that every buffer holds whole elements of `dtype` (`inputs` by name
    /// and length, and `output`), runs `f` on the output, and leaves valid `bool`s in it.
    fn raw(
        &mut self,
        op: Op,
        dtype: Dtype,
        inputs: &[(&str, usize)],
        (name, output): (&str, &mut [u8]),
        f: impl FnOnce(&mut Group, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        self.check_usable()?;
        for &(what, len) in inputs {
            self.elements(op, what, len, dtype)?;
        }
        self.elements(op, name, output.len(), dtype)?;
        normalise_bools(output, dtype);
        f(self, output)?;
        normalise_bools(output, dtype);
        Ok(())
    }

    /// A group of one copies `input` to `output`; otherwise `f` runs the call.
    fn copy_or_run(
        &mut self,
        call: Call,
        input: &[u8],
        output: &mut [u8],
        f: impl FnOnce(&mut Collectives, &[u8], &mut [u8], &Call) -> Result<()>,
    ) -> Result<()> {
        if matches!(self.state, State::Alone) {
            output.copy_from_slice(input);
            return Ok(());
        }
        self.run(call, |c, call| f(c, input, output, call))
    }

    /// Checks that `whole` holds `size()` blocks of `block` (lengths in bytes of `dtype`).
    fn check_blocks(
        &self,
        op: Op,
        dtype: Dtype,
        whole: (&str, usize),
        block: (&str, usize),
    ) -> Result<()> {
        if Some(whole.1) == block.1.checked_mul(self.size) {
            return Ok(());
        }
        let count = |bytes: usize| bytes / dtype.size();
        Err(self.invalid(
            op,
            format!(
                "{} has {} elements but must have size × {} = {} × {}",
                whole.0,
                count(whole.1),
                block.0,
                self.size,
                count(block.1)
            ),
        ))
    }

    /// Runs a call on the group's collectives (nothing to do when alone); poisons the group if
    /// it fails.
    fn run(
        &mut self,
        call: Call,
        f: impl FnOnce(&mut Collectives, &Call) -> Result<()>,
    ) -> Result<()> {
        let result = match &mut self.state {
            State::Alone => return Ok(()),
            State::Failed { error, .. } => return Err(error.clone()),
            State::Connected(c) => f(&mut c.collectives, &call),
        };
        let result = match (result, &self.state) {
            // A closed connection may be the ring passing on a loss that the heartbeat is
            // about to announce: then name the rank that was really lost. Or its peer left the
            // group or failed, which the heartbeat passes on too: then say so, with the first
            // cause. A transport failure may be a death or a departure seen from the
            // transport's side (an RDMA write into a killed process's memory completes with
            // "remote access error"): the same holds.
            (
                Err(lost @ (Error::PeerLost { .. } | Error::Protocol { .. } | Error::Io { .. })),
                State::Connected(c),
            ) if c.heartbeat.is_some() => Err(c.liveness.explain(lost, VERDICT_GRACE, call.op)),
            (other, _) => other,
        };
        if let Err(e) = &result
            && !e.is_local_argument_error()
        {
            tracing::debug!(rank = self.rank, error = %e, "jaccl group poisoned");
            let mut heartbeat = None;
            if let State::Connected(c) = &mut self.state {
                c.liveness.fail(e);
                if let Some(shm) = &c.shm {
                    shm.fail();
                }
                heartbeat = c.heartbeat.take();
            }
            // Dropping the connections closes them, so the peers fail promptly too.
            self.state = State::Failed {
                error: e.clone(),
                _heartbeat: heartbeat,
            };
        }
        result
    }

    fn check_usable(&self) -> Result<()> {
        match &self.state {
            State::Failed { error, .. } => Err(error.clone()),
            _ => Ok(()),
        }
    }

    fn check_peer(&self, op: Op, peer: usize) -> Result<()> {
        let what = if op == Op::Send {
            "send to"
        } else {
            "receive from"
        };
        if peer >= self.size {
            return Err(self.invalid(
                op,
                format!("rank {peer} does not exist in a group of {}", self.size),
            ));
        }
        if peer == self.rank {
            return Err(self.invalid(op, format!("a rank cannot {what} itself")));
        }
        if let State::Connected(c) = &self.state
            && !c.collectives.geometry().reaches(peer)
        {
            let g = c.collectives.geometry();
            let (left, right) = (g.left(), g.right());
            return Err(self.invalid(
                op,
                format!(
                    "rank {peer} is not a neighbour of rank {} (its neighbours are {left} and \
                     {right}); the ring topology can only {what} neighbours (the mesh can \
                     {what} any rank: JACCL_TOPOLOGY=mesh)",
                    self.rank
                ),
            ));
        }
        Ok(())
    }

    /// The number of `dtype` elements in `bytes` bytes of `what`, which must be whole.
    fn elements(&self, op: Op, what: &str, bytes: usize, dtype: Dtype) -> Result<usize> {
        if bytes.is_multiple_of(dtype.size()) {
            return Ok(bytes / dtype.size());
        }
        Err(self.invalid(
            op,
            format!(
                "{what} has {bytes} bytes, not a whole number of {}-byte {dtype} elements",
                dtype.size()
            ),
        ))
    }

    fn invalid(&self, op: Op, what: String) -> Error {
        Error::InvalidArgument(format!("rank {}: {op}: {what}", self.rank))
    }
}

/// A typed call on bytes: `input` and `output` viewed as the bytes of their elements (`bool`s
/// are normalised on the way back).
fn typed<T: Element, R>(input: &[T], output: &mut [T], f: impl FnOnce(&[u8], &mut [u8]) -> R) -> R {
    let input = T::as_bytes(input);
    T::with_bytes_mut(output, |out| f(&input, out))
}

/// Makes `bool` bytes 0 or 1 (any other byte is true), as `bool` values must be.
fn normalise_bools(bytes: &mut [u8], dtype: Dtype) {
    if dtype == Dtype::Bool {
        bytes.iter_mut().for_each(|b| *b = u8::from(*b != 0));
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Alone => "alone",
            State::Connected(_) => "connected",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("state", &state)
            .finish()
    }
}
