//! How `jaccl._native.Group` runs a call: blocking with the GIL released, or on the group's
//! progress thread, over the bytes of the caller's arrays; and the exceptions of its errors.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;

use crate::errors::{exception, internal_error, overlap, to_python};
use crate::guarded::{self, Unusable};
use crate::memory::Memory;
use crate::{Group, Work};

/// The arrays a nonblocking call uses, which it keeps referenced until it ends; `None` for a
/// blocking call.
pub(crate) type Keep = Option<Vec<Py<PyAny>>>;

impl Group {
    /// Runs `f` on the group over the bytes of the call's arrays (`inputs` read, `output`
    /// written; they may not overlap): with the GIL released at once, or, when `keep` holds
    /// the arrays, on the group's progress thread, returning its [`Work`]. Its error becomes a
    /// `jaccl.errors` exception.
    #[allow(unsafe_code)]
    pub(crate) fn call(
        &self,
        py: Python<'_>,
        op: &'static str,
        keep: Keep,
        inputs: &[Memory],
        output: Memory,
        f: impl FnOnce(&mut jaccl::Group, &[&[u8]], &mut [u8]) -> jaccl::Result<()> + Send + 'static,
    ) -> PyResult<Option<Work>> {
        if inputs.iter().any(|i| i.overlaps(output)) {
            return Err(overlap(py));
        }
        let inputs = inputs.to_vec();
        let on_arrays = move |g: &mut jaccl::Group| {
            // The package passes the `(address, length)` of C-contiguous arrays, the output
            // writable (checked by the numpy API and the torch backend, see `memory`), that
            // stay referenced until the operation ends: by the caller during a blocking call,
            // by `keep` (dropped only after this closure) during a nonblocking one. Another thread writing one of
            // them meanwhile is the caller's data race, as the package's documentation says.
            // SAFETY: as above, `Memory::bytes`' contract holds; no input overlaps the output
            // (checked above), and the slices die with this closure.
            let (inputs, output) = unsafe {
                let inputs: Vec<&[u8]> = inputs.iter().map(|m| m.bytes()).collect();
                (inputs, output.bytes_mut())
            };
            f(g, &inputs, output)
        };
        match keep {
            None => self.run(py, op, on_arrays).map(|()| None),
            Some(arrays) => self.start(py, op, arrays, on_arrays).map(Some),
        }
    }

    /// Starts `f` on the group's progress thread (`jaccl::Group::start`), keeping `arrays`
    /// referenced until it ends.
    pub(crate) fn start(
        &self,
        py: Python<'_>,
        op: &'static str,
        arrays: Vec<Py<PyAny>>,
        f: impl FnOnce(&mut jaccl::Group) -> jaccl::Result<()> + Send + 'static,
    ) -> PyResult<Work> {
        let (rank, broken) = (self.rank, self.inner.broken());
        let request = py.detach(|| {
            self.inner.with(rank, op, |g| {
                // The arrays go with the operation, once it has ended or the group has failed
                // it (their references are dropped without the GIL: Python releases them when
                // it next runs). A panic in it leaves the group's state half-updated: later
                // calls raise its internal error (and `close` still works).
                g.start(move |g| {
                    let result = match guarded::catch(Some(rank), op, || f(g)) {
                        Ok(result) => result.map(|()| None),
                        Err(internal) => {
                            let _ = broken.set(internal.clone());
                            Ok(Some(internal))
                        }
                    };
                    drop(arrays);
                    result
                })
            })
        });
        match request {
            Ok(request) => Ok(Work {
                request,
                op,
                sender: None,
            }),
            Err(unusable) => Err(self.unusable(py, unusable, op)),
        }
    }

    /// Runs `f` on the group with the GIL released; its error becomes a `jaccl.errors`
    /// exception.
    pub(crate) fn run<R: Send>(
        &self,
        py: Python<'_>,
        op: &'static str,
        f: impl FnOnce(&mut jaccl::Group) -> jaccl::Result<R> + Send,
    ) -> PyResult<R> {
        let result = py.detach(|| {
            self.inner.with(self.rank, op, |g| {
                let result = f(g);
                // A call may have made links (to a rank it first talked to).
                if let Ok(mut transport) = self.transport.lock() {
                    *transport = g.transport();
                }
                result
            })
        });
        let result = result.map_err(|unusable| self.unusable(py, unusable, op))?;
        result.map_err(|e| match e {
            // The handler's own exception, the first time (later calls on the stopped group
            // raise jaccl.errors.Interrupted).
            jaccl::Error::Interrupted { .. } => self
                .interrupt
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
                .unwrap_or_else(|| to_python(py, &e, op)),
            e => to_python(py, &e, op),
        })
    }

    /// The exception of a call (`op`) on a group that is gone.
    pub(crate) fn unusable(&self, py: Python<'_>, why: Unusable, op: &str) -> PyErr {
        match why {
            Unusable::Closed if self.aborted.load(Ordering::Acquire) => {
                to_python(py, &jaccl::Error::Aborted { rank: self.rank }, op)
            }
            Unusable::Closed => {
                let why = format!("rank {}: {op}: the group is closed", self.rank);
                exception(py, "Error", why, Some(self.rank), None, Some(op))
            }
            Unusable::Broken(internal) => {
                self.closed.store(true, Ordering::Release);
                internal_error(py, &internal)
            }
        }
    }
}
