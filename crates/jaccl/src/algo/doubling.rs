//! The recursive doubling and halving family, where the ranks pair up
//! ([`Geometry::doubling_partners`]): log2(size) steps, in each of which a rank swaps data with
//! that step's partner only. All-reduce swaps whole partial results, all-gather the blocks
//! gathered so far, reduce-scatter (halving, the steps in reverse) the half of the partial
//! sums around the partner's block. In every step the lower rank of a pair holds the partial
//! result of the lower ranks, so "lower rank's value first" is one order on every rank, and
//! every rank gets the same bits.

use std::ops::Range;

use super::call::Call;
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{DoublingRole, Geometry, lane_slice, whole_frame};
use super::plan::{Plan, Span, Step, Transfer};
use crate::error::Result;
use crate::reduce::{Reducer, copy};

/// Step `k` of recursive doubling with `partners` (in step order): this rank sends `send` to
/// `partners[k]` and receives as many bytes from it into `recv` ([`with_peer`]). The first
/// step also exchanges headers with the ring neighbours that are no step's partner
/// ([`neighbours_apart`]).
pub(crate) fn swap_with(
    g: &Geometry,
    partners: &[usize],
    k: usize,
    send: Span,
    recv: Span,
) -> Plan {
    let mut plan = with_peer(g, partners[k], send, recv);
    if k == 0 {
        plan.headers_both_ways = neighbours_apart(g, partners);
    }
    plan
}

/// This rank sends `send` to `peer` and receives `recv` from it, split over the ring's wires
/// to a neighbour (each span cut alike on both sides, so the two may differ in length). An
/// empty span sends (or receives) nothing but the header, unless both are empty: then the two
/// exchange headers.
pub(crate) fn with_peer(g: &Geometry, peer: usize, send: Span, recv: Span) -> Plan {
    let len = send.len.max(recv.len);
    let wires = g.wires_to(len, peer);
    let transfers = (0..wires)
        .map(|w| {
            let channel = g.channel_to(peer, w);
            let part = |span: Span| match span.len {
                0 => span,
                _ => {
                    let slice = lane_slice(span.len, wires, w);
                    Span {
                        off: span.off + slice.start,
                        len: slice.len(),
                        ..span
                    }
                }
            };
            Transfer::new(
                (send.len > 0 || recv.len == 0).then_some(channel),
                (recv.len > 0 || send.len == 0).then_some(channel),
                vec![Step::copy(part(send), part(recv))],
                whole_frame(lane_slice(len, wires, w).len()),
            )
        })
        .collect();
    Plan {
        transfers,
        ..Plan::default()
    }
}

/// The channels to the ring neighbours that are none of `peers`, with which the first round
/// of a doubling exchanges headers, so every neighbour of a rank that called something else
/// notices. A peer gets the header with its round's data (or alone, [`Plan::announcement`],
/// when this rank fails before), which saves a message per rank and call (with 4 ranks on the
/// ring, a third of them).
pub(crate) fn neighbours_apart(g: &Geometry, peers: &[usize]) -> Vec<usize> {
    [
        (g.left(), g.left_channel(0)),
        (g.right(), g.right_channel(0)),
    ]
    .into_iter()
    .filter(|(neighbour, _)| !peers.contains(neighbour))
    .map(|(_, channel)| channel)
    .collect()
}

/// The rounds of a recursive-doubling all-reduce of `bytes` for a rank in `role`, in the
/// order it runs them ([`around_hand_over`]): each step swaps the whole partial result.
pub(crate) fn all_reduce_plans(g: &Geometry, role: &DoublingRole, bytes: usize) -> Vec<Plan> {
    let (input, output) = (Span::input(0, bytes), Span::output(0, bytes));
    around_hand_over(g, role, bytes, output, |partners| {
        partners
            .iter()
            .map(|&p| with_peer(g, p, input, output))
            .collect()
    })
}

/// The rounds of a collective among any number of ranks that hand over `handed` bytes of input
/// (an all-reduce's vector, a reduce-scatter's every block) for a rank in `role`: for a rank
/// that hands over, sending them and receiving its result (`back`'s length); for one that
/// doubles, taking in its extra rank's input (if any), the `steps` among the doubling ranks
/// (`steps(partners)`), and handing the extra rank its result (`back`). The first round also
/// exchanges headers with the ring neighbours no round talks to ([`neighbours_apart`]).
pub(crate) fn around_hand_over(
    g: &Geometry,
    role: &DoublingRole,
    handed: usize,
    back: Span,
    steps: impl FnOnce(&[usize]) -> Vec<Plan>,
) -> Vec<Plan> {
    let (input, output) = (Span::input(0, handed), Span::output(0, handed));
    let (mut plans, peers): (Vec<Plan>, Vec<usize>) = match role {
        DoublingRole::HandOver { to } => (
            vec![
                with_peer(g, *to, input, Span::EMPTY),
                with_peer(g, *to, Span::EMPTY, Span::output(0, back.len)),
            ],
            vec![*to],
        ),
        DoublingRole::Double { extra, partners } => {
            let steps = steps(partners);
            let plans = match *extra {
                Some(e) => std::iter::once(with_peer(g, e, Span::EMPTY, output))
                    .chain(steps)
                    .chain(std::iter::once(with_peer(g, e, back, Span::EMPTY)))
                    .collect(),
                None => steps,
            };
            (plans, partners.iter().copied().chain(*extra).collect())
        }
    };
    if let Some(first) = plans.first_mut() {
        first.headers_both_ways = neighbours_apart(g, &peers);
    }
    plans
}

/// The two rounds of a rank that hands its vector (`input`, or `output` in place) over and
/// receives the result into `output` ([`around_hand_over`]).
pub(crate) fn hand_over(
    rounds: &mut Rounds<'_>,
    input: Option<&[u8]>,
    output: &mut [u8],
) -> Result<()> {
    rounds.run(0, &mut *output, input)?;
    rounds.run(1, output, None)
}

/// The aligned group of 2^k blocks (block indices) that holds block `r`: what a rank holds
/// after k steps of a recursive-doubling gather, or reduces before the last k steps of halving.
pub(crate) fn aligned_blocks(r: usize, k: usize) -> Range<usize> {
    let first = (r >> k) << k;
    first..first + (1 << k)
}

/// All-reduce by recursive doubling ([`all_reduce_plans`]): in each step this rank swaps its
/// partial result with that step's partner and combines the two, the lower rank's first. The
/// first step sends the caller's vector (or, with an extra rank, the extra rank's combined with
/// it, the extra rank's first); scratch vectors hold the partner's vector, the combined one and,
/// with more than one step, the partial result and, with more than two, the next one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: Option<&[u8]>,
    output: &mut [u8],
    reducer: &Reducer,
    call: &Call,
    role: &DoublingRole,
) -> Result<()> {
    let bytes = output.len();
    let plans = all_reduce_plans(g, role, bytes);
    let mut rounds = Rounds::new(net, &plans, call);
    let (extra, partners) = match role {
        DoublingRole::HandOver { .. } => return hand_over(&mut rounds, input, output),
        DoublingRole::Double { extra, partners } => (*extra, partners.as_slice()),
    };
    let first = usize::from(extra.is_some());
    let Some(last) = partners.len().checked_sub(1) else {
        // A group of one: the vector is the result.
        if let Some(input) = input {
            copy(output, input);
        }
        return Ok(());
    };
    let all = scratch.bytes((1 + first + last.min(2)) * bytes);
    let (theirs, rest) = all.split_at_mut(bytes);
    // Without an extra rank `folded` is empty; two steps need no `next`, one step no
    // `partial` either.
    let (folded, rest) = rest.split_at_mut(first * bytes);
    let (mut partial, mut next) = rest.split_at_mut(bytes.min(rest.len()));
    if extra.is_some() {
        rounds.run(0, &mut *theirs, None)?;
        reducer.combine(folded, theirs, input.unwrap_or(output));
    }
    let mut swap = Swap {
        steps: rounds,
        first,
        rank: g.rank,
        partners,
        theirs,
        reducer,
    };
    if last == 0 {
        match (extra, input) {
            (Some(_), _) => swap.step(0, folded, output)?,
            (None, Some(input)) => swap.step(0, input, output)?,
            (None, None) => swap.step_in_place(0, output)?,
        }
    } else {
        let start = match extra {
            Some(_) => &*folded,
            None => input.unwrap_or(output),
        };
        swap.step(0, start, partial)?;
        for k in 1..last {
            swap.step(k, partial, next)?;
            std::mem::swap(&mut partial, &mut next);
        }
        swap.step(last, partial, output)?;
    }
    match extra {
        Some(_) => swap.steps.run(first + partners.len(), output, None),
        None => Ok(()),
    }
}

/// The steps of a recursive-doubling all-gather of `block` bytes per rank with `partners`:
/// step k swaps the aligned group of 2^k blocks each partner holds (2 messages per rank at 4
/// ranks, against 3 for the both-ways gather).
pub(crate) fn all_gather_plans(g: &Geometry, block: usize, partners: &[usize]) -> Vec<Plan> {
    (0..partners.len())
        .map(|k| {
            // Before step k each rank holds the aligned group of 2^k blocks around its own
            // (partners differ in bit k; the ring's pairs 0-1 and 2-3 are such groups).
            let span = |r: usize| {
                let blocks = aligned_blocks(r, k);
                Span::output(blocks.start * block, blocks.len() * block)
            };
            swap_with(g, partners, k, span(g.rank), span(partners[k]))
        })
        .collect()
}

/// Gathers every rank's block of `block` bytes into `output` (`size` blocks), whose own block
/// the caller has filled ([`all_gather_plans`]).
pub(crate) fn all_gather(
    net: &mut Network,
    g: &Geometry,
    output: &mut [u8],
    block: usize,
    call: &Call,
    partners: &[usize],
) -> Result<()> {
    let plans = all_gather_plans(g, block, partners);
    Rounds::new(net, &plans, call).run_all(output)
}

/// Reduce-scatter by recursive halving, the doubling partners in reverse order: before the
/// step with partner `partners[k]` this rank holds partial sums of the aligned group of
/// 2^(k+1) blocks around its own; it sends the partner the half around the partner's block and
/// reduces the half around its own with what the partner sends. `log2 size` messages per rank
/// (2 at 4 ranks, against the ring's 3 hops), the ring's bytes. Each block is reduced on one
/// rank only, so no other rank's bits need to agree with it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_scatter(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: &[u8],
    output: &mut [u8],
    reducer: &Reducer,
    call: &Call,
    partners: &[usize],
) -> Result<()> {
    let bytes = output.len();
    let group = |r: usize, k: usize| {
        let blocks = aligned_blocks(r, k);
        blocks.start * bytes..blocks.end * bytes
    };
    let order: Vec<usize> = (0..partners.len()).rev().collect();
    let plans: Vec<Plan> = order
        .iter()
        .map(|&k| {
            let (theirs, mine) = (group(partners[k], k), group(g.rank, k));
            let send = Span::input(theirs.start, theirs.len());
            swap_with(g, partners, k, send, Span::output(mine.start, mine.len()))
        })
        .collect();
    let all = scratch.bytes(2 * g.size * bytes);
    let (theirs, partial) = all.split_at_mut(g.size * bytes);
    let mut steps = Rounds::new(net, &plans, call);
    for (i, &k) in order.iter().enumerate() {
        let mine = group(g.rank, k);
        let source: &[u8] = if i == 0 { input } else { partial };
        steps.run(i, &mut *theirs, Some(source))?;
        if i + 1 == order.len() {
            reducer.combine(output, &source[mine.clone()], &theirs[mine]);
        } else if i == 0 {
            reducer.combine(
                &mut partial[mine.clone()],
                &input[mine.clone()],
                &theirs[mine],
            );
        } else {
            reducer.accumulate(&mut partial[mine.clone()], &theirs[mine]);
        }
    }
    Ok(())
}

/// A recursive-doubling all-reduce in progress.
struct Swap<'a> {
    steps: Rounds<'a>,
    /// The round of the first step (after taking in an extra rank's vector).
    first: usize,
    rank: usize,
    /// The partner of each step.
    partners: &'a [usize],
    /// Receives the partner's partial result.
    theirs: &'a mut [u8],
    reducer: &'a Reducer,
}

impl Swap<'_> {
    /// Swaps `mine` with the partner of step `k` and leaves the two combined in `dst`, the
    /// lower rank's first.
    fn step(&mut self, k: usize, mine: &[u8], dst: &mut [u8]) -> Result<()> {
        self.steps.run(self.first + k, self.theirs, Some(mine))?;
        match self.rank < self.partners[k] {
            true => self.reducer.combine(dst, mine, self.theirs),
            false => self.reducer.combine(dst, self.theirs, mine),
        }
        Ok(())
    }

    /// [`Swap::step`] with `mine` also as `dst`.
    fn step_in_place(&mut self, k: usize, mine: &mut [u8]) -> Result<()> {
        self.steps.run(self.first + k, self.theirs, Some(mine))?;
        combine_in_place(self.reducer, self.rank, self.partners[k], mine, self.theirs);
        Ok(())
    }
}

/// Combines `theirs`, the partner's partial result, into `mine`, the lower rank's value first
/// (the higher rank combines into `theirs` and copies the result back).
pub(crate) fn combine_in_place(
    reducer: &Reducer,
    rank: usize,
    partner: usize,
    mine: &mut [u8],
    theirs: &mut [u8],
) {
    if rank < partner {
        reducer.accumulate(mine, theirs);
    } else {
        reducer.accumulate(theirs, mine);
        copy(mine, theirs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank of a recursive doubling builds the same expression over all ranks (so gets
    /// the same bits), talking only to ranks it has a channel to, and partners agree.
    #[test]
    fn doubling_sends_headers_alone_only_to_neighbours_no_step_talks_to() {
        // 4 ranks on the ring: both neighbours are partners, so each step is one message to
        // one channel and no header travels alone.
        for rank in 0..4 {
            let g = Geometry {
                rank,
                size: 4,
                wires: 1,
                mesh: false,
            };
            let partners = g.doubling_partners().expect("pairs up");
            for k in 0..partners.len() {
                let plan = swap_with(&g, &partners, k, Span::input(0, 8), Span::output(0, 8));
                assert_eq!(
                    plan.headers_both_ways,
                    Vec::<usize>::new(),
                    "rank {rank} step {k}"
                );
                let tx: Vec<_> = plan.transfers.iter().filter_map(|t| t.tx).collect();
                assert_eq!(
                    tx,
                    vec![g.channel_to(partners[k], 0)],
                    "rank {rank} step {k}"
                );
            }
        }
        // 8 ranks with the mesh: rank 0's partners are 1, 2 and 4; its left neighbour 7 is
        // none of them, so step 1 exchanges headers with it.
        let g = Geometry {
            rank: 0,
            size: 8,
            wires: 1,
            mesh: true,
        };
        let partners = g.doubling_partners().expect("pairs up");
        assert_eq!(partners, vec![1, 2, 4]);
        assert_eq!(
            swap_with(&g, &partners, 0, Span::input(0, 8), Span::output(0, 8)).headers_both_ways,
            vec![g.left_channel(0)]
        );
        assert!(
            swap_with(&g, &partners, 1, Span::input(0, 8), Span::output(0, 8))
                .headers_both_ways
                .is_empty()
        );
        // A rank that fails before step 2 announces itself on exactly that step's channels.
        let announcement =
            swap_with(&g, &partners, 2, Span::input(0, 8), Span::output(0, 8)).announcement();
        assert_eq!(announcement.headers_out, vec![g.channel_to(4, 0)]);
        assert!(announcement.transfers.is_empty() && announcement.headers_both_ways.is_empty());
    }

    /// Recursive doubling among any number of ranks: hand-overs pair up, partners are mutual,
    /// every rank ends with one expression that holds every rank once, and the first round
    /// exchanges headers with exactly the ring neighbours that no round talks to.
    #[test]
    fn doubling_among_any_number_of_ranks_builds_one_expression() {
        for size in 1..=40 {
            for mesh in [false, true] {
                let g = |rank| Geometry {
                    rank,
                    size,
                    wires: 2,
                    mesh,
                };
                let roles: Vec<DoublingRole> = (0..size).map(|r| g(r).doubling_role()).collect();
                let at = format!("{size} ranks, mesh {mesh}");
                let mut value: Vec<String> = (0..size).map(|r| r.to_string()).collect();
                let mut doublers = Vec::new();
                for (r, role) in roles.iter().enumerate() {
                    let peers = match role {
                        DoublingRole::HandOver { to } => {
                            let host = DoublingRole::Double {
                                extra: Some(r),
                                partners: match &roles[*to] {
                                    DoublingRole::Double { partners, .. } => partners.clone(),
                                    other => panic!("{at}: {r} hands over to {other:?}"),
                                },
                            };
                            assert_eq!(roles[*to], host, "{at}: {r}'s host");
                            vec![*to]
                        }
                        DoublingRole::Double { extra, partners } => {
                            if let Some(e) = extra {
                                assert_eq!(roles[*e], DoublingRole::HandOver { to: r }, "{at}");
                                value[r] = format!("({e} {r})");
                            }
                            doublers.push(r);
                            partners.iter().copied().chain(*extra).collect()
                        }
                    };
                    if size > 1 {
                        let plans = all_reduce_plans(&g(r), role, 8);
                        let apart = [g(r).left(), g(r).right()]
                            .into_iter()
                            .filter(|n| !peers.contains(n))
                            .count();
                        assert_eq!(plans[0].headers_both_ways.len(), apart, "{at}: rank {r}");
                    }
                }
                assert!(doublers.len().is_power_of_two(), "{at}: {doublers:?}");
                let partners = |r: usize| match &roles[r] {
                    DoublingRole::Double { partners, .. } => partners.clone(),
                    DoublingRole::HandOver { .. } => Vec::new(),
                };
                for k in 0..doublers.len().trailing_zeros() as usize {
                    let before = value.clone();
                    for &r in &doublers {
                        let peer = partners(r)[k];
                        assert_eq!(partners(peer)[k], r, "{at}: step {k}");
                        let (lo, hi) = (&before[r.min(peer)], &before[r.max(peer)]);
                        value[r] = format!("({lo} {hi})");
                    }
                }
                for (r, role) in roles.iter().enumerate() {
                    if let DoublingRole::HandOver { to } = role {
                        value[r] = value[*to].clone();
                    }
                }
                assert!(value.iter().all(|v| *v == value[0]), "{at}: {value:?}");
                let ranks: Vec<usize> = value[0]
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|t| !t.is_empty())
                    .map(|t| t.parse().expect("a rank"))
                    .collect();
                assert_eq!(ranks, (0..size).collect::<Vec<_>>(), "{at}: in rank order");
            }
        }
    }

    #[test]
    fn recursive_doubling_builds_one_expression_on_every_rank() {
        for (size, mesh) in [
            (2, false),
            (2, true),
            (4, false),
            (4, true),
            (8, true),
            (16, true),
        ] {
            let geometries: Vec<Geometry> = (0..size)
                .map(|rank| Geometry {
                    rank,
                    size,
                    wires: 2,
                    mesh,
                })
                .collect();
            let steps: Vec<Vec<usize>> = geometries
                .iter()
                .map(|g| g.doubling_partners().expect("pairs up"))
                .collect();
            // partners[k][r]: rank r's partner in step k.
            let partners: Vec<Vec<usize>> = (0..size.trailing_zeros() as usize)
                .map(|k| steps.iter().map(|s| s[k]).collect())
                .collect();
            let mut value: Vec<String> = (0..size).map(|r| r.to_string()).collect();
            for (k, partner) in partners.iter().enumerate() {
                let before = value.clone();
                for (r, g) in geometries.iter().enumerate() {
                    let peer = partner[r];
                    // A channel that start-up opened: a neighbour, or any rank with the mesh.
                    let opened = g.mesh || peer == g.left() || peer == g.right();
                    assert!(opened, "{r} to {peer} at {size} ranks");
                    assert_eq!(partner[peer], r, "pairs at step {k} of {size} ranks");
                    let (lo, hi) = (before[r.min(peer)].clone(), before[r.max(peer)].clone());
                    value[r] = format!("({lo} {hi})");
                }
            }
            assert!(value.iter().all(|v| *v == value[0]), "{value:?}");
            let mut ranks: Vec<usize> = value[0]
                .split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().expect("a rank"))
                .collect();
            ranks.sort_unstable();
            assert_eq!(ranks, (0..size).collect::<Vec<_>>());
        }
        for (size, mesh) in [(3, true), (5, false), (6, true), (8, false)] {
            let g = Geometry {
                rank: 0,
                size,
                wires: 1,
                mesh,
            };
            assert_eq!(g.doubling_partners(), None, "{size} ranks, mesh {mesh}");
        }
    }
}
