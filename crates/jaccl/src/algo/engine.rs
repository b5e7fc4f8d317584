//! Runs a [`Plan`] over links on the calling thread.
//!
//! An [`Execution`] is one call in progress: each [`Execution::pass`] over the lanes sends what
//! may be sent and merges what has arrived, without blocking. [`run`] repeats passes and, when
//! one moves nothing, waits as the links' readiness interface says (`crate::transport`): it
//! spins and yields (per the call's [`crate::WaitPolicy`]; on TCP links the yield phase is
//! short), and sleeps in `poll(2)` on exactly the links it waits for. With more ranks than
//! cores (tests run 8 ranks on 2), a rank that busy-polls steals the core its peer needs and
//! each hop then costs a scheduler slice, so such ranks never spin.
//!
//! Every wait has a deadline: when no byte moves for the call's timeout, it fails with
//! [`Error::Timeout`]. The waiting itself (arming links, `poll(2)`, the reports to the
//! deadlock search) is `super::waiting`'s, shared with the direct collectives; a channel and
//! what it read ahead are `super::channel`'s; the call's description is `super::call`'s.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::call::{Buffers, Call};
use super::channel::{Channel, lost};
use super::plan::{Merge, Plan, Transfer};
use super::waiting::{BlockedReport, PeerAhead, flows, sleep};
use crate::error::{Error, Result};
use crate::liveness::{Flow, Liveness};
use crate::op_header::{HEADER_LEN, Header};
use crate::reduce::Reducer;
use crate::transport::{Interest, Link};
use crate::wait::{Backoff, Idle};

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

/// The header traffic of one call, by channel, on the channels it uses (a group has a
/// channel to every rank: a 104-byte state for each, made afresh for every plan, cost more
/// than the rest of a small call among hundreds of ranks; a slot number each is cheap).
struct Headers {
    /// Each channel's place in `states` (`NO_HEADER`: none).
    slots: Vec<u32>,
    /// The channels, in the order first used.
    channels: Vec<usize>,
    states: Vec<HeaderState>,
    /// What a channel without header traffic reads as (no header either way).
    none: HeaderState,
}

/// The slot of a channel without header traffic.
const NO_HEADER: u32 = u32::MAX;

impl Headers {
    /// No header traffic yet on any of `channels` channels.
    fn new(channels: usize) -> Headers {
        Headers {
            slots: vec![NO_HEADER; channels],
            channels: Vec::new(),
            states: Vec::new(),
            none: HeaderState::default(),
        }
    }

    /// Where `channel`'s state is, if it has one.
    fn slot(&self, channel: usize) -> Option<usize> {
        match self.slots.get(channel) {
            Some(&at) if at != NO_HEADER => Some(at as usize),
            _ => None,
        }
    }

    /// The state of `channel`, added if new.
    fn add(&mut self, channel: usize) -> &mut HeaderState {
        let at = match self.slot(channel) {
            Some(at) => at,
            None => {
                if let Some(slot) = self.slots.get_mut(channel) {
                    *slot = self.states.len() as u32;
                }
                self.channels.push(channel);
                self.states.push(HeaderState::default());
                self.states.len() - 1
            }
        };
        &mut self.states[at]
    }

    /// Every channel with its state.
    fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut HeaderState)> {
        self.channels.iter().copied().zip(self.states.iter_mut())
    }

    /// Whether every header is through.
    fn done(&self) -> bool {
        self.states
            .iter()
            .all(|h| h.outgoing.is_none() && h.incoming.is_none())
    }
}

impl std::ops::Index<usize> for Headers {
    type Output = HeaderState;

    fn index(&self, channel: usize) -> &HeaderState {
        match self.slot(channel) {
            Some(at) => &self.states[at],
            None => &self.none,
        }
    }
}

impl std::ops::IndexMut<usize> for Headers {
    fn index_mut(&mut self, channel: usize) -> &mut HeaderState {
        match self.slot(channel) {
            Some(at) => &mut self.states[at],
            None => {
                self.none = HeaderState::default();
                &mut self.none
            }
        }
    }
}

/// One call in progress: a plan, the caller's buffers, and how far each lane and header got.
pub(crate) struct Execution<'a> {
    plan: &'a Plan,
    bufs: Buffers<'a>,
    reducer: Option<&'a Reducer>,
    call: &'a Call,
    headers: Headers,
    lanes: Vec<LaneState>,
    /// What each channel waited for in the last pass.
    wants: Vec<Interest>,
    /// The channels this plan receives on.
    receiving: Vec<usize>,
    /// The channels this plan does not receive on that go to a peer it receives from: read
    /// ahead while the call waits for that peer.
    siblings: Vec<usize>,
    /// Whether the last pass read ahead beyond the plan's channels and `siblings` (it was
    /// blocked sending), so `wants` may be set anywhere.
    wide: bool,
}

impl<'a> Execution<'a> {
    /// Starts `plan` over `channels`. Every channel the plan sends on first carries this call's
    /// header, and every channel it receives on first delivers the peer's, which must match.
    pub(crate) fn start(
        channels: &mut [Channel],
        plan: &'a Plan,
        bufs: Buffers<'a>,
        reducer: Option<&'a Reducer>,
        call: &'a Call,
    ) -> Execution<'a> {
        let mut headers = Headers::new(channels.len());
        let sending = plan.transfers.iter().filter_map(|t| t.tx);
        let receiving = plan.transfers.iter().filter_map(|t| t.rx);
        let headers_out = plan.headers_both_ways.iter().chain(&plan.headers_out);
        for tx in sending.chain(headers_out.copied()) {
            let state = headers.add(tx);
            if state.outgoing.is_none() {
                let ch = &mut channels[tx];
                state.outgoing = Some((call.header(ch.sent_ops, call.rank).encode(), 0));
                ch.sent_ops = ch.sent_ops.wrapping_add(1);
            }
        }
        for rx in receiving.chain(plan.headers_both_ways.iter().copied()) {
            let state = headers.add(rx);
            if state.incoming.is_none() {
                let ch = &channels[rx];
                let expect = call.header(ch.received_ops, ch.peer);
                state.incoming = Some((expect, [0u8; HEADER_LEN], 0));
            }
        }
        let mut receiving: Vec<usize> = plan.transfers.iter().filter_map(|t| t.rx).collect();
        receiving.extend(&plan.headers_both_ways);
        receiving.sort_unstable();
        receiving.dedup();
        let mut peers: Vec<usize> = receiving.iter().map(|&c| channels[c].peer).collect();
        peers.sort_unstable();
        peers.dedup();
        let siblings = (0..channels.len())
            .filter(|&i| peers.binary_search(&channels[i].peer).is_ok())
            .filter(|i| receiving.binary_search(i).is_err())
            .collect();
        Execution {
            plan,
            bufs,
            reducer,
            call,
            headers,
            lanes: vec![LaneState::default(); plan.transfers.len()],
            wants: vec![Interest::default(); channels.len()],
            receiving,
            siblings,
            wide: false,
        }
    }

    /// The channels whose `wants` a pass may have set: the plan's and their siblings (every
    /// channel after a pass that read ahead wide).
    fn touched(&self) -> impl Iterator<Item = usize> + '_ {
        let all = self.wide.then_some(0..self.wants.len());
        let some = (!self.wide).then(|| self.headers.channels.iter().chain(&self.siblings));
        all.into_iter()
            .flatten()
            .chain(some.into_iter().flatten().copied())
    }

    /// One pass over the lanes: sends what may be sent, then merges what has arrived. Returns
    /// whether any byte moved; afterwards [`Execution::wants`] says what each channel waits for.
    pub(crate) fn pass(&mut self, channels: &mut [Channel]) -> Result<bool> {
        let (plan, call) = (self.plan, self.call);
        match self.wide {
            true => self.wants.fill(Interest::default()),
            false => {
                for &i in self.headers.channels.iter().chain(&self.siblings) {
                    self.wants[i] = Interest::default();
                }
            }
        }
        self.wide = false;
        let wants = &mut self.wants;
        let headers = &mut self.headers;
        // Sends first: our header leaves on every channel (with the first data where there is
        // some) before any check of a peer's header can fail this call, so that the peers see
        // a `Mismatch` too rather than only a closed connection.
        let mut progress = false;
        for (t, lane) in plan.transfers.iter().zip(self.lanes.iter_mut()) {
            progress |= advance_send(t, lane, channels, headers, wants, &self.bufs, call)?;
        }
        for (i, h) in headers.iter_mut() {
            if h.outgoing.is_some() {
                progress |= send_on(&mut channels[i], h, &[], call)? > 0;
                wants[i].write |= h.outgoing.is_some();
            }
        }
        for (t, lane) in plan.transfers.iter().zip(self.lanes.iter_mut()) {
            progress |= advance_recv(
                t,
                lane,
                channels,
                headers,
                wants,
                &mut self.bufs,
                self.reducer,
                call,
            )?;
        }
        // Channels whose lanes receive no data in this call still deliver the peer's header.
        for (i, h) in headers.iter_mut() {
            if h.incoming.is_some() {
                progress |= receive_header(&mut channels[i], h, call)?;
                wants[i].read |= h.incoming.is_some();
            }
        }
        // Waiting: read ahead what peers send on channels this call does not receive on.
        // Blocked sending, from every peer, so that sends in a cycle (every rank sends before
        // it receives) go through; waiting to receive from a peer, from that peer: two ranks
        // share two connections, and a call may use one, so the peer's next call may start on
        // the other. Bytes read ahead count as received, so when the peer waits for this rank
        // in a call of its own (it called something else), the deadlock search sees nothing on
        // its way and names it, while data of this call still on its way (a TCP
        // retransmission, say) keeps it from doing so.
        // Only sends and headers set `wants.write`, on the plan's channels.
        if !progress && headers.channels.iter().any(|&i| wants[i].write) {
            self.wide = true;
            for i in 0..channels.len() {
                if self.receiving.binary_search(&i).is_err() {
                    progress |= channels[i].read_ahead_idle() > 0;
                    wants[i].read = channels[i].reads_ahead();
                }
            }
        } else if !progress {
            for &i in &self.siblings {
                let peer = channels[i].peer;
                let awaits = self
                    .receiving
                    .iter()
                    .any(|&j| wants[j].read && channels[j].peer == peer);
                if awaits {
                    progress |= channels[i].read_ahead_idle() > 0;
                    wants[i].read = channels[i].reads_ahead();
                }
            }
        }
        Ok(progress)
    }

    /// Whether every lane and header is through.
    pub(crate) fn done(&self) -> bool {
        let lanes_done = self
            .plan
            .transfers
            .iter()
            .zip(&self.lanes)
            .all(|(t, l)| l.send_step == t.steps.len() && l.recv_step == t.steps.len());
        lanes_done && self.headers.done()
    }

    /// What each channel waited for in the last pass.
    pub(crate) fn wants(&self) -> &[Interest] {
        &self.wants
    }
}

/// A reusable buffer of the algorithms, kept between calls (`u128` for alignment).
#[derive(Default)]
pub(crate) struct Scratch(Vec<u128>);

impl Scratch {
    /// `bytes` of it, grown as needed, viewed as bytes.
    pub(crate) fn bytes(&mut self, bytes: usize) -> &mut [u8] {
        let words = bytes.div_ceil(size_of::<u128>());
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut(self.0.as_mut_slice())[..bytes]
    }
}

/// A group's channels, and what its waits consult: where plans run.
pub(crate) struct Network {
    pub(crate) channels: Vec<Channel>,
    pub(crate) liveness: Arc<Liveness>,
    /// Makes the links of unopened channels ([`Channel::unopened`]).
    pub(crate) late: Option<Box<dyn LateLinks>>,
}

/// Makes links after start-up, when a call first needs them (`crate::connect::late`).
pub(crate) trait LateLinks: Send {
    /// One link to each of `peers`, every one of which is calling this for this rank in a
    /// matching call; waits end by `call`'s timeout, or by `liveness` (a lost peer, or the
    /// deadlock search, to which a wait reports the traffic over the links made so far,
    /// `known`, as [`super::waiting::flows`] gives it).
    ///
    /// # Errors
    /// A link could not be made; the call's timeout; what liveness found.
    fn open(
        &mut self,
        peers: &[usize],
        known: Vec<Flow>,
        call: &Call,
        liveness: &Liveness,
    ) -> Result<Vec<Box<dyn Link>>>;

    /// The links that any of `peers` (ranks below this one, which open them) opened to this
    /// rank so far, by peer, without waiting.
    ///
    /// # Errors
    /// This rank no longer accepts connections, or one could not be configured.
    fn arrived(&mut self, peers: &[usize], call: &Call) -> Result<Vec<(usize, Box<dyn Link>)>>;

    /// Readable when a link may have arrived ([`LateLinks::arrived`]).
    fn arrivals(&self) -> BorrowedFd<'_>;
}

impl Network {
    /// Opens the unopened channels among `channels` (by index), all at once.
    ///
    /// # Errors
    /// As [`LateLinks::open`].
    pub(crate) fn reach(
        &mut self,
        channels: impl IntoIterator<Item = usize>,
        call: &Call,
    ) -> Result<()> {
        let mut unopened: Vec<usize> = channels
            .into_iter()
            .filter(|&c| self.channels.get(c).is_some_and(|ch| !ch.is_open()))
            .collect();
        unopened.sort_unstable();
        unopened.dedup();
        if unopened.is_empty() {
            return Ok(());
        }
        let Some(late) = self.late.as_mut() else {
            let bug = std::io::Error::other("internal error: a channel has no way to open");
            return Err(Error::io(call.rank, call.op, bug));
        };
        let peers: Vec<usize> = unopened.iter().map(|&c| self.channels[c].peer()).collect();
        let idle = vec![Interest::default(); self.channels.len()];
        let known = flows(&self.channels, &idle);
        let links = late.open(&peers, known, call, &self.liveness)?;
        for (c, link) in unopened.into_iter().zip(links) {
            self.channels[c].open(link);
        }
        Ok(())
    }

    /// Runs `plan` over the channels to the end ([`run`]).
    pub(crate) fn run(
        &mut self,
        plan: &Plan,
        bufs: Buffers<'_>,
        reducer: Option<&Reducer>,
        call: &Call,
    ) -> Result<()> {
        run(
            &mut self.channels,
            &self.liveness,
            plan,
            bufs,
            reducer,
            call,
        )
    }
}

/// The longest a rank that failed a round with a `Mismatch` spends telling the peers of the
/// later rounds (their links have room for a header, so it takes no wait).
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(1);

/// The rounds of one collective that runs a plan per round (recursive doubling, a broadcast
/// tree): one plan each.
pub(crate) struct Rounds<'a> {
    pub(crate) net: &'a mut Network,
    pub(crate) plans: &'a [Plan],
    pub(crate) call: &'a Call,
}

impl<'a> Rounds<'a> {
    pub(crate) fn new(net: &'a mut Network, plans: &'a [Plan], call: &'a Call) -> Rounds<'a> {
        Rounds { net, plans, call }
    }

    /// Runs every round in turn over `output`.
    pub(crate) fn run_all(&mut self, output: &mut [u8]) -> Result<()> {
        (0..self.plans.len()).try_for_each(|k| self.run(k, &mut *output, None))
    }

    /// Runs round `k` over `output` (and `input`, where its plan sends from the input). On a
    /// `Mismatch` the peers of the later rounds, which expect this rank's header with those
    /// rounds, get it alone ([`Plan::announcement`]), so they see the mismatch too; that waits
    /// at most [`ANNOUNCE_TIMEOUT`] (this rank fails either way).
    pub(crate) fn run(&mut self, k: usize, output: &mut [u8], input: Option<&[u8]>) -> Result<()> {
        // Links made on first use are made for the round that needs them: the rounds before
        // carry the headers that show a neighbour in another call as a `Mismatch`, where a
        // wait for a link from it could only time out.
        self.net.reach(self.plans[k].channels(), self.call)?;
        let bufs = Buffers::new(input, output);
        let result = self.net.run(&self.plans[k], bufs, None, self.call);
        if let Err(Error::Mismatch { .. }) = result {
            let call = Call {
                timeout: self.call.timeout.min(ANNOUNCE_TIMEOUT),
                ..*self.call
            };
            for later in &self.plans[k + 1..] {
                let _ = self
                    .net
                    .run(&later.announcement(), Buffers::none(), None, &call);
            }
        }
        result
    }
}

/// Runs `plan` over `channels` to the end (see [`Execution::start`]).
fn run(
    channels: &mut [Channel],
    liveness: &Liveness,
    plan: &Plan,
    bufs: Buffers<'_>,
    reducer: Option<&Reducer>,
    call: &Call,
) -> Result<()> {
    let mut exec = Execution::start(channels, plan, bufs, reducer, call);
    match drive(&mut exec, channels, liveness) {
        Err(lost @ Error::PeerLost { .. }) => {
            Err(root_cause(channels, liveness, &mut exec.headers, call).unwrap_or(lost))
        }
        other => other,
    }
}

/// The loop of [`run`]: passes until done, waiting when nothing moves (and giving up when
/// the heartbeat declared a rank lost).
fn drive(exec: &mut Execution<'_>, channels: &mut [Channel], liveness: &Liveness) -> Result<()> {
    let call = exec.call;
    let mut backoff = Backoff::new(call.wait, call.timeout);
    let mut peer_ahead = PeerAhead::default();
    let mut blocked = BlockedReport::new(liveness);
    loop {
        let progress = exec.pass(channels)?;
        if exec.done() {
            return Ok(());
        }
        if progress {
            backoff.progressed();
            peer_ahead.clear();
            blocked.withdraw();
            continue;
        }
        liveness.check(call.op)?;
        if let Some(peer) = peer_in_a_collective(channels, exec)?
            && peer_ahead.grace_over()
        {
            return Err(Error::Mismatch {
                rank: call.rank,
                peer,
                op: call.op,
                detail: format!(
                    "rank {peer} is in a collective this rank did not call; this rank called {}",
                    call.header(0, call.rank)
                ),
            });
        }
        let wants = exec.wants();
        let in_memory = exec
            .touched()
            .all(|i| !wants[i].any() || channels[i].link.in_memory());
        match backoff.idle(in_memory) {
            Idle::Retry => {}
            Idle::TimedOut => return Err(call.timed_out()),
            Idle::Sleep(limit) => {
                let limit = peer_ahead.sleep_limit(limit);
                blocked.report(call.op, || flows(channels, exec.wants()), None);
                sleep(channels, liveness, exec.wants(), limit, call)?;
            }
        }
    }
}

/// A peer that this call sends to or receives from, that it waits on, and that has entered a
/// direct collective this rank has not.
///
/// # Errors
/// Such a peer's stamp fails its checks (`Protocol`).
fn peer_in_a_collective(channels: &[Channel], exec: &Execution<'_>) -> Result<Option<usize>> {
    let plan = exec.plan;
    let used = |i: usize| plan.receives_on(i) || plan.transfers.iter().any(|t| t.tx == Some(i));
    for i in exec.touched() {
        let ch = &channels[i];
        if exec.wants[i].any() && used(i) && ch.peer_ahead(exec.call)? {
            return Ok(Some(ch.peer));
        }
    }
    Ok(None)
}

/// When a peer closed a connection, the reason may be in another channel: a header that does
/// not match ours means a neighbour called something else (and the failure of its other
/// neighbour may have reached us first). Waits up to [`ROOT_CAUSE_GRACE`] for the peer headers
/// still expected, until each has arrived or its connection closed, and returns a mismatch.
fn root_cause(
    channels: &mut [Channel],
    liveness: &Liveness,
    headers: &mut Headers,
    call: &Call,
) -> Option<Error> {
    let deadline = Instant::now() + ROOT_CAUSE_GRACE;
    let mut wants = vec![Interest::default(); channels.len()];
    loop {
        wants.fill(Interest::default());
        for (i, h) in headers.iter_mut() {
            if h.incoming.is_none() {
                continue;
            }
            match receive_header(&mut channels[i], h, call) {
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
        sleep(
            channels,
            liveness,
            &wants,
            left.min(Duration::from_millis(10)),
            call,
        )
        .ok()?;
    }
}

/// How long a failed call waits for the peer headers that may explain the failure.
const ROOT_CAUSE_GRACE: Duration = Duration::from_millis(250);

/// Sends what lane `t` may send now. Returns whether any byte moved.
fn advance_send(
    t: &Transfer,
    lane: &mut LaneState,
    channels: &mut [Channel],
    headers: &mut Headers,
    wants: &mut [Interest],
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
    headers: &mut Headers,
    wants: &mut [Interest],
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
            let (ch, hs) = (&mut channels[rx], &mut headers[rx]);
            let n = match step.merge {
                Merge::Copy => {
                    let dst = &mut output[dst_off..dst_off + (limit - merged)];
                    match header_in(ch, hs, call)? {
                        true => ch.try_recv_into(dst).map_err(|e| lost(e, ch.peer, call))?,
                        false => 0,
                    }
                }
                Merge::Reduce { own } => {
                    let mut consume = |bytes: &[u8]| -> usize {
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
                    };
                    recv_on(ch, hs, limit - merged, &mut consume, call)?
                }
            };
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
        let n = ch.link.try_send(&[data]).map_err(|e| lost(e, peer, call))?;
        ch.bytes_sent += n as u64;
        return Ok(n);
    };
    let n = ch
        .link
        .try_send(&[&header[*sent..], data])
        .map_err(|e| lost(e, peer, call))?;
    ch.bytes_sent += n as u64;
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
    if !header_in(ch, hs, call)? {
        return Ok(0);
    }
    let peer = ch.peer;
    ch.try_recv(max, consume).map_err(|e| lost(e, peer, call))
}

/// Whether the peer's header for this call has arrived on `ch` and matched (reading what
/// there is of it).
fn header_in(ch: &mut Channel, hs: &mut HeaderState, call: &Call) -> Result<bool> {
    if hs.incoming.is_some() {
        receive_header(ch, hs, call)?;
    }
    Ok(hs.incoming.is_none())
}

/// Reads what is available of the peer's header and checks it once complete. Returns whether
/// any byte arrived.
fn receive_header(ch: &mut Channel, hs: &mut HeaderState, call: &Call) -> Result<bool> {
    let Some((expect, buf, got)) = &mut hs.incoming else {
        return Ok(false);
    };
    let peer = ch.peer;
    let n = ch
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
