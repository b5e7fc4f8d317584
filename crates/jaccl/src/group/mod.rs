//! [`Group`]: validates each call, dispatches it to the algorithm, and poisons itself when an
//! operation fails half-way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::algo::call::Call;
use crate::algo::collectives::Collectives;
use crate::algo::hosts::HostLayout;
use crate::config::{Config, Topology, Transport};
use crate::connect::{self, Connected, late};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::liveness::{Heartbeat, Liveness};
use crate::op_header::Digest;
use crate::reduce::Reducer;
use crate::transport::listener::{JobListener, Registration};
use crate::transport::questions::Revoker;
use crate::wait::WaitPolicy;
use levels::Levels;

mod abort;
mod collectives;
mod elastic;
mod forms;
mod grow;
mod levels;
mod point_to_point;
mod progress;
mod split;
mod uneven;

pub use abort::AbortHandle;
pub use elastic::Agreed;
use progress::Progress;
pub use progress::Request;

/// A set of ranks that run collectives together. Create one per process with [`crate::init`]
/// or [`crate::init_with`], and sub-groups of it with [`Group::split`] and
/// [`Group::subgroup`]; every rank must call the same operations, in the same order, with
/// matching lengths, types and reductions.
///
/// The operations block until this rank's part is done; [`Group::start`] runs any of them on
/// the group's progress thread instead, while the caller goes on. They take `&mut self`: one
/// caller at a time per group. A group can be moved to another thread, so a process can use
/// several groups (a data-parallel and a tensor-parallel one) from several threads at once.
///
/// Dropping a group closes its connections and says goodbye: a peer that waits for this rank
/// then fails with [`Error::PeerLost`] saying that it left the group. Rank 0's drop goes on
/// passing such news between the others until they have all left too, for at most half a
/// second, so that each can name the first cause of a failure. Operations still running on
/// the progress thread fail with [`Error::Closed`].
pub struct Group {
    rank: usize,
    size: usize,
    wires: usize,
    /// Whether this rank has links to every other rank (kept after a failure, for reports).
    mesh: bool,
    /// The operation timeout in nanoseconds (`u64::MAX`: none), shared with the progress
    /// thread's view so that [`Group::set_timeout`] reaches operations run there too.
    timeout: Arc<AtomicU64>,
    wait: WaitPolicy,
    /// Whether every rank shares memory with this one (the direct collectives).
    shares_memory: bool,
    /// The transport to each peer start-up linked this rank to ([`Group::transport`]).
    peers: Vec<(usize, Transport)>,
    /// Which ranks share a host.
    hosts: Arc<HostLayout>,
    /// The two levels of its all-reduces across hosts, formed on first use, dropped when the
    /// group fails.
    levels: Arc<Mutex<Option<Levels>>>,
    /// The peers of links made later, when first used.
    opened_late: Option<late::Opened>,
    /// What the heartbeat found out; `None` for a group of one.
    liveness: Option<Arc<Liveness>>,
    /// The connections and their state: this group's alone until it starts a progress
    /// thread, then shared with the thread's view (behind a lock).
    state: Holder,
    /// The error that poisoned the group, once one did (also in `state`): read without the
    /// lock by every call's first check.
    failure: Arc<OnceLock<Error>>,
    /// The thread of nonblocking operations, once one was started (never in its own view).
    progress: Option<Progress<Group>>,
    /// Whether this is the progress thread's view of the group.
    on_progress_thread: bool,
    /// What sub-groups are made from.
    family: Family,
    /// What a member's revocation of this group calls, while the group lives (`None` for a
    /// group of one).
    revoker: Option<Revoker>,
}

/// Where a group's [`State`] lives.
enum Holder {
    /// In the group, which alone uses it: calls reach it without a lock.
    Own(State),
    /// Shared with the progress thread's view.
    Shared(Arc<Mutex<State>>),
}

/// A group's [`State`] as one call has it.
enum StateRef<'a> {
    Own(&'a mut State),
    Locked(MutexGuard<'a, State>),
}

impl std::ops::Deref for StateRef<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        match self {
            StateRef::Own(s) => s,
            StateRef::Locked(s) => s,
        }
    }
}

impl std::ops::DerefMut for StateRef<'_> {
    fn deref_mut(&mut self) -> &mut State {
        match self {
            StateRef::Own(s) => s,
            StateRef::Locked(s) => s,
        }
    }
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

/// What a group's sub-groups are made from.
#[derive(Clone)]
pub(super) struct Family {
    /// The settings sub-groups inherit (this group's rank and size).
    pub(super) config: Arc<Config>,
    /// The listener every rank of the job keeps; `None` in a job of one rank.
    pub(super) job: Option<Arc<JobListener>>,
    /// The job's rank of each rank of this group.
    pub(super) job_rank: Arc<[usize]>,
    /// This group's id, in every connection made for it (0: the group `init` made).
    pub(super) id: u64,
    /// How many splits this group has made: with the id, it names the next sub-groups alike
    /// on every rank (shared with the progress thread's view).
    pub(super) splits: Arc<AtomicU64>,
    /// How many agreements (and shrinks) this group has run: with the id, it names the next
    /// alike on every rank (shared with the progress thread's view).
    pub(super) agreements: Arc<AtomicU64>,
    /// How many sub-groups this rank made with [`Group::subgroup_of_members`], by name and
    /// list: a name and list used again make another group.
    pub(super) made_by_members: Arc<Mutex<HashMap<(String, Digest), u64>>>,
    /// This group's id, alive in this process while the group is (`None` for the job's
    /// group and for groups of one).
    pub(super) _registration: Option<Arc<Registration>>,
}

impl Family {
    /// The family of the group `init` made from `config`.
    pub(super) fn of_job(config: &Config, job: Option<Arc<JobListener>>) -> Family {
        let config = Config {
            job_token: Some(config.token()),
            ..config.clone()
        };
        Family {
            job_rank: (0..config.size).collect(),
            config: Arc::new(config),
            job,
            id: 0,
            splits: Arc::default(),
            agreements: Arc::default(),
            made_by_members: Arc::default(),
            _registration: None,
        }
    }
}

/// How long a failed call waits for the heartbeat to explain it: a verdict, or its peer's
/// goodbye.
const VERDICT_GRACE: Duration = Duration::from_millis(500);

impl Group {
    pub(crate) fn new(config: Config) -> Result<Group> {
        if let Some(invitation) = config.join {
            return grow::join(&config, invitation);
        }
        config.validate()?;
        if config.size == 1 {
            return Ok(Group::of_one(Family::of_job(&config, None)));
        }
        let (connected, world) = connect::connect(&config)?;
        let family = Family::of_job(&config, Some(world));
        Ok(Group::connected(&config, connected, family))
    }

    /// A group of one.
    fn of_one(family: Family) -> Group {
        Group {
            rank: 0,
            size: 1,
            wires: 0,
            mesh: false,
            timeout: Arc::new(AtomicU64::new(nanos(family.config.timeout))),
            wait: WaitPolicy::SLEEP,
            shares_memory: false,
            peers: Vec::new(),
            hosts: Arc::new(HostLayout::alone()),
            levels: Arc::default(),
            opened_late: None,
            liveness: None,
            state: Holder::Own(State::Alone),
            failure: Arc::default(),
            progress: None,
            on_progress_thread: false,
            family,
            revoker: None,
        }
    }

    /// The group of `config`'s rank and size over `connected`.
    fn connected(config: &Config, connected: Connected, family: Family) -> Group {
        tracing::debug!(rank = config.rank, size = config.size, "jaccl group ready");
        let failure = Arc::default();
        let revoker = abort::revoker(config.rank, &family, &failure, &connected.liveness);
        Group {
            rank: config.rank,
            size: config.size,
            wires: config.wire_count(),
            mesh: connected.collectives.geometry().mesh,
            timeout: Arc::new(AtomicU64::new(nanos(config.timeout))),
            wait: connected.wait,
            shares_memory: connected.collectives.shares_memory_with_all(),
            peers: connected.peers.clone(),
            hosts: Arc::clone(&connected.hosts),
            levels: Arc::default(),
            opened_late: Some(Arc::clone(&connected.opened_late)),
            liveness: Some(Arc::clone(&connected.liveness)),
            state: Holder::Own(State::Connected(Box::new(connected))),
            failure,
            progress: None,
            on_progress_thread: false,
            family,
            revoker,
        }
    }

    /// The progress thread's view: the same group (its state now shared behind a lock), whose
    /// calls do not wait for the progress thread (they run on it) and do not ask the caller's
    /// interrupt check (which belongs to the caller's thread).
    fn progress_view(&mut self) -> Group {
        let shared = match std::mem::replace(&mut self.state, Holder::Own(State::Alone)) {
            Holder::Own(state) => Arc::new(Mutex::new(state)),
            Holder::Shared(shared) => shared,
        };
        self.state = Holder::Shared(Arc::clone(&shared));
        Group {
            rank: self.rank,
            size: self.size,
            wires: self.wires,
            mesh: self.mesh,
            timeout: Arc::clone(&self.timeout),
            wait: self.wait.in_background(),
            shares_memory: self.shares_memory,
            peers: self.peers.clone(),
            hosts: Arc::clone(&self.hosts),
            levels: Arc::clone(&self.levels),
            opened_late: self.opened_late.clone(),
            liveness: self.liveness.clone(),
            state: Holder::Shared(shared),
            failure: Arc::clone(&self.failure),
            progress: None,
            on_progress_thread: true,
            family: self.family.clone(),
            revoker: self.revoker.clone(),
        }
    }

    /// Starts `op` on the group's progress thread and returns at once: operations started
    /// this way run one after the other in the order they were started, and a blocking call
    /// on this group waits for those started before it. `op` owns what it works on (buffers
    /// moved into it) and returns it, so nothing it uses can go while it runs; its
    /// [`Request`] gives that back.
    ///
    /// ```no_run
    /// # fn main() -> jaccl::Result<()> {
    /// let mut group = jaccl::init()?;
    /// let grads: Vec<Vec<f32>> = vec![vec![1.0; 1 << 20]; 4];
    /// // One all-reduce per bucket, in flight while this thread goes on computing.
    /// let requests: Vec<_> = grads
    ///     .into_iter()
    ///     .map(|mut bucket| {
    ///         group.start(move |g| {
    ///             g.all_reduce_in_place(&mut bucket, jaccl::ReduceOp::Avg)?;
    ///             Ok(bucket)
    ///         })
    ///     })
    ///     .collect();
    /// // ... compute ...
    /// for request in requests.into_iter().rev() {
    ///     let averaged: Vec<f32> = request.wait()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// `op` may call any operation of the group it is given (several, even), not of another
    /// group: a call that waits for another group's progress could wait forever. Argument
    /// errors and every other error come out of [`Request::wait`]; after an error while data
    /// moved, the group is poisoned as with blocking calls. In a group of one, or in an
    /// operation that is itself running on the progress thread, `op` runs at once.
    pub fn start<R, F>(&mut self, op: F) -> Request<R>
    where
        F: FnOnce(&mut Group) -> Result<R> + Send + 'static,
        R: Send + 'static,
    {
        if self.on_progress_thread || self.alone() {
            return Request::completed(op(self));
        }
        if self.progress.is_none() {
            match Progress::spawn(self.progress_view(), self.rank) {
                Ok(progress) => self.progress = Some(progress),
                Err(e) => {
                    let e = Error::io(self.rank, "starting the progress thread", e);
                    return Request::completed(Err(e));
                }
            }
        }
        let (request, complete) = Request::new();
        let rank = self.rank;
        let job = Box::new(move |g: &mut Group| {
            let result = match g.closing() {
                true => Err(g.stopped()),
                false => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(g)))
                    .unwrap_or_else(|panic| Err(panicked(rank, &panic))),
            };
            complete(result);
        });
        if !self.progress.as_ref().is_some_and(|p| p.submit(job)) {
            let e = std::io::Error::other("the progress thread has ended");
            return Request::completed(Err(Error::io(rank, "starting an operation", e)));
        }
        request
    }

    /// Whether the group is being dropped or was aborted, so that operations not started yet
    /// fail.
    fn closing(&self) -> bool {
        self.liveness.as_ref().is_some_and(|l| l.closing())
    }

    /// The error of an operation that [`Group::closing`] keeps from starting.
    fn stopped(&self) -> Error {
        match &self.liveness {
            Some(liveness) => liveness.stopped(),
            None => Error::Closed { rank: self.rank },
        }
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
        let mut peers = self.peers.clone();
        if let Some(Ok(late)) = self.opened_late.as_ref().map(|l| l.lock()) {
            peers.extend(late.iter().copied());
        }
        peers
    }

    /// Which ranks of the group share a host, the same on every rank (see [`HostLayout`]).
    pub fn hosts(&self) -> &HostLayout {
        &self.hosts
    }

    /// Whether every rank shares memory with this one, so collectives read each other's data
    /// directly instead of passing it around the ring.
    pub fn shares_memory_with_all(&self) -> bool {
        self.shares_memory
    }

    /// How ranks wait for their peers in this group (see [`Config::wait`]).
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    /// This rank's shared memory with its peers on this host, for the tests that play a
    /// hostile member of a real group (`crate::transport::shm::harness`).
    #[cfg(test)]
    pub(crate) fn shared_memory(&self) -> Option<&crate::transport::shm::Shm> {
        match &self.state {
            Holder::Own(State::Connected(c)) => c.shm.as_ref(),
            _ => None,
        }
    }

    /// The topology in use ([`Topology::Ring`] or [`Topology::Mesh`]); `None` for a group of
    /// one.
    pub fn topology(&self) -> Option<Topology> {
        match (self.size, self.mesh) {
            (1, _) => None,
            (_, true) => Some(Topology::Mesh),
            _ => Some(Topology::Ring),
        }
    }

    /// Makes every wait of this group ask `check`, at least every 100 ms while it sleeps, whether
    /// to stop; when `check` answers true, the operation fails with [`Error::Interrupted`]
    /// (and, having stopped half-way, poisons the group). Bindings use it to honour Ctrl-C
    /// while a call waits for slow peers; `check` runs on the calling thread, and is not asked
    /// by operations on the progress thread ([`Group::start`]).
    pub fn interrupt_when(&mut self, check: impl Fn() -> bool + Send + Sync + 'static) {
        if let Some(liveness) = &self.liveness {
            liveness.set_interrupt(Some(Arc::new(check)));
        }
    }

    /// Sets the operation timeout ([`Config::timeout`]) of the calls made from now on, on any
    /// thread, those started with [`Group::start`] included. (A sub-group formed with a
    /// timeout of its own: [`Group::subgroup_of_members_with_timeout`].)
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout.store(nanos(timeout), Ordering::Relaxed);
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
            counts: None,
            message: 0,
            number: 0,
            history: [0; 32],
            timeout: self.operation_timeout(),
            wait: self.wait,
            interruptible: !self.on_progress_thread,
        }
    }

    /// The operation timeout of calls made now ([`Group::set_timeout`]).
    fn operation_timeout(&self) -> Duration {
        match self.timeout.load(Ordering::Relaxed) {
            u64::MAX => Duration::MAX,
            n => Duration::from_nanos(n),
        }
    }

    /// The description of a send or receive of `bytes`, a piece of a message of `message`
    /// bytes: the header's root field carries the tag (point to point has no root).
    fn p2p_call(&self, op: Op, dtype: Dtype, bytes: usize, message: usize, tag: u32) -> Call {
        Call {
            root: tag as usize,
            message: message / dtype.size(),
            ..self.call(op, dtype, ReduceOp::Sum, bytes / dtype.size())
        }
    }

    /// Whether the group has one rank: its collectives are local copies.
    fn alone(&self) -> bool {
        self.size == 1
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
        if self.alone() {
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
        let (rank, shares_memory) = (self.rank, self.shares_memory);
        let mut state = state_of(&mut self.state, self.progress.as_ref(), rank)?;
        let failure = &self.failure;
        let result = match &mut *state {
            State::Alone => return Ok(()),
            State::Failed { error, .. } => return Err(error.clone()),
            State::Connected(c) => {
                let call = c.numbers.number(call);
                let result = f(&mut c.collectives, &call);
                // A call refused for its arguments sent nothing: its retry is the same call.
                let refused = matches!(&result, Err(e) if e.is_local_argument_error());
                c.numbers.count(&call, refused, shares_memory);
                if call.is_collective() && result.is_ok() {
                    c.liveness.finished_a_collective();
                }
                result
            }
        };
        let result = match (result, &*state) {
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
            tracing::debug!(rank, error = %e, "jaccl group poisoned");
            let mut heartbeat = None;
            if let State::Connected(c) = &mut *state {
                c.liveness.fail(e);
                if let Some(shm) = &c.shm {
                    shm.fail();
                }
                heartbeat = c.heartbeat.take();
            }
            // Dropping the connections closes them, so the peers fail promptly too.
            let _ = failure.set(e.clone());
            *state = State::Failed {
                error: e.clone(),
                _heartbeat: heartbeat,
            };
            // The levels' members here wait no longer for this rank there.
            if let Ok(mut levels) = self.levels.lock() {
                levels.take();
            }
        }
        result
    }

    /// `f` on the group's collectives between calls (`None` for a group of one).
    fn on_collectives<T>(&mut self, f: impl FnOnce(&Collectives) -> T) -> Result<Option<T>> {
        let state = state_of(&mut self.state, self.progress.as_ref(), self.rank)?;
        match &*state {
            State::Alone => Ok(None),
            State::Failed { error, .. } => Err(error.clone()),
            State::Connected(c) => Ok(Some(f(&c.collectives))),
        }
    }

    fn check_usable(&self) -> Result<()> {
        match self.failure.get() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
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

/// The group's state in `holder`, once every operation started before has finished (`progress`
/// runs them; none on the progress thread itself). A function of the fields, so that a call
/// can borrow the others meanwhile.
fn state_of<'a>(
    holder: &'a mut Holder,
    progress: Option<&Progress<Group>>,
    rank: usize,
) -> Result<StateRef<'a>> {
    if let Some(progress) = progress {
        progress.settle();
    }
    match holder {
        Holder::Own(state) => Ok(StateRef::Own(state)),
        Holder::Shared(shared) => shared.lock().map(StateRef::Locked).map_err(|_| {
            let why = std::io::Error::other("an operation panicked earlier in this group");
            Error::io(rank, "group", why)
        }),
    }
}

/// `timeout` in nanoseconds, `u64::MAX` for one too long to count (as `Duration::MAX`).
fn nanos(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)
}

/// Makes `bool` bytes 0 or 1 (any other byte is true), as `bool` values must be.
fn normalise_bools(bytes: &mut [u8], dtype: Dtype) {
    if dtype == Dtype::Bool {
        bytes.iter_mut().for_each(|b| *b = u8::from(*b != 0));
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(progress) = &mut self.progress {
            // Stop the operation running and fail those queued, then wait for the thread:
            // the operations own their buffers, and the connections go after it.
            if let Some(liveness) = &self.liveness {
                liveness.close();
            }
            progress.join();
        }
    }
}

/// The error of a nonblocking operation that panicked (a bug in it, or in the closure given
/// to [`Group::start`]).
fn panicked(rank: usize, panic: &(dyn std::any::Any + Send)) -> Error {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    let why = std::io::Error::other(format!("it panicked: {what}"));
    Error::io(rank, "a nonblocking operation", why)
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |state: &State| match state {
            State::Alone => "alone",
            State::Connected(_) => "connected",
            State::Failed { .. } => "failed",
        };
        let state = match &self.state {
            Holder::Own(state) => name(state),
            Holder::Shared(shared) => shared.try_lock().map_or("busy", |s| name(&s)),
        };
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("state", &state)
            .finish()
    }
}
