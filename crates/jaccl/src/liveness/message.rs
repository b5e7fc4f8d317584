//! The messages of the side channel after start-up, and their framing: a u32 length, then the
//! payload, little-endian.

use super::{Blocked, Flow, Verdict};
use crate::op_header::{Reader, to_u32, u32_at};

/// Message kinds on the side channel after start-up.
const BEAT: u8 = 1;
const BYE: u8 = 2;
const STATUS: u8 = 3;
const GONE: u8 = 4;
/// The verdicts a status may carry.
const LOST: u8 = 1;
const DEADLOCK: u8 = 2;

/// A message on the side channel after start-up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// A member's beat: `BEAT`, then, if one of its calls is blocked, the latest round of the
    /// deadlock search it has seen (u32) and its report.
    Beat(Option<(u32, Blocked)>),
    /// `BYE`, the collectives the rank finished on the group (u64), then, if its group failed,
    /// the reason.
    Bye(Goodbye),
    /// The coordinator's status: `STATUS`, the round of its deadlock search (u32), then its
    /// verdict if it has one: `LOST`, the rank (u32) and the reason, or `DEADLOCK` and the
    /// description.
    Status {
        round: u32,
        verdict: Option<Verdict>,
    },
    /// The coordinator passes on a goodbye (its own too, when dropped or failed): `GONE`, the
    /// rank (u32), the collectives it finished (u64), the reason if any.
    Gone { rank: usize, goodbye: Goodbye },
}

/// What a rank says as it leaves the group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Goodbye {
    /// The collective calls it finished on the group: a rank that left after finishing a call
    /// did its part of it, one that left before did not (the others of that call then fail).
    pub(crate) calls: u64,
    /// `None`: it dropped the group; else its group failed, for this reason (the first cause
    /// of a chain of failures).
    pub(crate) farewell: Option<String>,
    /// The rank that revoked the group, when that is why it failed (first or down a chain):
    /// a rank that fails on its connections then reports the revocation, not a lost peer.
    pub(crate) revoked_by: Option<usize>,
}

/// A goodbye's `revoked_by` on the wire (`u32::MAX`: none).
fn revoked_to_wire(by: Option<usize>) -> [u8; 4] {
    by.map_or(u32::MAX, to_u32).to_le_bytes()
}

fn revoked_from_wire(x: u32) -> Option<usize> {
    (x != u32::MAX).then_some(x as usize)
}

/// The longest text a verdict carries.
const MAX_TEXT: usize = 4096;

/// A goodbye's reason: none if empty (a failure always has one).
fn reason(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

fn text(s: &str) -> &[u8] {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

impl Message {
    /// The message as it goes on the wire: its length (u32), then its payload.
    pub(super) fn framed(&self) -> Vec<u8> {
        let payload = self.encode();
        let mut bytes = to_u32(payload.len()).to_le_bytes().to_vec();
        bytes.extend(payload);
        bytes
    }

    fn encode(&self) -> Vec<u8> {
        match self {
            Message::Beat(None) => vec![BEAT],
            Message::Beat(Some((round, b))) => {
                let mut m = vec![BEAT];
                m.extend(round.to_le_bytes());
                m.extend(b.episode.to_le_bytes());
                m.extend(b.stamp.to_le_bytes());
                match b.awaits {
                    None => m.push(0),
                    Some(target) => {
                        m.push(1);
                        m.extend(target.to_le_bytes());
                    }
                }
                let op = &b.op.as_bytes()[..b.op.len().min(64)];
                m.push(op.len() as u8);
                m.extend(op);
                m.extend(to_u32(b.flows.len()).to_le_bytes());
                for f in &b.flows {
                    m.extend(to_u32(f.peer).to_le_bytes());
                    m.extend(f.sent.to_le_bytes());
                    m.extend(f.received.to_le_bytes());
                    m.push(
                        u8::from(f.reading)
                            | u8::from(f.writing) << 1
                            | u8::from(f.connecting) << 2,
                    );
                }
                m
            }
            Message::Bye(goodbye) => {
                let mut m = vec![BYE];
                m.extend(goodbye.calls.to_le_bytes());
                m.extend(revoked_to_wire(goodbye.revoked_by));
                m.extend(text(goodbye.farewell.as_deref().unwrap_or_default()));
                m
            }
            Message::Gone { rank, goodbye } => {
                let mut m = vec![GONE];
                m.extend(to_u32(*rank).to_le_bytes());
                m.extend(goodbye.calls.to_le_bytes());
                m.extend(revoked_to_wire(goodbye.revoked_by));
                m.extend(text(goodbye.farewell.as_deref().unwrap_or_default()));
                m
            }
            Message::Status { round, verdict } => {
                let mut m = vec![STATUS];
                m.extend(round.to_le_bytes());
                match verdict {
                    None => {}
                    Some(Verdict::Lost { peer, why }) => {
                        m.push(LOST);
                        m.extend(to_u32(*peer).to_le_bytes());
                        m.extend(text(why));
                    }
                    Some(Verdict::Deadlock { detail }) => {
                        m.push(DEADLOCK);
                        m.extend(text(detail));
                    }
                }
                m
            }
        }
    }

    fn decode(payload: &[u8]) -> Result<Message, String> {
        let mut r = Reader(payload);
        let message = match r.u8()? {
            BEAT if r.0.is_empty() => Message::Beat(None),
            BEAT => {
                let round = r.u32()?;
                let episode = r.u64()?;
                let stamp = r.u64()?;
                let awaits = match r.u8()? {
                    0 => None,
                    1 => Some(r.u64()?),
                    other => return Err(format!("bad stamp flag {other}")),
                };
                let op_len = usize::from(r.u8()?);
                let op = String::from_utf8_lossy(r.take(op_len)?).into_owned();
                let n = r.u32()? as usize;
                let mut flows = Vec::with_capacity(n.min(r.0.len() / FLOW_BYTES));
                for _ in 0..n {
                    let peer = r.u32()? as usize;
                    let (sent, received, flags) = (r.u64()?, r.u64()?, r.u8()?);
                    flows.push(Flow {
                        peer,
                        sent,
                        received,
                        reading: flags & 1 != 0,
                        writing: flags & 2 != 0,
                        connecting: flags & 4 != 0,
                    });
                }
                let blocked = Blocked {
                    episode,
                    op,
                    stamp,
                    awaits,
                    flows,
                };
                Message::Beat(Some((round, blocked)))
            }
            BYE => Message::Bye(Goodbye {
                calls: r.u64()?,
                revoked_by: revoked_from_wire(r.u32()?),
                farewell: reason(r.rest()),
            }),
            GONE => Message::Gone {
                rank: r.u32()? as usize,
                goodbye: Goodbye {
                    calls: r.u64()?,
                    revoked_by: revoked_from_wire(r.u32()?),
                    farewell: reason(r.rest()),
                },
            },
            STATUS => {
                let round = r.u32()?;
                let verdict = match r.0.first() {
                    None => None,
                    Some(&LOST) => {
                        r.u8()?;
                        let peer = r.u32()? as usize;
                        let why = String::from_utf8_lossy(r.rest()).into_owned();
                        Some(Verdict::Lost { peer, why })
                    }
                    Some(&DEADLOCK) => {
                        r.u8()?;
                        let detail = String::from_utf8_lossy(r.rest()).into_owned();
                        Some(Verdict::Deadlock { detail })
                    }
                    Some(other) => return Err(format!("unknown verdict {other}")),
                };
                Message::Status { round, verdict }
            }
            other => return Err(format!("unknown message kind {other}")),
        };
        r.end()?;
        Ok(message)
    }
}

/// The bytes of one [`Flow`] in a beat.
const FLOW_BYTES: usize = 21;

/// Takes the complete messages out of `buf`. Fails on bytes that are not ours.
pub(crate) fn decode(buf: &mut Vec<u8>) -> Result<Vec<Message>, String> {
    let mut messages = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32_at(buf, at) as usize;
        if len == 0 || len > MAX_MESSAGE {
            return Err(format!("a message of {len} bytes"));
        }
        if buf.len() - at < 4 + len {
            break;
        }
        messages.push(Message::decode(&buf[at + 4..at + 4 + len])?);
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(messages)
}

/// The largest message: a beat with a flow for every other rank of the largest group.
const MAX_MESSAGE: usize = 128 + crate::config::Config::MAX_SIZE * FLOW_BYTES;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::liveness::tests::blocked;

    #[test]
    fn messages_round_trip_in_pieces() {
        let messages = [
            Message::Beat(None),
            Message::Beat(Some((7, blocked(3, &[(1, 10, 20, true, false)])))),
            Message::Status {
                round: 2,
                verdict: Some(Verdict::Lost {
                    peer: 3,
                    why: "silent".into(),
                }),
            },
            Message::Status {
                round: 4,
                verdict: Some(Verdict::Deadlock {
                    detail: "ranks 0 and 1".into(),
                }),
            },
            Message::Status {
                round: 5,
                verdict: None,
            },
            Message::Bye(Goodbye::default()),
            Message::Bye(Goodbye {
                calls: u64::MAX,
                farewell: Some("rank 3: all_reduce: timed out".into()),
                revoked_by: None,
            }),
            Message::Gone {
                rank: 2,
                goodbye: Goodbye {
                    calls: 7,
                    farewell: None,
                    revoked_by: None,
                },
            },
            Message::Gone {
                rank: 0,
                goodbye: Goodbye {
                    calls: 0,
                    farewell: Some("rank 1's group failed: revoked".into()),
                    revoked_by: Some(1),
                },
            },
        ];
        let stream: Vec<u8> = messages.iter().flat_map(Message::framed).collect();
        let mut buf = stream[..3].to_vec();
        assert_eq!(decode(&mut buf), Ok(vec![]));
        buf.extend_from_slice(&stream[3..]);
        assert_eq!(decode(&mut buf).as_deref(), Ok(&messages[..]));
        assert!(buf.is_empty());
        assert!(decode(&mut vec![1, 0, 0, 0, 9]).is_err());
        assert!(decode(&mut vec![0, 0, 0, 0]).is_err());
    }

    proptest! {
        /// Frames with plausible lengths and kinds, random contents.
        #[test]
        fn heartbeat_messages_never_panic(kind in 0u8..6, body in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
            let mut payload = vec![kind];
            payload.extend(body);
            let mut buf = to_u32(payload.len()).to_le_bytes().to_vec();
            buf.extend(payload);
            buf.truncate(cut.max(1));
            let _ = decode(&mut buf);
        }

        /// Beats with reports: whole, they round-trip; cut short or with a byte changed, they
        /// decode to something or fail, never panic.
        #[test]
        fn beats_with_reports_round_trip_and_survive_damage(
            round in any::<u32>(),
            episode in any::<u64>(),
            stamp in any::<u64>(),
            awaits in any::<Option<u64>>(),
            flows in proptest::collection::vec((0usize..100, any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>()), 0..20),
            cut in 0usize..600,
            at in 0usize..600,
            byte in any::<u8>(),
        ) {
            let mut report = Blocked { stamp, awaits, ..blocked(episode, &flows) };
            for f in &mut report.flows {
                f.connecting = f.reading && !f.writing;
            }
            let beat = Message::Beat(Some((round, report)));
            let whole = beat.framed();
            prop_assert_eq!(decode(&mut whole.clone()), Ok(vec![beat]));
            let mut damaged = whole.clone();
            let at = at % damaged.len();
            damaged[at] = byte;
            let _ = decode(&mut damaged);
            let _ = decode(&mut whole[..cut.min(whole.len())].to_vec());
        }
    }
}
