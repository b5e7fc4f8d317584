//! Mutual authentication of every connection against the job's secret, and serving many
//! handshakes at once so that strangers cannot stall or kill start-up.
//!
//! # The handshake (HMAC-SHA-256 challenge-response, both ways)
//!
//! ```text
//! connecting side                                   accepting side
//!   hello: magic, version, claim (purpose, rank,
//!          size, wire, group), nonce C (32 bytes) ─►
//!                                                  ◄─ nonce S, HMAC(key, "S" ‖ hello ‖ S)
//!   checks the accepting side knows the key
//!   HMAC(key, "C" ‖ hello ‖ S)                      ─►
//!                                                      checks the connecting side knows it
//!                                                  ◄─ verdict: admitted, or why not
//! ```
//!
//! The key is SHA-256 of the job token; neither crosses the network, and each side's proof
//! covers the other's fresh nonce, so a recorded handshake cannot be replayed and a proof from
//! one direction is useless in the other. Proofs are compared in constant time. A connection
//! that fails is closed without a word (and logged with `tracing`): a refusal reveals nothing.
//! Only an authenticated peer is told why it is refused (a wrong size, a taken rank).

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hmac::Mac;
use rustix::event::{PollFd, PollFlags};
use rustix::net::{RecvFlags, SendFlags};

use crate::error::{Error, Result};
use crate::op_header::{PROTOCOL_VERSION, to_u32, u32_at};
use crate::os::{deadline_after, time_left};
use crate::token::JobToken;

/// `n` random bytes.
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

/// Who this process is, for the handshakes that open connections.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) token: JobToken,
}

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum Purpose {
    /// A member joining the coordinator.
    Side = 1,
    /// A TCP data connection (one wire) to a ring neighbour.
    Data = 2,
    /// A shared-memory peer handing over its segment.
    Shm = 3,
    /// A TCP data connection made on first use: to a rank off the ring (`crate::connect::late`).
    Late = 4,
    /// A question to a rank's job listener: what it knows of an agreement
    /// (`crate::transport::questions`); its answer also shows that the process lives.
    Ask = 5,
    /// News for a rank's job listener: a member revoked the group the claim names.
    Revoke = 6,
    /// A new process joining the group the claim names (`Group::grow`), at the rank that
    /// invited it.
    Join = 7,
}

/// Who the connecting side says it is, and what for. Authenticated by the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) purpose: Purpose,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) wire: usize,
    /// The group the connection serves, by its id (0: the group `init` made).
    pub(crate) group: u64,
}

const MAGIC: [u8; 4] = *b"JCAU";
const NONCE: usize = 32;
const TAG: usize = 32;
/// Length of the connecting side's hello.
pub(crate) const HELLO_LEN: usize = 4 + 2 + 1 + 1 + 4 + 4 + 2 + 2 + 8 + NONCE;
const CHALLENGE_LEN: usize = NONCE + TAG;
/// The longest refusal reason sent.
const MAX_REASON: usize = 1024;

impl Claim {
    fn hello(&self, nonce: &[u8; NONCE]) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b[6] = self.purpose as u8;
        b[8..12].copy_from_slice(&to_u32(self.rank).to_le_bytes());
        b[12..16].copy_from_slice(&to_u32(self.size).to_le_bytes());
        b[16..18].copy_from_slice(&u16::try_from(self.wire).unwrap_or(u16::MAX).to_le_bytes());
        b[20..28].copy_from_slice(&self.group.to_le_bytes());
        b[28..].copy_from_slice(nonce);
        b
    }

    /// Parses a hello; an error means it is not a jaccl hello of this protocol version.
    pub(crate) fn parse(b: &[u8; HELLO_LEN]) -> std::result::Result<Claim, String> {
        if b[0..4] != MAGIC {
            return Err("not a jaccl connection (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "jaccl protocol {version}, this build speaks {PROTOCOL_VERSION}"
            ));
        }
        let purpose = match b[6] {
            1 => Purpose::Side,
            2 => Purpose::Data,
            3 => Purpose::Shm,
            4 => Purpose::Late,
            5 => Purpose::Ask,
            6 => Purpose::Revoke,
            7 => Purpose::Join,
            other => return Err(format!("unknown purpose {other}")),
        };
        Ok(Claim {
            purpose,
            rank: u32_at(b, 8) as usize,
            size: u32_at(b, 12) as usize,
            wire: usize::from(u16::from_le_bytes([b[16], b[17]])),
            group: u64::from_le_bytes(b[20..28].try_into().unwrap_or_default()),
        })
    }
}

/// A connection that carries the handshake's messages: fixed-size messages over a stream,
/// or one datagram each over a `SOCK_SEQPACKET` socket. Every call ends by `deadline`.
pub(crate) trait Messages {
    fn send(&mut self, bytes: &[u8], deadline: Instant) -> io::Result<()>;
    fn recv(&mut self, len: usize, deadline: Instant) -> io::Result<Vec<u8>>;
}

impl Messages for TcpStream {
    fn send(&mut self, bytes: &[u8], deadline: Instant) -> io::Result<()> {
        self.set_write_timeout(Some(time_left(deadline)?))?;
        self.write_all(bytes)
    }

    fn recv(&mut self, len: usize, deadline: Instant) -> io::Result<Vec<u8>> {
        let mut b = vec![0u8; len];
        let mut got = 0;
        while got < len {
            self.set_read_timeout(Some(time_left(deadline)?))?;
            match self.read(&mut b[got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(b)
    }
}

impl Messages for OwnedFd {
    fn send(&mut self, bytes: &[u8], _deadline: Instant) -> io::Result<()> {
        // Handshake messages are far smaller than a socket buffer: this does not block.
        rustix::net::send(&*self, bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?;
        Ok(())
    }

    fn recv(&mut self, len: usize, deadline: Instant) -> io::Result<Vec<u8>> {
        if !crate::os::wait_readable(self.as_fd(), time_left(deadline)?)? {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let mut b = vec![0u8; len];
        let (n, _) = rustix::net::recv(&*self, &mut b, RecvFlags::DONTWAIT)?;
        if n != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {n}-byte message where {len} were expected"),
            ));
        }
        Ok(b)
    }
}

/// Why a handshake failed.
#[derive(Debug)]
pub(crate) enum AuthError {
    /// The other side does not know the job's key (another job, a stranger, a wrong token).
    Unknown,
    /// Not a jaccl peer of this version, or it went silent or away.
    Failed(String),
    /// The accepting side knows the key, and refused this connection: why.
    Refused(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Unknown => f.write_str(
                "it does not know this job's token (another job's, or the ranks were given \
                 different JACCL_JOB_TOKENs)",
            ),
            AuthError::Failed(why) => f.write_str(why),
            AuthError::Refused(why) => write!(f, "it refused this rank: {why}"),
        }
    }
}

fn failed(what: &str) -> impl Fn(io::Error) -> AuthError + '_ {
    move |e| {
        let why = match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                "it closed the connection (a stranger, another job, or another jaccl version)"
                    .to_string()
            }
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "it did not answer".into(),
            _ => e.to_string(),
        };
        AuthError::Failed(format!("{what}: {why}"))
    }
}

/// The connecting side: proves this rank knows `token`, checks the other side does, and
/// reads its verdict.
pub(crate) fn connect(
    conn: &mut impl Messages,
    token: &JobToken,
    claim: Claim,
    deadline: Instant,
) -> std::result::Result<(), AuthError> {
    let nonce = random_bytes::<NONCE>().map_err(failed("random nonce"))?;
    let hello = claim.hello(&nonce);
    conn.send(&hello, deadline)
        .map_err(failed("sending the hello"))?;
    let challenge = conn
        .recv(CHALLENGE_LEN, deadline)
        .map_err(failed("waiting for the challenge"))?;
    let (theirs, proof) = challenge.split_at(NONCE);
    token
        .mac(b"S", &[&hello, theirs])
        .verify_slice(proof)
        .map_err(|_| AuthError::Unknown)?;
    let ours = token.mac(b"C", &[&hello, theirs]).finalize().into_bytes();
    conn.send(&ours, deadline)
        .map_err(failed("sending the proof"))?;
    let head = conn
        .recv(3, deadline)
        .map_err(failed("waiting for the verdict"))?;
    let len = usize::from(u16::from_le_bytes([head[1], head[2]])).min(MAX_REASON);
    match head[0] {
        0 => Ok(()),
        _ if len == 0 => Err(AuthError::Refused(String::new())),
        _ => {
            let why = conn
                .recv(len, deadline)
                .map_err(failed("reading the refusal"))?;
            Err(AuthError::Refused(
                String::from_utf8_lossy(&why).into_owned(),
            ))
        }
    }
}

/// The accepting side: reads the hello, proves it knows `token`, checks the connecting side
/// does. Returns the authenticated claim; the caller then sends a [`verdict`].
pub(crate) fn accept(
    conn: &mut impl Messages,
    token: &JobToken,
    deadline: Instant,
) -> std::result::Result<Claim, AuthError> {
    let hello = conn.recv(HELLO_LEN, deadline).map_err(failed("hello"))?;
    let hello: [u8; HELLO_LEN] = hello
        .try_into()
        .map_err(|_| AuthError::Failed("short hello".into()))?;
    let claim = Claim::parse(&hello).map_err(AuthError::Failed)?;
    let nonce = random_bytes::<NONCE>().map_err(failed("random nonce"))?;
    let proof = token.mac(b"S", &[&hello, &nonce]).finalize().into_bytes();
    let mut challenge = [0u8; CHALLENGE_LEN];
    challenge[..NONCE].copy_from_slice(&nonce);
    challenge[NONCE..].copy_from_slice(&proof);
    conn.send(&challenge, deadline)
        .map_err(failed("challenge"))?;
    let theirs = conn.recv(TAG, deadline).map_err(failed("proof"))?;
    token
        .mac(b"C", &[&hello, &nonce])
        .verify_slice(&theirs)
        .map_err(|_| AuthError::Unknown)?;
    Ok(claim)
}

/// Tells an authenticated connecting side whether it is admitted, and if not, why.
pub(crate) fn verdict(
    conn: &mut impl Messages,
    outcome: std::result::Result<(), &str>,
    deadline: Instant,
) -> io::Result<()> {
    let why = outcome.err().unwrap_or("").as_bytes();
    let why = &why[..why.len().min(MAX_REASON)];
    let mut head = [u8::from(outcome.is_err()), 0, 0];
    head[1..].copy_from_slice(&u16::try_from(why.len()).unwrap_or(0).to_le_bytes());
    // Two messages, as the connecting side reads them (one datagram each over SEQPACKET).
    conn.send(&head, deadline)?;
    if why.is_empty() {
        return Ok(());
    }
    conn.send(why, deadline)
}

/// How long a connection may take to authenticate: a stranger holds no more than this.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// Handshakes served at once. When one more connection comes, the oldest unauthenticated one
/// is cut to make room: a member's handshake takes milliseconds, so under a flood the oldest
/// are strangers' (idle connections that would otherwise hold their place for
/// [`HANDSHAKE_TIMEOUT`]), and a member that is cut all the same retries.
const MAX_HANDSHAKES: usize = 64;

/// What [`serve`]'s admission step decided.
pub(crate) enum Admission {
    /// Keep accepting.
    More,
    /// Everyone expected is in.
    Done,
}

/// Accepts connections on `listener` until `admit` says [`Admission::Done`] (true) or
/// `deadline` passes (false). Each connection is authenticated on its own thread (at most
/// [`HANDSHAKE_TIMEOUT`], and at most [`MAX_HANDSHAKES`] at once, the oldest cut to make
/// room), so an idle or slow stranger holds up nobody; failures are dropped and logged.
/// `accept_one` returns `Ok(None)` when nothing is pending; its errors are retried as
/// accept(2) says ([`crate::os::accept_failure`]), with back-off when the process or the system
/// is out of descriptors or memory. Authenticated connections reach `admit`, on the calling
/// thread, in the order they finish; `admit` sends the verdict, and its error ends start-up
/// (only members, who authenticated, can cause one). `stop`, asked every tenth of a second,
/// ends it early (false) when it answers true.
pub(crate) fn serve<S: Messages + AsFd + Send + 'static>(
    listener: BorrowedFd<'_>,
    mut accept_one: impl FnMut() -> io::Result<Option<(S, String)>>,
    token: &JobToken,
    rank: usize,
    deadline: Instant,
    stop: Option<&dyn Fn() -> bool>,
    mut admit: impl FnMut(Claim, S) -> Result<Admission>,
) -> Result<bool> {
    let wake =
        Arc::new(crate::os::event_counter().map_err(|e| Error::io(rank, "serving handshakes", e))?);
    type Finished<S> = (u64, Option<(Claim, S)>);
    let (tx, rx) = mpsc::channel::<Finished<S>>();
    // Handshakes in progress, oldest first: their number, and a descriptor that cuts them.
    let mut pending: VecDeque<(u64, OwnedFd)> = VecDeque::new();
    let mut started = 0u64;
    let mut backoff = crate::os::RetryDelay::new();
    let mut resting_until: Option<Instant> = None;
    loop {
        while let Ok((id, finished)) = rx.try_recv() {
            pending.retain(|(i, _)| *i != id);
            if let Some((claim, conn)) = finished
                && let Admission::Done = admit(claim, conn)?
            {
                return Ok(true);
            }
        }
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        if left.is_zero() || stop.is_some_and(|stop| stop()) {
            return Ok(false);
        }
        // With a stop check, ask it every 100 ms; while resting, do not accept.
        let mut limit = match stop {
            Some(_) => left.min(Duration::from_millis(100)),
            None => left,
        };
        let listening = resting_until.is_none_or(|t| now >= t);
        if let Some(t) = resting_until.filter(|_| !listening) {
            limit = limit.min(t - now);
        }
        let mut fds = [
            PollFd::new(&*wake, PollFlags::IN),
            PollFd::new(&listener, PollFlags::IN),
        ];
        let watched = if listening { 2 } else { 1 };
        crate::os::poll(&mut fds[..watched], limit)
            .map_err(|e| Error::io(rank, "waiting for connections", e))?;
        crate::os::drain(&*wake);
        if !listening || !fds[1].revents().contains(PollFlags::IN) {
            continue;
        }
        let (mut conn, from) = match accept_one() {
            Ok(Some(accepted)) => {
                backoff = crate::os::RetryDelay::new();
                resting_until = None;
                accepted
            }
            Ok(None) => continue,
            Err(e) => match crate::os::accept_failure(&e) {
                crate::os::AcceptFailure::Retry => continue,
                crate::os::AcceptFailure::BackOff => {
                    tracing::warn!(rank, error = %e, "cannot accept a connection now: backing off");
                    resting_until = Some(Instant::now() + backoff.next());
                    continue;
                }
                crate::os::AcceptFailure::Fatal => {
                    return Err(Error::io(rank, "accepting a connection", e));
                }
            },
        };
        if pending.len() >= MAX_HANDSHAKES
            && let Some((_, oldest)) = pending.pop_front()
        {
            tracing::info!(rank, "too many handshakes at once: cutting the oldest");
            let _ = rustix::net::shutdown(&oldest, rustix::net::Shutdown::Both);
        }
        let Ok(cut) = conn.as_fd().try_clone_to_owned() else {
            tracing::warn!(rank, %from, "out of descriptors: closing a new connection");
            continue;
        };
        let id = started;
        started += 1;
        pending.push_back((id, cut));
        let (token, tx, wake) = (token.clone(), tx.clone(), Arc::clone(&wake));
        let until = deadline.min(deadline_after(HANDSHAKE_TIMEOUT));
        std::thread::spawn(move || {
            let finished = match accept(&mut conn, &token, until) {
                Ok(claim) => Some((claim, conn)),
                Err(why) => {
                    tracing::info!(rank, %from, %why, "dropped an unauthenticated connection");
                    None
                }
            };
            let _ = tx.send((id, finished));
            crate::os::signal(&*wake);
        });
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Both ends of a stream pair as TCP-like message carriers.
    fn pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn claim() -> Claim {
        Claim {
            purpose: Purpose::Data,
            rank: 3,
            size: 8,
            wire: 1,
            group: 7,
        }
    }

    fn soon() -> Instant {
        deadline_after(Duration::from_secs(5))
    }

    #[test]
    fn members_authenticate_both_ways() {
        let token = JobToken::new("sixteen bytes at least").unwrap();
        let (mut a, mut b) = pair();
        let t = token.clone();
        let server = std::thread::spawn(move || {
            let c = accept(&mut b, &t, soon()).unwrap();
            verdict(&mut b, Ok(()), soon()).unwrap();
            c
        });
        connect(&mut a, &token, claim(), soon()).unwrap();
        assert_eq!(server.join().unwrap(), claim());
    }

    #[test]
    fn another_token_is_refused_on_both_sides_and_no_reason_is_given() {
        let ours = JobToken::new("our job's secret token").unwrap();
        let theirs = JobToken::new("another job's secret!").unwrap();
        let (mut a, mut b) = pair();
        let server = std::thread::spawn(move || accept(&mut b, &ours, soon()));
        // The connecting side finds out first (the accepting side's proof does not check).
        assert!(matches!(
            connect(&mut a, &theirs, claim(), soon()),
            Err(AuthError::Unknown)
        ));
        drop(a);
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn a_replayed_handshake_does_not_authenticate() {
        let token = JobToken::new("a secret for replays!").unwrap();
        // Record a real handshake's hello and proof...
        let (mut a, mut b) = pair();
        let t = token.clone();
        let server = std::thread::spawn(move || {
            let mut rec = Recorder {
                inner: b.try_clone().unwrap(),
                log: Vec::new(),
            };
            accept(&mut rec, &t, soon()).unwrap();
            verdict(&mut b, Ok(()), soon()).unwrap();
            rec.log
        });
        connect(&mut a, &token, claim(), soon()).unwrap();
        let recorded = server.join().unwrap();
        // ...and play it to a new connection: the new nonce makes the old proof wrong.
        let (mut c, mut d) = pair();
        let t = token.clone();
        let server = std::thread::spawn(move || accept(&mut d, &t, soon()));
        c.write_all(&recorded[0]).unwrap();
        let _ = Messages::recv(&mut c, CHALLENGE_LEN, soon()).unwrap();
        c.write_all(&recorded[1]).unwrap();
        assert!(matches!(server.join().unwrap(), Err(AuthError::Unknown)));
    }

    /// Records what an accepting side receives.
    struct Recorder {
        inner: TcpStream,
        log: Vec<Vec<u8>>,
    }

    impl Messages for Recorder {
        fn send(&mut self, bytes: &[u8], deadline: Instant) -> io::Result<()> {
            self.inner.send(bytes, deadline)
        }
        fn recv(&mut self, len: usize, deadline: Instant) -> io::Result<Vec<u8>> {
            let b = self.inner.recv(len, deadline)?;
            self.log.push(b.clone());
            Ok(b)
        }
    }

    #[test]
    fn seqpacket_sockets_carry_the_handshake() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let token = JobToken::new("sixteen bytes at least").unwrap();
        let t = token.clone();
        let (mut a, mut b) = (a, b);
        let server = std::thread::spawn(move || {
            let c = accept(&mut b, &t, soon()).unwrap();
            verdict(&mut b, Err("rank 3 is taken"), soon()).unwrap();
            c
        });
        match connect(&mut a, &token, claim(), soon()) {
            Err(AuthError::Refused(why)) => assert_eq!(why, "rank 3 is taken"),
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
    }

    proptest! {
        /// Hellos with a valid magic (and often a valid version) and random rest.
        #[test]
        fn hellos_never_panic(rest in proptest::collection::vec(any::<u8>(), HELLO_LEN - 4), version_ok in any::<bool>()) {
            let mut b = [0u8; HELLO_LEN];
            b[..4].copy_from_slice(&MAGIC);
            b[4..].copy_from_slice(&rest);
            if version_ok {
                b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            }
            let _ = Claim::parse(&b);
        }
    }
}
