//! What the ranks of an agreement send one another and answer questions with: calls,
//! hellos, decisions and standings, as bytes; every value read is checked (ranks in range and
//! in order, flags 0 or 1); and what they are.

use std::collections::BTreeSet;

use crate::op_header::{Reader, to_u32};

/// What was called: every rank of an agreement must call the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    /// Which operation (the group's numbering).
    pub(crate) kind: u8,
    /// Ranks the caller leaves out, sorted: they do not take part.
    pub(crate) left_out: Vec<usize>,
}

/// What a rank brings to an agreement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bringing {
    pub(crate) call: Call,
    pub(crate) flag: bool,
}

/// What the ranks agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The AND of the flags of the ranks alive, and those ranks (sorted).
    Agreed { flag: bool, alive: Vec<usize> },
    /// `peer` called something else than `by` did.
    Mismatch {
        by: usize,
        peer: usize,
        detail: String,
    },
}

/// Where a rank stands in an agreement, as its listener answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Standing {
    /// Taking part, with its call and the ranks it counts as lost.
    Taking {
        call: Call,
        lost: Vec<usize>,
    },
    Decided(Decision),
    /// Out: another rank counted it as lost.
    Out,
    /// It went on with a group formed by an earlier attempt of the same shrink (`super::moved_on`).
    MovedOn,
}

/// A list of ranks: its length, then each (`u32`s, little-endian).
fn encode_ranks(b: &mut Vec<u8>, ranks: &[usize]) {
    b.extend_from_slice(&to_u32(ranks.len()).to_le_bytes());
    for &r in ranks {
        b.extend_from_slice(&to_u32(r).to_le_bytes());
    }
}

/// Reads [`encode_ranks`]' list: strictly increasing ranks below `size`.
fn decode_ranks(r: &mut Reader<'_>, size: usize) -> Option<Vec<usize>> {
    let n = r.u32().ok()? as usize;
    if n > size {
        return None;
    }
    let ranks: Vec<usize> = (0..n)
        .map(|_| r.u32().map(|x| x as usize))
        .collect::<Result<_, _>>()
        .ok()?;
    let increasing = ranks.windows(2).all(|w| w[0] < w[1]);
    (increasing && ranks.iter().all(|&x| x < size)).then_some(ranks)
}

fn encode_call(b: &mut Vec<u8>, call: &Call) {
    b.push(call.kind);
    encode_ranks(b, &call.left_out);
}

fn decode_call(r: &mut Reader<'_>, size: usize) -> Option<Call> {
    let kind = r.u8().ok()?;
    let left_out = decode_ranks(r, size)?;
    Some(Call { kind, left_out })
}

fn decode_bool(r: &mut Reader<'_>) -> Option<bool> {
    match r.u8().ok()? {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

/// A member's hello: its call, its flag, the ranks it counts as lost.
pub(super) fn encode_bringing(b: &Bringing, lost: &BTreeSet<usize>) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_call(&mut bytes, &b.call);
    bytes.push(u8::from(b.flag));
    encode_ranks(&mut bytes, &lost.iter().copied().collect::<Vec<_>>());
    bytes
}

pub(super) fn decode_bringing(bytes: &[u8], size: usize) -> Option<(Bringing, Vec<usize>)> {
    let mut r = Reader(bytes);
    let call = decode_call(&mut r, size)?;
    let flag = decode_bool(&mut r)?;
    let lost = decode_ranks(&mut r, size)?;
    r.end().ok()?;
    Some((Bringing { call, flag }, lost))
}

/// A decision: 0, the flag and the ranks alive; or 1, the ranks `by` and `peer`, the detail.
pub(super) fn encode_decision(d: &Decision) -> Vec<u8> {
    match d {
        Decision::Agreed { flag, alive } => {
            let mut b = vec![0, u8::from(*flag)];
            encode_ranks(&mut b, alive);
            b
        }
        Decision::Mismatch { by, peer, detail } => {
            let mut b = vec![1];
            b.extend_from_slice(&to_u32(*by).to_le_bytes());
            b.extend_from_slice(&to_u32(*peer).to_le_bytes());
            b.extend_from_slice(detail.as_bytes());
            b
        }
    }
}

pub(super) fn decode_decision(bytes: &[u8], size: usize) -> Option<Decision> {
    let mut r = Reader(bytes);
    match r.u8().ok()? {
        0 => {
            let flag = decode_bool(&mut r)?;
            let alive = decode_ranks(&mut r, size)?;
            r.end().ok()?;
            (!alive.is_empty()).then_some(Decision::Agreed { flag, alive })
        }
        1 => {
            let by = r.u32().ok()? as usize;
            let peer = r.u32().ok()? as usize;
            let detail = String::from_utf8_lossy(r.rest()).into_owned();
            (by < size && peer < size).then_some(Decision::Mismatch { by, peer, detail })
        }
        _ => None,
    }
}

/// A standing: 0, the call and the ranks lost; 1 and the decision; 2 (out); 3 (moved on).
pub(super) fn encode_standing(s: &Standing) -> Vec<u8> {
    match s {
        Standing::Taking { call, lost } => {
            let mut b = vec![0];
            encode_call(&mut b, call);
            encode_ranks(&mut b, lost);
            b
        }
        Standing::Decided(d) => [&[1u8][..], &encode_decision(d)].concat(),
        Standing::Out => vec![2],
        Standing::MovedOn => vec![3],
    }
}

pub(super) fn decode_standing(bytes: &[u8], size: usize) -> Option<Standing> {
    let (&tag, rest) = bytes.split_first()?;
    match (tag, rest.is_empty()) {
        (0, _) => {
            let mut r = Reader(rest);
            let call = decode_call(&mut r, size)?;
            let lost = decode_ranks(&mut r, size)?;
            r.end().ok()?;
            Some(Standing::Taking { call, lost })
        }
        (1, _) => decode_decision(rest, size).map(Standing::Decided),
        (2, true) => Some(Standing::Out),
        (3, true) => Some(Standing::MovedOn),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn messages_round_trip_and_foreign_bytes_are_refused() {
        let call = Call {
            kind: 2,
            left_out: vec![1, 3],
        };
        let b = Bringing {
            call: call.clone(),
            flag: true,
        };
        let lost = BTreeSet::from([0, 2]);
        assert_eq!(
            decode_bringing(&encode_bringing(&b, &lost), 4),
            Some((b, vec![0, 2]))
        );
        let agreed = Decision::Agreed {
            flag: false,
            alive: vec![0, 2, 3],
        };
        assert_eq!(
            decode_decision(&encode_decision(&agreed), 4),
            Some(agreed.clone())
        );
        let mismatch = Decision::Mismatch {
            by: 0,
            peer: 2,
            detail: "x".into(),
        };
        assert_eq!(
            decode_decision(&encode_decision(&mismatch), 4),
            Some(mismatch)
        );
        for standing in [
            Standing::Taking {
                call,
                lost: vec![0],
            },
            Standing::Decided(agreed),
            Standing::Out,
            Standing::MovedOn,
        ] {
            assert_eq!(
                decode_standing(&encode_standing(&standing), 4),
                Some(standing)
            );
        }
        // Ranks out of range, out of order, twice; an empty group; a bad flag.
        for bad in [
            vec![0, 1, 1, 0, 0, 0, 4, 0, 0, 0],
            vec![0, 1, 2, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0],
            vec![0, 1, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
            vec![0, 1, 0, 0, 0, 0],
            vec![0, 2, 0, 0, 0, 0],
        ] {
            assert_eq!(decode_decision(&bad, 4), None, "{bad:?}");
        }
        assert_eq!(decode_standing(&[2, 0], 4), None);
        assert_eq!(decode_standing(&[4], 4), None);
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_decision(&bytes, 8);
            let _ = decode_bringing(&bytes, 8);
            let _ = decode_standing(&bytes, 8);
        }
    }
}
