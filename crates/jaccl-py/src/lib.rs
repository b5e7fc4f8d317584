//! `jaccl._native`: the Rust side of the Python package `jaccl`.
//!
//! It is deliberately thin: a `Group` whose collectives take raw bytes (`(address, length)`
//! of arrays, see `memory`) and an element type by name, and errors that become the
//! exceptions of `jaccl.errors`. The package (python/jaccl/__init__.py) does everything
//! about arrays: element types, shapes, `out=`, PyTorch tensors. Data moves with the GIL
//! released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use jaccl::{Dtype, ReduceOp};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

mod memory;

use memory::Memory;

/// A jaccl group (`jaccl::Group`), for the package's `jaccl.Group`.
///
/// The group itself is behind a mutex that a running call holds (with the GIL released);
/// what the getters answer is copied out when the group forms, so that no getter ever waits
/// for that mutex while holding the GIL, which a running call takes back now and then.
#[pyclass(module = "jaccl._native", frozen)]
struct Group {
    /// `None` once closed.
    inner: Mutex<Option<jaccl::Group>>,
    rank: usize,
    size: usize,
    /// Refreshed after every call (links made on first use add peers); never held long.
    transport: Mutex<Vec<(usize, String)>>,
    topology: Option<String>,
    closed: AtomicBool,
    /// What a signal handler raised while a call waited (Ctrl-C: `KeyboardInterrupt`).
    interrupt: Arc<Mutex<Option<PyErr>>>,
}

/// Joins the group that `settings` (variable name → value, e.g. `JACCL_WIRES` → `2`) and
/// the environment describe.
#[pyfunction]
fn init(py: Python<'_>, settings: HashMap<String, String>) -> PyResult<Group> {
    let mut group = py
        .detach(|| jaccl::Config::from_env_with(&settings).and_then(jaccl::init_with))
        .map_err(|e| to_python(py, &e))?;
    // While a call waits, run Python's signal handlers (on the main thread) every 100 ms: a
    // handler that raises (Ctrl-C) stops the call, and its exception is raised in its place.
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
    Ok(Group {
        rank: group.rank(),
        size: group.size(),
        transport: Mutex::new(transports(&group)),
        topology: group.topology().map(|t| t.to_string()),
        closed: AtomicBool::new(false),
        inner: Mutex::new(Some(group)),
        interrupt,
    })
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
            false => self.transport.lock().map(|t| t.clone()).unwrap_or_default(),
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

    /// Whether [`Group::close`] was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Leaves the group: says goodbye to the peers and closes the connections (the other
    /// ranks' next calls fail with `PeerLost`). Later calls raise; closing again does nothing.
    /// Waits, with the GIL released, for a call running on another thread to end.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closed.store(true, Ordering::Release);
        py.detach(|| {
            let group = self.lock()?.take();
            drop(group);
            Ok(())
        })
    }

    /// All-reduce of `input` into `output`, or of `output` in place when `input` is `None`.
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: Option<Memory>,
        output: Memory,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        match input {
            Some(input) => self.run_on(py, &[input], output, |g, i, o| {
                g.all_reduce_raw(i[0], o, dtype, op)
            }),
            None => self.run_on(py, &[], output, |g, _, o| {
                g.all_reduce_raw_in_place(o, dtype, op)
            }),
        }
    }

    fn all_gather(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.all_gather_raw(i[0], o, dtype)
        })
    }

    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.run_on(py, &[input], output, |g, i, o| {
            g.reduce_scatter_raw(i[0], o, dtype, op)
        })
    }

    fn broadcast(&self, py: Python<'_>, data: Memory, dtype: &str, root: usize) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[], data, |g, _, d| g.broadcast_raw(d, dtype, root))
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        op: &str,
        root: usize,
    ) -> PyResult<()> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.run_on(py, &[input], output, |g, i, o| {
            g.reduce_raw(i[0], o, dtype, op, root)
        })
    }

    fn gather(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        root: usize,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.gather_raw(i[0], o, dtype, root)
        })
    }

    fn scatter(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
        root: usize,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.scatter_raw(i[0], o, dtype, root)
        })
    }

    fn all_to_all(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.all_to_all_raw(i[0], o, dtype)
        })
    }

    /// Counts in elements.
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        input: Memory,
        send_counts: Vec<usize>,
        output: Memory,
        recv_counts: Vec<usize>,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.all_to_all_v_raw(i[0], &send_counts, o, &recv_counts, dtype)
        })
    }

    /// Counts in elements.
    fn all_gather_v(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        counts: Vec<usize>,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[input], output, |g, i, o| {
            g.all_gather_v_raw(i[0], o, &counts, dtype)
        })
    }

    /// Counts in elements.
    fn reduce_scatter_v(
        &self,
        py: Python<'_>,
        input: Memory,
        output: Memory,
        counts: Vec<usize>,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let (dtype, op) = (parse_dtype(py, dtype)?, parse_op(py, op)?);
        self.run_on(py, &[input], output, |g, i, o| {
            g.reduce_scatter_v_raw(i[0], o, &counts, dtype, op)
        })
    }

    fn send(&self, py: Python<'_>, data: Memory, dst: usize, dtype: &str) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[data], Memory::EMPTY, |g, i, _| {
            g.send_raw(i[0], dst, dtype)
        })
    }

    fn recv(&self, py: Python<'_>, out: Memory, src: usize, dtype: &str) -> PyResult<()> {
        let dtype = parse_dtype(py, dtype)?;
        self.run_on(py, &[], out, |g, _, o| g.recv_raw(o, src, dtype))
    }

    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, jaccl::Group::barrier)
    }
}

impl Group {
    /// The group, for one call at a time (Python threads sharing a group take turns).
    fn lock(&self) -> PyResult<MutexGuard<'_, Option<jaccl::Group>>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("a jaccl call panicked earlier in this group"))
    }

    /// Runs `f` on the group with the GIL released, over the bytes of the call's arrays
    /// (`inputs` read, `output` written; they may not overlap); its error becomes a
    /// `jaccl.errors` exception.
    #[allow(unsafe_code)]
    fn run_on(
        &self,
        py: Python<'_>,
        inputs: &[Memory],
        output: Memory,
        f: impl FnOnce(&mut jaccl::Group, &[&[u8]], &mut [u8]) -> jaccl::Result<()> + Send,
    ) -> PyResult<()> {
        if inputs.iter().any(|i| i.overlaps(output)) {
            return Err(overlap(py));
        }
        // SAFETY: the package passes the `(address, length)` of C-contiguous arrays that it
        // keeps referenced until this native call returns, the output writable (all checked
        // in python/jaccl/__init__.py), and no input overlaps the output (checked above); the
        // slices die with this call. Another thread writing one of them meanwhile is the
        // caller's data race, as the package's documentation says.
        let (inputs, output) = unsafe {
            let inputs: Vec<&[u8]> = inputs.iter().map(|m| m.bytes()).collect();
            (inputs, output.bytes_mut())
        };
        self.run(py, |g| f(g, &inputs, output))
    }

    /// Runs `f` on the group with the GIL released; its error becomes a `jaccl.errors`
    /// exception.
    fn run(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut jaccl::Group) -> jaccl::Result<()> + Send,
    ) -> PyResult<()> {
        let result = py.detach(|| {
            let mut group = self.lock()?;
            let result = group.as_mut().map(f);
            // A call may have made links (to a rank it first talked to).
            if let (Some(g), Ok(mut transport)) = (group.as_ref(), self.transport.lock()) {
                *transport = transports(g);
            }
            Ok(result)
        });
        let closed = || {
            let why = format!("rank {}: the group is closed", self.rank);
            exception(py, "Error", why, Some(self.rank), None, None)
        };
        result.and_then(|r| {
            let r = r.ok_or_else(closed)?;
            r.map_err(|e| match e {
                // The handler's own exception, the first time (later calls on the stopped
                // group raise jaccl.errors.Interrupted).
                jaccl::Error::Interrupted { .. } => self
                    .interrupt
                    .lock()
                    .ok()
                    .and_then(|mut slot| slot.take())
                    .unwrap_or_else(|| to_python(py, &e)),
                e => to_python(py, &e),
            })
        })
    }
}

/// `[(peer, transport name)]` of `g`.
fn transports(g: &jaccl::Group) -> Vec<(usize, String)> {
    let peers = g.transport().into_iter();
    peers.map(|(p, t)| (p, t.to_string())).collect()
}

fn parse_dtype(py: Python<'_>, name: &str) -> PyResult<Dtype> {
    name.parse()
        .map_err(|why: String| exception(py, "InvalidArgument", why, None, None, None))
}

fn parse_op(py: Python<'_>, name: &str) -> PyResult<ReduceOp> {
    name.parse()
        .map_err(|why: String| exception(py, "InvalidArgument", why, None, None, None))
}

fn overlap(py: Python<'_>) -> PyErr {
    let why = "the input and output overlap without being the same array";
    exception(py, "InvalidArgument", why.into(), None, None, None)
}

/// The `jaccl.errors` exception for `e`, with the rank, peer and operation it names.
fn to_python(py: Python<'_>, e: &jaccl::Error) -> PyErr {
    use jaccl::Error as E;
    let msg = e.to_string();
    let op = |op: &jaccl::Op| Some(op.name());
    let (class, rank, peer, op) = match e {
        E::PeerLost {
            rank, peer, op: o, ..
        } => ("PeerLost", Some(*rank), Some(*peer), op(o)),
        E::Timeout { rank, op: o, .. } => ("Timeout", Some(*rank), None, op(o)),
        E::Mismatch {
            rank, peer, op: o, ..
        } => ("Mismatch", Some(*rank), Some(*peer), op(o)),
        E::Deadlock { rank, op: o, .. } => ("Deadlock", Some(*rank), None, op(o)),
        E::Interrupted { rank, op: o } => ("Interrupted", Some(*rank), None, op(o)),
        E::Protocol {
            rank, peer, op: o, ..
        } => ("ProtocolError", Some(*rank), Some(*peer), op(o)),
        E::Bootstrap(_) => ("BootstrapError", None, None, Some("init")),
        E::Config(_) => ("ConfigError", None, None, Some("init")),
        E::InvalidArgument(_) => ("InvalidArgument", None, None, None),
        E::Unsupported(_) => ("Unsupported", None, None, None),
        E::Io { rank, .. } => ("IoError", Some(*rank), None, None),
        _ => ("Error", None, None, None),
    };
    let made = exception(py, class, msg, rank, peer, op);
    if let Some(code) = e.raw_os_error() {
        let _ = made.value(py).setattr("errno", code);
    }
    made
}

/// An instance of `jaccl.errors.<class>` with its `rank`, `peer` and `op` attributes.
fn exception(
    py: Python<'_>,
    class: &str,
    msg: String,
    rank: Option<usize>,
    peer: Option<usize>,
    op: Option<&str>,
) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let class = py.import("jaccl.errors")?.getattr(class)?;
        let value = class.call1((msg,))?;
        value.setattr("rank", rank)?;
        value.setattr("peer", peer)?;
        value.setattr("op", op)?;
        Ok(PyErr::from_value(value))
    })();
    made.unwrap_or_else(|e| e)
}

/// The module `jaccl._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Group>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    Ok(())
}
