//! Byte formats of the data connections: the header that starts every operation on every
//! connection it uses (the handshake that opens a connection is `crate::auth`'s). Pure encode/decode, no I/O; decoding
//! never trusts the bytes (fuzzed in `fuzz/`).

use std::fmt;

use sha2::{Digest as _, Sha256};

use crate::dtype::{Dtype, ReduceOp};
use crate::error::Op;

/// Protocol version of data connections and the side channel. Bumped on any format change,
/// and on any change to how every rank chooses an algorithm (`algo::select`, `algo::pricing`
/// and what it prices), which ranks of one job must do alike.
pub(crate) const PROTOCOL_VERSION: u16 = 15;

const HEADER_MAGIC: [u8; 4] = *b"JCOP";

/// Length of [`Header`] on the wire.
pub(crate) const HEADER_LEN: usize = 64;

/// A SHA-256 digest of values a header cannot carry ([`counts_digest`]): ranks whose values
/// differ have different digests (no one can make two lists collide, by accident or on
/// purpose).
pub(crate) type Digest = [u8; 32];

/// The digest of the counts of a variable-size collective, as its headers carry it.
pub(crate) fn counts_digest(counts: &[usize]) -> Digest {
    let mut h = Sha256::new();
    h.update(b"jaccl counts\0");
    h.update((counts.len() as u64).to_le_bytes());
    for &c in counts {
        h.update((c as u64).to_le_bytes());
    }
    h.finalize().into()
}

/// What kind of operation a [`Header`] announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    /// Both `send` and the matching `recv`.
    SendRecv = 4,
    Barrier = 5,
    Broadcast = 6,
    Reduce = 7,
    Gather = 8,
    Scatter = 9,
    AllToAll = 10,
    AllToAllV = 11,
    AllGatherV = 12,
    ReduceScatterV = 13,
    Split = 14,
}

impl Kind {
    const ALL: [Kind; 14] = [
        Kind::AllReduce,
        Kind::AllGather,
        Kind::ReduceScatter,
        Kind::SendRecv,
        Kind::Barrier,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::Gather,
        Kind::Scatter,
        Kind::AllToAll,
        Kind::AllToAllV,
        Kind::AllGatherV,
        Kind::ReduceScatterV,
        Kind::Split,
    ];

    fn from_id(id: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == id)
    }

    pub(crate) fn of(op: Op) -> Kind {
        match op {
            Op::AllReduce => Kind::AllReduce,
            Op::AllGather => Kind::AllGather,
            Op::ReduceScatter => Kind::ReduceScatter,
            Op::Send | Op::Recv => Kind::SendRecv,
            Op::Barrier | Op::Init => Kind::Barrier,
            Op::Split | Op::Agree | Op::Shrink | Op::Grow => Kind::Split,
            Op::Broadcast => Kind::Broadcast,
            Op::Reduce => Kind::Reduce,
            Op::Gather => Kind::Gather,
            Op::Scatter => Kind::Scatter,
            Op::AllToAll => Kind::AllToAll,
            Op::AllToAllV => Kind::AllToAllV,
            Op::AllGatherV => Kind::AllGatherV,
            Op::ReduceScatterV => Kind::ReduceScatterV,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::SendRecv => "send/recv",
            Kind::Barrier => "barrier",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::Gather => "gather",
            Kind::Scatter => "scatter",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_all_v",
            Kind::AllGatherV => "all_gather_v",
            Kind::ReduceScatterV => "reduce_scatter_v",
            Kind::Split => "split",
        }
    }

    /// Whether the operation reduces (its header's reduction counts).
    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::AllReduce | Kind::ReduceScatter | Kind::Reduce | Kind::ReduceScatterV
        )
    }

    /// Whether the operation's header carries the digest of its counts
    /// ([`counts_digest`]): the collectives whose ranks pass a list of counts that must agree.
    pub(crate) fn has_counts(self) -> bool {
        matches!(self, Kind::AllGatherV | Kind::ReduceScatterV)
    }

    /// Whether the header has room for [`Header::history`]: not where the digest of the counts
    /// or a send's message takes its bytes.
    pub(crate) fn has_history(self) -> bool {
        !self.has_counts() && self != Kind::SendRecv
    }

    /// Whether the operation has a root (its header's root counts).
    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
        )
    }
}

/// Sent on each connection an operation uses, before its data, so that ranks calling different
/// operations (or lengths, types, reductions) fail with `Mismatch` instead of exchanging garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// Operations sent so far on this connection in this direction.
    pub(crate) seq: u32,
    /// The call's number among its group's collectives, which every rank counts alike
    /// (`Call::number`; 0 for point to point and in shared-memory descriptions, whose `seq`
    /// numbers the calls): a message that a rank sent in an earlier call and no rank read
    /// fails the call that reads it, even where that call is of the same kind.
    pub(crate) number: u32,
    pub(crate) kind: Kind,
    pub(crate) dtype: Dtype,
    /// Meaningful for reductions only; `Sum` otherwise.
    pub(crate) reduce: ReduceOp,
    /// The sending rank.
    pub(crate) sender: u32,
    /// Elements in the caller's call (per-rank block for all-gather and reduce-scatter; for
    /// the variable-size collectives the sum of the counts).
    pub(crate) count: u64,
    /// The root of a rooted collective; a send's or receive's tag (0 otherwise).
    pub(crate) root: u32,
    /// The digest of the counts where the kind has them ([`Kind::has_counts`]), else `None`.
    pub(crate) counts: Option<Digest>,
    /// A send's or receive's whole message in elements, of which this call is a piece
    /// (`count` when the message travels in one call), so that two ranks whose messages
    /// differ fail at the first piece, even when the pieces agree; 0 for the other kinds.
    pub(crate) message: u64,
    /// The digest of the group's rooted collectives before this call ([`rooted_history`]),
    /// where the kind has room ([`Kind::has_history`]: not send/recv, `all_gather_v` nor
    /// `reduce_scatter_v`; `None` in shared-memory descriptions): ranks that disagreed on a
    /// root in a call that every rank completed (none waited for what went elsewhere) fail
    /// at their next exchange of such headers.
    pub(crate) history: Option<Digest>,
}

/// The digest of the rooted collectives of a group up to one numbered `number`: `before`
/// (that of the calls before it; zeros for none) and the call's kind, type, reduction, count
/// and root, which every rank passes alike: 51 bytes, one block of SHA-256.
pub(crate) fn rooted_history(before: &Digest, number: u32, call: &Header) -> Digest {
    let mut h = Sha256::new();
    h.update(before);
    h.update(number.to_le_bytes());
    h.update([call.kind as u8, call.dtype.id(), call.reduce as u8]);
    h.update(call.count.to_le_bytes());
    h.update(call.root.to_le_bytes());
    h.finalize().into()
}

/// Counts of shared-memory call descriptions fit in 48 bits; the root takes the other 16.
const WORD_COUNT_BITS: u32 = 48;

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&HEADER_MAGIC);
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8] = self.kind as u8;
        b[9] = self.dtype.id();
        b[10] = self.reduce as u8;
        b[12..16].copy_from_slice(&self.sender.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..28].copy_from_slice(&self.root.to_le_bytes());
        b[28..32].copy_from_slice(&self.number.to_le_bytes());
        let digest = match self.kind.has_history() {
            true => self.history,
            false => self.counts,
        };
        if let Some(digest) = &digest {
            b[32..64].copy_from_slice(digest);
        }
        if self.kind == Kind::SendRecv {
            b[32..40].copy_from_slice(&self.message.to_le_bytes());
        }
        b
    }

    /// Parses a header; an error means the bytes are not a header at all (a protocol error).
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        if b[0..4] != HEADER_MAGIC {
            return Err(format!(
                "expected an operation header, got bytes {:02x?} (the stream lost its framing)",
                &b[0..8]
            ));
        }
        let kind = Kind::from_id(b[8]).ok_or_else(|| format!("unknown operation {}", b[8]))?;
        let dtype = Dtype::from_id(b[9]).ok_or_else(|| format!("unknown dtype id {}", b[9]))?;
        let reduce =
            ReduceOp::from_id(b[10]).ok_or_else(|| format!("unknown reduction id {}", b[10]))?;
        let count = u64_at(b, 16);
        let message = match kind {
            Kind::SendRecv => u64_at(b, 32),
            _ => 0,
        };
        if kind == Kind::SendRecv && message < count {
            return Err(format!(
                "a send of {count} elements as a piece of a message of {message}"
            ));
        }
        Ok(Header {
            seq: u32_at(b, 4),
            number: u32_at(b, 28),
            kind,
            dtype,
            reduce,
            sender: u32_at(b, 12),
            count,
            root: u32_at(b, 24),
            counts: kind.has_counts().then(|| digest_at(b, 32)),
            message,
            history: kind.has_history().then(|| digest_at(b, 32)),
        })
    }

    /// The header as two words, as a shared-memory mailbox publishes it (the sender is the
    /// mailbox's owner, the digest of the counts has a line of its own), or `None` when its
    /// count or root does not fit: the count takes 48 bits, the root 16 (shared memory joins
    /// ranks of one host, far fewer than 2^16, moving far fewer than 2^48 elements). Only
    /// collectives publish there: a send's message (`message`) has no room in the words, nor
    /// has the call number ([`Header::number`]), which `seq` stands for there.
    pub(crate) fn to_words(self) -> Option<[u64; 2]> {
        if self.count >> WORD_COUNT_BITS != 0 || self.root >> 16 != 0 || self.message != 0 {
            return None;
        }
        let word = u64::from(self.seq)
            | u64::from(self.kind as u8) << 32
            | u64::from(self.dtype.id()) << 40
            | u64::from(self.reduce as u8) << 48;
        Some([word, self.count | u64::from(self.root) << WORD_COUNT_BITS])
    }

    /// Parses [`Header::to_words`] published by rank `sender`, with the digest of the counts
    /// it published beside them (read only for a kind that has counts). The words carry no
    /// call number ([`Header::number`] 0): their `seq` numbers the calls.
    pub(crate) fn from_words(
        words: [u64; 2],
        sender: u32,
        counts: impl FnOnce() -> Digest,
    ) -> Result<Header, String> {
        let byte = |shift: u32| (words[0] >> shift) as u8;
        let kind =
            Kind::from_id(byte(32)).ok_or_else(|| format!("unknown operation {}", byte(32)))?;
        Ok(Header {
            seq: words[0] as u32,
            number: 0,
            kind,
            dtype: Dtype::from_id(byte(40))
                .ok_or_else(|| format!("unknown dtype id {}", byte(40)))?,
            reduce: ReduceOp::from_id(byte(48))
                .ok_or_else(|| format!("unknown reduction id {}", byte(48)))?,
            sender,
            count: words[1] & ((1 << WORD_COUNT_BITS) - 1),
            root: (words[1] >> WORD_COUNT_BITS) as u32,
            counts: kind.has_counts().then(counts),
            message: 0,
            history: None,
        })
    }

    /// Whether `other` describes the same call (its sequence numbers, call number and sender
    /// aside).
    pub(crate) fn same_call(&self, other: &Header) -> bool {
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.reduce == other.reduce
            && self.count == other.count
            && self.root == other.root
            && self.counts == other.counts
            && self.message == other.message
    }

    /// How `self` (what this rank expects) and `got` (what the peer sent) differ, if they do.
    pub(crate) fn mismatch(&self, got: &Header) -> Option<String> {
        let sender = got.sender;
        // Call numbers wrap: the nearer way round tells which is older.
        let ahead = got.number.wrapping_sub(self.number) as i32;
        if ahead < 0 {
            return Some(format!(
                "rank {sender} sent {got} as its collective #{} of the group; this rank is at \
                 #{}, {self}: a message of an earlier call that no rank read (ranks that \
                 disagree on a root leave such), or rank {sender} skipped a call",
                got.number, self.number
            ));
        }
        if ahead > 0 {
            return Some(format!(
                "rank {sender} is at its collective #{} of the group, this rank at #{}: this \
                 rank skipped a call, or the two disagreed on a root in #{}",
                got.number, self.number, self.number
            ));
        }
        if self.same_call(got) {
            if self.seq != got.seq {
                return Some(format!(
                    "rank {sender} is at operation #{} on this connection, this rank at #{} (one \
                     of them skipped or repeated a call)",
                    got.seq, self.seq
                ));
            }
            if self.history.is_some() && got.history.is_some() && self.history != got.history {
                return Some(format!(
                    "rank {sender} and this rank described the group's earlier broadcasts, \
                     reduces, gathers and scatters otherwise (one of them named another root, \
                     count or type, and no rank read its messages)"
                ));
            }
            return None;
        }
        let other_counts = Header {
            counts: self.counts,
            ..*got
        };
        if self.counts != got.counts && self.same_call(&other_counts) {
            return Some(format!(
                "rank {sender} passed other counts to {} than this rank (both add up to {})",
                self.kind.name(),
                self.count
            ));
        }
        Some(format!(
            "rank {sender} called {got}; this rank called {self}"
        ))
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.kind.name();
        match self.kind {
            Kind::Barrier => return f.write_str("barrier"),
            k if k.reduces() => write!(f, "{name}({})", self.reduce)?,
            _ => f.write_str(name)?,
        }
        match self.kind {
            Kind::AllToAllV => write!(f, " of {}", self.dtype)?,
            Kind::AllGatherV | Kind::ReduceScatterV => {
                write!(f, " of {} × {} in all", self.count, self.dtype)?;
            }
            _ => write!(f, " of {} × {}", self.count, self.dtype)?,
        }
        if self.kind.rooted() {
            write!(f, " to or from root {}", self.root)?;
        }
        if self.kind == Kind::SendRecv {
            write!(f, " with tag {}", self.root)?;
            if self.message != self.count {
                write!(
                    f,
                    ", a piece of a message of {} × {}",
                    self.message, self.dtype
                )?;
            }
        }
        Ok(())
    }
}

/// `x` as a `u32` for a wire field, saturating (sizes and ranks above `u32::MAX` are refused
/// long before anything is sent).
pub(crate) fn to_u32(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The little-endian `u32` at `at` of `b`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// The 32 bytes at `at` of `b`.
fn digest_at(b: &[u8], at: usize) -> Digest {
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&b[at..at + 32]);
    digest
}

/// The little-endian `u64` at `at` of `b`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Bounds-checked little-endian reads of a message, for bytes from the network.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "message too short ({} bytes missing)",
                n - self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32_at(self.take(4)?, 0))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64_at(self.take(8)?, 0))
    }

    /// Whatever is left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    /// Fails if bytes are left.
    pub(crate) fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn header() -> Header {
        Header {
            seq: 7,
            number: 0,
            kind: Kind::AllReduce,
            dtype: Dtype::Float32,
            reduce: ReduceOp::Max,
            sender: 3,
            count: 1 << 40,
            root: 0,
            counts: None,
            message: 0,
            history: Some([4; 32]),
        }
    }

    #[test]
    fn header_round_trips_and_describes_mismatches() {
        let h = header();
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let words = h.to_words().unwrap();
        let described = Header { history: None, ..h };
        assert_eq!(
            Header::from_words(words, h.sender, || [9; 32]),
            Ok(described)
        );
        assert_eq!(h.mismatch(&h), None);
        let other = Header { count: 5, ..h };
        let msg = h.mismatch(&other).unwrap();
        assert!(msg.contains("all_reduce(max) of 5 × f32"), "{msg}");
        let later = Header { seq: 8, ..h };
        assert!(h.mismatch(&later).unwrap().contains("#8"));
        // A call's number travels whole; an earlier call's message is no message of this one.
        let numbered = Header {
            number: 70_000,
            ..h
        };
        assert_eq!(Header::decode(&numbered.encode()), Ok(numbered));
        let msg = numbered.mismatch(&h).unwrap();
        assert!(
            msg.contains("collective #0") && msg.contains("at #70000"),
            "{msg}"
        );
        let msg = h.mismatch(&numbered).unwrap();
        assert!(msg.contains("skipped a call"), "{msg}");
        // An earlier call's message of another kind is named, with both numbers; numbers
        // wrap, so the one before 0 is older.
        let barrier = Header {
            kind: Kind::Barrier,
            ..h
        };
        let msg = numbered.mismatch(&barrier).unwrap();
        assert!(msg.contains("sent barrier as its collective #0"), "{msg}");
        let wrapped = Header {
            number: u32::MAX,
            ..h
        };
        assert!(h.mismatch(&wrapped).unwrap().contains("earlier call"));
        // Another call in the same collective: both named.
        let msg = h.mismatch(&barrier).unwrap();
        assert!(
            msg.contains("called barrier; this rank called all_reduce"),
            "{msg}"
        );
        // The rooted calls before, exactly: one differing byte of the digest is a mismatch.
        let mut other = [4; 32];
        other[31] = 5;
        let earlier = Header {
            history: Some(other),
            ..h
        };
        assert!(h.mismatch(&earlier).unwrap().contains("earlier broadcasts"));
        let digest = |root| rooted_history(&[0; 32], 3, &Header { root, ..h });
        assert_ne!(digest(1), digest(65537));
        // What does not fit a mailbox's words is refused, never cut.
        assert_eq!(
            Header {
                count: 1 << 48,
                ..h
            }
            .to_words(),
            None
        );
        assert_eq!(Header { root: 1 << 16, ..h }.to_words(), None);
    }

    #[test]
    fn pieces_of_messages_that_differ_differ() {
        let piece = |count: u64, message: u64| Header {
            kind: Kind::SendRecv,
            count,
            message,
            history: None,
            ..header()
        };
        let (sent, expected) = (piece(16, 32), piece(16, 16));
        assert_eq!(Header::decode(&sent.encode()), Ok(sent));
        let msg = expected.mismatch(&sent).unwrap();
        assert!(msg.contains("a piece of a message of 32 × f32"), "{msg}");
        assert!(msg.ends_with("send/recv of 16 × f32 with tag 0"), "{msg}");
        // A piece larger than its message is not a header an honest peer writes.
        assert!(Header::decode(&piece(17, 16).encode()).is_err());
        // Sends never go to a shared-memory mailbox, whose words have no room for the message.
        assert_eq!(sent.to_words(), None);
    }

    #[test]
    fn tags_and_counts_are_compared_whole() {
        let send = |tag: u32| Header {
            kind: Kind::SendRecv,
            count: 1,
            root: tag,
            message: 1,
            history: None,
            ..header()
        };
        // Tags that a 16-bit fold made equal.
        for (a, b) in [
            (65536, 1),
            (u32::MAX, 0),
            (0x0001_0001, 0),
            (u32::MAX - 1, 1),
        ] {
            let msg = send(a).mismatch(&send(b)).unwrap();
            assert!(msg.contains(&format!("with tag {b}")), "{msg}");
            assert!(msg.contains(&format!("with tag {a}")), "{msg}");
        }
        // Counts a 48-bit FNV digest made equal (both add up to 257 + 0 or 1 + 111872 alike).
        let gather_v = |counts: &[usize]| Header {
            kind: Kind::AllGatherV,
            count: counts.iter().sum::<usize>() as u64,
            counts: Some(counts_digest(counts)),
            history: None,
            ..header()
        };
        let (a, b) = (gather_v(&[257, 0]), gather_v(&[1, 111872]));
        assert!(a.mismatch(&b).is_some());
        let (a, b) = (gather_v(&[1, 2]), gather_v(&[2, 1]));
        let msg = a.mismatch(&b).unwrap();
        assert!(
            msg.contains("other counts") && msg.contains("add up to 3"),
            "{msg}"
        );
        assert_eq!(Header::decode(&a.encode()), Ok(a));
        assert_ne!(counts_digest(&[0]), counts_digest(&[0, 0]));
    }

    proptest! {
        /// Headers with the valid magic (so decoding gets past it) and random fields.
        #[test]
        fn headers_with_a_valid_magic_never_panic(rest in proptest::collection::vec(any::<u8>(), HEADER_LEN - 4), small_ids in any::<bool>()) {
            let mut b = [0u8; HEADER_LEN];
            b[..4].copy_from_slice(&HEADER_MAGIC);
            b[4..].copy_from_slice(&rest);
            if small_ids {
                // Often valid ids, so mismatches and printing are reached too.
                b[8] %= 15;
                b[9] %= 14;
                b[10] %= 8;
            }
            if let Ok(h) = Header::decode(&b) {
                let _ = h.mismatch(&header());
                let _ = h.to_string();
                let small = Header { count: h.count >> 16, root: h.root & 0xffff, message: 0, number: 0, history: None, ..h };
                let words = small.to_words().unwrap();
                let digest = h.counts.unwrap_or_default();
                prop_assert_eq!(Header::from_words(words, h.sender, || digest), Ok(small));
            }
        }

        /// Mailbox words from a shared-memory peer.
        #[test]
        fn mailbox_words_never_panic(a in any::<u64>(), b in any::<u64>()) {
            let _ = Header::from_words([a, b], 1, || [0; 32]);
        }
    }
}
