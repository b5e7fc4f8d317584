//! Byte formats of the data connections: the header that starts every operation on every
//! connection it uses (the handshake that opens a connection is `crate::auth`'s). Pure encode/decode, no I/O; decoding
//! never trusts the bytes (fuzzed in `fuzz/`).

use std::fmt;

use crate::dtype::{Dtype, ReduceOp};
use crate::error::Op;

/// Protocol version of data connections and the side channel. Bumped on any format change.
pub(crate) const PROTOCOL_VERSION: u16 = 3;

const HEADER_MAGIC: [u8; 4] = *b"JCOP";

/// Length of [`Header`] on the wire.
pub(crate) const HEADER_LEN: usize = 32;

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
            Op::Split => Kind::Split,
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

    /// Whether the operation has a root (its header's root counts).
    fn rooted(self) -> bool {
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
    pub(crate) kind: Kind,
    pub(crate) dtype: Dtype,
    /// Meaningful for reductions only; `Sum` otherwise.
    pub(crate) reduce: ReduceOp,
    /// The sending rank.
    pub(crate) sender: u32,
    /// Elements in the caller's call (per-rank block for all-gather and reduce-scatter; for
    /// the variable-size collectives a digest of every rank's counts).
    pub(crate) count: u64,
    /// The root of a rooted collective; a send's or receive's [`tag_digest`] (0 otherwise).
    pub(crate) root: u32,
}

/// A send/recv tag as headers carry it: the 16 bits a shared-memory call description has for
/// it, the tag itself below 2^16 and a fold of both halves above.
pub(crate) fn tag_digest(tag: u32) -> u16 {
    (tag ^ (tag >> 16)) as u16
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
        Ok(Header {
            seq: u32_at(b, 4),
            kind,
            dtype,
            reduce,
            sender: u32_at(b, 12),
            count: u64_at(b, 16),
            root: u32_at(b, 24),
        })
    }

    /// The header as two words, as a shared-memory mailbox publishes it (the sender is the
    /// mailbox's owner; the count keeps its low 48 bits, the root its low 16: shared memory
    /// joins ranks of one host, far fewer than 2^16, moving far fewer than 2^48 elements).
    pub(crate) fn to_words(self) -> [u64; 2] {
        let word = u64::from(self.seq)
            | u64::from(self.kind as u8) << 32
            | u64::from(self.dtype.id()) << 40
            | u64::from(self.reduce as u8) << 48;
        let count = self.count & ((1 << WORD_COUNT_BITS) - 1);
        [
            word,
            count | u64::from(self.root & 0xffff) << WORD_COUNT_BITS,
        ]
    }

    /// Parses [`Header::to_words`] published by rank `sender`.
    pub(crate) fn from_words(words: [u64; 2], sender: u32) -> Result<Header, String> {
        let byte = |shift: u32| (words[0] >> shift) as u8;
        Ok(Header {
            seq: words[0] as u32,
            kind: Kind::from_id(byte(32))
                .ok_or_else(|| format!("unknown operation {}", byte(32)))?,
            dtype: Dtype::from_id(byte(40))
                .ok_or_else(|| format!("unknown dtype id {}", byte(40)))?,
            reduce: ReduceOp::from_id(byte(48))
                .ok_or_else(|| format!("unknown reduction id {}", byte(48)))?,
            sender,
            count: words[1] & ((1 << WORD_COUNT_BITS) - 1),
            root: (words[1] >> WORD_COUNT_BITS) as u32,
        })
    }

    /// Whether `other` describes the same call (its sequence number and sender aside).
    pub(crate) fn same_call(&self, other: &Header) -> bool {
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.reduce == other.reduce
            && self.count == other.count
            && self.root == other.root
    }

    /// How `self` (what this rank expects) and `got` (what the peer sent) differ, if they do.
    pub(crate) fn mismatch(&self, got: &Header) -> Option<String> {
        let same_call = self.same_call(got);
        if same_call && self.seq == got.seq {
            return None;
        }
        if same_call {
            return Some(format!(
                "rank {} is at operation #{} on this connection, this rank at #{} (one of them \
                 skipped or repeated a call)",
                got.sender, got.seq, self.seq
            ));
        }
        Some(format!(
            "rank {} called {got}; this rank called {self}",
            got.sender
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
            Kind::AllToAllV | Kind::AllGatherV | Kind::ReduceScatterV => {
                write!(f, " of {} (counts digest {:#x})", self.dtype, self.count)?;
            }
            _ => write!(f, " of {} × {}", self.count, self.dtype)?,
        }
        if self.kind.rooted() {
            write!(f, " to or from root {}", self.root)?;
        }
        if self.kind == Kind::SendRecv {
            write!(f, " with tag {}", self.root)?;
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
            kind: Kind::AllReduce,
            dtype: Dtype::Float32,
            reduce: ReduceOp::Max,
            sender: 3,
            count: 1 << 40,
            root: 0,
        }
    }

    #[test]
    fn header_round_trips_and_describes_mismatches() {
        let h = header();
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        assert_eq!(Header::from_words(h.to_words(), h.sender), Ok(h));
        assert_eq!(h.mismatch(&h), None);
        let other = Header { count: 5, ..h };
        let msg = h.mismatch(&other).unwrap();
        assert!(msg.contains("all_reduce(max) of 5 × f32"), "{msg}");
        let later = Header { seq: 8, ..h };
        assert!(h.mismatch(&later).unwrap().contains("#8"));
    }

    proptest! {
        /// Headers with the valid magic (so decoding gets past it) and random fields.
        #[test]
        fn headers_with_a_valid_magic_never_panic(rest in proptest::array::uniform28(any::<u8>()), small_ids in any::<bool>()) {
            let mut b = [0u8; HEADER_LEN];
            b[..4].copy_from_slice(&HEADER_MAGIC);
            b[4..].copy_from_slice(&rest);
            if small_ids {
                // Often valid ids, so mismatches and printing are reached too.
                b[8] %= 14;
                b[9] %= 14;
                b[10] %= 8;
            }
            if let Ok(h) = Header::decode(&b) {
                let _ = h.mismatch(&header());
                let _ = h.to_string();
                let small = Header { count: h.count >> 16, root: h.root & 0xffff, ..h };
                prop_assert_eq!(Header::from_words(small.to_words(), h.sender), Ok(small));
            }
        }

        /// Mailbox words from a shared-memory peer.
        #[test]
        fn mailbox_words_never_panic(a in any::<u64>(), b in any::<u64>()) {
            let _ = Header::from_words([a, b], 1);
        }
    }
}
