//! What a rank's plans cost, counted from the plans themselves: the latency–bandwidth–reduction
//! model (α, β, γ). A plan costs one latency per message a rank makes in sequence (the steps of
//! its longest lane, or one message to each peer it sends data to, whichever is more; a plan of
//! headers alone is one; headers that travel beside data are free), the bytes it sends or
//! receives (whichever is more: one port each way, both at once) at the link's bandwidth, and
//! the bytes it reduces at the reduction rate. Plans run one after another add up. Where ranks
//! share hosts ([`Spread`]), a tally also counts what crosses to other hosts, for a price that
//! tells the network from shared memory (`crate::planner`).

use super::geometry::Geometry;
use super::plan::{Merge, Plan};
use crate::config::LinkSpeed;

/// f32 sums per second of one core of the machine jaccl is measured on (bytes of input
/// reduced: 18–25 GB/s over 8 MiB, 35–45 GB/s within the cache).
pub(crate) const DEFAULT_REDUCE_RATE: f64 = 20e9;

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

impl Rates {
    /// A link's figures, reductions at `reduce_rate` bytes per second.
    pub(crate) fn of_link(link: &LinkSpeed, reduce_rate: f64) -> Rates {
        Rates {
            latency: link.latency_seconds(),
            per_byte: 1.0 / link.bytes_per_second(),
            per_reduced_byte: 1.0 / reduce_rate,
        }
    }
}

/// Where a group's ranks are: `hosts` hosts, the ranks spread evenly over them in rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spread {
    pub(crate) ranks: usize,
    pub(crate) hosts: usize,
}

impl Spread {
    /// Every rank on a host of its own.
    pub(crate) fn apart(ranks: usize) -> Spread {
        Spread {
            ranks,
            hosts: ranks,
        }
    }

    /// The host of `rank`.
    pub(crate) fn host_of(&self, rank: usize) -> usize {
        rank * self.hosts / self.ranks.max(1)
    }

    /// The ranks on `host`.
    pub(crate) fn ranks_on(&self, host: usize) -> std::ops::Range<usize> {
        let first = |h: usize| (h * self.ranks).div_ceil(self.hosts.max(1));
        first(host)..first(host + 1).min(self.ranks)
    }
}

/// What one rank does in a call (or in one plan of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Messages in sequence: the α terms.
    pub(crate) rounds: usize,
    /// Those of them in plans that reach another host.
    pub(crate) remote_rounds: usize,
    /// Bytes through the busier direction of the rank's port, plan by plan: the β terms.
    pub(crate) bytes: usize,
    /// Those of them to or from other hosts (the busier direction of those alone).
    pub(crate) remote: usize,
    /// Bytes reduced into the result: the γ terms.
    pub(crate) reduced: usize,
}

impl Tally {
    /// One plan of rank `g.rank` of a group spread as `spread` (the channels to one peer
    /// count once); with `reduces_received`, every byte it receives is reduced by the caller
    /// after the plan (recursive doubling and halving), besides the bytes its steps reduce as
    /// they arrive (the ring).
    pub(crate) fn of_plan(
        plan: &Plan,
        g: &Geometry,
        spread: &Spread,
        reduces_received: bool,
    ) -> Tally {
        let longest_lane = plan.transfers.iter().map(|t| t.steps.len()).max();
        let here = spread.host_of(g.rank);
        let remote = |c: Option<usize>| {
            c.and_then(|c| g.peer_on(c))
                .is_some_and(|p| spread.host_of(p) != here)
        };
        let mut peers: Vec<usize> = plan
            .transfers
            .iter()
            .filter_map(|t| t.tx.and_then(|c| g.peer_on(c)))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        let headers_alone = plan.transfers.is_empty() && !plan.headers_both_ways.is_empty();
        let crosses = plan.transfers.iter().any(|t| remote(t.tx) || remote(t.rx))
            || (headers_alone && plan.headers_both_ways.iter().any(|&c| remote(Some(c))));
        let [
            mut sent,
            mut received,
            mut sent_across,
            mut received_across,
            mut reduced,
        ] = [0usize; 5];
        for t in &plan.transfers {
            let (tx_across, rx_across) = (remote(t.tx), remote(t.rx));
            for step in &t.steps {
                if t.tx.is_some() {
                    sent = sent.saturating_add(step.send.len);
                    if tx_across {
                        sent_across = sent_across.saturating_add(step.send.len);
                    }
                }
                if t.rx.is_some() {
                    received = received.saturating_add(step.recv.len);
                    if rx_across {
                        received_across = received_across.saturating_add(step.recv.len);
                    }
                    if reduces_received || matches!(step.merge, Merge::Reduce { .. }) {
                        reduced = reduced.saturating_add(step.recv.len);
                    }
                }
            }
        }
        let rounds = longest_lane
            .unwrap_or(0)
            .max(peers.len())
            .max(usize::from(headers_alone));
        Tally {
            rounds,
            remote_rounds: if crosses { rounds } else { 0 },
            bytes: sent.max(received),
            remote: sent_across.max(received_across),
            reduced,
        }
    }

    /// A rank's plans, run one after another; the first `reducing` of them have their
    /// received bytes reduced by the caller ([`Tally::of_plan`]).
    pub(crate) fn of_plans(
        plans: &[Plan],
        g: &Geometry,
        spread: &Spread,
        reducing: usize,
    ) -> Tally {
        plans
            .iter()
            .enumerate()
            .map(|(i, plan)| Tally::of_plan(plan, g, spread, i < reducing))
            .fold(Tally::default(), Tally::then)
    }

    /// This, then `next`.
    pub(crate) fn then(self, next: Tally) -> Tally {
        Tally {
            rounds: self.rounds.saturating_add(next.rounds),
            remote_rounds: self.remote_rounds.saturating_add(next.remote_rounds),
            bytes: self.bytes.saturating_add(next.bytes),
            remote: self.remote.saturating_add(next.remote),
            reduced: self.reduced.saturating_add(next.reduced),
        }
    }

    /// This, `times` times over.
    pub(crate) fn times(self, times: usize) -> Tally {
        (0..times).fold(Tally::default(), |sum, _| sum.then(self))
    }

    /// Seconds this takes at `rates`.
    pub(crate) fn seconds(&self, rates: &Rates) -> f64 {
        self.rounds as f64 * rates.latency
            + self.bytes as f64 * rates.per_byte
            + self.reduced as f64 * rates.per_reduced_byte
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::doubling;
    use crate::algo::geometry::Geometry;
    use crate::algo::ring;

    fn rank(rank: usize, size: usize) -> Geometry {
        Geometry {
            rank,
            size,
            wires: 1,
            mesh: false,
        }
    }

    #[test]
    fn the_ring_all_reduce_costs_its_textbook_terms() {
        // 2(N − 1) steps per lane, 2(N − 1)/N · S sent and received, (N − 1)/N · S reduced.
        let (n, count, elem) = (8, 8 * 1024, 4);
        let g = rank(3, n);
        let plan = ring::all_reduce(&g, count, elem, false);
        let tally = Tally::of_plan(&plan, &g, &Spread::apart(n), false);
        let bytes = count * elem;
        assert_eq!(tally.rounds, 2 * (n - 1));
        assert_eq!(tally.bytes, 2 * (n - 1) * bytes / n);
        assert_eq!(tally.reduced, (n - 1) * bytes / n);
    }

    #[test]
    fn a_ring_across_hosts_crosses_at_their_boundaries_only() {
        // 8 ranks on 2 hosts of 4, 1 MiB (both directions of the ring): rank 3 sends one
        // direction to rank 4 on the other host and gets the other from it; rank 1 talks
        // within its host only.
        let (n, count, elem) = (8, 256 * 1024, 4);
        let spread = Spread { ranks: n, hosts: 2 };
        assert_eq!((spread.ranks_on(0), spread.ranks_on(1)), (0..4, 4..8));
        let tally = |r| {
            let g = rank(r, n);
            Tally::of_plan(
                &ring::all_reduce(&g, count, elem, false),
                &g,
                &spread,
                false,
            )
        };
        let (edge, inner) = (tally(3), tally(1));
        assert_eq!(edge.remote * 2, edge.bytes);
        assert_eq!(edge.remote_rounds, edge.rounds);
        assert_eq!((inner.remote, inner.remote_rounds), (0, 0));
        assert_eq!(inner.bytes, edge.bytes);
    }

    #[test]
    fn a_hand_over_costs_its_bytes_both_ways() {
        // Among 3 ranks rank 1 takes rank 0's vector in, doubles with rank 2, hands the result
        // back: 3 messages, 3 vectors through its port (one way each time), 2 reduced.
        let g = rank(1, 3);
        let plans = doubling::all_reduce_plans(&g, &g.doubling_role(), 64);
        let tally = Tally::of_plans(&plans, &g, &Spread::apart(3), usize::MAX);
        assert_eq!((tally.rounds, tally.bytes), (3, 3 * 64));
        assert_eq!(tally.reduced, 2 * 64);
    }
}
