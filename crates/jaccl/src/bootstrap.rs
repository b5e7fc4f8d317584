//! The side channel: a TCP star through the coordinator (rank 0), used at start-up to check
//! that all ranks belong to the same job and agree on the configuration, and to exchange the
//! addresses of the data connections.
//!
//! Every message is a frame: a little-endian `u32` length, then the payload. A member joins with
//! `JCBS`, the protocol version, its rank, the group size and the job token; the coordinator
//! answers with an acceptance or a reason for refusal. After that, all-gathers: each member sends
//! its bytes and receives everyone's, in rank order. Every read and write has a deadline.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::config::{Config, split_host_port};
use crate::error::{Error, Result};
use crate::transport::tcp::{connect_with_retry, remaining};
use crate::transport::wait_readable;
use crate::wire::{PROTOCOL_VERSION, to_u32};

const MAGIC: [u8; 4] = *b"JCBS";
/// Side-channel messages are small (addresses, settings); anything larger is not ours.
const MAX_FRAME: usize = 1 << 20;
/// How long an accepted connection may take to say who it is before it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A member's request to join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Join {
    pub(crate) version: u16,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) token: u64,
}

impl Join {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(22);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.token.to_le_bytes());
        b
    }

    /// Parses a join request; an error means the bytes are not from a jaccl rank.
    pub(crate) fn decode(b: &[u8]) -> std::result::Result<Join, String> {
        let mut r = Reader(b);
        if r.take(4)? != MAGIC {
            return Err("not a jaccl rank (bad magic)".into());
        }
        let join = Join {
            version: r.u16()?,
            rank: r.u32()?,
            size: r.u32()?,
            token: r.u64()?,
        };
        r.end()?;
        Ok(join)
    }
}

/// The coordinator's answer to a [`Join`]: `Ok(())` or the reason for refusal.
pub(crate) fn encode_reply(reply: &std::result::Result<(), String>) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    match reply {
        Ok(()) => b.push(0),
        Err(why) => {
            b.push(1);
            b.extend_from_slice(why.as_bytes());
        }
    }
    b
}

/// Parses the coordinator's answer. The outer error means the peer is not a jaccl coordinator.
pub(crate) fn decode_reply(
    b: &[u8],
) -> std::result::Result<std::result::Result<(), String>, String> {
    let mut r = Reader(b);
    if r.take(4)? != MAGIC {
        return Err("it is not a jaccl coordinator (bad magic)".into());
    }
    let version = r.u16()?;
    if version != PROTOCOL_VERSION {
        return Err(format!(
            "it speaks jaccl protocol {version}, this rank speaks {PROTOCOL_VERSION}"
        ));
    }
    match r.take(1)?[0] {
        0 => Ok(Ok(())),
        1 => Ok(Err(String::from_utf8_lossy(r.rest()).into_owned())),
        other => Err(format!("unknown reply status {other}")),
    }
}

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

/// Bounds-checked little-endian reads.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "message too short ({} bytes missing)",
                n - self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let mut x = [0u8; 4];
        x.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(x))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut x = [0u8; 8];
        x.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(x))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    fn end(&self) -> std::result::Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.0.len()))
        }
    }
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
        let addr = resolve(cfg)?;
        if cfg.rank == 0 {
            coordinate(cfg, addr, deadline)
        } else {
            attend(cfg, addr, deadline)
        }
    }

    /// The local address other ranks reach this one at.
    pub(crate) fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// Every rank's `data`, in rank order.
    pub(crate) fn all_gather(&mut self, data: &[u8], deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let (rank, size) = (self.rank, self.size);
        match &mut self.role {
            Role::Coordinator { members } => {
                let mut all = Vec::with_capacity(size);
                all.push(data.to_vec());
                for (i, stream) in members.iter_mut().enumerate() {
                    let from = i + 1;
                    let bytes = read_frame(stream, deadline).map_err(|e| {
                        Error::Bootstrap(format!(
                            "rank {rank}: rank {from} {} during start-up",
                            describe_loss(&e)
                        ))
                    })?;
                    all.push(bytes);
                }
                let reply = encode_list(&all);
                for (i, stream) in members.iter_mut().enumerate() {
                    write_frame(stream, &reply, deadline).map_err(|e| {
                        Error::Bootstrap(format!(
                            "rank {rank}: cannot reach rank {} during start-up: {e}",
                            i + 1
                        ))
                    })?;
                }
                Ok(all)
            }
            Role::Member { stream } => {
                let lost = |e: io::Error| {
                    Error::Bootstrap(format!(
                        "rank {rank}: the coordinator (rank 0) {} during start-up; see rank 0's error",
                        describe_loss(&e)
                    ))
                };
                write_frame(stream, data, deadline).map_err(lost)?;
                let reply = read_frame(stream, deadline).map_err(lost)?;
                decode_list(&reply, size).map_err(|why| {
                    Error::Bootstrap(format!(
                        "rank {rank}: bad reply from the coordinator: {why}"
                    ))
                })
            }
        }
    }

    /// Returns once every rank has called it.
    pub(crate) fn barrier(&mut self, deadline: Instant) -> Result<()> {
        self.all_gather(&[], deadline).map(drop)
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

fn resolve(cfg: &Config) -> Result<SocketAddr> {
    let addr = cfg.coordinator.as_deref().unwrap_or_default();
    let (host, port) = split_host_port(addr)
        .map_err(|why| Error::Config(format!("coordinator '{addr}': {why}")))?;
    (host, port)
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
        })
}

/// Rank 0: listens on the coordinator address and admits the other `size - 1` ranks.
fn coordinate(cfg: &Config, addr: SocketAddr, deadline: Instant) -> Result<SideChannel> {
    let listener = listen(addr).map_err(|e| {
        Error::Bootstrap(format!(
            "rank 0: cannot listen on the coordinator address {addr}: {e}"
        ))
    })?;
    let fail = |what: String| Error::Bootstrap(format!("rank 0: {what}"));
    let mut members: Vec<Option<TcpStream>> = (1..cfg.size).map(|_| None).collect();
    let mut joined = 0;
    while joined < members.len() {
        let ready = wait_readable(listener.as_fd(), remaining(deadline))
            .map_err(|e| Error::io(0, "waiting for ranks to join", e))?;
        if !ready {
            let absent: Vec<String> = members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.is_none())
                .map(|(i, _)| (i + 1).to_string())
                .collect();
            return Err(fail(format!(
                "timed out after {:?} waiting for rank(s) {} to join at {addr}",
                cfg.timeout,
                absent.join(", ")
            )));
        }
        let (mut stream, from) = listener
            .accept()
            .map_err(|e| Error::io(0, "accepting a rank", e))?;
        let handshake_deadline = deadline.min(Instant::now() + HANDSHAKE_TIMEOUT);
        let join = match read_frame(&mut stream, handshake_deadline)
            .map_err(|e| e.to_string())
            .and_then(|b| Join::decode(&b))
        {
            Ok(join) => join,
            Err(why) => {
                tracing::debug!(%from, %why, "ignoring a connection to the coordinator");
                continue;
            }
        };
        let verdict = admit(cfg, &join, &members);
        let reply = encode_reply(&verdict.as_ref().map(|_| ()).map_err(|(why, _)| why.clone()));
        // A refused rank learns why; failing to tell it changes nothing for us.
        let _ = write_frame(&mut stream, &reply, handshake_deadline);
        match verdict {
            Ok(index) => {
                members[index] = Some(stream);
                joined += 1;
            }
            Err((why, fatal)) => {
                if fatal {
                    return Err(fail(format!("refused rank {} at {from}: {why}", join.rank)));
                }
                tracing::warn!(%from, %why, "refused a rank of another job");
            }
        }
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

/// Whether `join` may take its rank: `Ok(index into members)`, or the reason and whether it
/// dooms this job (a rank of ours misconfigured) rather than being a stray of another job.
fn admit(
    cfg: &Config,
    join: &Join,
    members: &[Option<TcpStream>],
) -> std::result::Result<usize, (String, bool)> {
    if join.version != PROTOCOL_VERSION {
        return Err((
            format!(
                "it speaks jaccl protocol {}, the coordinator speaks {PROTOCOL_VERSION}",
                join.version
            ),
            true,
        ));
    }
    if join.token != cfg.job_token {
        return Err((
            format!(
                "it belongs to another job (job token {:#x}, this job's is {:#x})",
                join.token, cfg.job_token
            ),
            false,
        ));
    }
    if join.size as usize != cfg.size {
        return Err((
            format!(
                "it was started for {} ranks, rank 0 for {}",
                join.size, cfg.size
            ),
            true,
        ));
    }
    let rank = join.rank as usize;
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
            true,
        ));
    }
    Ok(rank - 1)
}

/// A member: joins the coordinator, retrying while it is not up yet.
fn attend(cfg: &Config, addr: SocketAddr, deadline: Instant) -> Result<SideChannel> {
    let rank = cfg.rank;
    let join = Join {
        version: PROTOCOL_VERSION,
        rank: to_u32(cfg.rank),
        size: to_u32(cfg.size),
        token: cfg.job_token,
    }
    .encode();
    let mut backoff = Duration::from_millis(10);
    let mut last_error;
    loop {
        let attempt = connect_with_retry(addr, deadline).and_then(|mut stream| {
            write_frame(&mut stream, &join, deadline)?;
            let reply = read_frame(&mut stream, deadline)?;
            Ok((stream, reply))
        });
        match attempt {
            Ok((stream, reply)) => match decode_reply(&reply) {
                Ok(Ok(())) => {
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
                Ok(Err(why)) => {
                    return Err(Error::Bootstrap(format!(
                        "rank {rank}: the coordinator at {addr} refused this rank: {why}"
                    )));
                }
                Err(why) => {
                    return Err(Error::Bootstrap(format!(
                        "rank {rank}: cannot use {addr} as the coordinator: {why}"
                    )));
                }
            },
            Err(e) => last_error = e,
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(Error::Bootstrap(format!(
                "rank {rank}: cannot join the coordinator at {addr} within {:?}: {last_error} \
                 (is rank 0 running, and is the address right?)",
                cfg.timeout
            )));
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    Ok(socket.into())
}

fn write_frame(stream: &mut TcpStream, payload: &[u8], deadline: Instant) -> io::Result<()> {
    stream.set_write_timeout(Some(time_left(deadline)?))?;
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&to_u32(payload.len()).to_le_bytes());
    frame.extend_from_slice(payload);
    stream.write_all(&frame)
}

fn read_frame(stream: &mut TcpStream, deadline: Instant) -> io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(time_left(deadline)?))?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a side-channel message of {len} bytes is not jaccl's"),
        ));
    }
    let mut payload = vec![0u8; len];
    stream.set_read_timeout(Some(time_left(deadline)?))?;
    stream.read_exact(&mut payload)?;
    Ok(payload)
}

/// Time left before `deadline`, as an error once it passed (a zero socket timeout would mean
/// "wait forever").
fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = remaining(deadline);
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn messages_round_trip() {
        let join = Join {
            version: PROTOCOL_VERSION,
            rank: 3,
            size: 8,
            token: 0xdead_beef,
        };
        assert_eq!(Join::decode(&join.encode()), Ok(join));
        assert_eq!(decode_reply(&encode_reply(&Ok(()))), Ok(Ok(())));
        assert_eq!(
            decode_reply(&encode_reply(&Err("no".into()))),
            Ok(Err("no".into()))
        );
        let items = vec![b"a".to_vec(), vec![], vec![1, 2, 3]];
        assert_eq!(decode_list(&encode_list(&items), 3), Ok(items));
    }

    #[test]
    fn foreign_bytes_are_rejected() {
        assert!(Join::decode(b"GET / HTTP/1.1\r\n").is_err());
        assert!(decode_reply(b"SSH-2.0-OpenSSH").is_err());
        assert!(decode_list(&[5, 0, 0, 0, 1], 5).is_err());
        assert!(decode_list(&encode_list(&[vec![1]]), 2).is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), n in 0usize..5) {
            let _ = Join::decode(&bytes);
            let _ = decode_reply(&bytes);
            let _ = decode_list(&bytes, n);
        }
    }
}
