//! The layout of a rank's segment and typed views of its control words.
//!
//! ```text
//! control     the mailbox (lines 0-2), the eager lines, then a tail and a head line per
//!             outgoing ring (whole pages)
//! 2 areas     the direct collectives' data (rounds alternate between them)
//! rings       per outgoing ring, its bytes (both ends map them twice, back to back)
//! ```
//!
//! Every line of the control page has one writer: the mailbox, the eager lines and the tails
//! are the owner's, a ring's head is its reader's (the peer). Page 0 and the areas are mapped
//! as one [`Mapping`]; each ring separately, mirrored. What readers check of each value is
//! written next to it: [`Mailbox`], [`EagerLine`], and the ring cursors in `super::link`. A
//! segment's size is checked (and sealed) before it is mapped, so no offset computed from this
//! layout can fall outside. Every peer maps the control page writable (it writes the heads
//! there), so "one writer" is the protocol, not the hardware's: a reader checks every value
//! as if anyone could have written it, and names the owner when one is wrong.

use std::sync::atomic::{AtomicU32, AtomicU64};

use super::sys::{self, Mapping};

const LINE: usize = 64;
/// Lines of eager broadcasts each rank has ([`EagerLine`]): how many calls a root may be ahead.
pub(crate) const EAGER_LINES: usize = 256;
/// Rings per wire: one to each side (the left and the right neighbour).
const SIDES: usize = 2;

/// The outgoing ring to ring neighbours and to every other rank of the group. Indices are
/// the same in every segment, so each side of a pair knows which ring of the other's it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// Wire `w` to the left neighbour.
    Left(usize),
    /// Wire `w` to the right neighbour.
    Right(usize),
    /// The one ring to a rank off the ring (the mesh, a send to any rank).
    To(usize),
}

/// Where everything is in a segment. Every rank of a group computes the same layout, and a
/// peer's is checked against it at set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Outgoing rings: `SIDES × wires` to the neighbours (left wires first, like the ring's
    /// channels), then one per rank of the group ([`Layout::ring_index`]).
    pub(crate) rings: usize,
    /// Wires per neighbour.
    pub(crate) wires: usize,
    /// Bytes of each ring (a page multiple).
    pub(crate) ring_bytes: usize,
    /// Bytes of each of the two areas (a page multiple).
    pub(crate) area_bytes: usize,
}

impl Layout {
    /// The layout for `wires` wires per neighbour in a group of `size` ranks, with each size
    /// rounded up to whole pages. Rings to ranks off the ring cost address space only until
    /// they carry data (untouched pages of a memfd take no memory).
    pub(crate) fn new(wires: usize, size: usize, ring_bytes: usize, area_bytes: usize) -> Layout {
        let page = sys::page_size();
        Layout {
            rings: SIDES * wires + size,
            wires,
            ring_bytes: ring_bytes.div_ceil(page) * page,
            area_bytes: area_bytes.div_ceil(page) * page,
        }
    }

    /// The index of `ring` among the outgoing rings.
    pub(crate) fn ring_index(&self, ring: Ring) -> usize {
        match ring {
            Ring::Left(w) => w,
            Ring::Right(w) => self.wires + w,
            Ring::To(rank) => SIDES * self.wires + rank,
        }
    }

    /// Bytes of the control lines: the mailbox, the eager lines, then the cursors of every
    /// ring.
    fn control_len(&self) -> usize {
        let page = sys::page_size();
        (RINGS_AT + self.rings * 2 * LINE).div_ceil(page) * page
    }

    /// Bytes of the control lines and the areas, mapped together.
    pub(crate) fn main_len(&self) -> usize {
        self.control_len() + 2 * self.area_bytes
    }

    /// The whole segment.
    pub(crate) fn total(&self) -> usize {
        self.main_len() + self.rings * self.ring_bytes
    }

    /// Offset of area `parity` (0 or 1) in the main mapping.
    pub(crate) fn area(&self, parity: usize) -> usize {
        self.control_len() + (parity % 2) * self.area_bytes
    }

    /// Offset of ring `i`'s bytes in the segment.
    pub(crate) fn ring(&self, i: usize) -> usize {
        self.main_len() + i * self.ring_bytes
    }

    /// Offsets of ring `i`'s tail (written by the owner) and head (written by the reader) in
    /// the control lines.
    pub(crate) fn ring_cursors(&self, i: usize) -> (usize, usize) {
        let tail = RINGS_AT + i * 2 * LINE;
        (tail, tail + LINE)
    }

    /// The layout as bytes, for the handshake.
    pub(crate) fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, v) in [self.rings, self.wires, self.ring_bytes, self.area_bytes]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&(v as u64).to_le_bytes());
        }
        b
    }
}

/// Where the digests of the calls' counts are in the control page (after the mailbox's two
/// lines): see [`Mailbox::counts`].
const COUNTS_AT: usize = 2 * LINE;
/// Where the eager lines start in the control page (after the mailbox and the digests).
const EAGER_AT: usize = 3 * LINE;
/// Where the rings' cursors start in the control page.
const RINGS_AT: usize = EAGER_AT + EAGER_LINES * LINE;

/// One of a rank's eager lines (line `k` carries the eager broadcasts it roots at
/// synchronisation points `k`, `k + EAGER_LINES`, …, see `algo::shared_memory`), so a receiver
/// fetches one cache line. Written by its owner only, and read only by a rank that waits for
/// that owner as the root of the broadcast at point `p` (and has published `p` itself):
/// - **stamp** (word 0): the point of the broadcast the line holds, written last (`Release`).
///   The reader (`Board::eager_stamp`) checks that it is 0 (never written) or a point of this
///   line (equal to `p` modulo `EAGER_LINES`), never below the stamp it saw in this line
///   before, and at most the reader's stamp plus `EAGER_LINES - 1`: a root posts point `k`
///   only once every rank published `k + 1 - EAGER_LINES` (the broadcast that used the line
///   last), so here at most `p`. `p` itself means posted; anything else, not yet;
/// - **description** (words 1-2): parsed with `Header::from_words` (unknown ids rejected) and
///   compared whole with the reader's own call, its sequence number (`Direct::made`, the
///   calls before) included;
/// - **data** (the rest): the reader copies as many bytes as its own call has.
///
/// A value that breaks these rules is a `Protocol` error naming the owner (a description
/// that differs, a `Mismatch`). No value becomes an index, a length or an offset.
#[derive(Clone, Copy)]
pub(crate) struct EagerLine<'a> {
    main: &'a Mapping,
    at: usize,
}

/// Bytes of data an eager line carries.
pub(crate) const EAGER_BYTES: usize = LINE - 24;

impl<'a> EagerLine<'a> {
    /// Line `k % EAGER_LINES` of the segment mapped at `main`.
    pub(crate) fn of(main: &'a Mapping, k: u64) -> EagerLine<'a> {
        let at = EAGER_AT + (k % EAGER_LINES as u64) as usize * LINE;
        EagerLine { main, at }
    }

    pub(crate) fn stamp(self) -> &'a AtomicU64 {
        self.main.atomic_u64(self.at)
    }

    pub(crate) fn call(self) -> [&'a AtomicU64; 2] {
        [
            self.main.atomic_u64(self.at + 8),
            self.main.atomic_u64(self.at + 16),
        ]
    }

    /// Offset (in the main mapping) of the line's data.
    pub(crate) fn data(self) -> usize {
        self.at + 24
    }
}

/// What a rank is doing, as its peers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum State {
    /// In the group (the zero-filled start).
    Running = 0,
    /// Left the group normally.
    Closed = 1,
    /// An operation failed; its group is poisoned.
    Failed = 2,
}

/// A rank's mailbox: the first three lines of its segment. Line 0 is what peers wait on, so
/// one cache-line transfer brings all they need; line 1 changes rarely, so peers keep it
/// cached; line 2 is read only for the calls that have counts.
///
/// Who writes what, and what the reader checks (a peer is an authenticated member of the job,
/// but a bug or a hostile member must not make this rank panic, read outside its mappings, or
/// wait on or trust a stamp no honest rank can write):
/// - **stamp** (line 0) is written by the owner only: how many synchronisation points of the
///   direct collectives it has reached (`Release`, after all it covers). The reader
///   (`Board::stamp_of`) checks that it never goes below the greatest it saw of that rank, and
///   never passes the reader's own stamp plus `EAGER_LINES`: a rank publishes point `k` only
///   after it finished point `k - 1`, which takes every rank at `k - 1` (a synchronisation) or
///   its root's eager line posted (an eager broadcast, posted only once every rank published
///   `k - EAGER_LINES`). The deadlock search is given this word too (a rank's reports read
///   their own mailbox), so it sees what the waiting ranks see;
/// - **two call slots** (line 0, calls of even and odd number, see `algo::shared_memory`) are written
///   by the owner only, before the stamp that publishes them: the call's description (two
///   words) and up to [`INLINE`] bytes of its data. The reader parses the description with
///   `Header::from_words` (unknown ids rejected) and compares it whole with its own call,
///   sequence number (`Direct::made`) included; the count of eager broadcasts the owner
///   rooted (its top byte) must add up, over all ranks, to the broadcasts since the last call
///   (`Direct::check_roots`). The inline data is read at offsets of the reader's own call;
/// - **state** (line 1, [`State`]) is written by the owner only; compared with `Running` and
///   `Closed`, anything else is a failed group;
/// - **sleeping** (line 1) is written by the owner only, non-zero while it may be asleep on
///   its doorbell; every waker compares it with zero;
/// - **hints** (line 1, rank 0's store hints, for the call after call `c` in the slot of `c`'s
///   parity) are written by rank 0 only; tested bit by bit to pick a kind of store (any value
///   gives correct results);
/// - **counts** (line 2, per parity, [`Mailbox::counts`]) are written by the owner only, for
///   the calls that have counts; compared whole with the reader's own digest.
///
/// A value that breaks these rules is a `Protocol` error naming the owner (a description or
/// digest that differs, a `Mismatch`). No value from a mailbox becomes an index, a length or an
/// offset: offsets into the areas and the inline data come from the reader's own call.
#[derive(Clone, Copy)]
pub(crate) struct Mailbox<'a>(&'a Mapping);

/// Bytes of data a call slot carries inline.
pub(crate) const INLINE: usize = 8;

impl<'a> Mailbox<'a> {
    pub(crate) fn of(main: &'a Mapping) -> Mailbox<'a> {
        Mailbox(main)
    }

    pub(crate) fn stamp(self) -> &'a AtomicU64 {
        self.0.atomic_u64(0)
    }

    /// The two words of the description of calls with this parity.
    pub(crate) fn call(self, parity: u64) -> [&'a AtomicU64; 2] {
        let at = Mailbox::slot(parity);
        [self.0.atomic_u64(at), self.0.atomic_u64(at + 8)]
    }

    /// Offset (in the main mapping) of the inline data of calls with this parity.
    pub(crate) fn inline(parity: u64) -> usize {
        Mailbox::slot(parity) + 16
    }

    fn slot(parity: u64) -> usize {
        8 + (parity % 2) as usize * 24
    }

    pub(crate) fn state_word(self) -> &'a AtomicU32 {
        self.0.atomic_u32(LINE)
    }

    pub(crate) fn sleeping(self) -> &'a AtomicU32 {
        self.0.atomic_u32(LINE + 4)
    }

    /// The digest of the counts of the call of this parity (line 2, two halves), for the
    /// calls whose ranks pass counts that must agree (`op_header::Kind::has_counts`): written
    /// with the call's description, before its stamp; read only for such a call.
    pub(crate) fn counts(self, parity: u64) -> [&'a AtomicU64; 4] {
        let at = COUNTS_AT + (parity % 2) as usize * 32;
        std::array::from_fn(|i| self.0.atomic_u64(at + 8 * i))
    }

    /// Rank 0's store hints published with calls of this parity.
    pub(crate) fn hints(self, parity: u64) -> &'a AtomicU64 {
        self.0.atomic_u64(LINE + 8 + (parity % 2) as usize * 8)
    }
}
