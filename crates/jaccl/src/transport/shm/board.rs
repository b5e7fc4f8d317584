//! [`Board`]: what the direct collectives (`crate::algo::shared_memory`) see of shared memory, when
//! every rank of a group is on this host: each rank's two data areas and its mailbox (a
//! synchronisation stamp, the description of its current call, rank 0's store hints), ranks
//! named by their number, and how to wake a peer or sleep until one moves. The segments,
//! mappings and their layout stay inside this module.
//!
//! Every stamp read from a peer is checked here, against what this rank saw of it before and
//! what an honest rank can have reached ([`Board::stamp_of`], [`Board::eager_stamp`]; the
//! rules are next to the mailbox's definition, `super::segment::Mailbox`).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::event::PollFd;

use super::segment::{EAGER_BYTES, EagerLine, INLINE, Mailbox};
use super::{Local, Mapping, Peer, Shm};
use crate::op_header::Digest;

/// Bytes of data a call description carries inline, in the line peers wait on.
pub(crate) const INLINE_BYTES: usize = INLINE;
/// Bytes of data an eager broadcast carries ([`Board::post_eager`]).
pub(crate) const EAGER_DATA_BYTES: usize = EAGER_BYTES;
pub(crate) use super::segment::EAGER_LINES;

/// Every rank's segment, as this rank reaches it.
pub(crate) struct Board {
    local: Arc<Local>,
    /// Every other rank, by rank (`None` at this rank's index).
    peers: Vec<Option<Arc<Peer>>>,
    /// The greatest stamps this rank has seen of each rank (by rank), which theirs may never
    /// go below. Atomics only so that the board can be shared: one thread at a time reads
    /// stamps (the group's calls run one at a time), and these words are in this process's
    /// own memory.
    seen: Box<[Seen]>,
    /// The stamp this rank last published: its own copy, since any peer can write its mailbox.
    published: AtomicU64,
}

/// What this rank saw of one rank's stamps.
struct Seen {
    /// Its mailbox's stamp.
    stamp: AtomicU64,
    /// The stamp in each of its eager lines.
    lines: Box<[AtomicU64]>,
}

impl Board {
    /// The board of a group of `size` whose every other rank `shm` reaches, else `None`.
    pub(crate) fn new(size: usize, shm: &Shm) -> Option<Board> {
        let others = shm.peers.iter().flatten().count();
        (others + 1 == size && shm.peers.len() == size)
            .then(|| Board::of(Arc::clone(&shm.local), shm.peers.clone()))
    }

    /// The board over this rank's segment and its peers' (`None` at this rank's index).
    pub(super) fn of(local: Arc<Local>, peers: Vec<Option<Arc<Peer>>>) -> Board {
        let seen = (0..peers.len())
            .map(|_| Seen {
                stamp: AtomicU64::new(0),
                lines: (0..EAGER_LINES).map(|_| AtomicU64::new(0)).collect(),
            })
            .collect();
        Board {
            local,
            peers,
            seen,
            published: AtomicU64::new(0),
        }
    }

    fn peer(&self, rank: usize) -> Option<&Peer> {
        self.peers.get(rank)?.as_deref()
    }

    /// The main mapping of `rank`'s segment (this rank's own included).
    fn main_of(&self, rank: usize) -> &Mapping {
        match self.peer(rank) {
            Some(peer) => &peer.main,
            None => &self.local.main,
        }
    }

    fn mailbox_of(&self, rank: usize) -> Mailbox<'_> {
        Mailbox::of(self.main_of(rank))
    }

    /// Bytes of each of a rank's two areas: the most one round moves.
    pub(crate) fn area_bytes(&self) -> usize {
        self.local.layout.area_bytes
    }

    /// The offset of area `parity` (0 or 1) in every segment.
    pub(crate) fn area(&self, parity: u64) -> usize {
        self.local.layout.area(parity as usize)
    }

    /// The offset of the inline data of calls of `seq`'s parity ([`INLINE_BYTES`] of them).
    pub(crate) fn inline(&self, seq: u64) -> usize {
        Mailbox::inline(seq)
    }

    /// Copies `src` into this rank's segment at `offset`, with streaming stores or ordinary
    /// ones (see [`super::Mapping::write_streaming`]).
    pub(crate) fn write(&self, offset: usize, src: &[u8], streaming: bool) {
        if streaming {
            self.local.main.write_streaming(offset, src);
        } else {
            self.local.main.write(offset, src);
        }
    }

    /// Copies `dst.len()` bytes at `offset` of `rank`'s segment into `dst`.
    pub(crate) fn read(&self, rank: usize, offset: usize, dst: &mut [u8]) {
        self.main_of(rank).read(offset, dst);
    }

    /// [`Board::read`] with non-temporal stores into `dst`, for destinations far larger than
    /// the caches (see [`super::sys::copy_streaming`]).
    pub(crate) fn read_streaming(&self, rank: usize, offset: usize, dst: &mut [u8]) {
        self.main_of(rank).read_streaming(offset, dst);
    }

    /// Runs `f` over `len` bytes at `offset` of `rank`'s segment (this rank's own included).
    pub(crate) fn with_bytes<R>(
        &self,
        rank: usize,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        self.main_of(rank).with_bytes(offset, len, f)
    }

    /// Publishes the description of call `seq` (visible to peers with the next stamp).
    pub(crate) fn publish_call(&self, seq: u64, words: [u64; 2]) {
        for (word, value) in self.local.mailbox().call(seq).into_iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Publishes the digest of the counts of call `seq` (visible to peers with the next
    /// stamp).
    pub(crate) fn publish_counts(&self, seq: u64, digest: &Digest) {
        let words = self.local.mailbox().counts(seq);
        for (word, bytes) in words.into_iter().zip(digest.chunks_exact(8)) {
            word.store(crate::op_header::u64_at(bytes, 0), Ordering::Relaxed);
        }
    }

    /// `rank`'s digest of the counts of call `seq` (read after its stamp said it is there).
    pub(crate) fn counts_of(&self, rank: usize, seq: u64) -> Digest {
        let mut digest = [0u8; 32];
        let words = self.mailbox_of(rank).counts(seq);
        for (bytes, word) in digest.chunks_exact_mut(8).zip(words) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        digest
    }

    /// `rank`'s description of call `seq` (read after its stamp said it is there).
    pub(crate) fn call_of(&self, rank: usize, seq: u64) -> [u64; 2] {
        self.mailbox_of(rank)
            .call(seq)
            .map(|w| w.load(Ordering::Relaxed))
    }

    /// Publishes that this rank reached synchronisation point `stamp` (a `Release` store:
    /// everything it wrote before is visible to a peer that sees it).
    pub(crate) fn publish_stamp(&self, stamp: u64) {
        self.local.mailbox().stamp().store(stamp, Ordering::Release);
        self.published.store(stamp, Ordering::Relaxed);
    }

    /// This rank's stamp as its peers read it (its mailbox's), for the deadlock search.
    pub(crate) fn shown_stamp(&self) -> u64 {
        self.local.mailbox().stamp().load(Ordering::Acquire)
    }

    /// The synchronisation point `rank` reached (an `Acquire` load), checked: never below
    /// what this rank saw of it before, never beyond [`Board::reach`].
    ///
    /// # Errors
    /// What is wrong with the stamp, for a `Protocol` error naming `rank`.
    pub(crate) fn stamp_of(&self, rank: usize) -> Result<u64, String> {
        let stamp = self.mailbox_of(rank).stamp().load(Ordering::Acquire);
        let seen = &self.seen[rank].stamp;
        let last = seen.load(Ordering::Relaxed);
        if stamp == last {
            return Ok(stamp);
        }
        let (published, reach) = self.reach();
        if stamp < last {
            return Err(format!(
                "its synchronisation stamp went back from {last} to {stamp} (it only grows)"
            ));
        }
        if stamp > reach {
            return Err(format!(
                "its synchronisation stamp {stamp} is beyond {reach}, the most a rank can reach \
                 while this rank is at {published} (only eager broadcasts run ahead, at most \
                 {EAGER_LINES})"
            ));
        }
        seen.store(stamp, Ordering::Relaxed);
        Ok(stamp)
    }

    /// This rank's stamp, and the most any peer's can be. A rank publishes point `k` only
    /// after it finished point `k - 1`: a synchronisation waits for every rank to publish
    /// `k - 1`, and an eager broadcast for its root to post `k - 1`, which the root does only
    /// once every rank published `k - EAGER_LINES` (it reuses the line of that broadcast). So
    /// `k ≤ this rank's stamp + EAGER_LINES`, whatever either rank calls.
    fn reach(&self) -> (u64, u64) {
        let published = self.published.load(Ordering::Relaxed);
        (published, published.saturating_add(EAGER_LINES as u64))
    }

    /// Whether `rank` has passed a synchronisation point this rank has not: it is in a direct
    /// collective this rank has not entered.
    ///
    /// # Errors
    /// As [`Board::stamp_of`].
    pub(crate) fn ahead(&self, rank: usize) -> Result<bool, String> {
        Ok(self.stamp_of(rank)? > self.published.load(Ordering::Relaxed))
    }

    /// Posts an eager broadcast at synchronisation point `stamp` in this rank's eager line for
    /// it: the call's description `words` and `data` (at most [`EAGER_DATA_BYTES`]), then the
    /// stamp (a `Release` store: a peer that sees it sees the rest). The caller makes sure no
    /// peer still reads the line (the broadcast `EAGER_LINES` before).
    pub(crate) fn post_eager(&self, stamp: u64, words: [u64; 2], data: &[u8]) {
        let line = EagerLine::of(&self.local.main, stamp);
        self.local.main.write(line.data(), data);
        for (word, value) in line.call().into_iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        line.stamp().store(stamp, Ordering::Release);
    }

    /// The stamp of the eager broadcast in `rank`'s line for synchronisation point `point`
    /// (an `Acquire` load), checked: never below what this rank saw in that line before, and
    /// one its root can have posted there: 0 (never written) or a point of that line (equal
    /// to `point` modulo `EAGER_LINES`) before [`Board::reach`] (which the root posts only
    /// once every rank published the point after it, less `EAGER_LINES`). This rank has
    /// published `point` when it asks, so a posted stamp is at most `point`.
    ///
    /// # Errors
    /// What is wrong with the stamp, for a `Protocol` error naming `rank`.
    pub(crate) fn eager_stamp(&self, rank: usize, point: u64) -> Result<u64, String> {
        let line = EagerLine::of(self.main_of(rank), point);
        let stamp = line.stamp().load(Ordering::Acquire);
        let lines = EAGER_LINES as u64;
        let seen = &self.seen[rank].lines[(point % lines) as usize];
        let last = seen.load(Ordering::Relaxed);
        if stamp == last {
            return Ok(stamp);
        }
        let (published, reach) = self.reach();
        let on_line = stamp == 0 || stamp % lines == point % lines;
        if stamp < last || stamp >= reach || !on_line {
            return Err(format!(
                "its eager line for synchronisation point {point} holds stamp {stamp}; a root \
                 can have posted only 0 or a point of that line ({} modulo {lines}) from {last} \
                 (seen there before) to {} (this rank is at {published})",
                point % lines,
                reach.saturating_sub(1)
            ));
        }
        seen.store(stamp, Ordering::Relaxed);
        Ok(stamp)
    }

    /// The description of the eager broadcast in `rank`'s line for `stamp` (read after
    /// [`Board::eager_stamp`] said it is there).
    pub(crate) fn eager_call(&self, rank: usize, stamp: u64) -> [u64; 2] {
        let line = EagerLine::of(self.main_of(rank), stamp);
        line.call().map(|w| w.load(Ordering::Relaxed))
    }

    /// Copies the first `dst.len()` bytes of the data in `rank`'s eager line for `stamp`.
    pub(crate) fn read_eager(&self, rank: usize, stamp: u64, dst: &mut [u8]) {
        let main = self.main_of(rank);
        main.read(EagerLine::of(main, stamp).data(), dst);
    }

    /// Rank 0's store hints published with calls of `seq`'s parity.
    pub(crate) fn hints(&self, seq: u64) -> u64 {
        self.mailbox_of(0).hints(seq).load(Ordering::Relaxed)
    }

    /// Publishes this rank's store hints with calls of `seq`'s parity (rank 0), writing only
    /// when they change: peers read the line only for tuned sizes, and small calls should not
    /// pay for a line that moves between cores on every call.
    pub(crate) fn publish_hints(&self, seq: u64, hints: u64) {
        let slot = self.local.mailbox().hints(seq);
        if slot.load(Ordering::Relaxed) != hints {
            slot.store(hints, Ordering::Relaxed);
        }
    }

    /// Wakes `rank` if it may be asleep (after publishing what it may wait for).
    pub(crate) fn wake(&self, rank: usize) {
        if let Some(peer) = self.peer(rank) {
            peer.wake();
        }
    }

    /// Why `rank` will never answer, from its mailbox: it left the group or its group failed.
    pub(crate) fn departed(&self, rank: usize) -> Option<String> {
        self.peer(rank).and_then(Peer::departed)
    }

    /// Why `rank` will never answer, also checking whether its process ended.
    pub(crate) fn lost(&self, rank: usize) -> Option<String> {
        self.peer(rank).and_then(Peer::lost)
    }

    /// Whether `rank`'s process ended without leaving the group, and the reason to give.
    pub(crate) fn vanished(&self, rank: usize) -> Option<String> {
        self.peer(rank).and_then(Peer::vanished)
    }

    /// Marks this rank as possibly asleep; the caller re-checks what it waits for, then sleeps
    /// on [`Board::sleep_fds`] (see `Local::arm`).
    ///
    /// # Errors
    /// The barrier that peers publishing without a fence rely on failed.
    pub(crate) fn arm(&self) -> io::Result<()> {
        self.local.arm()
    }

    /// Undoes [`Board::arm`] after the sleep.
    pub(crate) fn disarm(&self) {
        self.local.disarm();
    }

    /// What to sleep on while waiting for `ranks`: this rank's doorbell, and each of their
    /// process's end.
    pub(crate) fn sleep_fds<'a>(
        &'a self,
        ranks: impl Iterator<Item = usize>,
        fds: &mut Vec<PollFd<'a>>,
    ) {
        fds.push(crate::os::poll_fd(self.local.doorbell.fd(), true, false));
        fds.extend(ranks.filter_map(|r| self.peer(r)).map(Peer::poll_liveness));
    }
}
