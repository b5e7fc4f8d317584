//! Send and receive between two ranks, and receive from any rank, in their two forms (as
//! `collectives`); `jaccl_send` and `jaccl_recv` may also be batched (`batch`).
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::{c_int, c_void};

use crate::buffers::{Lent, Site};
use crate::calls::{self, Kind, Operation, nothing};
use crate::collectives::{element, rank_of};
use crate::comm::{as_int, jaccl_comm_t, write_out};
use crate::errors::Failure;
use crate::requests::jaccl_request_t;
use crate::types::*;

type Message = (*const c_void, usize, jaccl_dtype_t, c_int, u32);

/// `peer` as a rank of `c` other than this one (a rank does not send to itself).
fn other(peer: c_int, c: &jaccl_comm_t, site: Site<'_>) -> Result<usize, Failure> {
    let peer = rank_of(peer, c, site)?;
    match peer == c.rank() {
        true => Err(site.invalid(format!(
            "rank {peer} is this rank (a rank does not send to itself)"
        ))),
        false => Ok(peer),
    }
}

unsafe fn send(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (buf, count, dtype, peer, tag): Message,
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let peer = other(peer, c, site)?;
    let data = Lent::new(buf, count, d, "sendbuf", site)?;
    Ok(move |g: &mut jaccl::Group| {
        // SAFETY: lent until the operation ends (the header's contract); only read.
        let bytes = unsafe { data.bytes() };
        g.send_raw(bytes, peer, d, tag).map(|()| None)
    })
}

/// Sends `count` elements to rank `peer`, which receives them with `jaccl_recv` of the same
/// count, type and `tag` (any number; messages between two ranks with one tag arrive in the
/// order sent). Returns once the data is on its way; may be called before the peer's
/// receive, even by every rank of a cycle. `peer` is another rank: a rank does not send to
/// itself.
///
/// # Safety
/// `sendbuf` holds `count` elements; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_send(
    sendbuf: *const c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    peer: c_int,
    tag: u32,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (sendbuf, count, dtype, peer, tag);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::now(comm, "send", Kind::Send, |c, s| send(c, s, args), nothing) }
}

/// `jaccl_send`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_send`, the buffer until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_send_start(
    sendbuf: *const c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    peer: c_int,
    tag: u32,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (sendbuf, count, dtype, peer, tag);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "send", request, |c, s| send(c, s, args)) }
}

unsafe fn recv(
    c: &jaccl_comm_t,
    site: Site<'_>,
    (buf, count, dtype, peer, tag): (*mut c_void, usize, jaccl_dtype_t, c_int, u32),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let peer = other(peer, c, site)?;
    let out = Lent::new(buf, count, d, "recvbuf", site)?;
    Ok(move |g: &mut jaccl::Group| {
        // SAFETY: lent until the operation ends (the header's contract); the only slice.
        let bytes = unsafe { out.bytes_mut() };
        g.recv_raw(bytes, peer, d, tag).map(|()| None)
    })
}

/// Receives `count` elements from rank `peer`'s `jaccl_send` with `tag` (a different count
/// or type is `JACCL_MISMATCH`).
///
/// # Safety
/// `recvbuf` holds `count` elements; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_recv(
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    peer: c_int,
    tag: u32,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (recvbuf, count, dtype, peer, tag);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::now(comm, "recv", Kind::Recv, |c, s| recv(c, s, args), nothing) }
}

/// `jaccl_recv`, started (see `jaccl_all_reduce_start`).
///
/// # Safety
/// As `jaccl_recv`, the buffer until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_recv_start(
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    peer: c_int,
    tag: u32,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (recvbuf, count, dtype, peer, tag);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "recv", request, |c, s| recv(c, s, args)) }
}

unsafe fn recv_any(
    _: &jaccl_comm_t,
    site: Site<'_>,
    (buf, count, dtype, tag): (*mut c_void, usize, jaccl_dtype_t, u32),
) -> Result<impl Operation + use<>, Failure> {
    let d = element(dtype, site)?;
    let out = Lent::new(buf, count, d, "recvbuf", site)?;
    Ok(move |g: &mut jaccl::Group| {
        // SAFETY: lent until the operation ends (the header's contract); the only slice.
        let bytes = unsafe { out.bytes_mut() };
        g.recv_any_raw(bytes, d, tag).map(Some)
    })
}

/// Receives the next message with `tag` from whichever rank sends one first (its count and
/// type must be these); `*source` is its sender.
///
/// # Safety
/// `recvbuf` holds `count` elements; `source` is valid for a write; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_recv_any(
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    tag: u32,
    source: *mut c_int,
    comm: *mut jaccl_comm_t,
) -> jaccl_result_t {
    let args = (recvbuf, count, dtype, tag);
    let found = |from: Option<usize>| {
        // SAFETY: by the caller's contract.
        unsafe { write_out(source, None, "recv_any", "source", from.map_or(-1, as_int)) }
    };
    // SAFETY: the caller's contract is the builder's.
    unsafe {
        calls::now(
            comm,
            "recv_any",
            Kind::Other,
            |c, s| {
                if source.is_null() {
                    return Err(s.invalid("source is NULL"));
                }
                recv_any(c, s, args)
            },
            found,
        )
    }
}

/// `jaccl_recv_any`, started (see `jaccl_all_reduce_start`): `jaccl_request_source` gives
/// the sender once it has ended.
///
/// # Safety
/// As `jaccl_recv_any`, the buffer until the request ends; `request` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_recv_any_start(
    recvbuf: *mut c_void,
    count: usize,
    dtype: jaccl_dtype_t,
    tag: u32,
    comm: *mut jaccl_comm_t,
    request: *mut *mut jaccl_request_t,
) -> jaccl_result_t {
    let args = (recvbuf, count, dtype, tag);
    // SAFETY: the caller's contract is the builder's.
    unsafe { calls::start(comm, "recv_any", request, |c, s| recv_any(c, s, args)) }
}
