//! The coordinator's deadlock search: from the members' reports of what their blocked calls
//! wait for, whether nothing can ever move again, and when that is certain.

use std::collections::HashMap;

use super::{Blocked, Flow};

/// Whether ranks blocked as `reports` say (every rank of the group, by rank, at one instant; `None`
/// for a rank that has left the group) can never move again. A blocked rank moves only when bytes
/// reach it from a peer it reads from, or when such a peer takes the bytes it waits to send, or (in
/// a direct collective) when a peer it waits for has published the stamp it waits for, or (waiting
/// for a connection made on first use) when the peer has connected: its report then has a flow to
/// this rank. A rank that waits on a peer that has left fails soon (`PeerLost`), as does a send or
/// receive that waits on a peer already in a direct collective (`Mismatch`): both count as moving.
/// If no rank can move, nothing ever will: every rank is in a call, and publishes or sends more
/// only after that call moved.
fn deadlocked(reports: &[Option<&Blocked>]) -> bool {
    let flows: HashMap<(usize, usize), &Flow> = reports
        .iter()
        .enumerate()
        .filter_map(|(rank, b)| Some((rank, (*b)?)))
        .flat_map(|(rank, b)| b.flows.iter().map(move |f| ((rank, f.peer), f)))
        .collect();
    let blocked = reports
        .iter()
        .enumerate()
        .filter_map(|(r, b)| Some((r, (*b)?)));
    blocked.into_iter().all(|(rank, b)| {
        b.flows.iter().filter(|f| f.reading).all(|f| {
            let Some(Some(peer)) = reports.get(f.peer) else {
                return false; // it has left (or is unknown): this rank fails
            };
            let back = flows.get(&(f.peer, rank));
            let coming = match f.connecting {
                true => back.is_some_and(|back| !back.connecting),
                false => back.is_some_and(|back| back.sent > f.received || back.writing),
            };
            let arrived = match b.awaits {
                Some(target) => peer.stamp >= target,
                None => peer.stamp > b.stamp,
            };
            !coming && !arrived
        })
    })
}

/// The deadlock as the error message gives it: what each rank waits for.
fn describe(reports: &[Option<&Blocked>]) -> String {
    const SHOWN: usize = 8;
    let mut parts: Vec<String> = reports
        .iter()
        .enumerate()
        .take(SHOWN)
        .map(|(rank, b)| {
            let Some(b) = b else {
                return format!("rank {rank} has left");
            };
            // A rank that waits to send also reads whatever comes (so that sends in a cycle
            // go through): name only what it waits to send then.
            let sending = b.flows.iter().any(|f| f.writing);
            let waits_for: Vec<String> = b
                .flows
                .iter()
                .filter(|f| if sending { f.writing } else { f.reading })
                .map(|f| match (sending, b.awaits) {
                    (true, _) => format!("rank {} to take its data", f.peer),
                    (false, _) if f.connecting => format!("rank {} to connect", f.peer),
                    (false, Some(_)) => format!("rank {} to join", f.peer),
                    (false, None) => format!("data from rank {}", f.peer),
                })
                .collect();
            format!(
                "rank {rank} in {} waits for {}",
                b.op,
                waits_for.join(" and ")
            )
        })
        .collect();
    if reports.len() > SHOWN {
        parts.push(format!("and {} more ranks", reports.len() - SHOWN));
    }
    format!(
        "every rank waits for another and no data is on its way ({}): the calls do not match \
         up (for example, both ranks of a pair called recv before send)",
        parts.join("; ")
    )
}

/// The coordinator's deadlock search. Each member's report was true when the member sent
/// it, but they were sent at different moments. So a deadlock seen in one set of reports is
/// only suspected, and a new round is announced; it is declared once every member has sent a
/// report after seeing that round, each from the same stretch of waiting as before (and rank
/// 0 is still in its own). Then every rank was blocked, as reported, at the moment the
/// suspicion arose: nothing moved for any of them in between. (Members that have left the
/// group stay gone: they report nothing more.)
#[derive(Default)]
pub(super) struct DeadlockWatch {
    /// The latest round announced.
    pub(super) round: u32,
    suspect: Option<Suspect>,
}

struct Suspect {
    round: u32,
    /// Each rank's stretch of waiting; `None` for a rank that has left.
    episodes: Vec<Option<u64>>,
    detail: String,
}

/// A member as the deadlock search sees it.
#[derive(Clone, Copy)]
pub(super) enum Member<'a> {
    /// Not in a blocked call (or not known to be).
    Moving,
    /// Blocked, as its latest beat says, sent after it saw this round.
    Blocked(u32, &'a Blocked),
    /// It left the group (said goodbye): it will never send again.
    Left,
}

impl DeadlockWatch {
    /// Looks at rank 0's own report and the members'; looks for a new suspicion only if
    /// `search` (the full check is linear in the connections of the whole group: once a beat
    /// interval). Returns the description of a confirmed deadlock.
    pub(super) fn update<'a>(
        &mut self,
        own: Option<&'a Blocked>,
        members: impl Iterator<Item = Member<'a>>,
        search: bool,
    ) -> Option<String> {
        let (mut reports, mut rounds, mut all_blocked) = (vec![own], Vec::new(), own.is_some());
        for member in members {
            let (report, round) = match member {
                Member::Moving => (None, 0),
                Member::Blocked(round, b) => (Some(b), round),
                Member::Left => (None, u32::MAX),
            };
            all_blocked &= !matches!(member, Member::Moving);
            reports.push(report);
            rounds.push(round);
        }
        if !all_blocked {
            // A rank is not blocked: nothing is, or will be, declared from these reports.
            self.suspect = None;
            return None;
        }
        let episodes: Vec<Option<u64>> = reports.iter().map(|b| b.map(|b| b.episode)).collect();
        if let Some(s) = &self.suspect
            && s.episodes == episodes
        {
            // (Rank 0's own report is read now: it has no round.)
            let after_the_round = rounds.iter().all(|&round| round >= s.round);
            return after_the_round.then(|| s.detail.clone());
        }
        self.suspect = None;
        if search && deadlocked(&reports) {
            self.round = self.round.wrapping_add(1);
            self.suspect = Some(Suspect {
                round: self.round,
                episodes,
                detail: describe(&reports),
            });
        }
        None
    }

    /// Whether a suspicion waits for its confirmation.
    pub(super) fn suspects(&self) -> bool {
        self.suspect.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::liveness::Flow;
    use crate::liveness::tests::blocked;

    /// Every rank's report, none left.
    fn all(reports: &[Blocked]) -> Vec<Option<&Blocked>> {
        reports.iter().map(Some).collect()
    }

    #[test]
    fn a_receive_cycle_with_nothing_on_its_way_is_a_deadlock() {
        // Ranks 0 and 1 each wait for the other, and each has taken all the other sent.
        let cycle = |received_by_0| {
            [
                blocked(1, &[(1, 40, received_by_0, true, false)]),
                blocked(1, &[(0, 40, 40, true, false)]),
            ]
        };
        assert!(deadlocked(&all(&cycle(40))));
        // Bytes on their way to rank 0, which reads: it will move.
        assert!(!deadlocked(&all(&cycle(30))));
        // Rank 1 waits to send to rank 0, which reads from it: it will move.
        let sending = [
            blocked(1, &[(1, 40, 40, true, false)]),
            blocked(1, &[(0, 40, 40, false, true)]),
        ];
        assert!(!deadlocked(&all(&sending)));
        // Rank 1 sends to rank 0, which reads only from rank 2, which waits for rank 0.
        let stuck = [
            blocked(1, &[(1, 0, 0, false, false), (2, 0, 0, true, false)]),
            blocked(1, &[(0, 64, 0, false, true), (2, 0, 0, false, false)]),
            blocked(1, &[(0, 0, 0, true, false), (1, 0, 0, false, false)]),
        ];
        assert!(deadlocked(&all(&stuck)));
        let detail = describe(&all(&stuck));
        assert!(
            detail.contains("rank 1 in recv waits for rank 0 to take its data"),
            "{detail}"
        );
    }

    /// A rank that waits for a peer to connect moves once the peer has: the peer's report then
    /// has a flow to it.
    #[test]
    fn a_wait_for_a_connection_moves_once_the_peer_connected() {
        let connecting = |b: Blocked| Blocked {
            flows: b
                .flows
                .iter()
                .map(|f| Flow {
                    connecting: f.reading,
                    ..*f
                })
                .collect(),
            ..b
        };
        // Rank 2 waits for rank 0 to connect; rank 0 reads from rank 1, rank 1 from rank 0.
        let group = |connected: bool| {
            let mut zero = vec![(1, 0, 0, true, false)];
            if connected {
                zero.push((2, 0, 0, false, false));
            }
            [
                blocked(1, &zero),
                blocked(1, &[(0, 0, 0, true, false)]),
                connecting(blocked(1, &[(0, 0, 0, true, false)])),
            ]
        };
        assert!(deadlocked(&all(&group(false))));
        let detail = describe(&all(&group(false)));
        assert!(
            detail.contains("rank 2 in recv waits for rank 0 to connect"),
            "{detail}"
        );
        assert!(!deadlocked(&all(&group(true))));
        // Rank 0 connected and waits to read from rank 2, which has not taken the link yet.
        let dialed = [
            blocked(1, &[(1, 0, 0, false, false), (2, 64, 0, true, false)]),
            blocked(1, &[(0, 0, 0, true, false)]),
            connecting(blocked(1, &[(0, 0, 0, true, false)])),
        ];
        assert!(!deadlocked(&all(&dialed)));
    }

    #[test]
    fn a_direct_collective_waits_for_stamps() {
        let at = |stamp, awaits, b: Blocked| Blocked { stamp, awaits, ..b };
        // Ranks 0 and 1 receive from each other; rank 2 (no connection to rank 0) waits in a
        // direct collective for both to publish stamp 5.
        let group = |stamp_of_1| {
            [
                at(4, None, blocked(1, &[(1, 0, 0, true, false)])),
                at(stamp_of_1, None, blocked(1, &[(0, 0, 0, true, false)])),
                at(
                    5,
                    Some(5),
                    blocked(1, &[(1, 0, 0, true, false), (0, 0, 0, true, false)]),
                ),
            ]
        };
        assert!(deadlocked(&all(&group(4))));
        let detail = describe(&all(&group(4)));
        assert!(
            detail.contains("rank 2 in recv waits for rank 1 to join and rank 0 to join"),
            "{detail}"
        );
        // Rank 1 has published 5: rank 2 will see it. (And rank 0, which waits on rank 1, is
        // waiting on a rank in a collective it did not call: it fails with a mismatch.)
        assert!(!deadlocked(&all(&group(5))));
        // Ranks 0 and 1 receive from each other after rank 2 left: still a deadlock, unless one
        // of them waits on rank 2 (which then fails with `PeerLost`).
        let left = |reading_2| {
            let waits_on_2 = blocked(1, &[(1, 0, 0, true, false), (2, 0, 0, reading_2, false)]);
            vec![
                Some(waits_on_2),
                Some(blocked(1, &[(0, 0, 0, true, false)])),
                None,
            ]
        };
        let with_left = |r: &[Option<Blocked>]| -> bool {
            deadlocked(&r.iter().map(Option::as_ref).collect::<Vec<_>>())
        };
        assert!(with_left(&left(false)));
        assert!(!with_left(&left(true)));
    }

    #[test]
    fn a_deadlock_is_declared_only_after_a_round_that_every_member_saw() {
        let own = blocked(5, &[(1, 8, 8, true, false)]);
        let member = |episode| blocked(episode, &[(0, 8, 8, true, false)]);
        let (nine, ten) = (member(9), member(10));
        let mut watch = DeadlockWatch::default();
        let mut update = |m: Member<'_>, search| watch.update(Some(&own), [m].into_iter(), search);
        // Only a search finds a new suspicion.
        assert_eq!(update(Member::Blocked(0, &nine), false), None);
        assert_eq!(update(Member::Blocked(0, &nine), true), None);
        // The same report again, sent before the member saw round 1: not yet.
        assert_eq!(update(Member::Blocked(0, &nine), false), None);
        assert!(update(Member::Blocked(1, &nine), false).is_some());
        // The member moved in between (a new stretch of waiting): suspected again, not declared.
        let mut watch = DeadlockWatch::default();
        let mut update = |m: Member<'_>| watch.update(Some(&own), [m].into_iter(), true);
        assert_eq!(update(Member::Blocked(0, &nine)), None);
        assert_eq!(update(Member::Blocked(1, &ten)), None);
        // A member that is not blocked: nothing.
        assert_eq!(update(Member::Moving), None);
        assert_eq!(watch.round, 2);
        assert!(!watch.suspects());
        // Rank 0 not blocked: nothing.
        assert_eq!(
            watch.update(None, [Member::Blocked(2, &ten)].into_iter(), true),
            None
        );
        assert!(!watch.suspects());
        // Rank 1 has left; ranks 0 and 2 wait for each other: a deadlock, and the rank that
        // left needs no round.
        let own = blocked(5, &[(2, 0, 0, true, false)]);
        let two = blocked(3, &[(0, 0, 0, true, false)]);
        let members = || [Member::Left, Member::Blocked(0, &two)].into_iter();
        let members_later = || [Member::Left, Member::Blocked(1, &two)].into_iter();
        let mut watch = DeadlockWatch::default();
        assert_eq!(watch.update(Some(&own), members(), true), None);
        let detail = watch.update(Some(&own), members_later(), false);
        assert!(detail.is_some_and(|d| d.contains("rank 1 has left")));
    }
}
