//! The header's plain types: result codes, element types and reductions as C integers (a
//! value the caller made up is then an argument error, where a Rust enum would make it
//! undefined behaviour), and the version.
#![allow(missing_docs)] // Each constant's documentation is the header's.

use std::ffi::c_int;

/// What every function returns: `JACCL_SUCCESS`, or the kind of error (its full message:
/// `jaccl_comm_get_last_error`, `jaccl_get_last_error`).
pub type jaccl_result_t = c_int;
/// The call succeeded.
pub const JACCL_SUCCESS: jaccl_result_t = 0;
/// An argument cannot work (a null or misaligned buffer, a count that overflows, an unknown
/// element type or reduction, a rank out of range, a reduction that does not apply to the
/// type). Found before anything is sent: the communicator stays usable.
pub const JACCL_INVALID_ARGUMENT: jaccl_result_t = 1;
/// A peer's process ended or its connection went away (the message names the rank).
pub const JACCL_PEER_LOST: jaccl_result_t = 2;
/// No progress for the operation timeout.
pub const JACCL_TIMEOUT: jaccl_result_t = 3;
/// Ranks called different operations, or the same one with different element types,
/// reductions, counts, roots or tags (the message shows both calls).
pub const JACCL_MISMATCH: jaccl_result_t = 4;
/// Every rank waits for another and nothing is on its way: the calls do not match up.
pub const JACCL_DEADLOCK: jaccl_result_t = 5;
/// A peer sent bytes that are not jaccl's, or the transport failed.
pub const JACCL_PROTOCOL_ERROR: jaccl_result_t = 6;
/// The operation was interrupted.
pub const JACCL_INTERRUPTED: jaccl_result_t = 7;
/// The communicator was destroyed before the operation (a `_start` form's) ended.
pub const JACCL_CLOSED: jaccl_result_t = 8;
/// The communicator was aborted (`jaccl_comm_abort`).
pub const JACCL_ABORTED: jaccl_result_t = 9;
/// A member revoked the communicator (`jaccl_comm_revoke`); it can still agree and shrink.
pub const JACCL_REVOKED: jaccl_result_t = 10;
/// The other ranks went on without this one (they took it for lost).
pub const JACCL_LEFT_OUT: jaccl_result_t = 11;
/// Start-up failed: the coordinator is unreachable, a rank did not come in time, ranks
/// disagree on the configuration.
pub const JACCL_BOOTSTRAP_ERROR: jaccl_result_t = 12;
/// The configuration is invalid (an environment variable or a field of `jaccl_config_t`).
pub const JACCL_CONFIG_ERROR: jaccl_result_t = 13;
/// Valid, but not available in this build or on this machine (an RDMA transport without a
/// device).
pub const JACCL_UNSUPPORTED: jaccl_result_t = 14;
/// An operating-system error that is not a lost peer.
pub const JACCL_IO_ERROR: jaccl_result_t = 15;
/// A bug in jaccl (a Rust panic, caught at the boundary): the communicator is unusable.
pub const JACCL_INTERNAL_ERROR: jaccl_result_t = 16;

/// An element type (`JACCL_FLOAT32`, ...). Buffers must be aligned to the element's C type.
pub type jaccl_dtype_t = c_int;
/// `bool` (C99 `_Bool`, C++ `bool`): one byte; any non-zero byte is true, results are 0 or 1.
pub const JACCL_BOOL: jaccl_dtype_t = 0;
pub const JACCL_INT8: jaccl_dtype_t = 1;
pub const JACCL_INT16: jaccl_dtype_t = 2;
pub const JACCL_INT32: jaccl_dtype_t = 3;
pub const JACCL_INT64: jaccl_dtype_t = 4;
pub const JACCL_UINT8: jaccl_dtype_t = 5;
pub const JACCL_UINT16: jaccl_dtype_t = 6;
pub const JACCL_UINT32: jaccl_dtype_t = 7;
pub const JACCL_UINT64: jaccl_dtype_t = 8;
/// IEEE 754 half precision (`_Float16`, or its bits in a `uint16_t`).
pub const JACCL_FLOAT16: jaccl_dtype_t = 9;
/// bfloat16 (its bits in a `uint16_t`).
pub const JACCL_BFLOAT16: jaccl_dtype_t = 10;
pub const JACCL_FLOAT32: jaccl_dtype_t = 11;
pub const JACCL_FLOAT64: jaccl_dtype_t = 12;
/// Two `float`s, real then imaginary (C99 `float _Complex`, C++ `std::complex<float>`).
pub const JACCL_COMPLEX64: jaccl_dtype_t = 13;

/// A reduction (`JACCL_SUM`, ...).
pub type jaccl_op_t = c_int;
/// Sum; integers wrap, `bool` is OR.
pub const JACCL_SUM: jaccl_op_t = 0;
/// Maximum; floats propagate NaN and order -0 < +0, complex numbers compare (re, im).
pub const JACCL_MAX: jaccl_op_t = 1;
/// Minimum; as `JACCL_MAX`. `bool`: AND.
pub const JACCL_MIN: jaccl_op_t = 2;
/// Product; integers wrap, `bool` is AND.
pub const JACCL_PROD: jaccl_op_t = 3;
/// The sum divided by the number of ranks (integers toward zero). Not for `bool`.
pub const JACCL_AVG: jaccl_op_t = 4;
/// Bitwise AND of integers and `bool`s.
pub const JACCL_BAND: jaccl_op_t = 5;
/// Bitwise OR of integers and `bool`s.
pub const JACCL_BOR: jaccl_op_t = 6;
/// Bitwise XOR of integers and `bool`s.
pub const JACCL_BXOR: jaccl_op_t = 7;

/// `jaccl_comm_split`'s color of a rank that joins no new communicator.
pub const JACCL_SPLIT_NOCOLOR: c_int = -1;

/// This header's version: `jaccl_get_version` gives the library's, as
/// `MAJOR * 10000 + MINOR * 100 + PATCH`.
pub const JACCL_VERSION_MAJOR: c_int = 0;
pub const JACCL_VERSION_MINOR: c_int = 1;
pub const JACCL_VERSION_PATCH: c_int = 0;

/// The shortest timeout: a shorter one would round to nothing and fail every wait at once.
pub(crate) const SHORTEST_TIMEOUT: f64 = 0.001;

/// `seconds` as a timeout: at least [`SHORTEST_TIMEOUT`], infinity as none; `None` for a
/// shorter one, a negative one or NaN.
pub(crate) fn timeout(seconds: f64) -> Option<std::time::Duration> {
    (seconds >= SHORTEST_TIMEOUT).then(|| {
        std::time::Duration::try_from_secs_f64(seconds).unwrap_or(std::time::Duration::MAX)
    })
}

/// The element type of a C value, if it names one.
pub(crate) fn dtype(value: jaccl_dtype_t) -> Option<jaccl::Dtype> {
    u8::try_from(value).ok().and_then(jaccl::Dtype::from_id)
}

/// The reduction of a C value, if it names one.
pub(crate) fn reduce_op(value: jaccl_op_t) -> Option<jaccl::ReduceOp> {
    usize::try_from(value)
        .ok()
        .and_then(|i| jaccl::ReduceOp::ALL.get(i).copied())
}

/// The alignment of a dtype's C type.
pub(crate) fn alignment(dtype: jaccl::Dtype) -> usize {
    match dtype {
        jaccl::Dtype::Complex64 => 4,
        other => other.size(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_librarys_ids() {
        for d in jaccl::Dtype::ALL {
            assert_eq!(dtype(jaccl_dtype_t::from(d.id())), Some(d));
        }
        assert_eq!(dtype(JACCL_COMPLEX64), Some(jaccl::Dtype::Complex64));
        assert_eq!(dtype(14), None);
        assert_eq!(dtype(-1), None);
        assert_eq!(reduce_op(JACCL_BXOR), Some(jaccl::ReduceOp::BitXor));
        assert_eq!(reduce_op(JACCL_AVG), Some(jaccl::ReduceOp::Avg));
        assert_eq!(reduce_op(8), None);
        assert_eq!(timeout(f64::NAN), None);
        assert_eq!(timeout(1e-12), None);
        assert_eq!(timeout(-1.0), None);
        assert_eq!(timeout(2.5), Some(std::time::Duration::from_millis(2500)));
        assert_eq!(timeout(f64::INFINITY), Some(std::time::Duration::MAX));
        let version = format!("{JACCL_VERSION_MAJOR}.{JACCL_VERSION_MINOR}.{JACCL_VERSION_PATCH}");
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
    }
}
