//! What a rank's plans cost, counted from the plans themselves: the latency–bandwidth–reduction
//! model (α, β, γ). A plan costs one latency per message a rank makes in sequence (the steps of
//! its longest lane, or one message to each peer it sends to, whichever is more), the bytes it
//! sends or receives (whichever is more: one port each way) at the link's bandwidth, and the
//! bytes it reduces at the reduction rate.

use super::plan::{Merge, Plan};

/// The cost of a link and of reducing, per message and per byte, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rates {
    /// α: seconds per message.
    pub(crate) latency: f64,
    /// β: seconds per byte sent or received.
    pub(crate) per_byte: f64,
    /// γ: seconds per byte reduced.
    pub(crate) per_reduced_byte: f64,
}

/// What one rank does in a call (or in one plan of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Messages in sequence: the α terms.
    pub(crate) rounds: usize,
    pub(crate) sent: usize,
    pub(crate) received: usize,
    /// Bytes reduced into the result.
    pub(crate) reduced: usize,
}

impl Tally {
    /// One plan of a rank; with `reduces_received`, every byte it receives is reduced by the
    /// caller after the plan (recursive doubling and halving), besides the bytes its steps
    /// reduce as they arrive (the ring).
    /// `wires` is the group's wires per ring neighbour: the channels to one peer count once.
    pub(crate) fn of_plan(plan: &Plan, wires: usize, reduces_received: bool) -> Tally {
        let longest_lane = plan.transfers.iter().map(|t| t.steps.len()).max();
        // The ring's channels are `wires` to the left, then `wires` to the right.
        let peer = |c: usize| if c < 2 * wires { c / wires.max(1) } else { c };
        let mut peers: Vec<usize> = plan
            .transfers
            .iter()
            .filter_map(|t| t.tx.map(peer))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let header_only =
            usize::from(plan.transfers.is_empty() && !plan.headers_both_ways.is_empty());
        let mut tally = Tally {
            rounds: longest_lane.unwrap_or(0).max(peers.len()).max(header_only),
            ..Tally::default()
        };
        for t in &plan.transfers {
            for step in &t.steps {
                if t.tx.is_some() {
                    tally.sent += step.send.len;
                }
                if t.rx.is_some() {
                    tally.received += step.recv.len;
                    if reduces_received || matches!(step.merge, Merge::Reduce { .. }) {
                        tally.reduced += step.recv.len;
                    }
                }
            }
        }
        tally
    }

    /// A rank's plans run one after another; the first `reducing` of them have their received
    /// bytes reduced by the caller ([`Tally::of_plan`]).
    pub(crate) fn of_plans(plans: &[Plan], wires: usize, reducing: usize) -> Vec<Tally> {
        plans
            .iter()
            .enumerate()
            .map(|(i, plan)| Tally::of_plan(plan, wires, i < reducing))
            .collect()
    }

    /// Seconds this takes at `rates`.
    pub(crate) fn seconds(&self, rates: &Rates) -> f64 {
        self.rounds as f64 * rates.latency
            + self.sent.max(self.received) as f64 * rates.per_byte
            + self.reduced as f64 * rates.per_reduced_byte
    }

    /// The tallies of plans run one after another, as one.
    pub(crate) fn total(tallies: &[Tally]) -> Tally {
        tallies.iter().fold(Tally::default(), |a, b| Tally {
            rounds: a.rounds + b.rounds,
            sent: a.sent + b.sent,
            received: a.received + b.received,
            reduced: a.reduced + b.reduced,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::geometry::Geometry;
    use crate::algo::ring;

    #[test]
    fn the_ring_all_reduce_costs_its_textbook_terms() {
        // 2(N − 1) steps per lane, 2(N − 1)/N · S sent and received, (N − 1)/N · S reduced.
        let (n, count, elem) = (8, 8 * 1024, 4);
        let g = Geometry {
            rank: 3,
            size: n,
            wires: 1,
            mesh: false,
        };
        let tally = Tally::of_plan(&ring::all_reduce(&g, count, elem, false), 1, false);
        let bytes = count * elem;
        assert_eq!(tally.rounds, 2 * (n - 1));
        assert_eq!(tally.sent, 2 * (n - 1) * bytes / n);
        assert_eq!(tally.received, tally.sent);
        assert_eq!(tally.reduced, (n - 1) * bytes / n);
    }
}
