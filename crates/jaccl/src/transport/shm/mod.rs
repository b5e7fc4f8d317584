//! Shared memory between the ranks of one host.
//!
//! Each rank creates one sealed memfd segment ([`Layout`]): its mailbox, the two areas of the
//! direct collectives (`crate::algo::direct`) and its outgoing rings ([`link`]); and a doorbell,
//! an eventfd its peers ring to wake it when it sleeps. At start-up it listens on an abstract
//! Unix socket (a name, no file) chosen at random and published through the side channel. For
//! every peer on this host it needs, the higher rank connects; the two check that they belong to
//! the same job, then each hands the other its segment and doorbell (`SCM_RIGHTS`). Nothing
//! outside the job can map a segment: it has no name, and only travels over these sockets.
//!
//! Publishing and falling asleep meet in [`Peer::wake`] and [`Local::arm`]; see there for the
//! memory fences that make sure no wake-up is lost.
//!
//! The socket stays open for liveness. A rank that leaves marks its mailbox and rings its
//! peers' doorbells; a rank whose process dies (`SIGKILL`) closes nothing itself, but the kernel
//! closes its end of every socket, which wakes peers sleeping on it. A segment's memory is freed
//! when the last process mapping it exits, however it exits: nothing is ever left in `/dev/shm`
//! or `/tmp`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering, compiler_fence, fence};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use rustix::thread::{MembarrierCommand, MembarrierQuery, membarrier, membarrier_query};

use crate::auth::Identity;
use crate::auth::{self, Admission, Claim, Purpose};
use crate::error::{Error, Result};

mod board;
pub(crate) mod link;
mod segment;
mod sys;

pub(crate) use board::{Board, INLINE_BYTES};
pub(crate) use segment::Layout;
use segment::{Mailbox, State};
pub(crate) use sys::Mapping;

/// Bytes of each ring (one per neighbour, wire and direction): the most a sender may be ahead.
pub(crate) const RING_BYTES: usize = 256 * 1024;
/// Bytes of each of a rank's two areas: the most one round of a direct collective moves.
pub(crate) const AREA_BYTES: usize = 1024 * 1024;

/// Opens the second message of the handshake, which carries the segment and the doorbell.
const OFFER_MAGIC: [u8; 4] = *b"JCSM";
/// Magic, layout, and whether the sender fences asymmetrically ([`asymmetric_fences`]).
const OFFER_LEN: usize = 4 + 24 + 1;

/// Whether this process can use asymmetric fences: a rank about to sleep pays for a barrier on
/// every CPU (`membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`) so that its peers can publish
/// with plain stores, without a full fence on the hot path: 0.21 → 0.17 µs per 8-byte
/// all-reduce at N=2 on this 2-CPU VM. The barrier is cheap with a CPU per rank (N=2 sleeping
/// on every wait: 15 µs per call, 20 µs with plain fences) and dear with more ranks than CPUs
/// (N=4: 57 µs against 15), hence offered only by ranks that spin before they sleep. Only
/// processes that registered receive those barriers; registration lasts for the life of the
/// process, so it is tried once.
fn asymmetric_fences() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let needed = MembarrierQuery::GLOBAL_EXPEDITED | MembarrierQuery::REGISTER_GLOBAL_EXPEDITED;
        membarrier_query().contains(needed)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok()
            // A seccomp filter could allow one command and not the other: try the one used.
            && membarrier(MembarrierCommand::GlobalExpedited).is_ok()
    })
}

/// This host as ranks compare it: ranks with equal identities share memory. It is the kernel's
/// boot id, the host name and the network namespace (abstract sockets reach only within one),
/// plus `pretend` (`JACCL_HOST_ID` / `Config::host_id`), which lets tests play several hosts on
/// one machine. Where the boot id cannot be read, a random identity: no sharing.
pub(crate) fn host_identity(pretend: Option<&str>) -> String {
    use std::os::unix::fs::MetadataExt;
    let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned());
    let boot = read("/proc/sys/kernel/random/boot_id").unwrap_or_else(|_| random_hex(16));
    let host = read("/proc/sys/kernel/hostname").unwrap_or_default();
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    let pretend = pretend.map(|p| format!(" as {p}")).unwrap_or_default();
    format!("{host} boot {boot} netns {netns}{pretend}")
}

/// Checks that shared memory works here: a sealed segment, its mapping (also mirrored), a
/// doorbell and an abstract socket.
pub(crate) fn probe() -> std::result::Result<(), String> {
    let layout = Layout::new(1, sys::page_size(), sys::page_size());
    Local::create(layout).map_err(|e| format!("cannot create or map a memfd segment: {e}"))?;
    Listener::new().map_err(|e| format!("cannot listen on an abstract Unix socket: {e}"))?;
    Ok(())
}

/// `bytes` random bytes in hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    // Only names and identities come from this; a failing generator leaves zeros, which a
    // bind then reports as "in use" if two ranks collide.
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A rank's doorbell: an eventfd that peers write to wake it.
pub(crate) struct Doorbell(OwnedFd);

impl Doorbell {
    fn new() -> io::Result<Doorbell> {
        Ok(Doorbell(crate::os::event_counter()?))
    }

    /// Wakes the owner (the counter only grows, so this cannot block).
    pub(crate) fn ring(&self) {
        crate::os::signal(&self.0);
    }

    /// Resets the counter after a wake-up.
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut b);
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// This rank's own segment, mapped, and its doorbell.
pub(crate) struct Local {
    pub(crate) layout: Layout,
    /// Whether some peer publishes without a full fence, trusting [`Local::arm`] to fence for
    /// it (see [`Peer::wake`]).
    fences_for_peers: bool,
    /// The control page and the areas.
    pub(crate) main: Mapping,
    /// Outgoing rings, mirrored, indexed like the ring's channels.
    pub(crate) rings: Vec<Mapping>,
    pub(crate) doorbell: Doorbell,
}

impl Local {
    fn create(layout: Layout) -> io::Result<(Local, OwnedFd)> {
        let segment = sys::create_segment(layout.total())?;
        let main = Mapping::new(segment.as_fd(), 0, layout.main_len())?;
        let rings = (0..layout.rings)
            .map(|i| Mapping::mirrored(segment.as_fd(), layout.ring(i), layout.ring_bytes))
            .collect::<io::Result<_>>()?;
        let local = Local {
            layout,
            fences_for_peers: false,
            main,
            rings,
            doorbell: Doorbell::new()?,
        };
        Ok((local, segment))
    }

    pub(crate) fn mailbox(&self) -> Mailbox<'_> {
        Mailbox::of(&self.main)
    }

    /// Marks this rank as possibly asleep (see [`Peer::wake`]); the caller re-checks what it
    /// waits for afterwards, then sleeps on the doorbell.
    ///
    /// # Errors
    /// The barrier that peers publishing without a fence rely on failed (the kernel allowed it at
    /// start-up, so this is not expected): sleeping could then miss a wake-up.
    pub(crate) fn arm(&self) -> io::Result<()> {
        self.mailbox().sleeping().store(1, Ordering::Relaxed);
        if self.fences_for_peers {
            // Also a full fence on this CPU.
            membarrier(MembarrierCommand::GlobalExpedited)?;
        } else {
            fence(Ordering::SeqCst);
        }
        Ok(())
    }

    /// Undoes [`Local::arm`] after the sleep.
    pub(crate) fn disarm(&self) {
        self.mailbox().sleeping().store(0, Ordering::Relaxed);
        self.doorbell.drain();
    }
}

/// A peer on this host: its segment (the main part, and the rings it sends to this rank), its
/// doorbell, and the socket that tells when its process is gone.
pub(crate) struct Peer {
    pub(crate) rank: usize,
    pub(crate) main: Mapping,
    /// Its rings that this rank reads, by ring index.
    pub(crate) rings: Vec<Option<Mapping>>,
    doorbell: Doorbell,
    socket: OwnedFd,
    /// Whether both sides fence asymmetrically, so that waking this peer needs no fence.
    asymmetric: bool,
}

impl Peer {
    pub(crate) fn mailbox(&self) -> Mailbox<'_> {
        Mailbox::of(&self.main)
    }

    /// Wakes the peer if it may be asleep. Call after publishing (a `Release` store) what it
    /// may wait for. This rank stores then loads its `sleeping` word; the peer, in
    /// [`Local::arm`], stores that word then loads what it waits for. With a full fence between
    /// the store and the load on both sides, one of the two sees the other's store: no lost
    /// wake-up. The peer's fence is either a plain one, or a barrier it forces on every CPU of
    /// every registered process, which orders this rank's store and load wherever this rank
    /// is; then this side needs none, and publishing costs no round trip for the cache line.
    pub(crate) fn wake(&self) {
        if self.asymmetric {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        if self.mailbox().sleeping().load(Ordering::Relaxed) != 0 {
            self.doorbell.ring();
        }
    }

    /// Why this peer will never answer, from its mailbox (no system call): it left the group
    /// or its group failed.
    pub(crate) fn departed(&self) -> Option<String> {
        match self.mailbox().state_word().load(Ordering::Acquire) {
            s if s == State::Running as u32 => None,
            s if s == State::Closed as u32 => Some(crate::error::left_the_group(self.rank)),
            _ => Some(format!(
                "rank {}'s group failed (its own error says why)",
                self.rank
            )),
        }
    }

    /// Why this peer will never answer, also checking whether its process ended.
    pub(crate) fn lost(&self) -> Option<String> {
        self.departed().or_else(|| self.vanished())
    }

    /// Whether its process ended without leaving the group (one system call: its end of the
    /// socket is closed), and the reason to give.
    pub(crate) fn vanished(&self) -> Option<String> {
        let mut b = [0u8; 1];
        match rustix::net::recv(&self.socket, &mut b, RecvFlags::DONTWAIT | RecvFlags::PEEK) {
            Err(Errno::AGAIN | Errno::INTR) => None,
            // End of stream, a reset, or bytes it should never send: it is gone.
            _ => Some(format!(
                "rank {}'s process ended without leaving the group (killed?)",
                self.rank
            )),
        }
    }

    /// The descriptor that becomes readable when the peer's process ends.
    pub(crate) fn poll_liveness(&self) -> PollFd<'_> {
        PollFd::new(&self.socket, PollFlags::IN)
    }
}

/// The shared memory of one group: this rank's segment and its peers on this host. Dropping it
/// tells the peers this rank left; [`Shm::fail`] tells them its group failed.
pub(crate) struct Shm {
    pub(crate) local: Arc<Local>,
    /// By rank; `None` for this rank and ranks without shared memory.
    pub(crate) peers: Vec<Option<Arc<Peer>>>,
}

impl Shm {
    /// Marks this rank's group as failed, so that peers waiting for it fail at once.
    pub(crate) fn fail(&self) {
        self.set_state(State::Failed);
    }

    fn set_state(&self, state: State) {
        let word = self.local.mailbox().state_word();
        if word.load(Ordering::Relaxed) == State::Running as u32 {
            word.store(state as u32, Ordering::Release);
        }
        for peer in self.peers.iter().flatten() {
            peer.wake();
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        self.set_state(State::Closed);
    }
}

/// Where this rank accepts its shared-memory peers: an abstract Unix socket (no file) with a
/// random name.
pub(crate) struct Listener {
    fd: OwnedFd,
    name: String,
}

impl Listener {
    pub(crate) fn new() -> io::Result<Listener> {
        let name = format!("jaccl-{}", random_hex(16));
        let fd = seqpacket_socket()?;
        rustix::net::bind(&fd, &SocketAddrUnix::new_abstract_name(name.as_bytes())?)?;
        rustix::net::listen(&fd, 128)?;
        rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK)?;
        Ok(Listener { fd, name })
    }

    /// The name peers connect to.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// A peer to share memory with, as start-up found it.
#[derive(Debug, Clone)]
pub(crate) struct PeerSpec {
    pub(crate) rank: usize,
    /// Its listener's name.
    pub(crate) name: String,
    /// Its rings this rank reads (it sends to this rank on them).
    pub(crate) reads: Vec<usize>,
}

/// Creates this rank's segment and exchanges segments with every peer of `peers` before
/// `deadline`: connecting to lower ranks while accepting higher ones on `listener` (on another
/// thread). Every connection is authenticated first (`crate::auth`); strangers are dropped.
/// With `asymmetric`, this rank offers asymmetric fences where the kernel allows them (see
/// [`Peer::wake`]); each pair uses them only if both sides offer.
pub(crate) fn establish(
    listener: Listener,
    me: &Identity,
    layout: Layout,
    peers: &[PeerSpec],
    asymmetric: bool,
    deadline: Instant,
) -> Result<Shm> {
    let fail = |what: String| Error::Bootstrap(format!("rank {}: shared memory: {what}", me.rank));
    let (mut local, segment) =
        Local::create(layout).map_err(|e| fail(format!("cannot create a segment: {e}")))?;
    let offer = Offer {
        layout,
        segment: segment.as_fd(),
        doorbell: local.doorbell.fd(),
        asymmetric: asymmetric && asymmetric_fences(),
    };
    let stop = AtomicBool::new(false);
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| accept_all(&listener, me, peers, &offer, deadline, &stop));
        let connected: Result<Vec<Peer>> = peers
            .iter()
            .filter(|p| p.rank < me.rank)
            .map(|spec| {
                connect(me, spec, &offer, deadline)
                    .map_err(|why| fail(format!("with rank {}: {why}", spec.rank)))
            })
            .collect();
        if connected.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(fail("the acceptor failed".into())));
        (accepted, connected)
    });
    let mut found: Vec<Option<Arc<Peer>>> = (0..me.size).map(|_| None).collect();
    for peer in connected?.into_iter().chain(accepted?) {
        let rank = peer.rank;
        found[rank] = Some(Arc::new(peer));
    }
    drop(segment);
    local.fences_for_peers = found.iter().flatten().any(|p| p.asymmetric);
    Ok(Shm {
        local: Arc::new(local),
        peers: found,
    })
}

/// What this rank hands each peer.
struct Offer<'a> {
    layout: Layout,
    segment: BorrowedFd<'a>,
    doorbell: BorrowedFd<'a>,
    asymmetric: bool,
}

impl Offer<'_> {
    fn send(&self, socket: &OwnedFd) -> io::Result<()> {
        let mut message = [0u8; OFFER_LEN];
        message[..4].copy_from_slice(&OFFER_MAGIC);
        message[4..OFFER_LEN - 1].copy_from_slice(&self.layout.encode());
        message[OFFER_LEN - 1] = u8::from(self.asymmetric);
        send_with_fds(socket, &message, &[self.segment, self.doorbell])
    }

    /// Hands this rank's segment over and takes the peer's, on an authenticated socket.
    fn exchange(
        &self,
        spec: &PeerSpec,
        socket: OwnedFd,
        deadline: Instant,
    ) -> std::result::Result<Peer, String> {
        self.send(&socket)
            .map_err(|e| format!("cannot hand over the segment: {e}"))?;
        let (bytes, fds) =
            recv_message(&socket, deadline).map_err(|e| format!("no segment came: {e}"))?;
        let (segment, doorbell, asymmetric) = check_offer(self.layout, &bytes, fds)?;
        let mut peer = map_peer(spec, self.layout, &segment, doorbell, socket)?;
        peer.asymmetric = asymmetric && self.asymmetric;
        Ok(peer)
    }
}

/// Connects to a lower rank, authenticates, and exchanges segments.
fn connect(
    me: &Identity,
    spec: &PeerSpec,
    offer: &Offer<'_>,
    deadline: Instant,
) -> std::result::Result<Peer, String> {
    let mut socket = seqpacket_socket().map_err(|e| e.to_string())?;
    let addr =
        SocketAddrUnix::new_abstract_name(spec.name.as_bytes()).map_err(|e| e.to_string())?;
    rustix::net::connect(&socket, &addr)
        .map_err(|e| format!("cannot connect to its socket @{}: {e}", spec.name))?;
    let claim = Claim {
        purpose: Purpose::Shm,
        rank: me.rank,
        size: me.size,
        wire: 0,
    };
    auth::connect(&mut socket, &me.token, claim, deadline).map_err(|e| e.to_string())?;
    offer.exchange(spec, socket, deadline)
}

/// Accepts every higher rank of `peers` on `listener`: authenticated, expected, and not yet
/// connected; then exchanges segments with it.
fn accept_all(
    listener: &Listener,
    me: &Identity,
    peers: &[PeerSpec],
    offer: &Offer<'_>,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Vec<Peer>> {
    let mut missing: Vec<&PeerSpec> = peers.iter().filter(|s| s.rank > me.rank).collect();
    let mut found = Vec::new();
    if missing.is_empty() {
        return Ok(found);
    }
    let done = auth::serve(
        listener.fd.as_fd(),
        || match rustix::net::accept_with(&listener.fd, SocketFlags::CLOEXEC) {
            Ok(s) => Ok(Some((s, "a local process".to_string()))),
            Err(Errno::AGAIN | Errno::INTR | Errno::CONNABORTED) => Ok(None),
            Err(e) => Err(e.into()),
        },
        &me.token,
        me.rank,
        deadline,
        Some(stop),
        |claim, mut socket| {
            let reply_by = deadline.min(crate::os::deadline_after(auth::HANDSHAKE_TIMEOUT));
            let expected = missing
                .iter()
                .position(|s| s.rank == claim.rank)
                .filter(|_| claim.purpose == Purpose::Shm && claim.size == me.size);
            let Some(i) = expected else {
                let why = format!(
                    "not expecting rank {} here (or it is connected)",
                    claim.rank
                );
                tracing::warn!(rank = me.rank, %why, "refused a shared-memory connection");
                let _ = auth::verdict(&mut socket, Err(&why), reply_by);
                return Ok(Admission::More);
            };
            let spec = missing.swap_remove(i);
            auth::verdict(&mut socket, Ok(()), reply_by)
                .map_err(|e| Error::io(me.rank, "admitting a shared-memory peer", e))?;
            let peer = offer.exchange(spec, socket, deadline).map_err(|why| {
                Error::Bootstrap(format!(
                    "rank {}: shared memory with rank {}: {why}",
                    me.rank, spec.rank
                ))
            })?;
            found.push(peer);
            Ok(if missing.is_empty() {
                Admission::Done
            } else {
                Admission::More
            })
        },
    )?;
    if !done && !stop.load(Ordering::Relaxed) {
        let ranks: Vec<String> = missing.iter().map(|s| s.rank.to_string()).collect();
        return Err(Error::Bootstrap(format!(
            "rank {}: shared memory: timed out waiting for rank(s) {} to connect",
            me.rank,
            ranks.join(", ")
        )));
    }
    Ok(found)
}

/// Checks a peer's offer: its layout, a sealed segment of the right size, a doorbell; and
/// whether it fences asymmetrically.
fn check_offer(
    layout: Layout,
    bytes: &[u8],
    mut fds: Vec<OwnedFd>,
) -> std::result::Result<(OwnedFd, OwnedFd, bool), String> {
    let asymmetric = check_offer_bytes(layout, bytes)?;
    let (Some(doorbell), Some(segment), true) = (fds.pop(), fds.pop(), fds.is_empty()) else {
        return Err("its offer did not carry a segment and a doorbell".into());
    };
    sys::check_segment(segment.as_fd(), layout.total())
        .map_err(|why| format!("its segment is unusable: {why}"))?;
    Ok((segment, doorbell, asymmetric))
}

/// Checks the bytes of a peer's offer: magic and layout; returns whether it fences
/// asymmetrically.
pub(crate) fn check_offer_bytes(layout: Layout, bytes: &[u8]) -> std::result::Result<bool, String> {
    if bytes.len() != OFFER_LEN || bytes[..4] != OFFER_MAGIC {
        return Err("malformed segment offer".into());
    }
    if bytes[4..OFFER_LEN - 1] != layout.encode() {
        return Err("its segment layout differs (another jaccl version?)".into());
    }
    match bytes[OFFER_LEN - 1] {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err("malformed segment offer".into()),
    }
}

/// Maps a checked peer segment: the main part, and the rings it sends to this rank.
fn map_peer(
    spec: &PeerSpec,
    layout: Layout,
    segment: &OwnedFd,
    doorbell: OwnedFd,
    socket: OwnedFd,
) -> std::result::Result<Peer, String> {
    let map_err = |e: io::Error| format!("cannot map its segment: {e}");
    let main = Mapping::new(segment.as_fd(), 0, layout.main_len()).map_err(map_err)?;
    let mut rings: Vec<Option<Mapping>> = (0..layout.rings).map(|_| None).collect();
    for &i in &spec.reads {
        let ring = Mapping::mirrored(segment.as_fd(), layout.ring(i), layout.ring_bytes);
        rings[i] = Some(ring.map_err(map_err)?);
    }
    Ok(Peer {
        rank: spec.rank,
        main,
        rings,
        doorbell: Doorbell(doorbell),
        socket,
        asymmetric: false,
    })
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn send_with_fds(socket: &OwnedFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one message and the descriptors it carries, waiting until `deadline`.
fn recv_message(socket: &OwnedFd, deadline: Instant) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let left = deadline.saturating_duration_since(Instant::now());
    if !crate::os::wait_readable(socket.as_fd(), left)? {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    }
    let mut buf = [0u8; 128];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut buf)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if msg.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the connection closed",
        ));
    }
    if msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err(io::Error::other("an oversized message"));
    }
    Ok((buf[..msg.bytes].to_vec(), fds))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Offers with the valid magic, and often the valid layout, with random rest.
        #[test]
        fn offers_never_panic(rest in proptest::collection::vec(any::<u8>(), 0..40), valid in any::<bool>()) {
            let layout = Layout::new(1, RING_BYTES, AREA_BYTES);
            let mut b = OFFER_MAGIC.to_vec();
            if valid {
                b.extend_from_slice(&layout.encode());
            }
            b.extend(rest);
            let outcome = check_offer_bytes(layout, &b);
            let well_formed = valid && b.len() == OFFER_LEN && b[OFFER_LEN - 1] <= 1;
            prop_assert_eq!(outcome.is_ok(), well_formed);
        }
    }
}
