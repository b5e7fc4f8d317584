//! Batches of sends and receives (as NCCL's `ncclGroupStart`/`ncclGroupEnd`): between
//! `jaccl_batch_begin` and `jaccl_batch_end`, a thread's `jaccl_send` and `jaccl_recv` calls
//! are queued (`pending`); the end runs, per communicator, the sends, then the receives, each
//! in the order called. A rank blocked sending reads ahead what its peers send it on that
//! communicator, so sends first never wait for a receive: any pattern of pairs completes
//! (each rank receiving from its left while sending to its right, or both ranks of a pair
//! receiving first), where the same calls made one by one could deadlock. A batch over
//! several communicators runs each one's part at once, on its progress thread, since a send
//! reads ahead only on its own communicator. Matching is unchanged: messages between two
//! ranks, per communicator and tag, are received in the order they were sent.
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the communicators queued.

use crate::comm::jaccl_comm_t;
use crate::errors::{Failure, guard, invalid, record};
use crate::operation::Kind;
use crate::pending::{self, Queued};
use crate::types::*;

/// Starts a batch on the calling thread (batches nest: only the outermost end runs them).
#[unsafe(no_mangle)]
pub extern "C" fn jaccl_batch_begin() -> jaccl_result_t {
    guard("batch_begin", None, || {
        pending::begin();
        Ok(())
    })
}

/// Ends the calling thread's batch: the outermost end runs the queued sends and receives
/// (each communicator's sends, then its receives; several communicators' at once, each
/// starting as soon as no other thread is in a call on it) and
/// returns when all have ended: `JACCL_SUCCESS`, or the error of the first communicator
/// whose part failed (its later sends and receives are not run). The buffers stay lent until
/// it returns, and the communicators may not be destroyed before.
///
/// # Safety
/// Every communicator a queued call names is still alive.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_batch_end() -> jaccl_result_t {
    let Some(queued) = pending::end() else {
        let why = "no batch is open on this thread (call jaccl_batch_begin first)";
        return record(&invalid(None, "batch_end", why), "batch_end", None);
    };
    // Each communicator's part, in the order they first appear: sends, then receives.
    let mut parts: Vec<(usize, Vec<Queued>)> = Vec::new();
    for q in queued {
        match parts.iter_mut().find(|(comm, _)| *comm == q.comm) {
            Some((_, part)) => part.push(q),
            None => parts.push((q.comm, vec![q])),
        }
    }
    for (_, part) in &mut parts {
        // A stable sort: each kind keeps its order.
        part.sort_by_key(|q| q.kind != Kind::Send);
    }
    let mut comms = Vec::with_capacity(parts.len());
    for (address, _) in &parts {
        // SAFETY: by the caller's contract, the communicator is alive.
        match unsafe { jaccl_comm_t::from_ptr(*address as *const jaccl_comm_t) } {
            Some(comm) => comms.push(comm),
            None => {
                let why = "a communicator of the batch was destroyed before its end";
                return record(&invalid(None, "batch_end", why), "batch_end", None);
            }
        }
    }
    let results: Vec<(&jaccl_comm_t, &'static str, Result<(), Failure>)> = match parts.len() {
        0 => Vec::new(),
        1 => {
            let (comm, (_, part)) = (comms[0], parts.remove(0));
            let op = part.first().map_or("batch_end", |q| q.op);
            vec![(comm, op, run_here(comm, part))]
        }
        _ => run_at_once(&comms, parts),
    };
    // Recorded last to first, so that the thread's last error is the first failure's, the
    // one returned.
    let mut first = JACCL_SUCCESS;
    for (comm, op, result) in results.into_iter().rev() {
        let code = guard(op, Some(comm.last_error()), || result);
        if code != JACCL_SUCCESS {
            first = code;
        }
    }
    first
}

/// Runs one communicator's part on the calling thread, stopping at the first failure.
fn run_here(comm: &jaccl_comm_t, part: Vec<Queued>) -> Result<(), Failure> {
    for q in part {
        comm.with_group(q.op, q.call)?;
    }
    Ok(())
}

/// Runs the parts of several communicators at once, each on its communicator's progress
/// thread, and waits for all (their buffers are lent until then). A part starts as soon as its
/// communicator is free: those no other thread is in a call on first, so that a part never
/// waits to start for a call of another thread that waits for it.
fn run_at_once<'a>(
    comms: &[&'a jaccl_comm_t],
    parts: Vec<(usize, Vec<Queued>)>,
) -> Vec<(&'a jaccl_comm_t, &'static str, Result<(), Failure>)> {
    type Started = Result<jaccl::Request<Option<usize>>, Failure>;
    let start = |part: Vec<Queued>| {
        move |g: &mut jaccl::Group| {
            Ok(g.start(move |g| {
                for q in part {
                    (q.call)(g)?;
                }
                Ok(None::<usize>)
            }))
        }
    };
    let mut started: Vec<(&jaccl_comm_t, &'static str, Option<Started>)> = Vec::new();
    let mut busy = Vec::new();
    for (&comm, (_, part)) in comms.iter().zip(parts) {
        let op = part.first().map_or("batch_end", |q| q.op);
        // Tried first without waiting; a busy one is kept for the second pass.
        match comm.try_with_group(op, start(part)) {
            Ok(request) => started.push((comm, op, Some(request))),
            Err(job) => {
                busy.push((started.len(), job));
                started.push((comm, op, None));
            }
        }
    }
    for (at, job) in busy {
        let (comm, op, slot) = &mut started[at];
        *slot = Some(comm.with_group(op, job));
    }
    started
        .into_iter()
        .map(|(comm, op, request)| {
            // Each part ends: by its peers, liveness, its timeout, or an abort.
            let result = match request {
                Some(Ok(r)) => r.wait().map(|_| ()).map_err(Failure::from),
                Some(Err(failure)) => Err(failure),
                None => Ok(()),
            };
            (comm, op, result)
        })
        .collect()
}
