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
//! [`Error::Timeout`].

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::plan::{Buf, Merge, Plan, Span, Transfer};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::liveness::{Flow, Liveness};
use crate::os::poll;
use crate::reduce::{Reducer, copy};
use crate::transport::{Interest, Link, LinkError, Readiness};
use crate::wait::{Backoff, Idle, WaitPolicy};
use crate::wire::{Digest, HEADER_LEN, Header, Kind};

/// One link to one peer, with the count of operations started on it in each direction (the
/// `seq` of the operation headers), and the bytes read ahead of the calls that will use them.
pub(crate) struct Channel {
    link: Box<dyn Link>,
    peer: usize,
    sent_ops: u32,
    received_ops: u32,
    /// Bytes the peer sent that no call has consumed yet, read ahead while this rank was
    /// blocked sending ([`Channel::read_ahead`]); from `early_pos` on they come before the
    /// link's own.
    early: Vec<u8>,
    early_pos: usize,
    /// The link failed while reading ahead: the call that next receives on it reports that.
    read_ahead_failed: bool,
    /// With the direct collectives: whether the peer has entered one this rank has not.
    ahead: Option<PeerAhead>,
    /// Bytes handed to the link and taken from it since the group started, for the deadlock
    /// search ([`crate::liveness::Flow`]).
    bytes_sent: u64,
    bytes_received: u64,
    /// False while the link is a placeholder ([`Channel::unopened`]).
    opened: bool,
}

/// Whether the peer of a channel has entered a direct collective this rank has not: a send or
/// receive that waits on it then fails with `Mismatch` (see [`drive`]). `Err`: its stamp is
/// one no honest rank writes, and why (a `Protocol` error).
pub(crate) type PeerAhead = Box<dyn Fn() -> std::result::Result<bool, String> + Send>;

/// The most a pass reads ahead from one channel, so a fast peer cannot keep a pass going.
const READ_AHEAD_PER_PASS: usize = 4 << 20;

/// The most a channel holds read ahead of the calls that will consume it: what ranks that
/// send before they receive (in a cycle) may have in flight to this one. A peer that sends
/// more waits until this rank receives (its bytes stay in the transport), so no peer can make
/// a rank buffer more, whatever it sends.
const READ_AHEAD_MAX: usize = 64 << 20;

impl Channel {
    pub(crate) fn new(link: Box<dyn Link>, peer: usize) -> Channel {
        Channel {
            link,
            peer,
            sent_ops: 0,
            received_ops: 0,
            early: Vec::new(),
            early_pos: 0,
            read_ahead_failed: false,
            ahead: None,
            bytes_sent: 0,
            bytes_received: 0,
            opened: true,
        }
    }

    /// A channel to `peer` whose link is made later ([`Channel::open`]).
    pub(crate) fn unopened(peer: usize) -> Channel {
        Channel {
            opened: false,
            ..Channel::new(Box::new(crate::transport::Unopened { peer }), peer)
        }
    }

    /// Whether the channel waits for its link ([`Channel::unopened`]).
    pub(crate) fn is_open(&self) -> bool {
        self.opened
    }

    /// Gives an unopened channel its link, as new.
    pub(crate) fn open(&mut self, link: Box<dyn Link>) {
        let ahead = self.ahead.take();
        *self = Channel::new(link, self.peer);
        self.ahead = ahead;
    }

    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// Watches the peer's progress in the direct collectives (see [`drive`]).
    pub(crate) fn watch(&mut self, ahead: Option<PeerAhead>) {
        self.ahead = ahead;
    }

    /// The descriptors to sleep on for `interest` (see [`Link::wait_fds`]).
    pub(crate) fn wait_fds<'a>(&'a self, interest: Interest, fds: &mut Vec<PollFd<'a>>) {
        self.link.wait_fds(interest, fds);
    }

    /// The header of the next operation the peer sent on this channel, once all of it has
    /// arrived (read ahead: the call that receives it takes it from there).
    ///
    /// # Errors
    /// The link failed (the peer closed it, say).
    pub(crate) fn peek_header(
        &mut self,
    ) -> std::result::Result<Option<[u8; HEADER_LEN]>, LinkError> {
        let have = self.read_ahead_bytes().len();
        if have < HEADER_LEN {
            self.read_ahead(HEADER_LEN - have)?;
        }
        Ok(self.read_ahead_bytes().first_chunk::<HEADER_LEN>().copied())
    }

    /// Whether re-checking the link costs no system call ([`Link::in_memory`]).
    pub(crate) fn in_memory(&self) -> bool {
        self.link.in_memory()
    }

    /// Whether the peer has entered a direct collective this rank has not ([`Channel::watch`]).
    ///
    /// # Errors
    /// Its stamp is one no honest rank writes (`Protocol`).
    pub(crate) fn peer_ahead(&self, call: &Call) -> Result<bool> {
        let Some(ahead) = &self.ahead else {
            return Ok(false);
        };
        ahead().map_err(|detail| Error::Protocol {
            rank: call.rank,
            peer: self.peer,
            op: call.op,
            detail,
        })
    }

    /// The bytes read ahead and not consumed yet.
    pub(crate) fn read_ahead_bytes(&self) -> &[u8] {
        &self.early[self.early_pos..]
    }

    /// [`Link::try_recv`], offering the bytes read ahead first.
    pub(super) fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> std::result::Result<usize, LinkError> {
        if self.early_pos == self.early.len() {
            let n = self.link.try_recv(max, consume)?;
            self.bytes_received += n as u64;
            return Ok(n);
        }
        let mut offered = (self.early.len() - self.early_pos).min(max);
        let mut used = consume(&self.early[self.early_pos..self.early_pos + offered]);
        if used == 0 && offered < max {
            // The consumer needs more bytes in one piece (a whole element): append the link's.
            self.read_ahead(max - offered)?;
            offered = (self.early.len() - self.early_pos).min(max);
            used = consume(&self.early[self.early_pos..self.early_pos + offered]);
        }
        self.early_pos += used.min(offered);
        if self.early_pos == self.early.len() {
            // Reading ahead is rare: give the memory back rather than keep the largest ever.
            self.early = Vec::new();
            self.early_pos = 0;
        }
        Ok(used)
    }

    /// Reads up to `limit` bytes the peer has sent into the read-ahead buffer (which holds at
    /// most [`READ_AHEAD_MAX`]), without blocking. Returns how many arrived.
    fn read_ahead(&mut self, limit: usize) -> std::result::Result<usize, LinkError> {
        if self.early_pos > 0 {
            self.early.drain(..self.early_pos);
            self.early_pos = 0;
        }
        let limit = limit.min(READ_AHEAD_MAX.saturating_sub(self.early.len()));
        let mut total = 0;
        while total < limit {
            let early = &mut self.early;
            let n = self.link.try_recv(limit - total, &mut |bytes| {
                early.extend_from_slice(bytes);
                bytes.len()
            })?;
            self.bytes_received += n as u64;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total)
    }

    /// Whether [`Channel::read_ahead_idle`] reads: the link is open and has not failed.
    pub(crate) fn reads_ahead(&self) -> bool {
        self.opened && !self.read_ahead_failed
    }

    /// Reads ahead on a channel the current call does not receive on: for a call that is
    /// blocked sending (the peer may itself be blocked sending to this rank, both having called
    /// `send` before `recv`, or to a rank that waits on this one, and only reading its bytes
    /// lets the cycle move), and for a direct collective about to sleep (bytes from a peer it
    /// waits for mean that peer called `send` instead). A failed link is left for the call that
    /// receives on it to report (its peer may have finished and left). Returns how many bytes
    /// arrived.
    pub(crate) fn read_ahead_idle(&mut self) -> usize {
        if !self.reads_ahead() {
            return 0;
        }
        match self.read_ahead(READ_AHEAD_PER_PASS) {
            Ok(n) => n,
            Err(_) => {
                self.read_ahead_failed = true;
                0
            }
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
    /// Elements, as in the header (the sum of the counts for the variable-size collectives).
    pub(crate) count: usize,
    /// The root of a rooted collective; a send's or receive's tag (0 otherwise).
    pub(crate) root: usize,
    /// The digest of the counts of a variable-size collective whose ranks must agree on them.
    pub(crate) counts: Option<Digest>,
    /// A send's or receive's whole message in elements (see [`Header::message`]); 0 for the
    /// collectives.
    pub(crate) message: usize,
    pub(crate) timeout: Duration,
    pub(crate) wait: WaitPolicy,
    /// Whether waits ask the caller's interrupt check (not on the progress thread).
    pub(crate) interruptible: bool,
}

impl Call {
    /// The header of this call, as operation `seq` on a connection, sent by `sender`.
    pub(crate) fn header(&self, seq: u32, sender: usize) -> Header {
        Header {
            seq,
            kind: Kind::of(self.op),
            dtype: self.dtype,
            reduce: self.reduce,
            sender: crate::wire::to_u32(sender),
            count: self.count as u64,
            root: crate::wire::to_u32(self.root),
            counts: self.counts,
            message: self.message as u64,
        }
    }

    /// The error for a wait that saw no progress for the timeout.
    pub(crate) fn timed_out(&self) -> Error {
        Error::Timeout {
            rank: self.rank,
            op: self.op,
            after: self.timeout,
        }
    }
}

/// The caller's buffers, as bytes. `input` is `None` when the call is in place.
pub(crate) struct Buffers<'a> {
    pub(crate) input: Option<&'a [u8]>,
    pub(crate) output: &'a mut [u8],
}

impl Buffers<'_> {
    /// No buffers: for a plan that only sends headers.
    pub(crate) fn none() -> Buffers<'static> {
        Buffers {
            input: None,
            output: &mut [],
        }
    }

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

/// One call in progress: a plan, the caller's buffers, and how far each lane and header got.
pub(crate) struct Execution<'a> {
    plan: &'a Plan,
    bufs: Buffers<'a>,
    reducer: Option<&'a Reducer>,
    call: &'a Call,
    headers: Vec<HeaderState>,
    lanes: Vec<LaneState>,
    /// What each channel waited for in the last pass.
    wants: Vec<Interest>,
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
        let mut headers: Vec<HeaderState> =
            channels.iter().map(|_| HeaderState::default()).collect();
        let sending = plan.transfers.iter().filter_map(|t| t.tx);
        let receiving = plan.transfers.iter().filter_map(|t| t.rx);
        let headers_out = plan.headers_both_ways.iter().chain(&plan.headers_out);
        for tx in sending.chain(headers_out.copied()) {
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
        Execution {
            plan,
            bufs,
            reducer,
            call,
            headers,
            lanes: vec![LaneState::default(); plan.transfers.len()],
            wants: vec![Interest::default(); channels.len()],
        }
    }

    /// One pass over the lanes: sends what may be sent, then merges what has arrived. Returns
    /// whether any byte moved; afterwards [`Execution::wants`] says what each channel waits for.
    pub(crate) fn pass(&mut self, channels: &mut [Channel]) -> Result<bool> {
        let (plan, call) = (self.plan, self.call);
        let wants = &mut self.wants;
        let headers = &mut self.headers;
        wants.fill(Interest::default());
        // Sends first: our header leaves on every channel (with the first data where there is
        // some) before any check of a peer's header can fail this call, so that the peers see
        // a `Mismatch` too rather than only a closed connection.
        let mut progress = false;
        for (t, lane) in plan.transfers.iter().zip(self.lanes.iter_mut()) {
            progress |= advance_send(t, lane, channels, headers, wants, &self.bufs, call)?;
        }
        for (i, ch) in channels.iter_mut().enumerate() {
            if headers[i].outgoing.is_some() {
                progress |= send_on(ch, &mut headers[i], &[], call)? > 0;
                wants[i].write |= headers[i].outgoing.is_some();
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
        for (i, ch) in channels.iter_mut().enumerate() {
            if headers[i].incoming.is_some() {
                progress |= receive_header(ch, &mut headers[i], call)?;
                wants[i].read |= headers[i].incoming.is_some();
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
        if !progress {
            let writing = wants.iter().any(|w| w.write);
            for i in 0..channels.len() {
                if plan.receives_on(i) || !(writing || awaits(plan, channels, wants, i)) {
                    continue;
                }
                progress |= channels[i].read_ahead_idle() > 0;
                wants[i].read = channels[i].reads_ahead();
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
        lanes_done
            && self
                .headers
                .iter()
                .all(|h| h.outgoing.is_none() && h.incoming.is_none())
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
    /// matching call; waits end by `call`'s timeout, or by `liveness` (a lost peer).
    ///
    /// # Errors
    /// A link could not be made; the call's timeout; what liveness found.
    fn open(
        &mut self,
        peers: &[usize],
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
        let links = late.open(&peers, call, &self.liveness)?;
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

impl Rounds<'_> {
    /// Runs round `k` over `output` (and `input`, where its plan sends from the input). On a
    /// `Mismatch` the peers of the later rounds, which expect this rank's header with those
    /// rounds, get it alone ([`Plan::announcement`]), so they see the mismatch too; that waits
    /// at most [`ANNOUNCE_TIMEOUT`] (this rank fails either way).
    pub(crate) fn run(&mut self, k: usize, output: &mut [u8], input: Option<&[u8]>) -> Result<()> {
        let bufs = Buffers { input, output };
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
    // Since when a peer this call waits on has been in a direct collective this rank is not in.
    let mut peer_ahead_since: Option<Instant> = None;
    let mut blocked = BlockedReport::new(liveness);
    loop {
        let progress = exec.pass(channels)?;
        if exec.done() {
            return Ok(());
        }
        if progress {
            backoff.progressed();
            peer_ahead_since = None;
            blocked.withdraw();
            continue;
        }
        liveness.check(call.op)?;
        if let Some(peer) = peer_in_a_collective(channels, exec)? {
            // Bytes its side sent before it moved on may still be on their way (TCP): wait a
            // moment for them before calling it a mismatch.
            let since = *peer_ahead_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= PEER_AHEAD_GRACE {
                return Err(Error::Mismatch {
                    rank: call.rank,
                    peer,
                    op: call.op,
                    detail: format!(
                        "rank {peer} is in a collective this rank did not call; this rank \
                         called {}",
                        call.header(0, call.rank)
                    ),
                });
            }
        }
        let in_memory = channels
            .iter()
            .zip(exec.wants())
            .all(|(ch, w)| !w.any() || ch.link.in_memory());
        match backoff.idle(in_memory) {
            Idle::Retry => {}
            Idle::TimedOut => return Err(call.timed_out()),
            Idle::Sleep(limit) => {
                let limit = match peer_ahead_since {
                    Some(_) => limit.min(PEER_AHEAD_GRACE),
                    None => limit,
                };
                blocked.report(call.op, || flows(channels, exec.wants()), None);
                sleep(channels, liveness, exec.wants(), limit, call)?;
            }
        }
    }
}

/// The report of a call that sleeps (for the deadlock search, `crate::liveness`): made once
/// per stretch of waiting, withdrawn when the call moves or ends.
pub(crate) struct BlockedReport<'a> {
    liveness: &'a Liveness,
    reported: bool,
}

impl<'a> BlockedReport<'a> {
    pub(crate) fn new(liveness: &'a Liveness) -> BlockedReport<'a> {
        BlockedReport {
            liveness,
            reported: false,
        }
    }

    /// Reports the call as blocked (once per stretch of waiting), with the `flows` that
    /// [`flows`] gives and, in a direct collective, the stamp it `awaits`.
    pub(crate) fn report(
        &mut self,
        op: Op,
        flows: impl FnOnce() -> Vec<Flow>,
        awaits: Option<u64>,
    ) {
        if !self.reported {
            self.liveness.report_blocked(op, flows(), awaits);
            self.reported = true;
        }
    }

    /// The call moved.
    pub(crate) fn withdraw(&mut self) {
        if self.reported {
            self.liveness.report_moving();
            self.reported = false;
        }
    }
}

/// Each peer's traffic over `channels` and what the call waits for from it (`wants`).
pub(crate) fn flows(channels: &[Channel], wants: &[Interest]) -> Vec<Flow> {
    let mut flows: Vec<Flow> = Vec::new();
    for (ch, want) in channels.iter().zip(wants) {
        let i = match flows.iter().position(|f| f.peer == ch.peer) {
            Some(i) => i,
            None => {
                flows.push(Flow::new(ch.peer));
                flows.len() - 1
            }
        };
        let flow = &mut flows[i];
        flow.sent += ch.bytes_sent;
        flow.received += ch.bytes_received;
        flow.reading |= want.read;
        flow.writing |= want.write;
    }
    flows
}

impl Drop for BlockedReport<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// How long a send or receive waits, without progress, on a peer that has entered a direct
/// collective before it fails with `Mismatch`.
pub(crate) const PEER_AHEAD_GRACE: Duration = Duration::from_millis(250);

/// A peer that this call sends to or receives from, that it waits on, and that has entered a
/// direct collective this rank has not.
///
/// # Errors
/// Such a peer's stamp fails its checks (`Protocol`).
fn peer_in_a_collective(channels: &[Channel], exec: &Execution<'_>) -> Result<Option<usize>> {
    let plan = exec.plan;
    let used = |i: usize| plan.receives_on(i) || plan.transfers.iter().any(|t| t.tx == Some(i));
    for (i, (ch, want)) in channels.iter().zip(exec.wants()).enumerate() {
        if want.any() && used(i) && ch.peer_ahead(exec.call)? {
            return Ok(Some(ch.peer));
        }
    }
    Ok(None)
}

/// Whether the plan waits to receive from the peer of channel `i` on another channel.
fn awaits(plan: &Plan, channels: &[Channel], wants: &[Interest], i: usize) -> bool {
    let peer = channels[i].peer;
    (0..channels.len())
        .any(|j| j != i && wants[j].read && plan.receives_on(j) && channels[j].peer == peer)
}

/// When a peer closed a connection, the reason may be in another channel: a header that does
/// not match ours means a neighbour called something else (and the failure of its other
/// neighbour may have reached us first). Waits up to [`ROOT_CAUSE_GRACE`] for the peer headers
/// still expected, until each has arrived or its connection closed, and returns a mismatch.
fn root_cause(
    channels: &mut [Channel],
    liveness: &Liveness,
    headers: &mut [HeaderState],
    call: &Call,
) -> Option<Error> {
    let deadline = Instant::now() + ROOT_CAUSE_GRACE;
    let mut wants = vec![Interest::default(); channels.len()];
    loop {
        wants.fill(Interest::default());
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
    headers: &mut [HeaderState],
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
    headers: &mut [HeaderState],
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
            let mut consume = |bytes: &[u8]| -> usize {
                match step.merge {
                    Merge::Copy => {
                        copy(&mut output[dst_off..dst_off + bytes.len()], bytes);
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
    if hs.incoming.is_some() {
        receive_header(ch, hs, call)?;
        if hs.incoming.is_some() {
            return Ok(0);
        }
    }
    let peer = ch.peer;
    ch.try_recv(max, consume).map_err(|e| lost(e, peer, call))
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

pub(crate) fn lost(e: LinkError, peer: usize, call: &Call) -> Error {
    match e {
        LinkError::Closed(cause) => Error::PeerLost {
            rank: call.rank,
            peer,
            op: call.op,
            cause,
        },
        LinkError::Io(e) => Error::io(call.rank, format!("{} with rank {peer}", call.op), e),
        LinkError::Broken(detail) => Error::Protocol {
            rank: call.rank,
            peer,
            op: call.op,
            detail,
        },
    }
}

/// Arms every channel with an interest and, unless one is ready already, sleeps until one of
/// their descriptors fires or `limit` passes; then disarms them.
fn sleep(
    channels: &mut [Channel],
    liveness: &Liveness,
    wants: &[Interest],
    limit: Duration,
    call: &Call,
) -> Result<()> {
    sleep_also(channels, liveness, wants, None, limit, call)
}

/// [`sleep`], also woken when `also` is readable (with `also`, `wants` may be empty).
pub(crate) fn sleep_also(
    channels: &mut [Channel],
    liveness: &Liveness,
    wants: &[Interest],
    also: Option<BorrowedFd<'_>>,
    limit: Duration,
    call: &Call,
) -> Result<()> {
    let (armed, mut outcome) = match also.is_some() && !wants.iter().any(|w| w.any()) {
        true => (0, Ok(Readiness::Armed)),
        false => arm(channels, wants, call),
    };
    if let Ok(Readiness::Armed) = outcome {
        let mut fds: Vec<PollFd<'_>> =
            vec![PollFd::from_borrowed_fd(liveness.wake_fd(), PollFlags::IN)];
        fds.extend(also.map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)));
        for (ch, w) in channels.iter().zip(wants) {
            if w.any() {
                ch.link.wait_fds(*w, &mut fds);
            }
        }
        outcome = poll(&mut fds, liveness.sleep_limit(limit))
            .map(|_| Readiness::Armed)
            .map_err(|e| Error::io(call.rank, format!("{}: poll", call.op), e));
    }
    disarm(channels, wants, armed);
    outcome?;
    liveness.check_interrupt(call.op, call.interruptible)
}

/// Arms the channels with an interest in order, stopping at the first that is ready (or
/// fails). Returns how many were armed, to [`disarm`] later, and the outcome.
pub(crate) fn arm(
    channels: &mut [Channel],
    wants: &[Interest],
    call: &Call,
) -> (usize, Result<Readiness>) {
    let mut armed = 0;
    for (ch, w) in channels.iter_mut().zip(wants) {
        if !w.any() {
            continue;
        }
        armed += 1;
        match ch.link.arm(*w) {
            Ok(Readiness::Armed) => {}
            Ok(Readiness::Ready) => return (armed, Ok(Readiness::Ready)),
            Err(e) => return (armed, Err(lost(e, ch.peer, call))),
        }
    }
    if armed == 0 {
        // Every unfinished lane waits on a channel, so this cannot happen; fail rather than hang.
        let bug = std::io::Error::other("internal error: nothing to wait for");
        return (0, Err(Error::io(call.rank, call.op, bug)));
    }
    (armed, Ok(Readiness::Armed))
}

/// Disarms the first `armed` channels with an interest (those [`arm`] armed).
pub(crate) fn disarm(channels: &mut [Channel], wants: &[Interest], armed: usize) {
    let waited = channels.iter_mut().zip(wants).filter(|(_, w)| w.any());
    for (ch, _) in waited.take(armed) {
        ch.link.disarm();
    }
}
