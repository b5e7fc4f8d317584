//! Liveness: a heartbeat between the ranks through the side channel, from a thread that beats
//! while the application computes.
//!
//! Every member sends a beat to the coordinator (rank 0) every [`interval`]; the coordinator
//! answers each interval with a status that carries its verdict, if it has one. A member that
//! stays silent for the liveness window (its process is stopped or hung, or its host or link is
//! gone), or whose connection ends without a goodbye (it died), is declared lost by the
//! coordinator, which tells every rank at once; a coordinator that stays silent is declared
//! lost by every member. So every rank names the same rank, within the window plus an
//! interval, whatever the transport. A rank that is only busy in its own code keeps beating.
//!
//! Operations look at the verdict whenever they would wait, and sleeps wake when it arrives
//! ([`Liveness::wake_fd`]). The same object carries the caller's interrupt check
//! ([`crate::Group::interrupt_when`]), which sleeping operations consult.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::error::{Error, Op};
use crate::wire::{to_u32, u32_at};

/// What this rank knows about the others, shared by the heartbeat thread and the operations.
pub(crate) struct Liveness {
    rank: usize,
    /// Set once a verdict is in (checked on every wait: one load).
    lost: AtomicBool,
    verdict: Mutex<Option<(usize, String)>>,
    /// Readable once a verdict is in, so that sleeping operations wake.
    wake: OwnedFd,
    /// Asked after each sleep (sleeps then last at most [`INTERRUPT_EVERY`]).
    interrupt: Mutex<Option<InterruptCheck>>,
}

/// A check that says whether the caller wants the current operation to stop (for example, the
/// Python bindings answer whether Ctrl-C was pressed). See [`crate::Group::interrupt_when`].
pub(crate) type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a sleeping operation asks the interrupt check, when there is one.
pub(crate) const INTERRUPT_EVERY: Duration = Duration::from_millis(100);

impl Liveness {
    /// No verdict yet; a heartbeat ([`coordinate`], [`attend`]) may deliver one.
    pub(crate) fn new(rank: usize) -> io::Result<Arc<Liveness>> {
        Ok(Arc::new(Liveness {
            rank,
            lost: AtomicBool::new(false),
            verdict: Mutex::new(None),
            wake: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            interrupt: Mutex::new(None),
        }))
    }

    /// Installs (or with `None` removes) the interrupt check.
    pub(crate) fn set_interrupt(&self, check: Option<InterruptCheck>) {
        if let Ok(mut slot) = self.interrupt.lock() {
            *slot = check;
        }
    }

    /// The longest a sleep of `limit` may last: [`INTERRUPT_EVERY`] with an interrupt check.
    pub(crate) fn sleep_limit(&self, limit: Duration) -> Duration {
        match self.interrupt.lock() {
            Ok(slot) if slot.is_some() => limit.min(INTERRUPT_EVERY),
            _ => limit,
        }
    }

    /// After a sleep: [`Error::Interrupted`] if the interrupt check asks to stop.
    pub(crate) fn check_interrupt(&self, op: Op) -> Result<(), Error> {
        let check = match self.interrupt.lock() {
            Ok(slot) => slot.clone(),
            Err(_) => None,
        };
        match check {
            Some(stop) if stop() => Err(Error::Interrupted {
                rank: self.rank,
                op,
            }),
            _ => Ok(()),
        }
    }

    /// Records that `peer` is lost (the first verdict stays) and wakes sleeping operations.
    fn declare(&self, peer: usize, why: String) {
        let Ok(mut verdict) = self.verdict.lock() else {
            return;
        };
        if verdict.is_none() {
            tracing::warn!(rank = self.rank, peer, %why, "rank declared lost");
            *verdict = Some((peer, why));
            self.lost.store(true, Ordering::Release);
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// The rank declared lost and why, if any.
    pub(crate) fn verdict(&self) -> Option<(usize, String)> {
        if !self.lost.load(Ordering::Acquire) {
            return None;
        }
        self.verdict.lock().ok().and_then(|v| v.clone())
    }

    /// The error for operation `op` if a rank is declared lost.
    pub(crate) fn check(&self, op: Op) -> Result<(), Error> {
        match self.verdict() {
            None => Ok(()),
            Some((peer, cause)) => Err(Error::PeerLost {
                rank: self.rank,
                peer,
                op,
                cause,
            }),
        }
    }

    /// The verdict, waiting up to `limit` for one to arrive.
    pub(crate) fn verdict_within(&self, limit: Duration) -> Option<(usize, String)> {
        let mut fds = [PollFd::new(&self.wake, PollFlags::IN)];
        let _ = crate::transport::poll(&mut fds, limit);
        self.verdict()
    }

    /// Readable once a verdict is in: add it to every sleep.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }
}

/// The beat interval for a liveness `window`: a fifth of it, between 50 ms and 1 s.
pub(crate) fn interval(window: Duration) -> Duration {
    (window / 5).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// The heartbeat thread of one rank; dropping it says goodbye and stops it.
pub(crate) struct Heartbeat {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Message kinds on the side channel after start-up.
const BEAT: u8 = 1;
const BYE: u8 = 2;
/// Rank 0's status: `STATUS`, then if it has a verdict the rank (u32) and the reason.
const STATUS: u8 = 3;

/// Starts the heartbeat of a coordinator over its `members` (rank i + 1 at index i).
pub(crate) fn coordinate(
    members: Vec<TcpStream>,
    window: Duration,
    liveness: Arc<Liveness>,
) -> io::Result<Heartbeat> {
    let mut peers = members
        .into_iter()
        .enumerate()
        .map(|(i, s)| Peer::new(s, i + 1))
        .collect::<io::Result<Vec<_>>>()?;
    start(liveness, move |live, stop| {
        let tick = interval(window);
        let mut next = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next {
                next = now + tick;
                for p in peers.iter_mut().filter(|p| p.watched) {
                    if now.duration_since(p.heard) > window {
                        live.declare(p.rank, silent(p.rank, window));
                        p.watched = false;
                    }
                }
                let status = status_frame(live.verdict());
                for p in peers.iter_mut().filter(|p| p.watched) {
                    p.send(&status);
                }
            }
            let stopped = {
                let mut fds: Vec<PollFd<'_>> = vec![PollFd::new(stop, PollFlags::IN)];
                fds.extend(peers.iter().filter(|p| p.watched).map(|p| p.poll()));
                let _ = crate::transport::poll(&mut fds, next.saturating_duration_since(now));
                fds[0].revents().contains(PollFlags::IN)
            };
            if stopped {
                for p in peers.iter_mut().filter(|p| p.watched) {
                    p.send(&[BYE]);
                }
                return;
            }
            let known = live.verdict().is_some();
            for p in peers.iter_mut().filter(|p| p.watched) {
                match p.receive() {
                    Heard::Nothing | Heard::Beat(_) => {}
                    Heard::Bye => p.watched = false,
                    Heard::Gone => {
                        live.declare(p.rank, gone(p.rank));
                        p.watched = false;
                    }
                }
            }
            if !known && live.verdict().is_some() {
                next = Instant::now(); // tell everyone now
            }
        }
    })
}

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
        loop {
            let now = Instant::now();
            if now >= next {
                next = now + tick;
                coordinator.send(&[BEAT]);
            }
            if now.duration_since(coordinator.heard) > window {
                live.declare(0, silent(0, window));
                return;
            }
            let stopped = {
                let mut fds = [PollFd::new(stop, PollFlags::IN), coordinator.poll()];
                let _ = crate::transport::poll(&mut fds, next.saturating_duration_since(now));
                fds[0].revents().contains(PollFlags::IN)
            };
            if stopped {
                coordinator.send(&[BYE]);
                return;
            }
            match coordinator.receive() {
                Heard::Nothing => {}
                Heard::Beat(Some((peer, why))) => live.declare(peer, why),
                Heard::Beat(None) => {}
                // Rank 0 left the group: nothing more to watch.
                Heard::Bye => return,
                Heard::Gone => {
                    live.declare(0, gone(0));
                    return;
                }
            }
        }
    })
}

fn start(
    liveness: Arc<Liveness>,
    run: impl FnOnce(&Liveness, &OwnedFd) + Send + 'static,
) -> io::Result<Heartbeat> {
    let stop = Arc::new(rustix::event::eventfd(
        0,
        EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
    )?);
    let stop_fd = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(format!("jaccl-heartbeat-{}", liveness.rank))
        .spawn(move || run(&liveness, &stop_fd))?;
    Ok(Heartbeat {
        stop,
        thread: Some(thread),
    })
}

fn silent(rank: usize, window: Duration) -> String {
    format!(
        "rank {rank} has been silent for {window:?} (stopped, hung, or its host or network is \
         gone; see Config::liveness / JACCL_LIVENESS)"
    )
}

fn gone(rank: usize) -> String {
    format!("rank {rank}'s process ended or its connection to rank 0 was lost")
}

fn status_frame(verdict: Option<(usize, String)>) -> Vec<u8> {
    let mut b = vec![STATUS];
    if let Some((peer, why)) = verdict {
        b.extend_from_slice(&to_u32(peer).to_le_bytes());
        b.extend_from_slice(&why.as_bytes()[..why.len().min(1024)]);
    }
    b
}

/// What a peer said since last time.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    Nothing,
    /// A beat or a status (with the coordinator's verdict, if any).
    Beat(Option<(usize, String)>),
    Bye,
    /// End of stream, an error, or bytes that are not ours: the peer is gone.
    Gone,
}

/// One side-channel connection as the heartbeat sees it: framed messages, non-blocking.
struct Peer {
    stream: TcpStream,
    rank: usize,
    buf: Vec<u8>,
    heard: Instant,
    watched: bool,
}

/// Takes the complete messages out of `buf` and returns the most telling: a goodbye or a
/// verdict at once, a beat if there were only beats, `Gone` for bytes that are not ours.
pub(crate) fn decode(buf: &mut Vec<u8>) -> Heard {
    let mut heard = Heard::Nothing;
    while buf.len() >= 4 {
        let len = u32_at(buf, 0) as usize;
        if len == 0 || len > MAX_MESSAGE {
            return Heard::Gone;
        }
        if buf.len() < 4 + len {
            break;
        }
        let message: Vec<u8> = buf.drain(..4 + len).skip(4).collect();
        heard = match (message[0], message.len()) {
            (BYE, _) => return Heard::Bye,
            (BEAT, _) | (STATUS, 1) => Heard::Beat(None),
            (STATUS, n) if n >= 5 => {
                let peer = u32_at(&message, 1) as usize;
                let why = String::from_utf8_lossy(&message[5..]).into_owned();
                return Heard::Beat(Some((peer, why)));
            }
            _ => return Heard::Gone,
        };
    }
    heard
}

/// The largest heartbeat message: a status with a verdict.
const MAX_MESSAGE: usize = 2048;

impl Peer {
    fn new(stream: TcpStream, rank: usize) -> io::Result<Peer> {
        stream.set_nonblocking(true)?;
        Ok(Peer {
            stream,
            rank,
            buf: Vec::new(),
            heard: Instant::now(),
            watched: true,
        })
    }

    fn poll(&self) -> PollFd<'_> {
        PollFd::new(&self.stream, PollFlags::IN)
    }

    /// Sends one framed message if the socket takes it now (a peer too slow to read a beat a
    /// second is found by its own silence).
    fn send(&mut self, payload: &[u8]) {
        let mut frame = to_u32(payload.len()).to_le_bytes().to_vec();
        frame.extend_from_slice(payload);
        let _ = self.stream.write(&frame);
    }

    /// Reads what arrived and returns the most telling message: a goodbye before an end of
    /// stream counts as a goodbye.
    fn receive(&mut self) -> Heard {
        let mut chunk = [0u8; 4096];
        let mut ended = false;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    ended = true;
                    break;
                }
            }
        }
        let heard = decode(&mut self.buf);
        if !matches!(heard, Heard::Nothing) {
            self.heard = Instant::now();
        }
        if matches!(heard, Heard::Bye | Heard::Gone) {
            return heard;
        }
        // A verdict that arrived before the end still stands (the end comes next time).
        match heard {
            Heard::Nothing | Heard::Beat(None) if ended => Heard::Gone,
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut b = to_u32(payload.len()).to_le_bytes().to_vec();
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn messages_decode_in_pieces_and_goodbyes_win() {
        let mut stream = framed(&[BEAT]);
        stream.extend(framed(&status_frame(Some((3, "silent".into())))));
        let mut buf = stream[..3].to_vec();
        assert_eq!(decode(&mut buf), Heard::Nothing);
        buf.extend_from_slice(&stream[3..]);
        assert_eq!(decode(&mut buf), Heard::Beat(Some((3, "silent".into()))));
        let mut buf = [framed(&[BEAT]), framed(&[BYE])].concat();
        assert_eq!(decode(&mut buf), Heard::Bye);
        assert_eq!(decode(&mut framed(&[9])), Heard::Gone);
        assert_eq!(decode(&mut vec![0, 0, 0, 0]), Heard::Gone);
    }

    proptest! {
        /// Frames with plausible lengths and kinds, random contents.
        #[test]
        fn heartbeat_messages_never_panic(kind in 0u8..5, body in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
            let mut payload = vec![kind];
            payload.extend(body);
            let mut buf = framed(&payload);
            buf.truncate(cut.max(1));
            let _ = decode(&mut buf);
        }
    }
}
