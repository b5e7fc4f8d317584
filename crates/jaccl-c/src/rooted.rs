//! The collectives with a root: broadcast, reduce, gather, scatter, in their two forms (as
//! `collectives`). Buffers that only the root uses are not looked at elsewhere (NULL is fine).
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::{c_int, c_void};

use crate::buffers::{Lent, Site};
use crate::calls::{self, Kind, Operation, nothing};
use crate::collectives::{element, over, rank_of, reduction, times};
use crate::comm::jaccl_comm_t;
use crate::errors::Failure;
use crate::requests::jaccl_request_t;
use crate::types::*;

// ---- broadcast --------------------------------------------------------------------------

unsafe fn broadcast(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, count, dtype, root): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        c_int,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let root = rank_of(root, c, site)?;
    let data = Lent::new(recvbuf, count, d, "recvbuf", site)?;
    let source = match root == c.rank() {
        true => Lent::new(sendbuf, count, d, "sendbuf", site)?,
        false => Lent::NONE,
    };
    Ok(move |g: &mut jaccl::Group| {
        if source.len() > 0 && !source.same(data) {
            // SAFETY: both lent until the operation ends (the header's contract); the copy
            // allows them to overlap.
            unsafe { source.copy_to(data) };
        }
        // SAFETY: lent until the operation ends; the only slice of it now.
        let bytes = unsafe { data.bytes_mut() };
        g.broadcast_raw(bytes, d, root).map(|()| None)
    })
}

/// Every rank's `recvbuf` gets the root's `count` elements of `sendbuf` (read on the root
/// only; it may be `recvbuf`, as NCCL's `ncclBroadcast`).
///
/// # Safety
/// The buffers hold `count` elements (`sendbuf` on the root); `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_broadcast(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "broadcast",
            Kind::Other,
            |c, s| broadcast(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_broadcast`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_broadcast`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_broadcast_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "broadcast", request, |c, s| broadcast(c, s, args)) }
}

// ---- reduce -----------------------------------------------------------------------------

unsafe fn reduce(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, count, dtype, op, root): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        jaccl_op_t,
        c_int,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let (d, o) = reduction(dtype, op, site)?;
    let root = rank_of(root, c, site)?;
    let input = Lent::new(sendbuf, count, d, "sendbuf", site)?;
    let output = match root == c.rank() {
        true => Lent::new(recvbuf, count, d, "recvbuf", site)?,
        false => Lent::NONE,
    };
    // SAFETY: lent (the header's contract).
    Ok(unsafe {
        over(input, output, move |g, i, out| {
            g.reduce_raw(i, out, d, o, root)
        })
    })
}

/// Reduces `count` elements of `sendbuf` over every rank with `op` into the root's `recvbuf`
/// (written on the root only).
///
/// # Safety
/// The buffers hold `count` elements (`recvbuf` on the root); `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, op, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "reduce",
            Kind::Other,
            |c, s| reduce(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_reduce`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_reduce`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_reduce_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    op: jaccl_op_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, count, dtype, op, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "reduce", request, |c, s| reduce(c, s, args)) }
}

// ---- gather -----------------------------------------------------------------------------

unsafe fn gather(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, sendcount, dtype, root): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        c_int,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let root = rank_of(root, c, site)?;
    let input = Lent::new(sendbuf, sendcount, d, "sendbuf", site)?;
    let output = match root == c.rank() {
        true => Lent::new(
            recvbuf,
            times(sendcount, c.size(), site)?,
            d,
            "recvbuf",
            site,
        )?,
        false => Lent::NONE,
    };
    // SAFETY: lent (the header's contract).
    Ok(unsafe { over(input, output, move |g, i, o| g.gather_raw(i, o, d, root)) })
}

/// Gathers every rank's `sendcount` elements into the root's `recvbuf` (`size * sendcount`,
/// rank r's at `r * sendcount`; written on the root only).
///
/// # Safety
/// The buffers hold that many elements (`recvbuf` on the root); `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_gather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, sendcount, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "gather",
            Kind::Other,
            |c, s| gather(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_gather`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_gather`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_gather_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, sendcount, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "gather", request, |c, s| gather(c, s, args)) }
}

// ---- scatter ----------------------------------------------------------------------------

unsafe fn scatter(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (sendbuf, recvbuf, recvcount, dtype, root): (
        *const c_void,
        *mut c_void,
        usize,
        jaccl_dtype_t,
        c_int,
    ),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let root = rank_of(root, c, site)?;
    let input = match root == c.rank() {
        true => Lent::new(
            sendbuf,
            times(recvcount, c.size(), site)?,
            d,
            "sendbuf",
            site,
        )?,
        false => Lent::NONE,
    };
    let output = Lent::new(recvbuf, recvcount, d, "recvbuf", site)?;
    // SAFETY: lent (the header's contract).
    Ok(unsafe { over(input, output, move |g, i, o| g.scatter_raw(i, o, d, root)) })
}

/// Hands block r of the root's `sendbuf` (`size` blocks of `recvcount` elements; read on the
/// root only) to rank r's `recvbuf`.
///
/// # Safety
/// The buffers hold that many elements (`sendbuf` on the root); `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, recvcount, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "scatter",
            Kind::Other,
            |c, s| scatter(c, s, args),
            nothing,
        )
    }
}

/// `jaccl_scatter`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_scatter`, the buffers until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_scatter_start(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: jaccl_dtype_t,
    root: c_int,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, recvbuf, recvcount, dtype, root);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "scatter", request, |c, s| scatter(c, s, args)) }
}
