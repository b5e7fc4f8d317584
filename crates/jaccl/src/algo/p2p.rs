//! Point to point: the plans of `send` and `recv`, one step on the channels to the peer (split
//! over the ring's wires to a neighbour, one channel to another rank of the mesh).

use super::geometry::{Geometry, lane_slice, whole_frame};
use super::plan::{Plan, Span, Step, Transfer};

/// Send of `bytes` to `dst`.
pub(crate) fn send(g: &Geometry, bytes: usize, dst: usize) -> Plan {
    one_way(g, bytes, dst, true)
}

/// Receive of `bytes` from `src`, the mirror of [`send`].
pub(crate) fn recv(g: &Geometry, bytes: usize, src: usize) -> Plan {
    one_way(g, bytes, src, false)
}

fn one_way(g: &Geometry, bytes: usize, peer: usize, sending: bool) -> Plan {
    let wires = g.wires_to(bytes, peer);
    let transfers = (0..wires)
        .map(|w| {
            let slice = lane_slice(bytes, wires, w);
            let (off, len) = (slice.start, slice.len());
            let channel = g.channel_to(peer, w);
            let (send, recv) = match sending {
                true => (Span::input(off, len), Span::EMPTY),
                false => (Span::EMPTY, Span::output(off, len)),
            };
            Transfer::new(
                sending.then_some(channel),
                (!sending).then_some(channel),
                vec![Step::copy(send, recv)],
                whole_frame(len),
            )
        })
        .collect();
    Plan {
        transfers,
        ..Plan::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_can_send_and_receive() {
        for size in 2..=7 {
            for (wires, mesh) in [(1, true), (2, false), (3, true), (3, false)] {
                let geo = |rank| Geometry {
                    rank,
                    size,
                    wires,
                    mesh,
                };
                for a in 0..size {
                    for b in (0..size).filter(|&b| b != a) {
                        let sent = send(&geo(a), 1 << 20, b);
                        let received = recv(&geo(b), 1 << 20, a);
                        assert_eq!(sent.transfers.len(), received.transfers.len());
                        for (s, r) in sent.transfers.iter().zip(&received.transfers) {
                            assert_eq!(geo(a).far_end(s.tx.unwrap()), (b, r.rx.unwrap()));
                            assert_eq!(s.steps[0].send.len, r.steps[0].recv.len);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn two_rank_send_uses_the_channel_the_peer_receives_on() {
        for wires in 1..=4 {
            let a = Geometry {
                rank: 0,
                size: 2,
                wires,
                mesh: false,
            };
            let b = Geometry {
                rank: 1,
                size: 2,
                wires,
                mesh: false,
            };
            let sent = send(&a, 1 << 20, 1);
            let received = recv(&b, 1 << 20, 0);
            assert_eq!(sent.transfers.len(), received.transfers.len());
            for (s, r) in sent.transfers.iter().zip(&received.transfers) {
                // a's right wire w (the connection it opened) is b's left wire w.
                assert_eq!(s.tx.unwrap(), r.rx.unwrap() + wires);
                assert_eq!(s.steps[0].send.len, r.steps[0].recv.len);
            }
        }
    }
}
