//! What a rank's job listener answers for the other ranks without its application's help:
//! what this process says of an agreement (`crate::agreement`: opaque bytes here), and
//! revocations of its groups
//! ([`crate::Group::revoke`]). The accepting thread serves both, so they reach a process whose
//! threads are all busy, or whose group has failed, for as long as the process lives; and
//! whether a question is answered at all tells whether it does: a process that died no longer
//! listens (its host's kernel refuses the connection at once), one that is stopped does not
//! answer.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::auth::{self, AuthError, Claim, Identity, Purpose};
use crate::os::deadline_after;
use crate::transport::frame::{read_frame, write_frame};

/// What a revocation calls: it is given the job's rank that revoked the group.
pub(crate) type Revoker = Arc<RevokeFn>;

/// A group's reaction to a revocation (see [`Revoker`]).
pub(crate) type RevokeFn = dyn Fn(usize) + Send + Sync;

/// The agreements this process keeps answering for: the newest ones (an agreement is asked
/// about while its survivors finish it; a rank stopped for longer than this many agreements
/// of the others asks about one forgotten, and waits for the operation timeout).
const STANDINGS_KEPT: usize = 1024;

/// The longest standing answered (an agreement's: a few bytes per rank).
pub(crate) const MAX_STANDING: usize = 1 << 20;

/// What the accepting thread answers from.
#[derive(Default)]
pub(crate) struct Answers {
    /// What this process says of each agreement, by id, oldest first.
    standings: Mutex<VecDeque<(u64, Vec<u8>)>>,
    /// The groups alive here that a member may revoke, by id.
    revokers: Mutex<HashMap<u64, Weak<RevokeFn>>>,
}

impl Answers {
    /// What this process says of agreement `id` from now on (`only_if_new`: unless it said
    /// something already).
    pub(crate) fn stand(&self, id: u64, standing: &[u8], only_if_new: bool) {
        let Ok(mut standings) = self.standings.lock() else {
            return;
        };
        if let Some((_, s)) = standings.iter_mut().find(|(i, _)| *i == id) {
            if !only_if_new {
                *s = standing.to_vec();
            }
            return;
        }
        if standings.len() >= STANDINGS_KEPT {
            standings.pop_front();
        }
        standings.push_back((id, standing.to_vec()));
    }

    /// What this process says of agreement `id`, if anything.
    fn standing(&self, id: u64) -> Option<Vec<u8>> {
        let standings = self.standings.lock().ok()?;
        standings
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, s)| s.clone())
    }

    /// A revocation of group `group` calls `revoker` while it lives.
    pub(crate) fn on_revoke(&self, group: u64, revoker: &Revoker) {
        if let Ok(mut revokers) = self.revokers.lock() {
            revokers.retain(|_, r| r.strong_count() > 0);
            revokers.insert(group, Arc::downgrade(revoker));
        }
    }

    /// Serves an authenticated question or piece of news (the accepting thread's part):
    /// `Ask` is answered with a frame (0: nothing to say; 1 and the standing), `Revoke` is
    /// passed to the group's revoker.
    pub(crate) fn serve(&self, claim: &Claim, mut stream: TcpStream) {
        let reply_by = deadline_after(auth::HANDSHAKE_TIMEOUT);
        if auth::verdict(&mut stream, Ok(()), reply_by).is_err() {
            return;
        }
        match claim.purpose {
            Purpose::Ask => {
                let answer = match self.standing(claim.group) {
                    Some(s) => [&[1u8][..], &s].concat(),
                    None => vec![0],
                };
                let _ = write_frame(&mut stream, &answer, reply_by);
            }
            Purpose::Revoke => {
                let revoker = match self.revokers.lock() {
                    Ok(revokers) => revokers.get(&claim.group).and_then(Weak::upgrade),
                    Err(_) => None,
                };
                if let Some(revoke) = revoker {
                    revoke(claim.rank);
                }
            }
            _ => {}
        }
    }
}

/// What asking a rank's listener about an agreement found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing listens there any more: the process has ended.
    Gone,
    /// No answer in time (the process is stopped or hung, or its host or network is gone),
    /// or the connection broke on the way.
    Silent,
    /// The process lives and has said nothing of the agreement.
    Nothing,
    /// The process lives and says this of the agreement.
    Said(Vec<u8>),
}

/// Asks the job's rank `peer`, listening at `addr`, about agreement `id`, within `within`:
/// one attempt, no retry (the caller asks again).
pub(crate) fn ask(
    me: &Identity,
    peer: usize,
    addr: SocketAddr,
    id: u64,
    within: Duration,
) -> Answer {
    let deadline = deadline_after(within);
    let mut stream = match TcpStream::connect_timeout(&addr, within) {
        Ok(stream) => stream,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Answer::Gone,
        Err(_) => return Answer::Silent,
    };
    let _ = stream.set_nodelay(true);
    let claim = Claim {
        purpose: Purpose::Ask,
        rank: me.rank,
        size: me.size,
        wire: 0,
        group: id,
    };
    match auth::connect(&mut stream, &me.token, claim, deadline) {
        Ok(()) => {}
        Err(AuthError::Failed(_)) => return Answer::Silent,
        Err(why) => {
            tracing::warn!(rank = me.rank, peer, %why, "a question was refused");
            return Answer::Silent;
        }
    }
    match read_frame(&mut stream, deadline, MAX_STANDING + 1) {
        Ok(answer) => match answer.split_first() {
            Some((1, standing)) => Answer::Said(standing.to_vec()),
            _ => Answer::Nothing,
        },
        Err(_) => Answer::Silent,
    }
}

/// Tells each `(job rank, address)` of `peers` that the job's rank `me` revoked group
/// `group`, from a thread of its own, so the caller does not wait; each is tried once, within
/// `within` (a member that does not hear it fails on the revoker's closed connections).
pub(crate) fn tell_revoked(
    me: &Identity,
    peers: Vec<(usize, SocketAddr)>,
    group: u64,
    within: Duration,
) {
    let me = me.clone();
    let told = std::thread::Builder::new()
        .name(format!("jaccl-revoke-{}", me.rank))
        .spawn(move || {
            for (peer, addr) in peers {
                let claim = Claim {
                    purpose: Purpose::Revoke,
                    rank: me.rank,
                    size: me.size,
                    wire: 0,
                    group,
                };
                let deadline = deadline_after(within);
                let told = TcpStream::connect_timeout(&addr, within)
                    .map_err(|e| e.to_string())
                    .and_then(|mut s| {
                        auth::connect(&mut s, &me.token, claim, deadline).map_err(|e| e.to_string())
                    });
                if let Err(why) = told {
                    tracing::info!(rank = me.rank, peer, %why, "could not tell a rank of a revocation");
                }
            }
        });
    if let Err(e) = told {
        tracing::warn!(rank = me.rank, error = %e, "cannot start the thread that tells of a revocation");
    }
}
