//! The heartbeat threads: the coordinator's over every member, and each member's over its
//! connection to the coordinator.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::deadlock::{DeadlockWatch, Member};
use super::message::{Goodbye, Message, decode};
use super::{Blocked, Liveness, Verdict, interval};
use crate::os::{event_counter, poll, signal};

/// The heartbeat thread of one rank; dropping it says goodbye and stops it.
pub(crate) struct Heartbeat {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        signal(&*self.stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the heartbeat of a coordinator over its `members` (rank i + 1 at index i).
pub(crate) fn coordinate(
    members: Vec<TcpStream>,
    window: Duration,
    liveness: Arc<Liveness>,
) -> io::Result<Heartbeat> {
    let peers = members
        .into_iter()
        .enumerate()
        .map(|(i, s)| Peer::new(s, i + 1))
        .collect::<io::Result<Vec<_>>>()?;
    let mut coordinator = Coordinator {
        peers,
        window,
        watch: DeadlockWatch::default(),
        announced: false,
        linger: None,
    };
    start(liveness, move |live, stop| coordinator.run(live, stop))
}

/// The coordinator's side of the heartbeat.
struct Coordinator {
    /// Every member; those still `watched` are in the group and answer.
    peers: Vec<Peer>,
    window: Duration,
    watch: DeadlockWatch,
    /// Whether the members have heard that this rank left the group (its group failed, or
    /// it was dropped).
    announced: bool,
    /// Dropped: until when to go on passing news (see [`LINGER`]).
    linger: Option<Instant>,
}

impl Coordinator {
    fn run(&mut self, live: &Liveness, stop: &OwnedFd) {
        let tick = interval(self.window);
        let mut next = Instant::now();
        loop {
            let now = Instant::now();
            let ticked = now >= next;
            if ticked {
                next = now + tick;
                self.declare_the_silent(live, now);
                self.tell_all(&Message::Status {
                    round: self.watch.round,
                    verdict: live.verdict(),
                });
            }
            if self.wait(live, stop, now, next) {
                // A group closed in good health has no news to pass on: leave at once (a
                // close does not wait for the members' own).
                let linger = match live.verdict() {
                    Some(_) => LINGER,
                    None => Duration::ZERO,
                };
                self.linger = Some(Instant::now() + linger);
            }
            let (known, round) = (live.verdict().is_some(), self.watch.round);
            self.pass_on_departures(live);
            if !known && (ticked || self.watch.suspects()) {
                let own = live.blocked();
                let reports = self.peers.iter().map(Peer::as_member);
                if let Some(detail) = self.watch.update(own.as_ref(), reports, ticked) {
                    live.declare(Verdict::Deadlock { detail });
                }
            }
            if (!known && live.verdict().is_some()) || self.watch.round != round {
                next = Instant::now(); // tell everyone now
            }
            if let Some(until) = self.linger
                && (Instant::now() >= until || self.peers.iter().all(|p| !p.watched))
            {
                return self.leave(live.goodbye());
            }
        }
    }

    /// Members silent for longer than the window are lost.
    fn declare_the_silent(&mut self, live: &Liveness, now: Instant) {
        for p in self.peers.iter_mut().filter(|p| p.watched) {
            if now.duration_since(p.heard) > self.window {
                live.declare(Verdict::Lost {
                    peer: p.rank,
                    why: silent(&live.name(p.rank), self.window),
                });
                p.watched = false;
            }
        }
    }

    /// Sleeps until a member speaks, this rank's group fails, the group is dropped (the
    /// answer: true) or `next`.
    fn wait(&self, live: &Liveness, stop: &OwnedFd, now: Instant, next: Instant) -> bool {
        let unless = |done: bool| {
            if done {
                PollFlags::empty()
            } else {
                PollFlags::IN
            }
        };
        let mut fds: Vec<PollFd<'_>> = vec![
            PollFd::new(stop, unless(self.linger.is_some())),
            PollFd::new(&live.failed, unless(self.announced)),
        ];
        fds.extend(self.peers.iter().filter(|p| p.watched).map(|p| p.poll()));
        let until = self.linger.map_or(next, |l| l.min(next));
        let _ = poll(&mut fds, until.saturating_duration_since(now));
        fds[0].revents().contains(PollFlags::IN)
    }

    /// Reads the members, and passes every departure on to the others: their goodbyes, and
    /// this rank's own (its failure, or its drop). A member whose connection ends without one
    /// is lost.
    fn pass_on_departures(&mut self, live: &Liveness) {
        let mut left = Vec::new();
        let goodbye = live.goodbye();
        if !self.announced && (goodbye.farewell.is_some() || self.linger.is_some()) {
            self.announced = true;
            left.push((0, goodbye));
        }
        for p in self.peers.iter_mut().filter(|p| p.watched) {
            let heard = p.receive();
            for message in heard.messages {
                match message {
                    Message::Beat(report) => p.report = report,
                    Message::Bye(goodbye) => {
                        // The member closes once its stream ends (see `say_goodbye`).
                        let _ = p.stream.shutdown(Shutdown::Write);
                        p.watched = false;
                        p.left = true;
                        left.push((p.rank, goodbye));
                    }
                    Message::Status { .. } | Message::Gone { .. } => {}
                }
            }
            if heard.gone && p.watched {
                live.declare(Verdict::Lost {
                    peer: p.rank,
                    why: gone(live, p.rank),
                });
                p.watched = false;
            }
        }
        for (rank, goodbye) in left {
            if rank != 0 {
                live.depart(rank, goodbye.clone());
            }
            self.tell_all(&Message::Gone { rank, goodbye });
        }
    }

    /// Sends `message` to every member still in the group.
    fn tell_all(&mut self, message: &Message) {
        for p in self.peers.iter_mut().filter(|p| p.watched) {
            // A failed socket shows as the member's end of stream in `receive`.
            let _ = p.send(message);
        }
    }

    /// Says goodbye to every member still in the group.
    fn leave(&mut self, goodbye: Goodbye) {
        say_goodbye(self.peers.iter_mut().filter(|p| p.watched), &goodbye);
    }
}

/// How long a coordinator whose group failed, once dropped, goes on passing news between the
/// members before it leaves: until every member has left, at most this long. A member that
/// fails because its neighbour did (each fails when its neighbour does) then learns the first
/// cause at once; without it, it could name only a closed connection, after the grace of a
/// failed call.
const LINGER: Duration = Duration::from_millis(500);

/// Starts the heartbeat of a member over its side-channel `stream` to rank 0.
pub(crate) fn attend(
    stream: TcpStream,
    window: Duration,
    liveness: Arc<Liveness>,
) -> io::Result<Heartbeat> {
    let mut coordinator = Peer::new(stream, 0)?;
    start(liveness, move |live, stop| {
        let tick = interval(window);
        let mut next = Instant::now();
        // The latest round of the coordinator's deadlock search.
        let mut round = 0;
        loop {
            let now = Instant::now();
            if now >= next {
                next = now + tick;
                let report = live.blocked().map(|b| (round, b));
                // A failed socket shows as rank 0's end of stream in `receive`.
                let _ = coordinator.send(&Message::Beat(report));
            }
            if now.duration_since(coordinator.heard) > window {
                live.declare(Verdict::Lost {
                    peer: 0,
                    why: silent(&live.name(0), window),
                });
                return;
            }
            let stopped = {
                let mut fds = [
                    PollFd::new(stop, PollFlags::IN),
                    PollFd::new(&live.failed, PollFlags::IN),
                    coordinator.poll(),
                ];
                let _ = poll(&mut fds, next.saturating_duration_since(now));
                fds[0].revents().contains(PollFlags::IN)
            };
            // A member whose group failed says why and leaves.
            let goodbye = live.goodbye();
            if stopped || goodbye.farewell.is_some() {
                say_goodbye([&mut coordinator], &goodbye);
                return;
            }
            let heard = coordinator.receive();
            for message in heard.messages {
                match message {
                    Message::Status {
                        round: latest,
                        verdict,
                    } => {
                        if latest != round {
                            // A deadlock is suspected: report again, from now.
                            round = latest;
                            next = Instant::now();
                        }
                        if let Some(v) = verdict {
                            live.declare(v);
                        }
                    }
                    Message::Gone { rank, goodbye } => live.depart(rank, goodbye),
                    // Rank 0 left the group: nothing more to watch.
                    Message::Bye(goodbye) => {
                        live.coordinator_left(goodbye);
                        return;
                    }
                    Message::Beat(_) => {}
                }
            }
            if heard.gone {
                live.declare(Verdict::Lost {
                    peer: 0,
                    why: gone(live, 0),
                });
                return;
            }
        }
    })
}

/// Says goodbye to `peers` and closes their connections cleanly, within [`GOODBYE_WITHIN`].
///
/// Closing a socket with unread bytes resets the connection, and the reset throws away what
/// this side's kernel has not sent yet, the goodbye too. So each goodbye is followed by the
/// end of the stream, and the sockets close once the peers' ends have come (a rank that reads
/// a goodbye ends its side) or the deadline passed, with everything read.
fn say_goodbye<'a>(peers: impl IntoIterator<Item = &'a mut Peer>, goodbye: &Goodbye) {
    let deadline = Instant::now() + GOODBYE_WITHIN;
    let mut open: Vec<&mut Peer> = peers.into_iter().collect();
    for p in &mut open {
        p.start_goodbye(goodbye, deadline);
    }
    loop {
        open.retain_mut(|p| !p.drain());
        let left = deadline.saturating_duration_since(Instant::now());
        if open.is_empty() || left.is_zero() {
            return;
        }
        let mut fds: Vec<PollFd<'_>> = open.iter().map(|p| p.poll()).collect();
        let _ = poll(&mut fds, left);
    }
}

fn start(
    liveness: Arc<Liveness>,
    run: impl FnOnce(&Liveness, &OwnedFd) + Send + 'static,
) -> io::Result<Heartbeat> {
    let stop = Arc::new(event_counter()?);
    let stop_fd = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(format!("jaccl-heartbeat-{}", liveness.rank))
        .spawn(move || run(&liveness, &stop_fd))?;
    Ok(Heartbeat {
        stop,
        thread: Some(thread),
    })
}

fn silent(rank: &str, window: Duration) -> String {
    format!(
        "{rank} has been silent for {window:?} (stopped, hung, or its host or network is \
         gone; see Config::liveness / JACCL_LIVENESS)"
    )
}

fn gone(live: &Liveness, rank: usize) -> String {
    match rank {
        0 => format!(
            "{}'s process ended or this rank's connection to it was lost",
            live.name(0)
        ),
        _ => format!(
            "{}'s process ended or its connection to {} (the heartbeat's hub) was lost",
            live.name(rank),
            live.name(0)
        ),
    }
}

/// What a peer said since last time.
struct Heard {
    messages: Vec<Message>,
    /// The stream ended, failed, or carried bytes that are not ours.
    gone: bool,
}

/// One side-channel connection as the heartbeat sees it: framed messages, non-blocking.
struct Peer {
    stream: TcpStream,
    rank: usize,
    buf: Vec<u8>,
    /// The part of a message the socket did not take yet.
    outbox: Vec<u8>,
    heard: Instant,
    watched: bool,
    /// The report of the member's latest beat (at the coordinator).
    report: Option<(u32, Blocked)>,
    /// It said goodbye (at the coordinator).
    left: bool,
}

/// How long a goodbye may wait for the socket to take it.
const GOODBYE_WITHIN: Duration = Duration::from_millis(100);

impl Peer {
    fn new(stream: TcpStream, rank: usize) -> io::Result<Peer> {
        stream.set_nonblocking(true)?;
        // Each message goes out at once: Nagle's algorithm would hold one back until the last
        // is acknowledged (up to the peer's delayed-ACK time), and a goodbye held back is lost
        // when the socket closes.
        stream.set_nodelay(true)?;
        Ok(Peer {
            stream,
            rank,
            buf: Vec::new(),
            outbox: Vec::new(),
            heard: Instant::now(),
            watched: true,
            report: None,
            left: false,
        })
    }

    /// The member as the deadlock search sees it.
    fn as_member(&self) -> Member<'_> {
        match &self.report {
            _ if self.left => Member::Left,
            Some((round, b)) if self.watched => Member::Blocked(*round, b),
            _ => Member::Moving,
        }
    }

    fn poll(&self) -> PollFd<'_> {
        PollFd::new(&self.stream, PollFlags::IN)
    }

    /// Sends `message` as far as the socket takes it now. A message is queued only once the
    /// earlier ones are out, so a peer too slow to read misses whole messages (it is found by
    /// its own silence), never parts of one.
    ///
    /// # Errors
    /// The socket failed (the peer is gone).
    fn send(&mut self, message: &Message) -> io::Result<()> {
        self.flush()?;
        if self.outbox.is_empty() {
            self.outbox = message.framed();
            self.flush()?;
        }
        Ok(())
    }

    /// Writes as much of the outbox as the socket takes now.
    ///
    /// # Errors
    /// The socket failed (the peer is gone); a full socket is not an error.
    fn flush(&mut self) -> io::Result<()> {
        while !self.outbox.is_empty() {
            match self.stream.write(&self.outbox) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.outbox.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends a goodbye and then the end of this side's stream, waiting up to `deadline` for
    /// the socket to take them (without the goodbye the peer would take this rank's leaving
    /// for a death). A peer already gone needs none: polling its failed socket would return
    /// at once, over and over, until the deadline.
    fn start_goodbye(&mut self, goodbye: &Goodbye, deadline: Instant) {
        let mut said = false;
        loop {
            if self.flush().is_err() {
                return;
            }
            if self.outbox.is_empty() {
                if said {
                    let _ = self.stream.shutdown(Shutdown::Write);
                    return;
                }
                if self.send(&Message::Bye(goodbye.clone())).is_err() {
                    return;
                }
                said = true;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
            let _ = poll(&mut fds, left);
        }
    }

    /// Reads and drops what arrives until the stream ends or fails. False: it goes on.
    fn drain(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => return true,
            }
        }
    }

    /// Reads what arrived: the complete messages, and whether the stream is gone (messages
    /// before its end still count: a goodbye, or a verdict).
    fn receive(&mut self) -> Heard {
        let mut chunk = [0u8; 4096];
        let mut gone = false;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        let messages = match decode(&mut self.buf) {
            Ok(messages) => messages,
            Err(_) => {
                gone = true;
                Vec::new()
            }
        };
        if !messages.is_empty() {
            self.heard = Instant::now();
        }
        Heard { messages, gone }
    }
}
