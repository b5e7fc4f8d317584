//! The collectives, each in two forms: `jaccl_X` runs it and returns when it has ended;
//! `jaccl_X_start` starts it on the communicator's progress thread and gives a request. Both
//! over one builder, which checks the arguments and makes the operation (`calls::Call`).
//!
//! Counts are in elements. An input that overlaps the output is copied first (all-reduce
//! with `sendbuf == recvbuf` runs in place instead, and broadcast's root copies its
//! `sendbuf` to `recvbuf` as the operation runs).
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::{c_int, c_void};

use crate::buffers::{self, Input, Lent, Site};
use crate::calls::{self, Kind, Operation, nothing};
use crate::comm::jaccl_comm_t;
use crate::errors::Failure;
use crate::requests::jaccl_request_t;
use crate::types::*;

/// The element type `dtype` names.
pub(crate) fn element(dtype: jaccl_dtype_t, site: Site<'_>) -> Result<jaccl::Dtype, Failure> {
    crate::types::dtype(dtype)
        .ok_or_else(|| site.invalid(format!("dtype {dtype} is not a jaccl_dtype_t (0..13)")))
}

/// The element type and the reduction that `dtype` and `op` name, checked to go together
/// (found now, not when a started operation runs).
pub(crate) fn reduction(
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    site: Site<'_>,
) -> Result<(jaccl::Dtype, jaccl::ReduceOp), Failure> {
    let d = element(dtype, site)?;
    let o =
        reduce_op(op).ok_or_else(|| site.invalid(format!("op {op} is not a jaccl_op_t (0..7)")))?;
    match o.applies_to(d) {
        true => Ok((d, o)),
        false => Err(site.invalid(format!("{o} does not apply to {d}"))),
    }
}

/// `count * times` elements, checked.
pub(crate) fn times(count: usize, times: usize, site: Site<'_>) -> Result<usize, Failure> {
    count
        .checked_mul(times)
        .ok_or_else(|| site.invalid(format!("{count} elements times {times} ranks overflow")))
}

/// The sum of `counts`, checked.
fn total(counts: &[usize], site: Site<'_>) -> Result<usize, Failure> {
    counts
        .iter()
        .try_fold(0usize, |sum, &n| sum.checked_add(n))
        .ok_or_else(|| site.invalid("the counts' sum overflows"))
}

/// The operation `f` over `input` (copied if it overlaps `output`) and `output`.
///
/// # Safety
/// Both are lent (the header's contract, `buffers`).
pub(crate) unsafe fn over(
    input: Lent,
    output: Lent,
    f: impl FnOnce(&mut jaccl::Group, &[u8], &mut [u8]) -> jaccl::Result<()> + Send + 'static,
) -> impl Operation {
    // SAFETY: by the caller's contract.
    let input = unsafe { Input::apart_from(input, output) };
    move |g: &mut jaccl::Group| {
        // SAFETY: both are lent until the operation ends (the header's contract); the input
        // does not overlap the output (copied if it did), so the output is not aliased.
        let (i, o) = unsafe { (input.bytes(), output.bytes_mut()) };
        f(g, i, o).map(|()| None)
    }
}

// ---- all-reduce -------------------------------------------------------------------------

unsafe fn all_reduce(
    _: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, count, dtype, op): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        jaccl_op_t,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let (d, o) = reduction(dtype, op, site)?;
    let output = Lent::new(recvbuf, count, d, "recvbuf", site)?;
    let input = Lent::new(sendbuf, count, d, "sendbuf", site)?;
    // In place when the two are one buffer, else an input apart from the output.
    let in_place = input.same(output);
    let input = match in_place {
        true => Input::Lent(Lent::NONE),
        // SAFETY: lent (the header's contract).
        false => unsafe { Input::apart_from(input, output) },
    };
    Ok(move |g: &mut jaccl::Group| {
        // SAFETY: lent until the operation ends (the header's contract); the input is empty,
        // or apart from the output (copied if it was not), so the output is not aliased.
        let (i, out) = unsafe { (input.bytes(), output.bytes_mut()) };
        match in_place {
            true => g.all_reduce_raw_in_place(out, d, o),
            false => g.all_reduce_raw(i, out, d, o),
        }
        .map(|()| None)
    })
}

/// Reduces `count` elements of `sendbuf` over every rank with `op` into every rank's `recvbuf`
/// (`sendbuf == recvbuf`: in place). Every rank gets the same bits.
///
/// # Safety
/// The buffers hold `count` elements each; `comm` is a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "all_reduce",
            Kind::Other,
            |c, s| all_reduce(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_all_reduce`, started: it runs on the communicator's progress thread after the
/// operations called before it, and `*request` is its request (`jaccl_request_wait`); the
/// buffers stay lent until it ends. Arguments are checked now (`JACCL_INVALID_ARGUMENT`, and
/// `*request` NULL); every other error comes from the request.
///
/// # Safety
/// As `jaccl_all_reduce`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_reduce_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "all_reduce", request, |c, s| all_reduce(c, s, args)) }
}

// ---- all-gather -------------------------------------------------------------------------

unsafe fn all_gather(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, sendcount, dtype): (*const c_void, *mut c_void, usize, jaccl_dtype_t),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let input = Lent::new(sendbuf, sendcount, d, "sendbuf", site)?;
    let output = Lent::new(
        recvbuf,
        times(sendcount, c.size(), site)?,
        d,
        "recvbuf",
        site,
    )?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe { over(input, output, move |g, i, o| g.all_gather_raw(i, o, d)) })
}

/// Gathers every rank's `sendcount` elements into every rank's `recvbuf` (`size * sendcount`
/// elements, rank r's at `r * sendcount`).
///
/// # Safety
/// The buffers hold that many elements; `comm` is a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_gather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, sendcount, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "all_gather",
            Kind::Other,
            |c, s| all_gather(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_all_gather`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_all_gather`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_gather_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, sendcount, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "all_gather", request, |c, s| all_gather(c, s, args)) }
}

// ---- reduce-scatter ---------------------------------------------------------------------

unsafe fn reduce_scatter(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, recvcount, dtype, op): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        jaccl_op_t,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let (d, o) = reduction(dtype, op, site)?;
    let input = Lent::new(
        sendbuf,
        times(recvcount, c.size(), site)?,
        d,
        "sendbuf",
        site,
    )?;
    let output = Lent::new(recvbuf, recvcount, d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe {
        over(input, output, move |g, i, out| {
            g.reduce_scatter_raw(i, out, d, o)
        })
    })
}

/// Reduces `sendbuf` (`size * recvcount` elements) over every rank with `op`; rank r gets
/// block r of the result (`recvcount` elements) in `recvbuf`.
///
/// # Safety
/// The buffers hold that many elements; `comm` is a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, recvcount, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "reduce_scatter",
            Kind::Other,
            |c, s| reduce_scatter(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_reduce_scatter`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_reduce_scatter`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce_scatter_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, recvcount, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::start(comm, "reduce_scatter", request, |c, s| {
            reduce_scatter(c, s, args)
        })
    }
}

// ---- all-to-all -------------------------------------------------------------------------

unsafe fn all_to_all(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, count, dtype): (*const c_void, *mut c_void, usize, jaccl_dtype_t),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let whole = times(count, c.size(), site)?;
    let input = Lent::new(sendbuf, whole, d, "sendbuf", site)?;
    let output = Lent::new(recvbuf, whole, d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe { over(input, output, move |g, i, o| g.all_to_all_raw(i, o, d)) })
}

/// Block r of `sendbuf` (`count` elements each, `size` blocks) goes to rank r, whose
/// `recvbuf` gets it as its block of this rank.
///
/// # Safety
/// The buffers hold `size * count` elements; `comm` is a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_to_all(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "all_to_all",
            Kind::Other,
            |c, s| all_to_all(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_all_to_all`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_all_to_all`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_to_all_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "all_to_all", request, |c, s| all_to_all(c, s, args)) }
}

// ---- the variable-size collectives ------------------------------------------------------

unsafe fn all_to_all_v(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, sendcounts, recvbuf, recvcounts, dtype): (
        *const c_void,
        *const usize,
        *mut c_void,
        *const usize,
        jaccl_dtype_t,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    // SAFETY: by the header's contract, `size` counts each.
    let sends = unsafe { buffers::counts(sendcounts, "sendcounts", c.size(), site)? };
    // SAFETY: as above.
    let recvs = unsafe { buffers::counts(recvcounts, "recvcounts", c.size(), site)? };
    let input = Lent::new(sendbuf, total(&sends, site)?, d, "sendbuf", site)?;
    let output = Lent::new(recvbuf, total(&recvs, site)?, d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe {
        over(input, output, move |g, i, o| {
            g.all_to_all_v_raw(i, &sends, o, &recvs, d)
        })
    })
}

/// All-to-all of uneven blocks: `sendcounts[r]` elements of `sendbuf` go to rank r (blocks
/// packed in rank order), `recvcounts[r]` come from rank r into `recvbuf` (packed). Each
/// rank's `sendcounts[r]` must equal rank r's `recvcounts` of it.
///
/// # Safety
/// The count arrays hold `size` entries, the buffers their sums; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_to_all_v(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, sendcounts, recvbuf, recvcounts, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "all_to_all_v",
            Kind::Other,
            |c, s| all_to_all_v(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_all_to_all_v`, started (see `jaccl_all_reduce_start`); the counts are read now.
///
/// # Safety
/// As `jaccl_all_to_all_v`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_to_all_v_start(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, sendcounts, recvbuf, recvcounts, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::start(comm, "all_to_all_v", request, |c, s| {
            all_to_all_v(c, s, args)
        })
    }
}

unsafe fn all_gather_v(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, counts, dtype): (*const c_void, *mut c_void, *const usize, jaccl_dtype_t),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    // SAFETY: by the header's contract, `size` counts.
    let counts = unsafe { buffers::counts(counts, "counts", c.size(), site)? };
    let input = Lent::new(sendbuf, counts[c.rank()], d, "sendbuf", site)?;
    let output = Lent::new(recvbuf, total(&counts, site)?, d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe {
        over(input, output, move |g, i, o| {
            g.all_gather_v_raw(i, o, &counts, d)
        })
    })
}

/// All-gather of uneven blocks: rank r gives `counts[r]` elements (`sendbuf`); every rank's
/// `recvbuf` gets them all, packed in rank order. Every rank passes the same counts.
///
/// # Safety
/// `counts` holds `size` entries, `recvbuf` their sum; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_gather_v(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, counts, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "all_gather_v",
            Kind::Other,
            |c, s| all_gather_v(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_all_gather_v`, started (see `jaccl_all_reduce_start`); the counts are read now.
///
/// # Safety
/// As `jaccl_all_gather_v`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_all_gather_v_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    dtype: jaccl_dtype_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, counts, dtype);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::start(comm, "all_gather_v", request, |c, s| {
            all_gather_v(c, s, args)
        })
    }
}

unsafe fn reduce_scatter_v(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, counts, dtype, op): (
        *const c_void,
        *mut c_void,
        *const usize,
        jaccl_dtype_t,
        jaccl_op_t,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let (d, o) = reduction(dtype, op, site)?;
    // SAFETY: by the header's contract, `size` counts.
    let counts = unsafe { buffers::counts(counts, "counts", c.size(), site)? };
    let input = Lent::new(sendbuf, total(&counts, site)?, d, "sendbuf", site)?;
    let output = Lent::new(recvbuf, counts[c.rank()], d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe {
        over(input, output, move |g, i, out| {
            g.reduce_scatter_v_raw(i, out, &counts, d, o)
        })
    })
}

/// Reduce-scatter of uneven blocks: `sendbuf` holds the sum of `counts` elements, reduced
/// over every rank with `op`; rank r gets its block (`counts[r]` elements, blocks packed in
/// rank order) in `recvbuf`. Every rank passes the same counts.
///
/// # Safety
/// `counts` holds `size` entries, `sendbuf` their sum; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce_scatter_v(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, counts, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "reduce_scatter_v",
            Kind::Other,
            |c, s| reduce_scatter_v(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_reduce_scatter_v`, started (see `jaccl_all_reduce_start`); the counts are read now.
///
/// # Safety
/// As `jaccl_reduce_scatter_v`, the buffers until the request ends; `request` valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce_scatter_v_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, counts, dtype, op);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::start(comm, "reduce_scatter_v", request, |c, s| {
            reduce_scatter_v(c, s, args)
        })
    }
}

// ---- barrier ----------------------------------------------------------------------------

fn barrier(_: &jaccl_comm_t, _: Site<'_>) -> Result<impl Operation + use<>, Failure> {
    Ok(|g: &mut jaccl::Group| g.barrier().map(|()| None))
}

/// Returns once every rank has called it.
///
/// # Safety
/// `comm` is a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_barrier(comm: *mut jaccl_comm_t) -> jaccl_result_t {
    // SAFETY: the caller's contract.
    unsafe { calls::now(comm, "barrier", Kind::Other, barrier, nothing) }
}

/// `jaccl_barrier`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// `comm` is a live communicator; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_barrier_start(
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    // SAFETY: the caller's contract.
    unsafe { calls::start(comm, "barrier", request, barrier) }
}

/// `value` as a rank of `comm` (a root or peer).
pub(crate) fn rank_of(value: c_int, c: &jaccl_comm_t, site: Site<'_>) -> Result<usize, Failure> {
    buffers::rank(value, c.size(), site)
}
