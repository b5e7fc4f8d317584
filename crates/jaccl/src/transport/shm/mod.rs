//! Shared memory between the ranks of one host.
//!
//! Each rank creates one sealed memfd segment ([`Layout`]): its mailbox, the two areas of the
//! direct collectives (`crate::algo::shared_memory`) and its outgoing rings ([`link`]); and a doorbell,
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

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{Ordering, compiler_fence, fence};
use std::sync::{Arc, OnceLock};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::RecvFlags;
use rustix::thread::{MembarrierCommand, MembarrierQuery, membarrier, membarrier_query};

mod board;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod harness;
pub(crate) mod link;
mod segment;
mod setup;
mod sys;

pub(crate) use board::{Board, EAGER_DATA_BYTES, EAGER_LINES, INLINE_BYTES};
pub(crate) use segment::Layout;
use segment::{Mailbox, State};
use setup::Listener;
pub(crate) use setup::ShmConnector;
#[cfg(feature = "fuzzing")]
pub(crate) use setup::check_offer_bytes;
pub(crate) use sys::Mapping;

/// Bytes of each ring (one per neighbour, wire and direction): the most a sender may be ahead.
pub(crate) const RING_BYTES: usize = 256 * 1024;
/// Bytes of each of a rank's two areas: the most one round of a direct collective moves.
pub(crate) const AREA_BYTES: usize = 1024 * 1024;

/// Whether this process can use asymmetric fences: a rank about to sleep pays for a barrier on
/// every CPU (`membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`) so that its peers can publish
/// with plain stores, without a full fence on the hot path: 0.21 → 0.17 µs per 8-byte
/// all-reduce at N=2 on this 2-CPU VM. The barrier is cheap with a CPU per rank (N=2 sleeping
/// on every wait: 15 µs per call, 20 µs with plain fences) and dear with more ranks than CPUs
/// (N=4: 57 µs against 15), hence offered only by ranks that spin before they sleep. Only
/// processes that registered receive those barriers; registration lasts for the life of the
/// process, so it is tried once.
pub(crate) fn asymmetric_fences() -> bool {
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

/// The machine (kernel) part of a host identity ([`host_identity`]): its boot id, which
/// namespaces and containers on one machine share; the whole identity if it has none.
pub(crate) fn machine_of(identity: &str) -> &str {
    identity
        .split_once(" boot ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .unwrap_or(identity)
}

/// Checks that shared memory works here: a sealed segment, its mapping (also mirrored), a
/// doorbell and an abstract socket.
pub(crate) fn probe() -> Result<(), String> {
    let layout = Layout::new(1, 1, sys::page_size(), sys::page_size());
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
