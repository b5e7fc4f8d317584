//! `jaccl._native`: the Rust side of the Python package `jaccl`.
//!
//! It is deliberately thin: a `Group` whose collectives take raw bytes (`(address, length)`
//! of arrays, see `memory`) and an element type by name, and errors that become the
//! exceptions of `jaccl.errors` (`errors`). The package (python/jaccl/__init__.py, and the
//! torch backend in python/jaccl/torch/) does everything about arrays: element types, shapes,
//! `out=`, PyTorch tensors. Data moves with
//! the GIL released. `guarded` keeps a panic in a call from poisoning the group's lock. Also
//! the sealed boxes that the torch backend's start-up passes the job secret in (`sealed`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;

mod calls;
mod errors;
mod guarded;
mod memory;
mod sealed;

use calls::Keep;
use errors::{exception, internal_error, parse_dtype, parse_op, to_python};
use guarded::{Guarded, Internal};
use memory::Memory;
use sealed::SealKey;

/// A jaccl group (`jaccl::Group`), for the package's `jaccl.Group`.
///
/// The group itself is behind a mutex that a running call holds (with the GIL released);
/// what the getters answer is copied out when the group forms, so that no getter ever waits
/// for that mutex while holding the GIL, which a running call takes back now and then.
/// `abort` never takes that mutex, and `close` stops the call that holds it (both through the
/// group's `jaccl::AbortHandle`).
#[pyclass(module = "jaccl._native", frozen)]
struct Group {
    /// The group, one call at a time; gone once closed, or after a panic in a call.
    inner: Guarded<jaccl::Group>,
    /// Stops the call in flight from any thread, without the group's lock (this one is never
    /// held long); dropped with the group, whose heartbeat's file descriptors it holds.
    abort: Mutex<Option<jaccl::AbortHandle>>,
    rank: usize,
    size: usize,
    /// Checked after every call (links made on first use add peers), named only when asked
    /// for; never held long.
    transport: Mutex<Vec<(usize, jaccl::Transport)>>,
    topology: Option<String>,
    /// The ranks on each host, this rank's host and its place there (`jaccl::HostLayout`).
    hosts: Vec<Vec<usize>>,
    host: usize,
    local_rank: usize,
    /// The job's rank of each rank (`jaccl::Group::job_ranks`).
    job_ranks: Vec<usize>,
    closed: AtomicBool,
    /// Whether `abort` was called, or `close` aborted a call in flight: later calls raise
    /// `Aborted` (as that call did, and as the next could before the group is dropped), not
    /// "closed".
    aborted: AtomicBool,
    /// What a signal handler raised while a call waited (Ctrl-C: `KeyboardInterrupt`).
    interrupt: Arc<Mutex<Option<PyErr>>>,
}

/// Joins the group that `settings` (variable name → value, e.g. `JACCL_WIRES` → `2`) and
/// the environment describe.
#[pyfunction]
fn init(py: Python<'_>, settings: HashMap<String, String>) -> PyResult<Group> {
    let made = py.detach(|| {
        guarded::catch(None, "init", || {
            jaccl::Config::from_env_with(&settings).and_then(jaccl::init_with)
        })
    });
    let group = made
        .map_err(|internal| internal_error(py, &internal))?
        .map_err(|e| to_python(py, &e, "init"))?;
    Ok(Group::wrap(group))
}

impl Group {
    /// The Python object of `group`.
    fn wrap(mut group: jaccl::Group) -> Group {
        // While a call waits, run Python's signal handlers (on the main thread) every 100 ms:
        // a handler that raises (Ctrl-C) stops the call, and its exception is raised in its
        // place. Operations on the progress thread (async_op) never ask it.
        let interrupt = Arc::new(Mutex::new(None));
        let raised = Arc::clone(&interrupt);
        group.interrupt_when(move || {
            Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    if let Ok(mut slot) = raised.lock() {
                        *slot = Some(e);
                    }
                    true
                }
            })
        });
        Group {
            rank: group.rank(),
            size: group.size(),
            transport: Mutex::new(group.transport()),
            topology: group.topology().map(|t| t.to_string()),
            hosts: (0..group.hosts().count())
                .map(|h| group.hosts().ranks_on(h).to_vec())
                .collect(),
            host: group.hosts().host(),
            local_rank: group.hosts().local_rank(),
            job_ranks: group.job_ranks().to_vec(),
            closed: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            abort: Mutex::new(Some(group.abort_handle())),
            inner: Guarded::new(group),
            interrupt,
        }
    }
}

/// A nonblocking operation (`async_op=True`): the package's `jaccl.Work` wraps it. It owns
/// references to the arrays the operation reads and writes until the operation ends.
#[pyclass(module = "jaccl._native", frozen)]
struct Work {
    /// Ends with the internal error of a panic in the operation, if it had one.
    request: jaccl::Request<Option<Internal>>,
    /// The operation's name, for errors that do not carry one (`Aborted`, `Closed`).
    op: &'static str,
    /// A receive from any source's sender, set when it has received (else `None`).
    sender: Option<Sender>,
}

/// The sender of a receive from any source, once known: set by the operation, read by
/// `Work.source` and by the receives of the message's later pieces (`Group.recv`).
type Sender = Arc<OnceLock<usize>>;

/// Where `Group.recv` receives from: a rank, or the sender of an earlier `recv_any` (its
/// `Work`), read when the receive runs (which is after that one: a group runs its operations
/// in order), so that a message sent in pieces is received in pieces from whoever sent its
/// first.
#[derive(FromPyObject)]
enum Source {
    Rank(usize),
    SenderOf(Py<Work>),
}

#[pymethods]
impl Work {
    /// Waits, with the GIL released, until the operation ends or `timeout` seconds pass
    /// (`None`: no limit); returns whether it ended, or raises its error. Python's signal
    /// handlers run every 100 ms meanwhile (Ctrl-C raises; the operation goes on).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = timeout
            .map(|t| Duration::try_from_secs_f64(t.max(0.0)).unwrap_or(Duration::MAX))
            .map(|t| std::time::Instant::now().checked_add(t));
        let step = Duration::from_millis(100);
        loop {
            let left = match deadline {
                None | Some(None) => step,
                Some(Some(d)) => d
                    .saturating_duration_since(std::time::Instant::now())
                    .min(step),
            };
            if py.detach(|| self.request.wait_timeout(left)) {
                return match self.request.outcome() {
                    Some(Err(e)) => Err(to_python(py, &e, self.op)),
                    Some(Ok(Some(internal))) => Err(internal_error(py, &internal)),
                    _ => Ok(true),
                };
            }
            py.check_signals()?;
            if matches!(deadline, Some(Some(d)) if std::time::Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// Whether the operation has ended (well or not).
    fn is_completed(&self) -> bool {
        self.request.is_done()
    }

    /// The rank a receive from any source received from, once it has (else `None`).
    #[getter]
    fn source(&self) -> Option<usize> {
        self.sender.as_ref().and_then(|s| s.get().copied())
    }
}

#[pymethods]
impl Group {
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// `[(peer, transport name)]`, as `jaccl::Group::transport` (empty once closed).
    #[getter]
    fn transport(&self) -> Vec<(usize, String)> {
        match self.closed.load(Ordering::Acquire) {
            true => Vec::new(),
            false => self.transport.lock().map(|t| named(&t)).unwrap_or_default(),
        }
    }

    /// `ring`, `mesh`, or `None` for a group of one (or once closed).
    #[getter]
    fn topology(&self) -> Option<String> {
        match self.closed.load(Ordering::Acquire) {
            true => None,
            false => self.topology.clone(),
        }
    }

    /// The ranks on each host, as `jaccl::HostLayout` numbers the hosts.
    #[getter]
    fn hosts(&self) -> Vec<Vec<usize>> {
        self.hosts.clone()
    }

    /// This rank's host, an index into `hosts`.
    #[getter]
    fn host(&self) -> usize {
        self.host
    }

    /// This rank's place among the ranks of its host.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Whether [`Group::close`] was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Leaves the group: says goodbye to the peers and closes the connections (the other
    /// ranks' next calls fail with `PeerLost`). Later calls raise; closing again does nothing.
    /// A call running on another thread is aborted (it raises `Aborted`), and waited for with
    /// the GIL released; one this thread is in (a signal handler's close) ends the group as
    /// it returns.
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::Release);
        let handle = self.abort.lock().ok().and_then(|h| h.clone());
        py.detach(|| {
            self.inner.close(|| {
                self.aborted.store(true, Ordering::Release);
                if let Some(handle) = &handle {
                    handle.abort();
                }
            });
        });
        if let Ok(mut kept) = self.abort.lock() {
            *kept = None;
        }
    }

    /// Aborts the group from any thread: the call in flight (blocking, or started with
    /// `keep`) stops at its next wait and raises `Aborted`, as does every later call; the
    /// connections close (the peers' calls fail with `PeerLost`). Then as `close`.
    fn abort(&self, py: Python<'_>) {
        self.aborted.store(true, Ordering::Release);
        if let Some(handle) = self.abort.lock().ok().and_then(|h| h.clone()) {
            handle.abort();
        }
        self.close(py);
    }

    /// All-reduce of `input` into `output`, or of `output` in place when `input` is `None`.
    ///
    /// Every operation runs at once, or with `keep` (the arrays it uses, kept referenced until
    /// it ends) on the group's progress thread, returning its `Work`.
    #[pyo3(signature = (input, output, dtype, op, keep=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: Option<Memory>,
        output: Memory,
        dtype: &str,
        op: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        match input {
            Some(input) => self.call(py, "all_reduce", keep, &[input], output, move |g, i, o| {
                g.all_reduce_raw(i[0], o, dtype, op)
            }),
            None => self.call(py, "all_reduce", keep, &[], output, move |g, _, o| {
                g.all_reduce_raw_in_place(o, dtype, op)
            }),
        }
    }

    #[pyo3(signature = (input, output, dtype, keep=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(py, "all_gather", keep, &[input], output, move |g, i, o| {
            g.all_gather_raw(i[0], o, dtype)
        })
    }

    #[pyo3(signature = (input, output, dtype, op, keep=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        op: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.call(
            py,
            "reduce_scatter",
            keep,
            &[input],
            output,
            move |g, i, o| g.reduce_scatter_raw(i[0], o, dtype, op),
        )
    }

    #[pyo3(signature = (data, dtype, root, keep=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        data: Memory,
        dtype: &str,
        root: usize,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(py, "broadcast", keep, &[], data, move |g, _, d| {
            g.broadcast_raw(d, dtype, root)
        })
    }

    #[pyo3(signature = (input, output, dtype, op, root, keep=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        op: &str,
        root: usize,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.call(py, "reduce", keep, &[input], output, move |g, i, o| {
            g.reduce_raw(i[0], o, dtype, op, root)
        })
    }

    #[pyo3(signature = (input, output, dtype, root, keep=None))]
    fn gather(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        root: usize,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(py, "gather", keep, &[input], output, move |g, i, o| {
            g.gather_raw(i[0], o, dtype, root)
        })
    }

    #[pyo3(signature = (input, output, dtype, root, keep=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        root: usize,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(py, "scatter", keep, &[input], output, move |g, i, o| {
            g.scatter_raw(i[0], o, dtype, root)
        })
    }

    #[pyo3(signature = (input, output, dtype, keep=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(py, "all_to_all", keep, &[input], output, move |g, i, o| {
            g.all_to_all_raw(i[0], o, dtype)
        })
    }

    /// Counts in elements.
    #[pyo3(signature = (input, send_counts, output, recv_counts, dtype, keep=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: Memory,
        send_counts: Vec<usize>,
        output: Memory,
        recv_counts: Vec<usize>,
        dtype: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(
            py,
            "all_to_all_v",
            keep,
            &[input],
            output,
            move |g, i, o| g.all_to_all_v_raw(i[0], &send_counts, o, &recv_counts, dtype),
        )
    }

    /// Counts in elements.
    #[pyo3(signature = (input, output, counts, dtype, keep=None))]
    fn all_gather_v(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        counts: Vec<usize>,
        dtype: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        self.call(
            py,
            "all_gather_v",
            keep,
            &[input],
            output,
            move |g, i, o| g.all_gather_v_raw(i[0], o, &counts, dtype),
        )
    }

    /// Counts in elements.
    #[pyo3(signature = (input, output, counts, dtype, op, keep=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_v(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        counts: Vec<usize>,
        dtype: &str,
        op: &str,
        keep: Keep,
    ) -> PyResult<Option<Work>> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.call(
            py,
            "reduce_scatter_v",
            keep,
            &[input],
            output,
            move |g, i, o| g.reduce_scatter_v_raw(i[0], o, &counts, dtype, op),
        )
    }

    /// `message`: the bytes of the whole message `data` is a piece of (`data`'s own by
    /// default; see `jaccl::Group::send_piece_raw`).
    #[pyo3(signature = (data, dst, dtype, keep=None, tag=0, message=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments.
    fn send(
        &self,
        py: Python<'_>,
        data: Memory,
        dst: usize,
        dtype: &str,
        keep: Keep,
        tag: u32,
        message: Option<usize>,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        let message = message.unwrap_or(data.len());
        self.call(py, "send", keep, &[data], Memory::EMPTY, move |g, i, _| {
            g.send_piece_raw(i[0], dst, dtype, tag, message)
        })
    }

    /// `src`: a rank, or the `Work` of an earlier `recv_any` (see [`Source`]); `message` as
    /// for `send`.
    #[pyo3(signature = (out, src, dtype, keep=None, tag=0, message=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments.
    fn recv(
        &self,
        py: Python<'_>,
        out: Memory,
        src: Source,
        dtype: &str,
        keep: Keep,
        tag: u32,
        message: Option<usize>,
    ) -> PyResult<Option<Work>> {
        let dtype = parse_dtype(py, dtype)?;
        let message = message.unwrap_or(out.len());
        // The rank, or the sender to read it from when the receive runs.
        let (src, sender) = match src {
            Source::Rank(rank) => (rank, None),
            Source::SenderOf(work) => {
                let sender = work.get().sender.clone().ok_or_else(|| {
                    let why = "src is the Work of an operation that is not a recv_any".to_owned();
                    exception(py, "InvalidArgument", why, Some(self.rank), None, None)
                })?;
                (0, Some(sender))
            }
        };
        let rank = self.rank;
        self.call(py, "recv", keep, &[], out, move |g, _, o| {
            let src = match &sender {
                None => src,
                Some(sender) => sender.get().copied().ok_or_else(|| {
                    jaccl::Error::InvalidArgument(format!(
                        "rank {rank}: recv: the receive from any source that this one continues \
                         failed"
                    ))
                })?,
            };
            g.recv_piece_raw(o, src, dtype, tag, message)
        })
    }

    /// Receives into `out` the next message from any rank (`jaccl::Group::recv_any_raw`):
    /// returns its sender, or with `keep` the `Work`, whose `source` is the sender once
    /// received; `message` as for `send`.
    #[pyo3(signature = (out, dtype, keep=None, tag=0, message=None))]
    fn recv_any<'py>(
        &self,
        py: Python<'py>,
        out: Memory,
        dtype: &str,
        keep: Keep,
        tag: u32,
        message: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = parse_dtype(py, dtype)?;
        let message = message.unwrap_or(out.len());
        let sender = Sender::default();
        let found = Arc::clone(&sender);
        let work = self.call(py, "recv_any", keep, &[], out, move |g, _, o| {
            let from = g.recv_any_piece_raw(o, dtype, tag, message)?;
            // The one set of this cell: the operation runs once.
            let _ = found.set(from);
            Ok(())
        })?;
        match work {
            Some(work) => {
                let work = Work {
                    sender: Some(sender),
                    ..work
                };
                Ok(Bound::new(py, work)?.into_any())
            }
            None => Ok(sender.get().copied().into_pyobject(py)?.into_any()),
        }
    }

    #[pyo3(signature = (keep=None))]
    fn barrier(&self, py: Python<'_>, keep: Keep) -> PyResult<Option<Work>> {
        self.call(py, "barrier", keep, &[], Memory::EMPTY, |g, _, _| {
            g.barrier()
        })
    }

    /// `jaccl::Group::split`: the new group, or `None` for a rank without a color.
    #[pyo3(signature = (color, key))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: u32) -> PyResult<Option<Group>> {
        let made = self.run(py, "split", move |g| g.split(color, key))?;
        Ok(made.map(Group::wrap))
    }

    /// `jaccl::Group::subgroup_of_members_with_timeout`: the group of `ranks` that only they
    /// call, with `timeout` (seconds) as its start-up and operation timeouts.
    fn subgroup_of_members(
        &self,
        py: Python<'_>,
        ranks: Vec<usize>,
        name: String,
        timeout: f64,
    ) -> PyResult<Group> {
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let made = self.run(py, "subgroup_of_members", move |g| {
            g.subgroup_of_members_with_timeout(&ranks, &name, timeout)
        })?;
        Ok(Group::wrap(made))
    }

    /// `jaccl::Group::subgroup`: the new group, or `None` for a rank not in `ranks`.
    fn subgroup(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<Group>> {
        let made = self.run(py, "subgroup", move |g| g.subgroup(&ranks))?;
        Ok(made.map(Group::wrap))
    }

    /// `jaccl::Group::agree`: `(flag, alive, lost)`.
    fn agree(&self, py: Python<'_>, flag: bool) -> PyResult<(bool, Vec<usize>, Vec<usize>)> {
        let agreed = self.run(py, "agree", move |g| g.agree(flag))?;
        Ok((agreed.flag, agreed.alive, agreed.lost))
    }

    /// `jaccl::Group::job_ranks`.
    #[getter]
    fn job_ranks(&self) -> Vec<usize> {
        self.job_ranks.clone()
    }

    /// `jaccl::Group::shrink_excluding`: the group of the ranks alive but `exclude`.
    fn shrink(&self, py: Python<'_>, exclude: Vec<usize>) -> PyResult<Group> {
        let made = self.run(py, "shrink", move |g| g.shrink_excluding(&exclude))?;
        Ok(Group::wrap(made))
    }

    /// `jaccl::AbortHandle::failure`, as the exception its calls raise: `None` while the
    /// group works (or once it is closed). Without the group's lock: a call in flight on
    /// another thread does not hold it up.
    fn failure(&self, py: Python<'_>) -> Option<Py<pyo3::exceptions::PyBaseException>> {
        let handle = self.abort.lock().ok().and_then(|h| h.clone())?;
        let failure = handle.failure()?;
        Some(to_python(py, &failure, "failure").into_value(py))
    }

    /// `jaccl::Group::set_timeout`: `seconds` (infinite or beyond a `Duration`: none). It
    /// waits for a blocking call in flight on another thread.
    fn set_timeout(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        if seconds.is_nan() || seconds <= 0.0 {
            let why = format!(
                "rank {}: set_timeout: {seconds} s is not a timeout",
                self.rank
            );
            return Err(exception(
                py,
                "InvalidArgument",
                why,
                Some(self.rank),
                None,
                Some("set_timeout"),
            ));
        }
        let timeout = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX);
        self.run(py, "set_timeout", move |g| {
            g.set_timeout(timeout);
            Ok(())
        })
    }

    /// `jaccl::Group::invitation`, as text.
    fn invitation(&self, py: Python<'_>) -> PyResult<String> {
        self.run(py, "invitation", |g| g.invitation().map(|i| i.to_string()))
    }

    /// `jaccl::Group::grow`: the grown group.
    fn grow(&self, py: Python<'_>, count: usize) -> PyResult<Group> {
        let made = self.run(py, "grow", move |g| g.grow(count))?;
        Ok(Group::wrap(made))
    }

    /// `jaccl::AbortHandle::revoke`, from any thread, without the group's lock.
    fn revoke(&self) {
        if let Some(handle) = self.abort.lock().ok().and_then(|h| h.clone()) {
            handle.revoke();
        }
    }
}

/// `[(peer, transport name)]` of `peers`.
fn named(peers: &[(usize, jaccl::Transport)]) -> Vec<(usize, String)> {
    peers.iter().map(|(p, t)| (*p, t.to_string())).collect()
}

/// The module `jaccl._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Group>()?;
    m.add_class::<Work>()?;
    m.add_class::<SealKey>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(sealed::seal, m)?)?;
    Ok(())
}
