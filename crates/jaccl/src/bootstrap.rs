//! The side channel: a TCP star through the coordinator (rank 0), used at start-up to check
//! that all ranks belong to the same job and agree on the configuration, and to exchange what
//! the data connections need.
//!
//! A member connects and authenticates (`crate::auth`: both sides prove they know the job's
//! token, which never crosses the network); the coordinator serves those handshakes
//! concurrently, so strangers cannot stall it, and tells an authenticated member whether it is
//! admitted. After that every message is a frame (a little-endian `u32` length, then the
//! payload): each member sends its bytes and receives rank 0's reply, everyone's in rank order
//! (an all-gather) or what rank 0 made of them (`SideChannel::gather_reply`). Every read and
//! write has a deadline.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::Instant;

use crate::auth::{self, Admission, AuthError, Claim, Purpose};
use crate::config::{Config, split_host_port};
use crate::error::{Error, Result};
use crate::liveness::{self, Heartbeat, Liveness};
use crate::op_header::{Reader, to_u32};
use crate::os::{RetryDelay, accept_tcp, connect_with_retry, deadline_after};
use crate::transport::frame::{read_frame, write_frame};
use crate::transport::listener::{DialError, JobListener};

/// Side-channel messages are small (start-up data of one rank); anything larger is not ours.
/// The coordinator's replies hold one such message per rank.
const MAX_FRAME: usize = 64 * 1024;

/// Encodes everyone's bytes, in rank order.
pub(crate) fn encode_list(items: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&to_u32(items.len()).to_le_bytes());
    for item in items {
        b.extend_from_slice(&to_u32(item.len()).to_le_bytes());
        b.extend_from_slice(item);
    }
    b
}

/// Parses [`encode_list`]'s output, expecting `count` items.
pub(crate) fn decode_list(b: &[u8], count: usize) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut r = Reader(b);
    let n = r.u32()? as usize;
    if n != count {
        return Err(format!("expected {count} entries, got {n}"));
    }
    let mut items = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let len = r.u32()? as usize;
        items.push(r.take(len)?.to_vec());
    }
    r.end()?;
    Ok(items)
}

/// This rank's end of the side channel.
pub(crate) struct SideChannel {
    rank: usize,
    size: usize,
    role: Role,
    /// The address peers reach this host at (the side channel's local address).
    local_ip: IpAddr,
}

enum Role {
    /// Rank 0: `members[i]` is rank i + 1.
    Coordinator {
        members: Vec<TcpStream>,
    },
    Member {
        stream: TcpStream,
    },
}

impl SideChannel {
    /// Joins the group described by `cfg` (rank 0 hosts the coordinator) before `deadline`.
    pub(crate) fn join(cfg: &Config, deadline: Instant) -> Result<SideChannel> {
        let (addr, everywhere) = resolve(cfg)?;
        if cfg.rank == 0 {
            coordinate(cfg, addr, everywhere, deadline)
        } else {
            attend(cfg, addr, deadline)
        }
    }

    /// The side channel of sub-group `group` (`crate::group`), whose rank `r` is the job's rank
    /// `job_rank[r]`, through the listener every rank keeps from start-up (`job`): its rank 0
    /// coordinates, and each other member connects to it, authenticated like every
    /// connection, before `deadline`; the waits for members ask `go_on`.
    pub(crate) fn through(
        job: &JobListener,
        group: u64,
        job_rank: &[usize],
        rank: usize,
        deadline: Instant,
        go_on: &(dyn Fn() -> Result<()> + Send + Sync),
    ) -> Result<SideChannel> {
        let fail = |why: String| Error::Bootstrap(format!("rank {rank}: {why}"));
        let (role, local) = if rank == 0 {
            let slots: Vec<_> = job_rank[1..]
                .iter()
                .map(|&r| (Purpose::Side, group, r, 0))
                .collect();
            let members = job.collect(&slots, deadline, go_on)?;
            let local = members.first().map(TcpStream::local_addr);
            (Role::Coordinator { members }, local)
        } else {
            let coordinator = job_rank.first().copied().unwrap_or_default();
            let stream = job
                .dial(Purpose::Side, group, coordinator, 0, deadline, &mut || {
                    go_on()
                })
                .map_err(|e| match e {
                    DialError::Stopped(e) => e,
                    DialError::Failed(why) => {
                        fail(format!("joining the new group's rank 0: {why}"))
                    }
                })?;
            let local = Some(stream.local_addr());
            (Role::Member { stream }, local)
        };
        let local_ip = match local {
            Some(addr) => addr
                .map_err(|e| Error::io(rank, "side channel address", e))?
                .ip(),
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        Ok(SideChannel {
            rank,
            size: job_rank.len(),
            role,
            local_ip,
        })
    }

    /// The local address other ranks reach this one at.
    pub(crate) fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// Every rank's `data`, in rank order.
    pub(crate) fn all_gather(&mut self, data: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let (rank, size) = (self.rank, self.size);
        let mut gathered = None;
        let reply = self.gather_reply(data, deadline, |all| {
            let reply = encode_list(&all);
            gathered = Some(all);
            reply
        })?;
        match gathered {
            Some(all) => Ok(all),
            None => decode_list(&reply, size).map_err(|why| {
                Error::Bootstrap(format!(
                    "rank {rank}: bad reply from the coordinator: {why}"
                ))
            }),
        }
    }

    /// Rank 0 receives every rank's `data` and makes of them (in rank order) with `reply`,
    /// called on rank 0 only, the bytes every rank returns. So rank 0 works on everyone's data
    /// once and each member reads only what it needs, not every rank's data.
    pub(crate) fn gather_reply(
        &mut self,
        data: &[u8],
        deadline: Instant,
        reply: impl FnOnce(Vec<Vec<u8>>) -> Vec<u8>,
    ) -> Result<Vec<u8>> {
        let (rank, size) = (self.rank, self.size);
        match &mut self.role {
            Role::Coordinator { members } => {
                let mut all = Vec::with_capacity(size);
                all.push(data.to_vec());
                for (i, stream) in members.iter_mut().enumerate() {
                    let from = i + 1;
                    let bytes = read_frame(stream, deadline, MAX_FRAME).map_err(|e| {
                        Error::Bootstrap(format!(
                            "rank {rank}: rank {from} {} during start-up",
                            describe_loss(&e)
                        ))
                    })?;
                    all.push(bytes);
                }
                let reply = reply(all);
                for (i, stream) in members.iter_mut().enumerate() {
                    write_frame(stream, &reply, deadline).map_err(|e| {
                        Error::Bootstrap(format!(
                            "rank {rank}: cannot reach rank {} during start-up: {e}",
                            i + 1
                        ))
                    })?;
                }
                Ok(reply)
            }
            Role::Member { stream } => {
                let lost = |e: io::Error| {
                    Error::Bootstrap(format!(
                        "rank {rank}: the coordinator (rank 0) {} during start-up; see rank 0's error",
                        describe_loss(&e)
                    ))
                };
                write_frame(stream, data, deadline).map_err(lost)?;
                let most = size.saturating_mul(MAX_FRAME + 4).saturating_add(4);
                read_frame(stream, deadline, most).map_err(lost)
            }
        }
    }

    /// Returns once every rank has called it.
    pub(crate) fn barrier(&mut self, deadline: Instant) -> Result<()> {
        self.gather_reply(&[], deadline, |_| Vec::new()).map(drop)
    }

    /// Hands the connections to the heartbeat (`crate::liveness`) after start-up.
    pub(crate) fn into_heartbeat(
        self,
        window: std::time::Duration,
        live: std::sync::Arc<Liveness>,
    ) -> io::Result<Heartbeat> {
        match self.role {
            Role::Coordinator { members } => liveness::coordinate(members, window, live),
            Role::Member { stream } => liveness::attend(stream, window, live),
        }
    }
}

fn describe_loss(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            "did not answer before the timeout".into()
        }
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
            "closed the connection".into()
        }
        _ => format!("failed ({e})"),
    }
}

/// Where rank 0 listens and members connect: the coordinator address, resolved.
fn resolve(cfg: &Config) -> Result<(SocketAddr, bool)> {
    let addr = cfg.coordinator.as_deref().unwrap_or_default();
    let (host, port) = split_host_port(addr)
        .map_err(|why| Error::Config(format!("coordinator '{addr}': {why}")))?;
    let resolved = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::Bootstrap(format!(
                "rank {}: cannot resolve the coordinator address '{addr}': {e}",
                cfg.rank
            ))
        })?
        .next()
        .ok_or_else(|| {
            Error::Bootstrap(format!(
                "rank {}: the coordinator address '{addr}' resolves to nothing",
                cfg.rank
            ))
        })?;
    // A host *name* that resolves to a loopback address on rank 0's own host (Debian and
    // Ubuntu map the host name to 127.0.1.1) still names the host for the other machines.
    let named = host.parse::<IpAddr>().is_err();
    Ok((resolved, named && resolved.ip().is_loopback()))
}

/// The address rank 0 binds: the coordinator's, or every interface on its port when the
/// coordinator is a host name that resolves to loopback here.
fn bind_address(addr: SocketAddr, everywhere: bool) -> SocketAddr {
    match (everywhere, addr) {
        (false, _) => addr,
        (true, SocketAddr::V4(a)) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, a.port())),
        (true, SocketAddr::V6(a)) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, a.port())),
    }
}

/// Rank 0: listens on the coordinator address and admits the other `size - 1` ranks.
fn coordinate(
    cfg: &Config,
    addr: SocketAddr,
    everywhere: bool,
    deadline: Instant,
) -> Result<SideChannel> {
    let bind = bind_address(addr, everywhere);
    let listener = crate::os::listen_tcp(bind).map_err(|e| {
        Error::Bootstrap(format!(
            "rank 0: cannot listen on the coordinator address {bind}: {e}"
        ))
    })?;
    let token = cfg.token();
    let mut members: Vec<Option<TcpStream>> = (1..cfg.size).map(|_| None).collect();
    let mut joined = 0;
    let done = auth::serve(
        listener.as_fd(),
        || accept_tcp(&listener),
        &token,
        0,
        deadline,
        None,
        |claim, mut stream| {
            let reply_by = deadline.min(deadline_after(auth::HANDSHAKE_TIMEOUT));
            match admit(cfg, &claim, &members) {
                Ok(index) => {
                    if auth::verdict(&mut stream, Ok(()), reply_by).is_ok() {
                        members[index] = Some(stream);
                        joined += 1;
                    }
                }
                Err((why, fatal)) => {
                    let _ = auth::verdict(&mut stream, Err(&why), reply_by);
                    if fatal {
                        return Err(Error::Bootstrap(format!(
                            "rank 0: refused rank {}: {why}",
                            claim.rank
                        )));
                    }
                    tracing::warn!(rank = claim.rank, %why, "refused a rank");
                }
            }
            Ok(if joined == members.len() {
                Admission::Done
            } else {
                Admission::More
            })
        },
    )?;
    if !done {
        let absent: Vec<String> = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.is_none())
            .map(|(i, _)| (i + 1).to_string())
            .collect();
        return Err(Error::Bootstrap(format!(
            "rank 0: timed out after {:?} waiting for rank(s) {} to join at {addr}",
            cfg.startup_timeout,
            absent.join(", ")
        )));
    }
    let members: Vec<TcpStream> = members.into_iter().flatten().collect();
    let local_ip = members
        .first()
        .and_then(|m| m.local_addr().ok())
        .map_or(addr.ip(), |a| a.ip());
    Ok(SideChannel {
        rank: 0,
        size: cfg.size,
        role: Role::Coordinator { members },
        local_ip,
    })
}

/// Whether an authenticated `claim` may take its rank: `Ok(index into members)`, or the reason
/// and whether it dooms the job (a member of this job misconfigured) rather than only itself
/// (a second process claiming a taken rank, which keeps the first).
fn admit(
    cfg: &Config,
    claim: &Claim,
    members: &[Option<TcpStream>],
) -> std::result::Result<usize, (String, bool)> {
    if claim.purpose != Purpose::Side {
        return Err(("this is the coordinator, not a data port".into(), false));
    }
    if claim.size != cfg.size {
        return Err((
            format!(
                "it was started for {} ranks, rank 0 for {}",
                claim.size, cfg.size
            ),
            true,
        ));
    }
    let rank = claim.rank;
    if rank == 0 || rank >= cfg.size {
        return Err((
            format!(
                "rank {rank} is not a member rank of a group of {}",
                cfg.size
            ),
            true,
        ));
    }
    if members[rank - 1].is_some() {
        return Err((
            format!("rank {rank} has already joined (two processes claim it)"),
            false,
        ));
    }
    Ok(rank - 1)
}

/// A member: joins the coordinator, retrying while it is not up yet.
fn attend(cfg: &Config, addr: SocketAddr, deadline: Instant) -> Result<SideChannel> {
    let rank = cfg.rank;
    let token = cfg.token();
    let claim = Claim {
        purpose: Purpose::Side,
        rank,
        size: cfg.size,
        wire: 0,
        group: 0,
    };
    let fail = |why: String| Error::Bootstrap(format!("rank {rank}: {why}"));
    let mut delay = RetryDelay::new();
    let mut last_error = String::new();
    loop {
        last_error = match connect_with_retry(addr, deadline) {
            // Running out of time says less than what happened before.
            Err(e) if e.kind() == io::ErrorKind::TimedOut && !last_error.is_empty() => last_error,
            Err(e) => e.to_string(),
            Ok(mut stream) => match auth::connect(&mut stream, &token, claim, deadline) {
                Ok(()) => {
                    let local_ip = stream
                        .local_addr()
                        .map_err(|e| Error::io(rank, "side channel address", e))?
                        .ip();
                    return Ok(SideChannel {
                        rank,
                        size: cfg.size,
                        role: Role::Member { stream },
                        local_ip,
                    });
                }
                Err(e @ AuthError::Unknown) => {
                    return Err(fail(format!("the coordinator at {addr}: {e}")));
                }
                Err(AuthError::Refused(why)) => {
                    return Err(fail(format!(
                        "the coordinator at {addr} refused this rank: {why}"
                    )));
                }
                // Rank 0 may be busy or restarting: try again.
                Err(e @ AuthError::Failed(_)) => e.to_string(),
            },
        };
        if !delay.pause(deadline) {
            last_error += " (retried until the start-up timeout)";
            return Err(fail(format!(
                "cannot join the coordinator at {addr} within {:?}: {last_error} (is rank 0 \
                 running, and is the address right?)",
                cfg.startup_timeout
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn lists_round_trip_and_foreign_bytes_are_rejected() {
        let items = vec![b"a".to_vec(), vec![], vec![1, 2, 3]];
        assert_eq!(decode_list(&encode_list(&items), 3), Ok(items));
        assert!(decode_list(&[5, 0, 0, 0, 1], 5).is_err());
        assert!(decode_list(&encode_list(&[vec![1]]), 2).is_err());
    }

    #[test]
    fn a_host_name_that_resolves_to_loopback_is_bound_everywhere() {
        let cfg = Config::new(0, 2).coordinator("localhost:5000");
        let (addr, everywhere) = resolve(&cfg).unwrap();
        assert!(everywhere);
        assert!(bind_address(addr, everywhere).ip().is_unspecified());
        let cfg = Config::new(0, 2).coordinator("127.0.0.1:5000");
        assert!(!resolve(&cfg).unwrap().1);
    }

    proptest! {
        /// Lists whose count is right (so decoding gets past it) and whose rest is random.
        #[test]
        fn lists_never_panic(n in 0usize..5, rest in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut bytes = to_u32(n).to_le_bytes().to_vec();
            bytes.extend(rest);
            let _ = decode_list(&bytes, n);
        }
    }
}
