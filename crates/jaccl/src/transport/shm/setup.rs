//! Setting up shared memory between the ranks of one host: [`ShmConnector`] publishes the
//! name of an abstract Unix socket; for every peer on this host it needs, the higher rank
//! connects, the two authenticate, and each hands the other its segment and doorbell over the
//! socket (`SCM_RIGHTS`), checked before it is mapped.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde_json::Value;

use super::link::ShmLink;
use super::segment::Ring;
use super::sys::{self, Mapping};
use super::{Doorbell, Layout, Local, Peer, Shm, asymmetric_fences, random_hex};
use crate::auth::{self, Admission, Claim, Identity, Purpose};
use crate::error::{Error, Result};
use crate::transport::Link;
use crate::transport::connector::{Connector, End, Opened, Published, Request, Want};

/// Opens the second message of the handshake, which carries the segment and the doorbell.
const OFFER_MAGIC: [u8; 4] = *b"JCSM";
/// Magic, layout, and whether the sender fences asymmetrically ([`asymmetric_fences`]).
const OFFER_LEN: usize = 4 + 32 + 1;

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
pub(super) struct PeerSpec {
    pub(super) rank: usize,
    /// Its listener's name.
    pub(super) name: String,
    /// Its rings this rank reads (it sends to this rank on them).
    pub(super) reads: Vec<usize>,
}

/// Creates this rank's segment and exchanges segments with every peer of `peers` before
/// `deadline`: connecting to lower ranks while accepting higher ones on `listener` (on another
/// thread). Every connection is authenticated first (`crate::auth`); strangers are dropped.
/// With `asymmetric`, this rank offers asymmetric fences where the kernel allows them (see
/// [`Peer::wake`]); each pair uses them only if both sides offer.
fn establish(
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
        group: 0,
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
            Err(Errno::AGAIN) => Ok(None),
            Err(e) => Err(e.into()),
        },
        &me.token,
        me.rank,
        deadline,
        Some(&|| stop.load(Ordering::Relaxed)),
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
pub(super) fn map_peer(
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

/// Shared memory's part in a group's set-up. Ranks pair when both could listen and their
/// host identities are equal. Wants of a neighbour get links over the rings of the two
/// segments; a want of no wires only maps the peer's segment (the direct collectives).
pub(crate) struct ShmConnector {
    /// Where peers connect; `Err`: why this rank cannot share memory.
    listener: std::result::Result<Listener, String>,
    wires: usize,
    /// Whether to offer asymmetric fences (see [`Peer::wake`]).
    asymmetric: bool,
    /// What [`Connector::open`] set up, for the group.
    shared: Option<Shm>,
}

impl ShmConnector {
    /// A connector for `wires` wires per neighbour.
    pub(crate) fn new(wires: usize) -> ShmConnector {
        ShmConnector {
            listener: Listener::new()
                .map_err(|e| format!("cannot listen on an abstract Unix socket: {e}")),
            wires,
            asymmetric: false,
            shared: None,
        }
    }

    /// Why this rank cannot share memory, if it cannot.
    pub(crate) fn unavailable(&self) -> Option<&str> {
        self.listener.as_ref().err().map(String::as_str)
    }

    /// Offers asymmetric fences: a rank that spins before it sleeps rarely sleeps, so the
    /// costly barrier before sleeping buys cheaper publishing for its peers.
    pub(crate) fn offer_asymmetric_fences(&mut self, offer: bool) {
        self.asymmetric = offer;
    }

    /// The shared memory [`Connector::open`] set up, if any.
    pub(crate) fn take_shared(&mut self) -> Option<Shm> {
        self.shared.take()
    }
}

impl Connector for ShmConnector {
    fn publish(&self) -> Value {
        match &self.listener {
            Ok(l) => Value::String(l.name().to_owned()),
            Err(_) => Value::Null,
        }
    }

    fn unusable(&self, blob: &Value) -> Option<String> {
        blob.as_str()
            .is_none()
            .then(|| "it cannot share memory".to_string())
    }

    fn pairs(&self, a: Published<'_>, b: Published<'_>) -> bool {
        a.host == b.host && self.unusable(a.blob).is_none() && self.unusable(b.blob).is_none()
    }

    fn open(&mut self, request: Request<'_>) -> Result<Opened> {
        let me = request.me;
        if request.wants.is_empty() {
            return Ok(Vec::new());
        }
        let listener = match std::mem::replace(&mut self.listener, Err("in use".into())) {
            Ok(l) => l,
            Err(why) => {
                return Err(Error::Bootstrap(format!(
                    "rank {}: shared memory: {why}",
                    me.rank
                )));
            }
        };
        let layout = Layout::new(self.wires, me.size, super::RING_BYTES, super::AREA_BYTES);
        // The rings of wire w of a want, (this rank's, the peer's): a neighbour sends to this
        // rank on its rings towards this rank (the left one on its right rings, the right one
        // on its left rings); any other rank on its ring to this rank.
        let rings = |want: &Want, w: usize| {
            let (mine, theirs) = match want.end {
                End::Left => (Ring::Left(w), Ring::Right(w)),
                End::Right => (Ring::Right(w), Ring::Left(w)),
                End::Other => (Ring::To(want.peer), Ring::To(me.rank)),
            };
            (layout.ring_index(mine), layout.ring_index(theirs))
        };
        let mut specs: Vec<PeerSpec> = Vec::new();
        for want in request.wants {
            let name = request.published.get(want.peer).as_str();
            let spec = match specs.iter_mut().position(|s| s.rank == want.peer) {
                Some(i) => &mut specs[i],
                None => {
                    specs.push(PeerSpec {
                        rank: want.peer,
                        name: name.unwrap_or_default().to_owned(),
                        reads: Vec::new(),
                    });
                    let last = specs.len() - 1;
                    &mut specs[last]
                }
            };
            spec.reads.extend((0..want.wires).map(|w| rings(want, w).1));
        }
        let shm = establish(
            listener,
            me,
            layout,
            &specs,
            self.asymmetric,
            request.deadline,
        )?;
        let opened = request
            .wants
            .iter()
            .map(|want| {
                let peer = shm.peers[want.peer].as_ref()?;
                let links = (0..want.wires).map(|w| {
                    let (mine, theirs) = rings(want, w);
                    let link = ShmLink::new(Arc::clone(&shm.local), Arc::clone(peer), mine, theirs);
                    Box::new(link) as Box<dyn Link>
                });
                Some(links.collect())
            })
            .collect();
        self.shared = Some(shm);
        Ok(opened)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Offers with the valid magic, and often the valid layout, with random rest.
        #[test]
        fn offers_never_panic(rest in proptest::collection::vec(any::<u8>(), 0..40), valid in any::<bool>()) {
            let layout = Layout::new(1, 4, super::super::RING_BYTES, super::super::AREA_BYTES);
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
