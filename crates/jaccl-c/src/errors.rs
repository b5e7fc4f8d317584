//! Errors at the boundary: a `jaccl::Error` (or a caught panic) becomes a result code, and its
//! message is kept for `jaccl_get_last_error` (the calling thread's last) and
//! `jaccl_comm_get_last_error` (the communicator's last).
#![allow(unsafe_code)] // Exported functions (`no_mangle`).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use crate::types::*;

/// Why a call failed. Boxed: results of the calls that succeed stay small (the hot path
/// moves them around).
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The library's error, or an argument this crate refused (`InvalidArgument`).
    Jaccl(Box<jaccl::Error>),
    /// A panic caught at the boundary (a bug): what it said, with the operation.
    Panic(Box<str>),
}

impl From<jaccl::Error> for Failure {
    fn from(e: jaccl::Error) -> Failure {
        Failure::Jaccl(Box::new(e))
    }
}

impl Failure {
    /// The result code of this failure.
    pub(crate) fn code(&self) -> jaccl_result_t {
        use jaccl::Error as E;
        match self {
            Failure::Panic(_) => JACCL_INTERNAL_ERROR,
            Failure::Jaccl(e) => match **e {
                E::InvalidArgument(_) => JACCL_INVALID_ARGUMENT,
                E::PeerLost { .. } => JACCL_PEER_LOST,
                E::Timeout { .. } => JACCL_TIMEOUT,
                E::Mismatch { .. } => JACCL_MISMATCH,
                E::Deadlock { .. } => JACCL_DEADLOCK,
                E::Protocol { .. } => JACCL_PROTOCOL_ERROR,
                E::Interrupted { .. } => JACCL_INTERRUPTED,
                E::Closed { .. } => JACCL_CLOSED,
                E::Aborted { .. } => JACCL_ABORTED,
                E::Revoked { .. } => JACCL_REVOKED,
                E::LeftOut { .. } => JACCL_LEFT_OUT,
                E::Bootstrap(_) => JACCL_BOOTSTRAP_ERROR,
                E::Config(_) => JACCL_CONFIG_ERROR,
                E::Unsupported(_) => JACCL_UNSUPPORTED,
                E::Io { .. } => JACCL_IO_ERROR,
                _ => JACCL_INTERNAL_ERROR,
            },
        }
    }

    /// The full message (rank, operation, cause), in C's terms: `op` is the function's
    /// operation, named where the library's error does not name one.
    pub(crate) fn message(&self, op: &str) -> String {
        use jaccl::Error as E;
        let Failure::Jaccl(e) = self else {
            return match self {
                Failure::Panic(what) => format!("internal error (a bug in jaccl): {what}"),
                Failure::Jaccl(_) => String::new(),
            };
        };
        let text = e
            .to_string()
            .replace("(AbortHandle::abort)", "(jaccl_comm_abort)")
            .replace(
                "the group was dropped before the operation finished",
                "the communicator was destroyed before the operation finished",
            )
            .replace(
                "invitation as JACCL_JOIN",
                "invitation as jaccl_config_t.join (or JACCL_JOIN)",
            )
            .replace(
                "Config::timeout / JACCL_TIMEOUT",
                "jaccl_comm_set_timeout, jaccl_config_t.timeout or JACCL_TIMEOUT",
            );
        match **e {
            // "rank R: what" without the operation.
            E::Aborted { rank } | E::Closed { rank } | E::Revoked { rank, .. } => {
                let head = format!("rank {rank}: ");
                let rest = text.strip_prefix(&head).unwrap_or(&text);
                format!("{head}{op}: {rest}")
            }
            // Before there is a rank.
            E::Bootstrap(_) | E::Config(_) | E::Unsupported(_) => format!("{op}: {text}"),
            _ => text,
        }
    }
}

/// An argument error of `op` on `rank` (`None` before there is a communicator).
pub(crate) fn invalid(rank: Option<usize>, op: &str, why: impl std::fmt::Display) -> Failure {
    let whose = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
    jaccl::Error::InvalidArgument(format!("{whose}{op}: {why}")).into()
}

/// The last error message of a communicator, kept until the next one replaces it.
#[derive(Debug, Default)]
pub(crate) struct LastError(Mutex<Option<CString>>);

impl LastError {
    pub(crate) fn set(&self, message: &CStr) {
        // A message is replaced whole: a panic elsewhere cannot leave it half-written.
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(message.to_owned());
    }

    /// The message, or an empty string; the pointer is valid until the next `set`.
    pub(crate) fn get(&self) -> *const c_char {
        let slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.as_deref().map_or(c"".as_ptr(), CStr::as_ptr)
    }
}

thread_local! {
    /// The calling thread's last error message.
    static THREAD_LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `failure` of `op` as the thread's last error and, given one, the communicator's;
/// returns its code.
pub(crate) fn record(failure: &Failure, op: &str, comm: Option<&LastError>) -> jaccl_result_t {
    let text = failure.message(op).replace('\0', "\\0");
    let message = CString::new(text).unwrap_or_default();
    if let Some(last) = comm {
        last.set(&message);
    }
    THREAD_LAST.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.as_deref() != Some(message.as_c_str()) {
            *slot = Some(message);
        }
    });
    failure.code()
}

/// Runs an entry point's body: its failure, or a panic in it (which never crosses into C),
/// becomes a result code with its message recorded.
pub(crate) fn guard(
    op: &str,
    comm: Option<&LastError>,
    body: impl FnOnce() -> Result<(), Failure>,
) -> jaccl_result_t {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return JACCL_SUCCESS,
        Ok(Err(failure)) => failure,
        Err(panic) => Failure::Panic(format!("{op}: panicked: {}", panic_text(&panic)).into()),
    };
    record(&failure, op, comm)
}

/// What a panic said.
pub(crate) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// The name of a result code (`"peer lost"`, ...), for messages: a string that lives as long
/// as the library. An unknown code gives `"unknown result code"`.
#[unsafe(no_mangle)]
pub extern "C" fn jaccl_get_error_string(result: jaccl_result_t) -> *const c_char {
    let text: &'static CStr = match result {
        JACCL_SUCCESS => c"success",
        JACCL_INVALID_ARGUMENT => c"invalid argument",
        JACCL_PEER_LOST => c"peer lost",
        JACCL_TIMEOUT => c"timeout",
        JACCL_MISMATCH => c"ranks disagree on the call",
        JACCL_DEADLOCK => c"deadlock",
        JACCL_PROTOCOL_ERROR => c"protocol error",
        JACCL_INTERRUPTED => c"interrupted",
        JACCL_CLOSED => c"communicator destroyed before the operation ended",
        JACCL_ABORTED => c"communicator aborted",
        JACCL_REVOKED => c"communicator revoked",
        JACCL_LEFT_OUT => c"left out by the other ranks",
        JACCL_BOOTSTRAP_ERROR => c"start-up failed",
        JACCL_CONFIG_ERROR => c"invalid configuration",
        JACCL_UNSUPPORTED => c"unsupported",
        JACCL_IO_ERROR => c"I/O error",
        JACCL_INTERNAL_ERROR => c"internal error",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

/// The message of the calling thread's last error (rank, operation and cause), or `""` if it
/// had none. Valid until this thread's next call that fails.
#[unsafe(no_mangle)]
pub extern "C" fn jaccl_get_last_error() -> *const c_char {
    THREAD_LAST.with(|slot| slot.borrow().as_deref().map_or(c"".as_ptr(), CStr::as_ptr))
}
