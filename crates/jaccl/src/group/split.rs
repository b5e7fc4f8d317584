//! Sub-groups: [`Group::split`] and [`Group::subgroup`], collective over the parent.
//!
//! Every rank of the parent contributes what it asks for (a color and a key, or the list of
//! members) in an all-gather over the parent's own connections, so a rank that calls something
//! else, or a different list, fails every rank with [`Error::Mismatch`] instead of hanging.
//! Then the members of each new group form it as `init` forms a job
//! (`crate::connect::connect_subgroup`): their own side channel, heartbeat and links, chosen
//! from their own members (ranks of one host get shared memory and the direct collectives),
//! made through the listener every rank keeps from start-up (no new port), authenticated with
//! the job's secret. A sub-group shares nothing mutable with its parent, so both can be used
//! at once from different threads, and either can be dropped first.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::{Family, Group};
use crate::config::Config;
use crate::connect;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::op_header::Digest;
use crate::wait::GoOn;

/// What a rank asks of a split (or a grow), as the all-gather carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ask {
    /// [`Group::split`]: `color` (`None`: no group) and `key`.
    Split { color: Option<u32>, key: u32 },
    /// [`Group::subgroup`]: the list of members, by its SHA-256 digest ([`list_digest`]).
    Subgroup { list: Digest },
    /// [`Group::grow`] by `count` new ranks.
    Grow { count: u32 },
}

/// Bytes of an [`Ask`]: kind (1 split, 2 subgroup, 3 grow), whether a color follows (0 or
/// 1), color and key (u32 each, little-endian; a grow's count in the color's place), the
/// list's digest (32 bytes).
const ASK_LEN: usize = 1 + 1 + 4 + 4 + 32;

impl Ask {
    fn encode(&self) -> [u8; ASK_LEN] {
        let mut b = [0u8; ASK_LEN];
        match self {
            Ask::Split { color, key } => {
                b[0] = 1;
                b[1] = u8::from(color.is_some());
                b[2..6].copy_from_slice(&color.unwrap_or(0).to_le_bytes());
                b[6..10].copy_from_slice(&key.to_le_bytes());
            }
            Ask::Subgroup { list } => {
                b[0] = 2;
                b[10..42].copy_from_slice(list);
            }
            Ask::Grow { count } => {
                b[0] = 3;
                b[2..6].copy_from_slice(&count.to_le_bytes());
            }
        }
        b
    }

    /// Reads what a peer sent (`None`: not an ask of ours).
    fn decode(b: &[u8]) -> Option<Ask> {
        let u32_at = |i: usize| b.get(i..i + 4)?.try_into().ok().map(u32::from_le_bytes);
        match (b.len(), b.first(), b.get(1)) {
            (ASK_LEN, Some(1), Some(&present @ (0 | 1))) => Some(Ask::Split {
                color: (present == 1).then_some(u32_at(2)?),
                key: u32_at(6)?,
            }),
            (ASK_LEN, Some(2), _) => Some(Ask::Subgroup {
                list: b.get(10..42)?.try_into().ok()?,
            }),
            (ASK_LEN, Some(3), _) => Some(Ask::Grow { count: u32_at(2)? }),
            _ => None,
        }
    }

    /// What the ask was, for messages (`list`: the list of a subgroup this rank asked for,
    /// which a peer's digest stands for only when it is the same).
    fn describe(&self, list: Option<&[usize]>) -> String {
        match (self, list) {
            (
                Ask::Split {
                    color: Some(c),
                    key,
                },
                _,
            ) => format!("split(color {c}, key {key})"),
            (Ask::Split { color: None, key }, _) => format!("split(no color, key {key})"),
            (Ask::Subgroup { .. }, Some(list)) => format!("subgroup({list:?})"),
            (Ask::Subgroup { .. }, None) => "subgroup with another list of ranks".into(),
            (Ask::Grow { count, .. }, _) => format!("grow by {count}"),
        }
    }
}

/// The SHA-256 digest of a list of ranks, standing for it in asks and group ids.
pub(super) fn list_digest(ranks: &[usize]) -> Digest {
    let mut h = Sha256::new();
    h.update((ranks.len() as u64).to_le_bytes());
    for &r in ranks {
        h.update((r as u64).to_le_bytes());
    }
    h.finalize().into()
}

/// A sub-group's id: the first 64 bits of the SHA-256 of what tells it apart (`kind`, its
/// parent's id, then `parts`), never 0 (the group `init` made). Members compute it alike;
/// the registry of live groups (`JobListener::register`) refuses a second group with one id.
pub(super) fn group_id(kind: &str, parent: u64, parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    h.update(b"jaccl group id\0");
    h.update(kind.as_bytes());
    h.update(parent.to_le_bytes());
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest: Digest = h.finalize().into();
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default()).max(1)
}

impl Group {
    /// Splits the group into sub-groups, as `MPI_Comm_split` does: every rank of this group
    /// calls it; ranks that pass the same `color` form one new group, ordered by `key`, then by
    /// their rank here (so equal keys keep this group's order); a rank's new rank is its place
    /// in that order. A rank that passes `None` joins no group and gets `Ok(None)`.
    ///
    /// A sub-group is a [`Group`] of its own, with every operation, its own connections,
    /// heartbeat and algorithms chosen from its own members (ranks of one host use shared
    /// memory, and the direct collectives when all of them are on one host). It can be used
    /// from another thread while this group (or a sibling) is in use, and outlive this group.
    /// Its ranks are its own in everything it reports (a lost peer is named by its rank in the
    /// sub-group). Forming it needs no new port: its connections go through the listener each
    /// rank opened at start-up. Sub-groups can be split again.
    ///
    /// ```no_run
    /// # fn main() -> jaccl::Result<()> {
    /// let mut world = jaccl::init()?; // 8 ranks: 2 hosts × 4
    /// let host = (world.rank() / 4) as u32;
    /// // Tensor parallel inside each host, data parallel across hosts.
    /// let mut tp = world.split(Some(host), 0)?.expect("every rank has a color");
    /// let mut dp = world.split(Some(tp.rank() as u32), 0)?.expect("every rank has a color");
    /// std::thread::scope(|s| {
    ///     s.spawn(|| tp.barrier());
    ///     s.spawn(|| dp.barrier());
    /// });
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming a rank that called something else (or
    /// [`Group::subgroup`]); the errors of a collective on this group (after which it is
    /// poisoned); [`Error::Bootstrap`] when the new group cannot be formed in the start-up
    /// timeout (a member died or is not in this split), which leaves this group usable.
    pub fn split(&mut self, color: Option<u32>, key: u32) -> Result<Option<Group>> {
        let asks = self.gather_asks(Op::Split, &Ask::Split { color, key }, None)?;
        let split = self.next_split();
        let Some(color) = color else {
            self.end_split();
            return Ok(None);
        };
        let mut members: Vec<(u32, usize)> = asks
            .iter()
            .enumerate()
            .filter_map(|(rank, ask)| match ask {
                Ask::Split {
                    color: Some(c),
                    key,
                } if *c == color => Some((*key, rank)),
                _ => None,
            })
            .collect();
        members.sort_unstable();
        let members: Vec<usize> = members.into_iter().map(|(_, rank)| rank).collect();
        let id = group_id("split", self.family.id, &[&split, &color.to_le_bytes()]);
        let formed = self.form(&members, id, (None, None), Watch::Split);
        if formed.is_ok() {
            self.end_split();
        }
        formed.map(Some)
    }

    /// Makes a sub-group of `ranks` (ranks of this group, in the order of their new ranks):
    /// every rank of this group calls it with the same list; the members get the new group,
    /// the others `Ok(None)`. See [`Group::split`] for what a sub-group is.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming a rank whose list differs, or that called something else;
    /// [`Error::InvalidArgument`] (on every rank) for an empty list, a rank out of range or one
    /// listed twice; otherwise as [`Group::split`].
    pub fn subgroup(&mut self, ranks: &[usize]) -> Result<Option<Group>> {
        let list = list_digest(ranks);
        self.gather_asks(Op::Split, &Ask::Subgroup { list }, Some(ranks))?;
        let split = self.next_split();
        // Every rank has the same list now: each finds the same fault in it.
        self.check_list(ranks)?;
        if !ranks.contains(&self.rank) {
            self.end_split();
            return Ok(None);
        }
        let id = group_id("subgroup", self.family.id, &[&split, &list]);
        let formed = self.form(ranks, id, (None, None), Watch::Split);
        if formed.is_ok() {
            self.end_split();
        }
        formed.map(Some)
    }

    /// This rank is done with a split of this group (a member formed its new group; a rank
    /// outside it at once): counted as a second collective, so that a member that formed its
    /// new group and then left this one is known to have done its part for the others still
    /// forming theirs ([`crate::liveness::Liveness::check_collective`]). A member whose forming
    /// failed does not count it, so that if it leaves, the others fail at once rather than at
    /// their start-up timeout; its count then stays one behind theirs, which can only make a
    /// later departure of it look early (a failure, never a wait).
    pub(super) fn end_split(&self) {
        if let Some(liveness) = &self.liveness {
            liveness.finished_a_collective();
        }
    }

    /// The number of this split (or subgroup) among those of this group: counted on every
    /// rank of the group, member of the new group or not, so that the next split names its
    /// groups alike everywhere.
    pub(super) fn next_split(&self) -> [u8; 8] {
        self.family
            .splits
            .fetch_add(1, Ordering::Relaxed)
            .to_le_bytes()
    }

    /// Makes a sub-group of `ranks` (ranks of this group, in the order of their new ranks) that
    /// only its members call, each with the same `ranks` and `name`; `name` tells it apart
    /// from every other sub-group of this group, and this rank must be among `ranks`. For
    /// frameworks whose group creation reaches the members alone (PyTorch's `new_group` calls
    /// its backend only there); otherwise [`Group::subgroup`] is safer, since members that
    /// pass different lists or names never meet and fail only after the start-up timeout
    /// ([`Error::Bootstrap`] naming the ranks that did not come).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a list without this rank, with a rank out of range or
    /// listed twice; [`Error::Bootstrap`] as [`Group::split`].
    pub fn subgroup_of_members(&self, ranks: &[usize], name: &str) -> Result<Group> {
        self.members_form(ranks, name, None)
    }

    /// [`Group::subgroup_of_members`] whose new group has `timeout` as its start-up and
    /// operation timeouts instead of this group's (PyTorch's `new_group(timeout=...)`):
    /// members that do not all come within it fail with [`Error::Bootstrap`].
    ///
    /// # Errors
    /// As [`Group::subgroup_of_members`].
    pub fn subgroup_of_members_with_timeout(
        &self,
        ranks: &[usize],
        name: &str,
        timeout: Duration,
    ) -> Result<Group> {
        self.members_form(ranks, name, Some(timeout))
    }

    /// [`Group::subgroup_of_members`], with `timeout` (else this group's) for the new group.
    fn members_form(
        &self,
        ranks: &[usize],
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Group> {
        self.check_list(ranks)?;
        if !ranks.contains(&self.rank) {
            return Err(self.invalid(Op::Split, format!("this rank is not in the list {ranks:?}")));
        }
        // The same name and list again makes another group: its members have each made as
        // many with them before.
        let list = list_digest(ranks);
        let made = {
            let mut made = self.family.made_by_members.lock().map_err(|_| {
                let why = std::io::Error::other("the count of sub-groups is poisoned");
                Error::io(self.rank, "split", why)
            })?;
            let made = made.entry((name.to_owned(), list)).or_insert(0);
            *made += 1;
            *made - 1
        };
        let id = group_id(
            "members",
            self.family.id,
            &[name.as_bytes(), &list, &made.to_le_bytes()],
        );
        self.form(ranks, id, (timeout, timeout), Watch::Members)
    }

    /// A sub-group of `ranks` (this rank among them) that jaccl makes for its own use, named
    /// `purpose`, at most once per purpose and list: its id is of a kind of its own, which no
    /// name a caller gives to a sub-group can take. Every rank of this group forms its own in
    /// the same call, within the call's timeout.
    pub(super) fn internal_subgroup(&self, ranks: &[usize], purpose: &str) -> Result<Group> {
        let parts: [&[u8]; 2] = [purpose.as_bytes(), &list_digest(ranks)];
        self.form(
            ranks,
            group_id("internal", self.family.id, &parts),
            (
                Some(self.operation_timeout()),
                Some(self.operation_timeout()),
            ),
            Watch::Call,
        )
    }

    /// [`Error::InvalidArgument`] unless `ranks` is a non-empty list of distinct ranks.
    fn check_list(&self, ranks: &[usize]) -> Result<()> {
        if ranks.is_empty() {
            return Err(self.invalid(Op::Split, "the list of ranks is empty".into()));
        }
        for (i, &r) in ranks.iter().enumerate() {
            if r >= self.size {
                return Err(self.invalid(
                    Op::Split,
                    format!("rank {r} does not exist in a group of {}", self.size),
                ));
            }
            if ranks[..i].contains(&r) {
                return Err(self.invalid(Op::Split, format!("rank {r} is listed twice")));
            }
        }
        Ok(())
    }

    /// Every rank's ask, checked to be of the same kind as this rank's (and, for
    /// [`Group::subgroup`], the same `list`; for [`Group::grow`], the same count).
    pub(super) fn gather_asks(
        &mut self,
        op: Op,
        mine: &Ask,
        list: Option<&[usize]>,
    ) -> Result<Vec<Ask>> {
        self.check_usable()?;
        let mut all = vec![0u8; ASK_LEN * self.size];
        let call = self.call(op, Dtype::UInt8, ReduceOp::Sum, ASK_LEN);
        self.copy_or_run(call, &mine.encode(), &mut all, |c, i, o, call| {
            c.all_gather(i, o, call)
        })?;
        let mut asks = Vec::with_capacity(self.size);
        for (peer, bytes) in all.chunks_exact(ASK_LEN).enumerate() {
            let theirs = Ask::decode(bytes).ok_or_else(|| Error::Protocol {
                rank: self.rank,
                peer,
                op,
                detail: format!("its request ({op}) is not one of jaccl's"),
            })?;
            let same_kind = match (mine, &theirs) {
                (Ask::Split { .. }, Ask::Split { .. }) => true,
                _ => *mine == theirs,
            };
            if !same_kind {
                return Err(Error::Mismatch {
                    rank: self.rank,
                    peer,
                    op,
                    detail: format!(
                        "this rank called {}, rank {peer} {}",
                        mine.describe(list),
                        theirs.describe(None)
                    ),
                });
            }
            asks.push(theirs);
        }
        Ok(asks)
    }

    /// Forms the group of `members` (ranks of this group, in their new order; this rank among
    /// them) whose connections carry `id`, with `(startup, operation)` as its timeouts
    /// (`None`: this group's), watching the ranks `watch` says while it waits.
    pub(super) fn form(
        &self,
        members: &[usize],
        id: u64,
        timeouts: (Option<Duration>, Option<Duration>),
        watch: Watch,
    ) -> Result<Group> {
        let rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| {
                let why = std::io::Error::other("this rank is not a member of its own group");
                Error::io(self.rank, "split", why)
            })?;
        let job_rank: Arc<[usize]> = members.iter().map(|&r| self.family.job_rank[r]).collect();
        self.form_of_job_ranks(members, job_rank, rank, id, timeouts, watch)
    }

    /// [`Group::form`], whose ranks are the job's `job_rank` (with ranks of this group,
    /// `members`, first, then ranks new to it); this rank is `rank` of it.
    pub(super) fn form_of_job_ranks(
        &self,
        members: &[usize],
        job_rank: Arc<[usize]>,
        rank: usize,
        id: u64,
        (startup, operation): (Option<Duration>, Option<Duration>),
        watch: Watch,
    ) -> Result<Group> {
        let mut config = Config {
            rank,
            size: job_rank.len(),
            ..(*self.family.config).clone()
        };
        if let Some(startup) = startup {
            config.startup_timeout = startup;
        }
        if let Some(operation) = operation {
            config.timeout = operation;
        }
        let registration = match &self.family.job {
            Some(job) if job_rank.len() > 1 => Some(Arc::new(
                job.register(id)
                    .map_err(|why| self.invalid(Op::Split, why))?,
            )),
            _ => None,
        };
        let family = Family {
            config: Arc::new(config.clone()),
            job: self.family.job.clone(),
            job_rank: Arc::clone(&job_rank),
            id,
            splits: Arc::default(),
            agreements: Arc::default(),
            made_by_members: Arc::default(),
            _registration: registration,
        };
        if job_rank.len() == 1 {
            return Ok(Group::of_one(family));
        }
        let job = self.family.job.clone().ok_or_else(|| {
            let why = std::io::Error::other("a group of one has no connections to split");
            Error::io(self.rank, "split", why)
        })?;
        // Forming waits for the members: it ends early when one of them (within a call, any
        // rank of this group) is lost or has left this group without forming the new one, or
        // when this group is aborted, closed or interrupted.
        let (parent, interruptible) = (self.liveness.clone(), !self.on_progress_thread);
        let watched = match watch {
            Watch::Members | Watch::Split | Watch::Survivors => members.to_vec(),
            Watch::Call => (0..self.size).filter(|&r| r != self.rank).collect(),
        };
        let go_on: GoOn = Arc::new(move || match &parent {
            Some(parent) => {
                match watch {
                    Watch::Members => parent.check_peers(Op::Split, &watched)?,
                    Watch::Split | Watch::Call => parent.check_collective(Op::Split, &watched)?,
                    Watch::Survivors => {
                        return parent.check_interrupt_only(Op::Shrink, interruptible);
                    }
                }
                parent.check_interrupt(Op::Split, interruptible)
            }
            None => Ok(()),
        });
        let connected =
            connect::connect_subgroup(&config, job, job_rank, id, go_on).map_err(|e| match e {
                Error::Bootstrap(why) => Error::Bootstrap(format!(
                    "{why} (forming the sub-group of ranks {members:?})"
                )),
                other => other,
            })?;
        Ok(Group::connected(&config, connected, family))
    }
}

/// Whom forming a sub-group watches while it waits for its members ([`Group::form`]).
#[derive(Clone, Copy)]
pub(super) enum Watch {
    /// Members that form it when they come to it: any that is lost or has left this group
    /// ends the wait.
    Members,
    /// A split, which every rank of this group calls and ends with [`Group::end_split`]: a
    /// member whose group failed, or that left before the split, ends the wait (one that
    /// formed it and left did its part).
    Split,
    /// A call of every rank of this group in which each forms its sub-groups (the two
    /// levels): any rank of this group that failed, or left before finishing this call, ends
    /// the wait, as the call cannot succeed (a rank that passed the call's opening,
    /// `Collectives::check_neighbours`, has counted it).
    Call,
    /// The survivors of a failure ([`Group::shrink`]): this group has failed, so its
    /// heartbeat says nothing of them; only an interrupt ends the wait early, and a member
    /// lost meanwhile makes the formation fail at its start-up timeout (on every member but
    /// in one case: [`Group::shrink`]).
    Survivors,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_round_trip_and_foreign_bytes_are_not_asks() {
        for ask in [
            Ask::Split {
                color: Some(7),
                key: 3,
            },
            Ask::Split {
                color: None,
                key: u32::MAX,
            },
            Ask::Subgroup {
                list: list_digest(&[2, 0]),
            },
        ] {
            assert_eq!(Ask::decode(&ask.encode()), Some(ask));
        }
        assert_eq!(Ask::decode(&[0u8; ASK_LEN]), None);
        assert_eq!(Ask::decode(&[1u8, 2]), None);
        let mut bad = Ask::Split {
            color: None,
            key: 1,
        }
        .encode();
        bad[1] = 7;
        assert_eq!(Ask::decode(&bad), None);
    }

    #[test]
    fn digests_and_ids_tell_lists_and_groups_apart() {
        assert_eq!(list_digest(&[1, 2]), list_digest(&[1, 2]));
        assert_ne!(list_digest(&[1, 2]), list_digest(&[2, 1]));
        assert_ne!(list_digest(&[0]), list_digest(&[0, 0]));
        let id = |kind, parent, parts: &[&[u8]]| group_id(kind, parent, parts);
        assert_eq!(id("split", 0, &[b"a"]), id("split", 0, &[b"a"]));
        assert_ne!(id("split", 0, &[b"a"]), id("subgroup", 0, &[b"a"]));
        assert_ne!(id("split", 0, &[b"a"]), id("split", 1, &[b"a"]));
        assert_ne!(id("split", 0, &[b"ab", b""]), id("split", 0, &[b"a", b"b"]));
    }
}
