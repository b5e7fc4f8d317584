//! The job's listener ([`JobListener`]): the TCP listener that `init`'s group set up with,
//! kept for the whole job. A thread admits whoever connects to it and parks the connection
//! until the call that needs it takes it: links made on first use, and the side channels and
//! links of sub-groups. Also dialling a rank's listener (`dial`), which start-up uses too.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::auth::{self, Admission, AuthError, Claim, Identity, Purpose};
use crate::error::{Error, Result};
use crate::os::{RetryDelay, accept_tcp, deadline_after, remaining};
use crate::transport::questions::{self, Answer, Answers};
use crate::transport::tcp::congestion;
use crate::transport::tcp::link::{MIN_STAGING, STAGING_PER_RANK, TcpLink};

/// TCP connections made after start-up: when a call first needs them (to a rank off the
/// ring), and those of sub-groups. The start-up listener stays open, and a thread
/// authenticates whoever connects to it and parks the connection until the call that needs it
/// takes it. So a rank that connects never waits for the other to reach its call; only the
/// data does. Ranks here are the job's (the group `init` made).
pub(crate) struct JobListener {
    /// This rank in the job.
    me: Identity,
    /// Every rank's listener, as it published it.
    addresses: Addresses,
    /// The listeners of ranks that joined the job later (`Group::grow`).
    joined: Mutex<HashMap<usize, SocketAddr>>,
    parked: Arc<Parked>,
    stop: Arc<AtomicBool>,
}

/// Each job rank's listener, as it published it (read when first dialled).
pub(crate) type Addresses = Box<dyn Fn(usize) -> Option<SocketAddr> + Send + Sync>;

/// Connections accepted and authenticated, by what their claims say, and when they came.
/// Lock order: `streams`, then `live`.
struct Parked {
    streams: Mutex<HashMap<Slot, (TcpStream, Instant)>>,
    /// The ids of the sub-groups alive in this process ([`JobListener::register`]).
    live: Mutex<HashSet<u64>>,
    /// How long a connection nobody takes is kept: the start-up timeout, within which the
    /// group it serves is formed (or has failed to form) here.
    kept_for: Duration,
    /// Why the thread stopped accepting, if it failed.
    failure: Mutex<Option<String>>,
    /// Signalled when a connection is parked or the thread fails.
    arrived: std::os::fd::OwnedFd,
    /// What the thread answers other ranks' questions and news from.
    answers: Answers,
}

/// The links [`establish`] opens: `outgoing[i][w]` is wire `w` to the i-th peer it connects
/// to, `incoming[i][w]` wire `w` from the i-th it accepts.
pub(crate) type Established = (Vec<Vec<TcpLink>>, Vec<Vec<TcpLink>>);

/// What a connection serves: its purpose, its group, the job's rank that opened it, its wire.
pub(crate) type Slot = (Purpose, u64, usize, usize);

/// Whether the job's listener takes a connection that claims `claim` (the job's ranks in it):
/// links made on first use, of any group; and a sub-group's side channel and links.
/// A process joining a group (`Group::grow`) has no job's rank yet: its claim's rank is a tag
/// of its own choosing, its size 0.
fn parks(claim: &Claim, me: &Identity) -> bool {
    match claim.purpose {
        Purpose::Late => claim.size == me.size && claim.rank != me.rank,
        Purpose::Side | Purpose::Data => {
            claim.group != 0 && claim.size == me.size && claim.rank != me.rank
        }
        Purpose::Join => claim.group != 0 && claim.size == 0,
        Purpose::Shm | Purpose::Ask | Purpose::Revoke => false,
    }
}

impl Parked {
    /// Closes what no one will take: the connections of a sub-group not alive here that are
    /// older than [`Parked::kept_for`] (its formation failed, or it was dropped), and a
    /// sub-group's start-up connections older than that (its formation is over). Links made
    /// on first use of a live group stay until its call takes them.
    fn purge(&self, streams: &mut HashMap<Slot, (TcpStream, Instant)>) {
        let Ok(live) = self.live.lock() else { return };
        streams.retain(|&(purpose, group, _, _), (_, at)| {
            let fresh = at.elapsed() < self.kept_for;
            let alive = group == 0 || live.contains(&group);
            fresh || (alive && purpose == Purpose::Late)
        });
    }
}

/// A sub-group's id, alive in this process until this is dropped ([`JobListener::register`]).
pub(crate) struct Registration {
    job: Arc<JobListener>,
    group: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let parked = &self.job.parked;
        if let Ok(mut live) = parked.live.lock() {
            live.remove(&self.group);
        }
        if let Ok(mut streams) = parked.streams.lock() {
            streams.retain(|&(_, group, _, _), _| group != self.group);
            parked.purge(&mut streams);
        }
    }
}

impl JobListener {
    /// Keeps `listener` for the job: a thread admits the connections made after start-up and
    /// parks them (see [`JobListener`]); one nobody takes is closed after `kept_for`.
    /// `addresses`: every rank's listener, as it published it.
    ///
    /// # Errors
    /// The thread that accepts them cannot start.
    pub(crate) fn start(
        listener: TcpListener,
        me: Identity,
        addresses: Addresses,
        kept_for: Duration,
    ) -> io::Result<Arc<JobListener>> {
        let parked = Arc::new(Parked {
            streams: Mutex::new(HashMap::new()),
            live: Mutex::new(HashSet::new()),
            kept_for,
            failure: Mutex::new(None),
            arrived: crate::os::event_counter()?,
            answers: Answers::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let rank = me.rank;
        let (me_, parked_, stop_) = (me.clone(), Arc::clone(&parked), Arc::clone(&stop));
        std::thread::Builder::new()
            .name(format!("jaccl-accept-{rank}"))
            .spawn(move || park_arrivals(&listener, &me_, &parked_, &stop_))?;
        Ok(Arc::new(JobListener {
            me,
            addresses,
            joined: Mutex::default(),
            parked,
            stop,
        }))
    }
}

impl Drop for JobListener {
    fn drop(&mut self) {
        // The thread notices within 100 ms and closes the listener.
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl JobListener {
    /// Marks sub-group `group` alive in this process until the registration is dropped, so
    /// that connections for it are kept until taken.
    ///
    /// # Errors
    /// A group with this id is alive in this process already: the connections of two groups
    /// with one id could cross.
    pub(crate) fn register(
        self: &Arc<JobListener>,
        group: u64,
    ) -> std::result::Result<Registration, String> {
        let mut live = self
            .parked
            .live
            .lock()
            .map_err(|_| "the registry of sub-groups is poisoned".to_string())?;
        if group == 0 || !live.insert(group) {
            return Err(format!(
                "a sub-group with id {group:016x} is alive in this process already"
            ));
        }
        Ok(Registration {
            job: Arc::clone(self),
            group,
        })
    }

    /// Opens wire `wire` of group `group` to the job's rank `peer` (which takes it with
    /// [`JobListener::take`]), until `deadline`; `go_on` is asked at least every second whether to
    /// keep trying.
    ///
    /// # Errors
    /// The peer published no address, the connection could not be made or was refused, or
    /// `go_on`'s error.
    pub(crate) fn open(
        &self,
        group: u64,
        peer: usize,
        wire: usize,
        deadline: Instant,
        go_on: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<TcpLink, DialError> {
        let stream = self.dial(Purpose::Late, group, peer, wire, deadline, go_on)?;
        late_link(stream).map_err(|e| DialError::Failed(format!("configuring it: {e}")))
    }

    /// Opens and authenticates a connection for `purpose`, wire `wire` of group `group`, to
    /// the job's rank `peer`, until `deadline` (see [`JobListener::open`]).
    ///
    /// # Errors
    /// As [`JobListener::open`].
    pub(crate) fn dial(
        &self,
        purpose: Purpose,
        group: u64,
        peer: usize,
        wire: usize,
        deadline: Instant,
        go_on: &mut dyn FnMut() -> Result<()>,
    ) -> std::result::Result<TcpStream, DialError> {
        let addr = self
            .address(peer)
            .ok_or_else(|| DialError::Failed(format!("rank {peer} published no TCP address")))?;
        let claim = Claim {
            purpose,
            rank: self.me.rank,
            size: self.me.size,
            wire,
            group,
        };
        dial(&self.me, peer, addr, claim, deadline, go_on)
    }

    /// Opens and authenticates a connection for `purpose` of group `group` to the job's rank
    /// `peer` in one attempt, within `within`: for a peer known to be listening, where a
    /// refusal means it has just died (the caller asks again rather than retrying).
    ///
    /// # Errors
    /// Why the connection could not be made.
    pub(crate) fn dial_once(
        &self,
        purpose: Purpose,
        group: u64,
        peer: usize,
        within: Duration,
    ) -> std::result::Result<TcpStream, String> {
        let addr = self
            .address(peer)
            .ok_or_else(|| format!("rank {peer} published no TCP address"))?;
        let mut stream = congestion::connect(addr, within).map_err(|e| e.to_string())?;
        let claim = Claim {
            purpose,
            rank: self.me.rank,
            size: self.me.size,
            wire: 0,
            group,
        };
        auth::connect(&mut stream, &self.me.token, claim, deadline_after(within))
            .map_err(|e| e.to_string())?;
        Ok(stream)
    }

    /// The connection the job's rank `peer` opened for wire `wire` of group `group`, if it has
    /// arrived.
    ///
    /// # Errors
    /// Why the thread that accepts connections stopped, or the link could not be configured.
    pub(crate) fn take(
        &self,
        group: u64,
        peer: usize,
        wire: usize,
    ) -> std::result::Result<Option<TcpLink>, String> {
        let stream = self.take_parked((Purpose::Late, group, peer, wire))?;
        stream
            .map(late_link)
            .transpose()
            .map_err(|e| format!("configuring the connection from rank {peer}: {e}"))
    }

    /// The connection parked for `slot`, if it has arrived.
    ///
    /// # Errors
    /// Why the thread that accepts connections stopped.
    pub(crate) fn take_parked(&self, slot: Slot) -> std::result::Result<Option<TcpStream>, String> {
        let stream = match self.parked.streams.lock() {
            Ok(mut streams) => {
                self.parked.purge(&mut streams);
                streams.remove(&slot).map(|(stream, _)| stream)
            }
            Err(_) => None,
        };
        match stream {
            Some(stream) => Ok(Some(stream)),
            None => self.nothing_yet(),
        }
    }

    /// `Ok(None)`, having drained the arrivals' signal, unless the accepting thread failed.
    fn nothing_yet(&self) -> std::result::Result<Option<TcpStream>, String> {
        crate::os::drain(&self.parked.arrived);
        match self.parked.failure.lock().ok().and_then(|f| f.clone()) {
            Some(why) => Err(format!("this rank no longer accepts connections: {why}")),
            None => Ok(None),
        }
    }

    /// Waits until the connections of every slot of `slots` have arrived, or `deadline`,
    /// asking `go_on` at least every tenth of a second.
    ///
    /// # Errors
    /// The deadline passed (naming the ranks that did not connect), the thread that accepts
    /// connections stopped, or `go_on`'s error.
    pub(crate) fn collect(
        &self,
        slots: &[Slot],
        deadline: Instant,
        go_on: &(dyn Fn() -> Result<()> + Send + Sync),
    ) -> Result<Vec<TcpStream>> {
        let rank = self.me.rank;
        let mut got: Vec<Option<TcpStream>> = slots.iter().map(|_| None).collect();
        loop {
            for (stream, slot) in got.iter_mut().zip(slots).filter(|(s, _)| s.is_none()) {
                *stream = self
                    .take_parked(*slot)
                    .map_err(|why| Error::Bootstrap(format!("rank {rank}: {why}")))?;
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let absent: Vec<String> = got
                    .iter()
                    .zip(slots)
                    .filter(|(s, _)| s.is_none())
                    .map(|(_, (_, _, peer, wire))| format!("rank {peer} (wire {wire})"))
                    .collect();
                return Err(Error::Bootstrap(format!(
                    "rank {rank}: timed out waiting for connections from {} (of the job's \
                     ranks)",
                    absent.join(", ")
                )));
            }
            go_on()?;
            let mut fds = [PollFd::from_borrowed_fd(self.arrivals(), PollFlags::IN)];
            crate::os::poll(&mut fds, left.min(Duration::from_millis(100)))
                .map_err(|e| Error::io(rank, "waiting for connections", e))?;
        }
    }

    /// The links of a sub-group `group` (see [`establish`]), through this listener: `wires`
    /// connections to each `(peer, address, wires)` of `connect_to` and from each `(peer,
    /// wires)` of `accept_from`, peers being the sub-group's ranks (the job's `job_rank[peer]`).
    pub(crate) fn establish(
        &self,
        group: u64,
        job_rank: &[usize],
        connect_to: &[(usize, SocketAddr, usize)],
        accept_from: &[(usize, usize)],
        deadline: Instant,
        go_on: &(dyn Fn() -> Result<()> + Send + Sync),
    ) -> Result<Established> {
        let rank = self.me.rank;
        let job = |peer: usize| job_rank.get(peer).copied().unwrap_or(usize::MAX);
        let outgoing = connect_to
            .iter()
            .map(|&(peer, _, wires)| {
                (0..wires)
                    .map(|wire| {
                        self.dial(Purpose::Data, group, job(peer), wire, deadline, &mut || {
                            go_on()
                        })
                        .map_err(|e| match e {
                            DialError::Stopped(e) => e,
                            DialError::Failed(why) => {
                                Error::Bootstrap(format!("rank {rank}: {why}"))
                            }
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let slots: Vec<Slot> = accept_from
            .iter()
            .flat_map(|&(peer, wires)| {
                (0..wires).map(move |w| (Purpose::Data, group, job(peer), w))
            })
            .collect();
        let mut arrived = self.collect(&slots, deadline, go_on)?.into_iter();
        let incoming = accept_from
            .iter()
            .map(|&(_, wires)| arrived.by_ref().take(wires).collect())
            .collect();
        links(outgoing, incoming, connect_to, accept_from, &self.me)
    }

    /// What this process answers the other ranks' questions and news from.
    pub(crate) fn answers(&self) -> &Answers {
        &self.parked.answers
    }

    /// Asks the job's rank `peer` what it knows of agreement `id`, within `within`
    /// ([`questions::ask`]).
    pub(crate) fn ask(&self, peer: usize, id: u64, within: Duration) -> Answer {
        match self.address(peer) {
            Some(addr) => questions::ask(&self.me, peer, addr, id, within),
            None => Answer::Silent,
        }
    }

    /// Tells the job's ranks `peers`, from another thread, that this rank revoked group
    /// `group` ([`questions::tell_revoked`]).
    pub(crate) fn tell_revoked(&self, peers: &[usize], group: u64, within: Duration) {
        let peers = peers
            .iter()
            .filter_map(|&p| Some((p, self.address(p)?)))
            .collect();
        questions::tell_revoked(&self.me, peers, group, within);
    }

    /// This rank's address, as it published it.
    pub(crate) fn own_address(&self) -> Option<SocketAddr> {
        self.address(self.me.rank)
    }

    /// The listener of the job's rank `peer`: as it published it at start-up, or as the group
    /// it joined told ([`JobListener::learn`]).
    pub(crate) fn address(&self, peer: usize) -> Option<SocketAddr> {
        (self.addresses)(peer).or_else(|| {
            let joined = self.joined.lock().ok()?;
            joined.get(&peer).copied()
        })
    }

    /// Learns the listener of the job's rank `peer`, which joined the job after start-up.
    ///
    /// # Errors
    /// The rank has another address already (two processes given one job's rank).
    pub(crate) fn learn(&self, peer: usize, addr: SocketAddr) -> std::result::Result<(), String> {
        if let Some(known) = (self.addresses)(peer).filter(|&known| known != addr) {
            return Err(format!(
                "the job's rank {peer} is at {known}, not at {addr}"
            ));
        }
        let mut joined = self
            .joined
            .lock()
            .map_err(|_| "the table of joined ranks is poisoned".to_string())?;
        match joined.get(&peer) {
            Some(&known) if known != addr => Err(format!(
                "the job's rank {peer} is at {known}, not at {addr}"
            )),
            _ => {
                joined.insert(peer, addr);
                Ok(())
            }
        }
    }

    /// This rank in the job, and the job's size at start-up (which every claim carries).
    pub(crate) fn identity(&self) -> &Identity {
        &self.me
    }

    /// The oldest connection parked for `purpose` in group `group`, from any rank, if one
    /// has arrived.
    ///
    /// # Errors
    /// Why the thread that accepts connections stopped.
    pub(crate) fn take_oldest(
        &self,
        purpose: Purpose,
        group: u64,
    ) -> std::result::Result<Option<TcpStream>, String> {
        let oldest = self.parked.streams.lock().ok().and_then(|mut streams| {
            self.parked.purge(&mut streams);
            let slot = streams
                .iter()
                .filter(|((p, g, _, _), _)| (*p, *g) == (purpose, group))
                .min_by_key(|(_, (_, at))| *at)
                .map(|(slot, _)| *slot)?;
            streams.remove(&slot).map(|(stream, _)| stream)
        });
        match oldest {
            Some(stream) => Ok(Some(stream)),
            None => self.nothing_yet(),
        }
    }

    /// Readable when a connection may have arrived (see [`JobListener::take`]).
    pub(crate) fn arrivals(&self) -> std::os::fd::BorrowedFd<'_> {
        self.parked.arrived.as_fd()
    }
}

fn late_link(stream: TcpStream) -> io::Result<TcpLink> {
    TcpLink::new(stream, STAGING_PER_RANK / 2)
}

/// The accepting thread of [`JobListener`]: admits authenticated connections of this job that
/// claim a late link from another rank, and parks them, until `stop`; every tenth of a second
/// it closes those nobody will take ([`Parked::purge`]).
fn park_arrivals(listener: &TcpListener, me: &Identity, parked: &Parked, stop: &AtomicBool) {
    let forever = deadline_after(Duration::MAX);
    let tick = || {
        if let Ok(mut streams) = parked.streams.lock() {
            parked.purge(&mut streams);
        }
        stop.load(Ordering::Relaxed)
    };
    let served = auth::serve(
        listener.as_fd(),
        || accept_tcp(listener),
        &me.token,
        me.rank,
        forever,
        Some(&tick),
        |claim, mut stream| {
            if matches!(claim.purpose, Purpose::Ask | Purpose::Revoke) {
                if claim.size == me.size {
                    parked.answers.serve(&claim, stream);
                }
                return Ok(Admission::More);
            }
            let reply_by = deadline_after(auth::HANDSHAKE_TIMEOUT);
            let fits = parks(&claim, me);
            let Ok(mut streams) = parked.streams.lock() else {
                return Ok(Admission::Done);
            };
            let key = (claim.purpose, claim.group, claim.rank, claim.wire);
            parked.purge(&mut streams);
            if !fits || streams.contains_key(&key) {
                let why = format!(
                    "not expecting {:?} from rank {} (wire {}, group {:x}) here",
                    claim.purpose, claim.rank, claim.wire, claim.group
                );
                tracing::warn!(rank = me.rank, %why, "refused a data connection");
                let _ = auth::verdict(&mut stream, Err(&why), reply_by);
            } else if auth::verdict(&mut stream, Ok(()), reply_by).is_ok() {
                streams.insert(key, (stream, Instant::now()));
                crate::os::signal(&parked.arrived);
            }
            Ok(Admission::More)
        },
    );
    if let Err(e) = served {
        tracing::warn!(rank = me.rank, error = %e, "stopped accepting late connections");
        if let Ok(mut failure) = parked.failure.lock() {
            *failure = Some(e.to_string());
        }
        crate::os::signal(&parked.arrived);
    }
}

/// The links over the streams of [`establish`], each receiving through its share of this
/// rank's staging: each wire of each neighbour receives for one lane in each direction.
pub(crate) fn links(
    outgoing: Vec<Vec<TcpStream>>,
    incoming: Vec<Vec<TcpStream>>,
    connect_to: &[(usize, SocketAddr, usize)],
    accept_from: &[(usize, usize)],
    me: &Identity,
) -> Result<Established> {
    let wires = connect_to.iter().map(|c| c.2);
    let wires = wires.chain(accept_from.iter().map(|a| a.1)).max();
    let staging = (STAGING_PER_RANK / (2 * wires.unwrap_or(1).max(1))).max(MIN_STAGING);
    let to_links = |streams: Vec<Vec<TcpStream>>| -> Result<Vec<Vec<TcpLink>>> {
        streams
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|s| TcpLink::new(s, staging))
                    .collect::<io::Result<_>>()
            })
            .collect::<io::Result<_>>()
            .map_err(|e| Error::io(me.rank, "configuring a data connection", e))
    };
    Ok((to_links(outgoing)?, to_links(incoming)?))
}

/// Opens and authenticates one connection for `claim` to `peer` at `addr`, retrying while
/// the peer is not listening yet or a handshake fails on the way, until `deadline`; between
/// attempts `go_on` may end the wait with its own error.
pub(crate) fn dial(
    me: &Identity,
    peer: usize,
    addr: SocketAddr,
    claim: Claim,
    deadline: Instant,
    go_on: &mut dyn FnMut() -> Result<()>,
) -> std::result::Result<TcpStream, DialError> {
    let wire = claim.wire;
    let what =
        |e: &dyn std::fmt::Display| format!("data connection {wire} to rank {peer} at {addr}: {e}");
    let mut delay = RetryDelay::new();
    loop {
        let left = remaining(deadline);
        let attempt = match left.is_zero() {
            true => Err(io::Error::new(io::ErrorKind::TimedOut, "no time left")),
            false => congestion::connect(addr, left.min(Duration::from_secs(1))),
        };
        let mut stream = match attempt {
            Ok(stream) => stream,
            Err(e) if Instant::now() >= deadline => {
                return Err(DialError::Failed(format!("cannot open {}", what(&e))));
            }
            Err(_) => {
                // Refused: the peer is not listening yet, or its process ended, which `go_on`
                // (the heartbeat's verdict) tells at once; so it is asked after every attempt,
                // and attempts back off to a tenth of a second at most.
                go_on().map_err(DialError::Stopped)?;
                std::thread::sleep(delay.next().min(LOOK_AGAIN).min(remaining(deadline)));
                continue;
            }
        };
        // A peer whose process is stopped still has its kernel accept: the handshake is
        // bounded, and its waits ask `go_on` (liveness, interrupt, close) as every wait does.
        let handshake_by = deadline.min(deadline_after(auth::HANDSHAKE_TIMEOUT));
        let mut heeding = Heeding {
            stream: &mut stream,
            go_on: &mut *go_on,
            stopped: None,
        };
        let shaken = auth::connect(&mut heeding, &me.token, claim, handshake_by);
        if let Some(e) = heeding.stopped {
            return Err(DialError::Stopped(e));
        }
        match shaken {
            Ok(()) => return Ok(stream),
            Err(e @ (AuthError::Unknown | AuthError::Refused(_))) => {
                return Err(DialError::Failed(what(&e)));
            }
            Err(e @ AuthError::Failed(_)) => {
                if !delay.pause(deadline) {
                    return Err(DialError::Failed(what(&e)));
                }
                go_on().map_err(DialError::Stopped)?;
            }
        }
    }
}

/// A dialled stream during its handshake: reads wait in slices of at most [`LOOK_AGAIN`] and
/// ask `go_on` between them, so that a verdict of the heartbeat, an interrupt or the group's
/// closing ends the wait (`stopped` keeps the error).
struct Heeding<'a> {
    stream: &'a mut TcpStream,
    go_on: &'a mut dyn FnMut() -> Result<()>,
    stopped: Option<Error>,
}

/// The longest a handshake's read waits before it asks `go_on` again.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

impl auth::Messages for Heeding<'_> {
    fn send(&mut self, bytes: &[u8], deadline: Instant) -> io::Result<()> {
        // Handshake messages are far smaller than a socket buffer: this does not wait.
        auth::Messages::send(self.stream, bytes, deadline)
    }

    fn recv(&mut self, len: usize, deadline: Instant) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let slice = crate::os::time_left(deadline)?.min(LOOK_AGAIN);
            if !crate::os::wait_readable(self.stream.as_fd(), slice)? {
                if let Err(e) = (self.go_on)() {
                    self.stopped = Some(e);
                    return Err(io::Error::other("stopped"));
                }
                continue;
            }
            // Readable: data or the end of the stream, so this read does not wait.
            match io::Read::read(self.stream, &mut b[got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(b)
    }
}

/// Why [`dial`] gave up.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The connection could not be made or was refused, and why.
    Failed(String),
    /// The caller's `go_on` said stop.
    Stopped(Error),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Failed(why) => f.write_str(why),
            DialError::Stopped(e) => write!(f, "{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks' job listeners on loopback, whose connections nobody takes are kept for
    /// `kept_for`.
    fn two_listeners(kept_for: Duration) -> [Arc<JobListener>; 2] {
        let token = crate::JobToken::new("a token of sixteen bytes").unwrap();
        let listeners =
            [0, 1].map(|_| crate::os::listen_tcp("127.0.0.1:0".parse().unwrap()).unwrap());
        let addresses: Vec<_> = listeners.iter().map(|l| l.local_addr().ok()).collect();
        let mut rank = 0;
        listeners.map(|listener| {
            let me = Identity {
                rank,
                size: 2,
                token: token.clone(),
            };
            rank += 1;
            let addresses = addresses.clone();
            let addresses = Box::new(move |r: usize| addresses.get(r).copied().flatten());
            JobListener::start(listener, me, addresses, kept_for).unwrap()
        })
    }

    #[test]
    fn a_live_group_id_is_refused_until_its_group_is_dropped() {
        let [job, _] = two_listeners(Duration::from_secs(60));
        let first = job.register(5).unwrap();
        assert!(job.register(5).err().unwrap().contains("alive"));
        assert!(job.register(0).is_err(), "the job's own group");
        let other = job.register(6).unwrap();
        drop(first);
        let _again = job.register(5).unwrap();
        drop(other);
    }

    #[test]
    fn connections_nobody_takes_are_closed_after_the_start_up_timeout() {
        let [zero, one] = two_listeners(Duration::from_millis(300));
        let _live = zero.register(7).unwrap();
        let deadline = deadline_after(Duration::from_secs(10));
        // Rank 1 opens: a start-up connection of a group that is not alive at rank 0 (its
        // formation failed there, say), and a link made on first use of one that is.
        let slots = [(Purpose::Data, 9), (Purpose::Late, 7)];
        for (purpose, group) in slots {
            one.dial(purpose, group, 0, 0, deadline, &mut || Ok(()))
                .unwrap();
        }
        // The accepting thread closes the stale start-up connection by itself (nothing else
        // happens here); the live group's stays.
        let parked = |slot: (Purpose, u64)| {
            let streams = zero.parked.streams.lock().unwrap();
            streams.keys().any(|&(p, g, _, _)| (p, g) == slot)
        };
        while !parked(slots[1]) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let given_up = deadline_after(Duration::from_secs(30));
        while parked(slots[0]) {
            assert!(
                Instant::now() < given_up,
                "the stale connection was never closed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(zero.take(7, 1, 0).unwrap().is_some());
    }
}
