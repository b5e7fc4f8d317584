//! jaccl's errors as the exceptions of `jaccl.errors`, with the rank, peer and operation they
//! name; the parsers of the names the package passes.

use jaccl::{Dtype, ReduceOp};
use pyo3::prelude::*;

use crate::guarded::Internal;

/// The element type named `name`, or `jaccl.InvalidArgument`.
pub(crate) fn parse_dtype(py: Python<'_>, name: &str) -> PyResult<Dtype> {
    name.parse()
        .map_err(|why: String| exception(py, "InvalidArgument", why, None, None, None))
}

/// The reduction named `name`, or `jaccl.InvalidArgument`.
pub(crate) fn parse_op(py: Python<'_>, name: &str) -> PyResult<ReduceOp> {
    name.parse()
        .map_err(|why: String| exception(py, "InvalidArgument", why, None, None, None))
}

/// The `jaccl.Error` of a panic in a call.
pub(crate) fn internal_error(py: Python<'_>, internal: &Internal) -> PyErr {
    let Internal { rank, op, message } = internal;
    exception(py, "Error", message.clone(), *rank, None, Some(op))
}

pub(crate) fn overlap(py: Python<'_>) -> PyErr {
    let why = "the input and output overlap without being the same array";
    exception(py, "InvalidArgument", why.into(), None, None, None)
}

/// The `jaccl.errors` exception for `e`, with the rank, peer and operation it names (`call`,
/// the binding's call, when `e` names none).
pub(crate) fn to_python(py: Python<'_>, e: &jaccl::Error, call: &str) -> PyErr {
    use jaccl::Error as E;
    let mut msg = e.to_string();
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
        E::Revoked { rank, by } => ("Revoked", Some(*rank), Some(*by), None),
        E::LeftOut { rank, op: o, .. } => ("LeftOut", Some(*rank), None, op(o)),
        E::Bootstrap(_) => ("BootstrapError", None, None, Some("init")),
        E::Config(_) => ("ConfigError", None, None, Some("init")),
        E::InvalidArgument(_) => ("InvalidArgument", None, None, None),
        E::Unsupported(_) => ("Unsupported", None, None, None),
        E::Io { rank, .. } => ("IoError", Some(*rank), None, None),
        E::Closed { rank } => {
            msg =
                format!("rank {rank}: {call}: the group was closed before the operation finished");
            ("Error", Some(*rank), None, None)
        }
        E::Aborted { rank } => {
            msg = format!(
                "rank {rank}: {call}: the group was aborted (abort(), or close() while a call \
                 ran); it can no longer be used"
            );
            ("Aborted", Some(*rank), None, None)
        }
        _ => ("Error", None, None, None),
    };
    let made = exception(py, class, msg, rank, peer, op.or(Some(call)));
    if let Some(code) = e.raw_os_error() {
        let _ = made.value(py).setattr("errno", code);
    }
    made
}

/// An instance of `jaccl.errors.<class>` with its `rank`, `peer` and `op` attributes.
pub(crate) fn exception(
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
