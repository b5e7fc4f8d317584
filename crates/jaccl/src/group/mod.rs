//! [`Group`]: validates each call, dispatches it to the algorithm, and poisons itself when an
//! operation fails half-way.

use std::time::Duration;

use crate::algo::collectives::Collectives;
use crate::algo::engine::Call;
use crate::config::{Config, Topology, Transport};
use crate::connect::{self, Connected};
use crate::dtype::{Dtype, ReduceOp};
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

mod ops;

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
    /// the other ranks that start-up connected (all with the mesh, else those on this host) in
    /// rank order, then those connected later, when a call first needed them (a `send` to a
    /// rank on another host, an all-to-all), in that order. Shared memory
    /// ([`Transport::Shm`]) to every rank on this host; to a neighbour on another host RDMA
    /// where both ends have a device that reaches the other, TCP otherwise, unless
    /// [`Config::transport`] forced one; to the other ranks on other hosts TCP. Empty for a
    /// group of one, which needs none.
    pub fn transport(&self) -> Vec<(usize, Transport)> {
        match &self.state {
            State::Connected(c) => {
                let mut peers = c.peers.clone();
                if let Ok(late) = c.opened_late.lock() {
                    peers.extend(late.iter().copied());
                }
                peers
            }
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

    fn call(&self, op: Op, dtype: Dtype, reduce: ReduceOp, count: usize) -> Call {
        Call {
            rank: self.rank,
            op,
            dtype,
            reduce,
            count,
            root: 0,
            timeout: self.timeout,
            wait: self.wait,
        }
    }

    /// Whether the group has one rank: its collectives are local copies.
    fn alone(&self) -> bool {
        matches!(self.state, State::Alone)
    }

    /// The kernels of `reduce` over `dtype`, or why it does not apply.
    fn reducer(&self, op: Op, dtype: Dtype, reduce: ReduceOp) -> Result<Reducer> {
        Reducer::new(dtype, reduce).ok_or_else(|| {
            self.invalid(
                op,
                format!(
                    "the {reduce} reduction does not apply to {dtype} elements (bitwise \
                     reductions take integers and bool, avg takes numbers)"
                ),
            )
        })
    }

    /// Checks that `root` is a rank of the group.
    fn check_root(&self, op: Op, root: usize) -> Result<()> {
        if root < self.size {
            return Ok(());
        }
        Err(self.invalid(
            op,
            format!("root {root} is not a rank of a group of {}", self.size),
        ))
    }

    /// Checks that `what` has `expect` elements (`bytes` of `dtype`).
    fn check_len(
        &self,
        op: Op,
        what: &str,
        bytes: usize,
        expect: usize,
        dtype: Dtype,
    ) -> Result<()> {
        let elements = bytes / dtype.size();
        if elements == expect {
            return Ok(());
        }
        Err(self.invalid(
            op,
            format!("{what} has {elements} elements but must have {expect}"),
        ))
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
