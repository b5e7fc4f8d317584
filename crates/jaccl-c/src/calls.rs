//! How an operation runs: built once as a closure over the caller's buffers (a [`Call`]),
//! then run at once (the blocking form), on the group's progress thread (the `_start` form,
//! giving a request), or queued until the end of the thread's batch (send and receive).
#![allow(unsafe_code)] // The pointers C passes.

use crate::buffers::Site;
use crate::comm::{jaccl_comm_t, on_comm, write_out};
use crate::errors::Failure;
pub(crate) use crate::operation::{Kind, Operation};
use crate::pending::{self, Queued};
use crate::requests::jaccl_request_t;
use crate::types::jaccl_result_t;

/// Runs the operation `build` makes on `comm` now (or, a send or receive in a batch, at the
/// batch's end); `done` gets what it returned.
///
/// # Safety
/// `comm` is null or a communicator not destroyed during the call (or, queued, before the
/// batch ends); the buffers `build` lends are lent as the header says.
pub(crate) unsafe fn now<O: Operation>(
    comm: *mut jaccl_comm_t,
    op: &'static str,
    kind: Kind,
    build: impl FnOnce(&jaccl_comm_t, Site<'_>) -> Result<O, Failure>,
    done: impl FnOnce(Option<usize>) -> Result<(), Failure>,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, op, |c| {
            let site = Site { rank: c.rank(), op };
            let batched = pending::is_open();
            if kind == Kind::Other {
                pending::outside(c.rank(), op)?;
            }
            let call = build(c, site)?;
            if batched {
                let call = Box::new(call);
                pending::queue(Queued {
                    comm: comm.addr(),
                    kind,
                    op,
                    call,
                });
                return Ok(());
            }
            done(c.with_group(op, call)?)
        })
    }
}

/// Starts the operation `build` makes on `comm`'s progress thread and writes its request to
/// `request` (NULL if it could not start).
///
/// # Safety
/// `comm` is null or a communicator not destroyed during the call; `request` is null or
/// valid for a write of a pointer; the buffers `build` lends are lent as the header says.
pub(crate) unsafe fn start<O: Operation>(
    comm: *mut jaccl_comm_t,
    op: &'static str,
    request: *mut *mut jaccl_request_t,
    build: impl FnOnce(&jaccl_comm_t, Site<'_>) -> Result<O, Failure>,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, op, |c| {
            let site = Site { rank: c.rank(), op };
            write_out(request, Some(c.rank()), op, "request", std::ptr::null_mut())?;
            pending::outside(c.rank(), op)?;
            let call = build(c, site)?;
            let started = c.with_group(op, |g| Ok(g.start(call)))?;
            request.write(jaccl_request_t::into_raw(started, op, c));
            Ok(())
        })
    }
}

/// `done` for an operation that returns nothing.
pub(crate) fn nothing(_: Option<usize>) -> Result<(), Failure> {
    Ok(())
}
