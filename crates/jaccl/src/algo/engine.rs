//! Runs a [`Plan`] over links on the calling thread.
//!
//! Each pass over the lanes sends what may be sent and merges what has arrived, without
//! blocking. When a pass makes no progress, the engine sleeps in `poll(2)` on exactly the
//! descriptors it waits for. It does not busy-poll: with more ranks than cores (tests run 8
//! ranks on 2), a spinning rank steals the core its peer needs and each hop then costs a
//! scheduler slice. Sleeping costs one wake-up (tens of µs on a VM) only when there is nothing
//! to do anyway.
//!
//! Every wait has a deadline: when no byte moves for the call's timeout, it fails with
//! [`Error::Timeout`].

use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use super::{Buf, Merge, Plan, Span, Transfer};
use crate::error::{Error, Op, Result};
use crate::reduce::Reducer;
use crate::transport::{Link, LinkError};
use crate::wire::{HEADER_LEN, Header, Kind};
use crate::{Dtype, ReduceOp};

/// One link to one peer, with the count of operations started on it in each direction (the
/// `seq` of the operation headers).
pub(crate) struct Channel {
    link: Box<dyn Link>,
    peer: usize,
    sent_ops: u32,
    received_ops: u32,
}

impl Channel {
    pub(crate) fn new(link: Box<dyn Link>, peer: usize) -> Channel {
        Channel {
            link,
            peer,
            sent_ops: 0,
            received_ops: 0,
        }
    }
}

/// What the caller asked for: names the operation in errors and headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) op: Op,
    pub(crate) dtype: Dtype,
    pub(crate) reduce: ReduceOp,
    /// Elements, as in the header.
    pub(crate) count: usize,
    pub(crate) timeout: Duration,
}

impl Call {
    fn header(&self, seq: u32, sender: usize) -> Header {
        Header {
            seq,
            kind: Kind::of(self.op),
            dtype: self.dtype,
            reduce: self.reduce,
            sender: u32::try_from(sender).unwrap_or(u32::MAX),
            count: self.count as u64,
        }
    }
}

/// The caller's buffers, as bytes. `input` is `None` when the call is in place.
pub(crate) struct Buffers<'a> {
    pub(crate) input: Option<&'a [u8]>,
    pub(crate) output: &'a mut [u8],
}

impl Buffers<'_> {
    fn read(&self, span: Span) -> &[u8] {
        let buf = match (span.buf, self.input) {
            (Buf::Input, Some(input)) => input,
            _ => &*self.output,
        };
        &buf[span.off..span.off + span.len]
    }
}

/// Progress of one lane.
#[derive(Debug, Default, Clone, Copy)]
struct LaneState {
    send_step: usize,
    /// Bytes of the current send step handed to the link.
    sent: usize,
    recv_step: usize,
    /// Bytes of the current receive step merged.
    merged: usize,
}

/// Header traffic of one channel in this call.
#[derive(Default)]
struct HeaderState {
    /// Our header and how much of it went out.
    outgoing: Option<([u8; HEADER_LEN], usize)>,
    /// The header we expect, and what arrived of the peer's.
    incoming: Option<(Header, [u8; HEADER_LEN], usize)>,
}

/// Per-pass record of what each channel waits for.
#[derive(Default, Clone, Copy)]
struct Wants {
    read: bool,
    write: bool,
}

/// Runs `plan` over `channels`. Every channel the plan sends on first carries this call's
/// header, and every channel it receives on first delivers the peer's, which must match.
pub(crate) fn run(
    channels: &mut [Channel],
    plan: &Plan,
    mut bufs: Buffers<'_>,
    reducer: Option<&Reducer>,
    call: &Call,
) -> Result<()> {
    let mut headers: Vec<HeaderState> = channels.iter().map(|_| HeaderState::default()).collect();
    let sending = plan.transfers.iter().filter_map(|t| t.tx);
    let receiving = plan.transfers.iter().filter_map(|t| t.rx);
    for tx in sending.chain(plan.headers_both_ways.iter().copied()) {
        if headers[tx].outgoing.is_none() {
            let ch = &mut channels[tx];
            headers[tx].outgoing = Some((call.header(ch.sent_ops, call.rank).encode(), 0));
            ch.sent_ops = ch.sent_ops.wrapping_add(1);
        }
    }
    for rx in receiving.chain(plan.headers_both_ways.iter().copied()) {
        if headers[rx].incoming.is_none() {
            let ch = &channels[rx];
            let expect = call.header(ch.received_ops, ch.peer);
            headers[rx].incoming = Some((expect, [0u8; HEADER_LEN], 0));
        }
    }

    let mut lanes = vec![LaneState::default(); plan.transfers.len()];
    let result = drive(
        channels,
        plan,
        &mut bufs,
        reducer,
        call,
        &mut headers,
        &mut lanes,
    );
    match result {
        Err(lost @ Error::PeerLost { .. }) => {
            Err(root_cause(channels, &mut headers, call).unwrap_or(lost))
        }
        other => other,
    }
}

/// The loop of [`run`]: passes over the lanes until done, sleeping when nothing moves.
fn drive(
    channels: &mut [Channel],
    plan: &Plan,
    bufs: &mut Buffers<'_>,
    reducer: Option<&Reducer>,
    call: &Call,
    headers: &mut [HeaderState],
    lanes: &mut [LaneState],
) -> Result<()> {
    let mut wants = vec![Wants::default(); channels.len()];
    let mut last_progress = Instant::now();
    loop {
        wants.fill(Wants::default());
        // Sends first: our header leaves on every channel (with the first data where there is
        // some) before any check of a peer's header can fail this call, so that the peers see
        // a `Mismatch` too rather than only a closed connection.
        let mut progress = false;
        for (t, lane) in plan.transfers.iter().zip(lanes.iter_mut()) {
            progress |= advance_send(t, lane, channels, headers, &mut wants, bufs, call)?;
        }
        for (i, ch) in channels.iter_mut().enumerate() {
            if headers[i].outgoing.is_some() {
                progress |= send_on(ch, &mut headers[i], &[], call)? > 0;
                wants[i].write |= headers[i].outgoing.is_some();
            }
        }
        for (t, lane) in plan.transfers.iter().zip(lanes.iter_mut()) {
            progress |= advance_recv(t, lane, channels, headers, &mut wants, bufs, reducer, call)?;
        }
        // Channels whose lanes receive no data in this call still deliver the peer's header.
        for (i, ch) in channels.iter_mut().enumerate() {
            if headers[i].incoming.is_some() {
                progress |= receive_header(ch, &mut headers[i], call)?;
                wants[i].read |= headers[i].incoming.is_some();
            }
        }

        let lanes_done = plan
            .transfers
            .iter()
            .zip(lanes.iter())
            .all(|(t, l)| l.send_step == t.steps.len() && l.recv_step == t.steps.len());
        let headers_done = headers
            .iter()
            .all(|h| h.outgoing.is_none() && h.incoming.is_none());
        if lanes_done && headers_done {
            return Ok(());
        }
        if progress {
            last_progress = Instant::now();
            continue;
        }
        let waited = last_progress.elapsed();
        if waited >= call.timeout {
            return Err(Error::Timeout {
                rank: call.rank,
                op: call.op,
                after: call.timeout,
            });
        }
        wait(channels, &wants, call.timeout - waited, call)?;
    }
}

/// When a peer closed a connection, the reason may be in another channel: a header that does
/// not match ours means a neighbour called something else (and the failure of its other
/// neighbour may have reached us first). Waits up to [`ROOT_CAUSE_GRACE`] for the peer headers
/// still expected, until each has arrived or its connection closed, and returns a mismatch.
fn root_cause(channels: &mut [Channel], headers: &mut [HeaderState], call: &Call) -> Option<Error> {
    let deadline = Instant::now() + ROOT_CAUSE_GRACE;
    loop {
        let mut wants = vec![Wants::default(); channels.len()];
        for (i, (ch, h)) in channels.iter_mut().zip(headers.iter_mut()).enumerate() {
            if h.incoming.is_none() {
                continue;
            }
            match receive_header(ch, h, call) {
                Err(e @ (Error::Mismatch { .. } | Error::Protocol { .. })) => return Some(e),
                // This connection is gone too: nothing more will come from it.
                Err(_) => h.incoming = None,
                Ok(_) => wants[i].read = h.incoming.is_some(),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !wants.iter().any(|w| w.read) {
            return None;
        }
        wait(channels, &wants, left, call).ok()?;
    }
}

/// How long a failed call waits for the peer headers that may explain the failure.
const ROOT_CAUSE_GRACE: Duration = Duration::from_millis(250);

/// Sends what lane `t` may send now. Returns whether any byte moved.
fn advance_send(
    t: &Transfer,
    lane: &mut LaneState,
    channels: &mut [Channel],
    headers: &mut [HeaderState],
    wants: &mut [Wants],
    bufs: &Buffers<'_>,
    call: &Call,
) -> Result<bool> {
    let mut progress = false;
    while let Some(step) = t.steps.get(lane.send_step) {
        // Forwarding: step s sends what step s - 1 has merged so far.
        let ready = if lane.send_step == 0 || t.rx.is_none() || lane.recv_step >= lane.send_step {
            step.send.len
        } else {
            lane.merged.min(step.send.len)
        };
        if lane.sent < ready {
            let Some(tx) = t.tx else { break };
            let end = ready.min(lane.sent + t.frame);
            let data = &bufs.read(step.send)[lane.sent..end];
            let with_header = headers[tx].outgoing.is_some();
            let n = send_on(&mut channels[tx], &mut headers[tx], data, call)?;
            if n == 0 {
                wants[tx].write = true;
                break;
            }
            lane.sent += n;
            progress = true;
            if with_header {
                // Let the other lanes send their headers before this one sends more: a peer
                // may fail the call on reading ours, and its neighbours must still get theirs.
                break;
            }
        } else if lane.sent == step.send.len {
            lane.send_step += 1;
            lane.sent = 0;
        } else {
            break;
        }
    }
    Ok(progress)
}

/// Merges what has arrived for lane `t`. Returns whether any byte moved.
#[allow(clippy::too_many_arguments)]
fn advance_recv(
    t: &Transfer,
    lane: &mut LaneState,
    channels: &mut [Channel],
    headers: &mut [HeaderState],
    wants: &mut [Wants],
    bufs: &mut Buffers<'_>,
    reducer: Option<&Reducer>,
    call: &Call,
) -> Result<bool> {
    let mut progress = false;
    while let Some(step) = t.steps.get(lane.recv_step) {
        let limit = if !t.merge_after_send || lane.send_step > lane.recv_step {
            step.recv.len
        } else if lane.send_step == lane.recv_step {
            lane.sent.min(step.recv.len)
        } else {
            0
        };
        if lane.merged < limit {
            let Some(rx) = t.rx else { break };
            let (dst_off, merged) = (step.recv.off + lane.merged, lane.merged);
            let input = bufs.input;
            let output = &mut *bufs.output;
            let mut consume = |bytes: &[u8]| -> usize {
                match step.merge {
                    Merge::Copy => {
                        output[dst_off..dst_off + bytes.len()].copy_from_slice(bytes);
                        bytes.len()
                    }
                    Merge::Reduce { own } => {
                        let Some(r) = reducer else { return 0 };
                        let n = bytes.len() - bytes.len() % r.elem_size();
                        let dst = &mut output[dst_off..dst_off + n];
                        match (own, input) {
                            (Some(own), Some(input)) => {
                                let own = &input[own + merged..own + merged + n];
                                r.combine(dst, own, &bytes[..n]);
                            }
                            _ => r.accumulate(dst, &bytes[..n]),
                        }
                        n
                    }
                }
            };
            let n = recv_on(
                &mut channels[rx],
                &mut headers[rx],
                limit - lane.merged,
                &mut consume,
                call,
            )?;
            if n == 0 {
                wants[rx].read = true;
                break;
            }
            lane.merged += n;
            progress = true;
        } else if lane.merged == step.recv.len {
            lane.recv_step += 1;
            lane.merged = 0;
        } else {
            break;
        }
    }
    Ok(progress)
}

/// Sends `data` on `ch`, preceded by the rest of this call's header if it has not gone yet.
/// Returns how many bytes of `data` went.
fn send_on(ch: &mut Channel, hs: &mut HeaderState, data: &[u8], call: &Call) -> Result<usize> {
    let peer = ch.peer;
    let Some((header, sent)) = &mut hs.outgoing else {
        return ch.link.try_send(&[data]).map_err(|e| lost(e, peer, call));
    };
    let n = ch
        .link
        .try_send(&[&header[*sent..], data])
        .map_err(|e| lost(e, peer, call))?;
    let of_header = n.min(HEADER_LEN - *sent);
    *sent += of_header;
    if *sent == HEADER_LEN {
        hs.outgoing = None;
    }
    Ok(n - of_header)
}

/// Receives into `consume` from `ch` once the peer's header has arrived and matched.
fn recv_on(
    ch: &mut Channel,
    hs: &mut HeaderState,
    max: usize,
    consume: &mut dyn FnMut(&[u8]) -> usize,
    call: &Call,
) -> Result<usize> {
    if hs.incoming.is_some() {
        receive_header(ch, hs, call)?;
        if hs.incoming.is_some() {
            return Ok(0);
        }
    }
    let peer = ch.peer;
    ch.link
        .try_recv(max, consume)
        .map_err(|e| lost(e, peer, call))
}

/// Reads what is available of the peer's header and checks it once complete. Returns whether
/// any byte arrived.
fn receive_header(ch: &mut Channel, hs: &mut HeaderState, call: &Call) -> Result<bool> {
    let Some((expect, buf, got)) = &mut hs.incoming else {
        return Ok(false);
    };
    let peer = ch.peer;
    let n = ch
        .link
        .try_recv(HEADER_LEN - *got, &mut |bytes| {
            buf[*got..*got + bytes.len()].copy_from_slice(bytes);
            bytes.len()
        })
        .map_err(|e| lost(e, peer, call))?;
    *got += n;
    if *got < HEADER_LEN {
        return Ok(n > 0);
    }
    let header = Header::decode(buf).map_err(|detail| Error::Protocol {
        rank: call.rank,
        peer,
        op: call.op,
        detail,
    })?;
    if let Some(detail) = expect.mismatch(&header) {
        return Err(Error::Mismatch {
            rank: call.rank,
            peer,
            op: call.op,
            detail,
        });
    }
    ch.received_ops = ch.received_ops.wrapping_add(1);
    hs.incoming = None;
    Ok(true)
}

fn lost(e: LinkError, peer: usize, call: &Call) -> Error {
    match e {
        LinkError::Closed(cause) => Error::PeerLost {
            rank: call.rank,
            peer,
            op: call.op,
            cause,
        },
        LinkError::Io(e) => Error::io(call.rank, format!("{} with rank {peer}", call.op), e),
    }
}

/// Sleeps until a channel we wait for is ready or `timeout` passes.
fn wait(channels: &[Channel], wants: &[Wants], timeout: Duration, call: &Call) -> Result<()> {
    let mut fds: Vec<PollFd<'_>> = channels
        .iter()
        .zip(wants)
        .filter(|(_, w)| w.read || w.write)
        .map(|(ch, w)| {
            let mut flags = PollFlags::empty();
            flags.set(PollFlags::IN, w.read);
            flags.set(PollFlags::OUT, w.write);
            PollFd::from_borrowed_fd(ch.link.fd(), flags)
        })
        .collect();
    if fds.is_empty() {
        // Every unfinished lane waits on a channel, so this cannot happen; fail rather than hang.
        return Err(Error::io(
            call.rank,
            call.op,
            std::io::Error::other("internal error: nothing to wait for"),
        ));
    }
    let timeout = rustix::time::Timespec::try_from(timeout).unwrap_or(rustix::time::Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(Errno::INTR) => Ok(()),
        Err(e) => Err(Error::io(call.rank, format!("{}: poll", call.op), e.into())),
    }
}
