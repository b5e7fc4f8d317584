//! `jaccl_request_t`: an operation started with a `_start` form, running on its
//! communicator's progress thread: test it, wait for it (with or without a limit), free it.
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use crate::comm::{as_int, jaccl_comm_t, write_out};
use crate::errors::{Failure, LastError, guard, invalid, record};
use crate::types::*;

/// An operation started by a `_start` form. Opaque to C.
pub struct jaccl_request_t {
    request: jaccl::Request<Option<usize>>,
    op: &'static str,
    rank: usize,
    /// The communicator's: a failed operation is its last error too (it outlives the
    /// communicator).
    last_error: Arc<LastError>,
}

impl jaccl_request_t {
    pub(crate) fn into_raw(
        request: jaccl::Request<Option<usize>>,
        op: &'static str,
        comm: &jaccl_comm_t,
    ) -> *mut jaccl_request_t {
        let request = jaccl_request_t {
            request,
            op,
            rank: comm.rank(),
            last_error: Arc::clone(comm.last_error()),
        };
        Box::into_raw(Box::new(request))
    }

    /// What the operation ended with, once it has.
    fn outcome(&self) -> Option<Result<Option<usize>, Failure>> {
        self.request.outcome().map(|r| r.map_err(Failure::from))
    }
}

/// Runs a request's entry point `body`; its failure is recorded as the thread's last error
/// and the request's communicator's.
///
/// # Safety
/// `request` is null or a request not freed.
unsafe fn on_request(
    request: *const jaccl_request_t,
    op: &str,
    body: impl FnOnce(&jaccl_request_t) -> Result<(), Failure>,
) -> jaccl_result_t {
    // SAFETY: by the caller's contract.
    match unsafe { request.as_ref() } {
        // Errors of the operation are named after it.
        Some(r) => guard(r.op, Some(&r.last_error), || body(r)),
        None => record(&invalid(None, op, "request is NULL"), op, None),
    }
}

/// Waits up to `limit` (`None`: until it ends); whether it ended, and its result if it did.
fn wait(request: &jaccl_request_t, limit: Option<Duration>) -> (bool, Result<(), Failure>) {
    // Every operation ends (by its peers, liveness, its timeout or an abort): waiting without
    // a limit is waiting for that.
    let ended = match limit {
        Some(limit) => request.request.wait_timeout(limit),
        None => {
            while !request.request.wait_timeout(Duration::from_secs(3600)) {}
            true
        }
    };
    match request.outcome() {
        Some(Err(failure)) if ended => (true, Err(failure)),
        _ => (ended, Ok(())),
    }
}

/// Whether the operation has ended, without waiting: `*done` is 1 if it has (then the result
/// is the operation's, an error included), else 0.
///
/// # Safety
/// `request` is a request not freed; `done` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_request_test(
    request: *mut jaccl_request_t,
    done: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_request(request, "request_test", |r| {
            write_out(done, Some(r.rank), "request_test", "done", 0)?;
            let (ended, result) = wait(r, Some(Duration::ZERO));
            done.write(c_int::from(ended));
            result
        })
    }
}

/// Waits until the operation ends; its result.
///
/// # Safety
/// `request` is a request not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_request_wait(request: *mut jaccl_request_t) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe { on_request(request, "request_wait", |r| wait(r, None).1) }
}

/// Waits until the operation ends or `seconds` pass: `*done` is 1 if it ended (then the
/// result is the operation's, an error included), else 0 (the operation goes on).
///
/// # Safety
/// `request` is a request not freed; `done` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_request_wait_timeout(
    request: *mut jaccl_request_t,
    seconds: f64,
    done: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_request(request, "request_wait_timeout", |r| {
            write_out(done, Some(r.rank), "request_wait_timeout", "done", 0)?;
            if seconds.is_nan() || seconds < 0.0 {
                let why = format!("{seconds} s is not a time to wait");
                return Err(invalid(Some(r.rank), "request_wait_timeout", why));
            }
            let limit = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX);
            let (ended, result) = wait(r, Some(limit));
            done.write(c_int::from(ended));
            result
        })
    }
}

/// The rank a `jaccl_recv_any_start` received from, once it has ended well.
///
/// # Safety
/// `request` is a request not freed; `source` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_request_source(
    request: *mut jaccl_request_t,
    source: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_request(request, "request_source", |r| {
            let op = "request_source";
            match r.outcome() {
                Some(Ok(Some(from))) => write_out(source, Some(r.rank), op, "source", as_int(from)),
                Some(Err(failure)) => Err(failure),
                Some(Ok(None)) => Err(invalid(
                    Some(r.rank),
                    op,
                    format!("the request is a {}, not a recv_any", r.op),
                )),
                None => Err(invalid(
                    Some(r.rank),
                    op,
                    "the recv_any has not ended (wait for it first)",
                )),
            }
        })
    }
}

/// Frees a request. One whose operation has not ended leaves it running (its buffers stay
/// lent until it ends: a later blocking call on the communicator, or its destruction, tells
/// when, since a communicator's operations run in order). NULL does nothing.
///
/// # Safety
/// `request` is NULL or a request not freed, and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_request_free(request: *mut jaccl_request_t) -> jaccl_result_t {
    if request.is_null() {
        return JACCL_SUCCESS;
    }
    guard("request_free", None, || {
        // SAFETY: by the caller's contract, `request` came from `into_raw` and is not used
        // again.
        drop(unsafe { Box::from_raw(request) });
        Ok(())
    })
}
