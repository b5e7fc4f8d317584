//! Taking new processes into a running group, as NCCL's `ncclCommGrow` does: the members call
//! [`Group::grow`]; a new process joins with the group's [`Invitation`] ([`join`], which
//! `init` runs when `Config::join` is set). The group's rank 0 takes the newcomers in through
//! its job's listener (authenticated with the job's token, as every connection is), gives each
//! a job's rank of its own, and tells the members where they listen; then all of them form
//! the grown group as a sub-group forms (`Group::form_of_job_ranks`).
//!
//! The newcomer's side, in order: it connects to the address of the invitation (claim
//! [`Purpose::Join`], the group's id, a random tag for its rank, size 0) and sends its
//! listener's address; rank 0 answers, once the grow has all its newcomers, with the job's
//! size, the newcomer's rank in the grown group, and each rank's job's rank and address.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::split::{Ask, Watch, group_id};
use super::{Family, Group};
use crate::auth::{self, Claim, Identity, Purpose};
use crate::bootstrap::{decode_list, encode_list};
use crate::config::{Config, Invitation};
use crate::connect;
use crate::error::{Error, Op, Result};
use crate::op_header::{Reader, to_u32};
use crate::os::deadline_after;
use crate::transport::frame::{read_frame, write_frame};
use crate::transport::listener::{DialError, JobListener, dial};

/// Room for one listener's address as text (an IPv6 address with a scope and a port fits).
const ADDRESS_ROOM: usize = 64;
/// Room for why rank 0 took no newcomers in.
const MOST_REASON: usize = 512;
/// The job's ranks of newcomers: drawn at random from this range for each grow, so that
/// groups that grow apart (sub-groups, the two sides of a split) give their newcomers
/// different ones without a word between them; two processes given one would be found out by
/// a rank that learns both (`JobListener::learn` refuses the second address).
const JOINED_FROM: usize = 1 << 20;
const JOINED_BELOW: usize = 1 << 31;
/// How long rank 0 waits for a newcomer's address once it has connected.
const HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// How much longer than the start-up timeout the members wait for rank 0's news: rank 0 gives
/// up on the newcomers at the start-up timeout (its waits end by then), then tells them.
const NEWS_GRACE: Duration = Duration::from_secs(5);

impl Group {
    /// The invitation to this group's next [`Group::grow`]: the same on every member, until
    /// the group grows or splits. Hand it to the processes that are to join (as `JACCL_JOIN`
    /// or `Config::join`); it holds no secret.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] in a job of one process started without a coordinator (it
    /// has no listener to take new processes in).
    pub fn invitation(&self) -> Result<Invitation> {
        let job = self.job_listener()?;
        let first = self.family.job_rank.first().copied().unwrap_or_default();
        let address = job.address(first).ok_or_else(|| {
            self.invalid(
                Op::Grow,
                format!("the job's rank {first} published no address"),
            )
        })?;
        let next: [&[u8]; 1] = [&self
            .family
            .splits
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes()];
        Ok(Invitation::new(
            address,
            group_id("grow", self.family.id, &next),
        ))
    }

    /// Takes `count` new processes into the group, as NCCL's `ncclCommGrow` does: every member
    /// calls it with the same `count`, and `count` processes join with this group's
    /// [`Group::invitation`] (as `JACCL_JOIN`, their `init` returning the grown group). The
    /// grown group keeps the members' ranks, `0..size`, and numbers the new processes from
    /// `size` on, in the order they reached rank 0; its connections, transports and
    /// algorithms are chosen afresh (a newcomer on a member's host shares memory with it).
    /// Rank 0 waits for the newcomers up to the start-up timeout (they may start before or
    /// after the members call this). This group is left as it was: drop it.
    ///
    /// ```no_run
    /// # fn main() -> jaccl::Result<()> {
    /// let mut group = jaccl::init()?;
    /// let invitation = group.invitation()?;
    /// if group.rank() == 0 {
    ///     std::process::Command::new(std::env::current_exe().unwrap())
    ///         .env("JACCL_JOIN", invitation.to_string())
    ///         .spawn()
    ///         .unwrap();
    /// }
    /// let mut grown = group.grow(1)?; // the new process's `init` returns it too
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count of 0 or beyond the largest group, or where
    /// [`Group::invitation`] fails; [`Error::Mismatch`] when members pass different counts;
    /// [`Error::Bootstrap`] when fewer than `count` processes joined within the start-up
    /// timeout (the group stays usable, and its next invitation is another); the errors of a
    /// collective on this group.
    pub fn grow(&mut self, count: usize) -> Result<Group> {
        if count == 0 || self.size.saturating_add(count) > Config::MAX_SIZE {
            let why = format!(
                "cannot grow a group of {} by {count} (a group has 1 to {} ranks)",
                self.size,
                Config::MAX_SIZE
            );
            return Err(self.invalid(Op::Grow, why));
        }
        let job = Arc::clone(self.job_listener()?);
        let id = self.invitation()?.group();
        let mine = Ask::Grow {
            count: to_u32(count),
        };
        if self.size > 1 {
            self.gather_asks(Op::Grow, &mine, None)?;
        }
        self.next_split();

        // Rank 0 takes the newcomers in, and tells the members the first of their job's ranks
        // and where they listen, or why they did not come: a status byte, the first job's
        // rank (u32), then an address in each slot of `ADDRESS_ROOM` bytes (or the reason).
        let mut news = vec![0u8; 5 + (count * ADDRESS_ROOM).max(MOST_REASON)];
        let mut took_in = Ok((Vec::new(), 0));
        if self.rank == 0 {
            took_in = self
                .take_in(&job, id, count)
                .and_then(|came| Ok((came, first_job_rank(count)?)));
            match &took_in {
                Ok((came, first)) => {
                    news[0] = 1;
                    news[1..5].copy_from_slice(&first.to_le_bytes());
                    let slots = news[5..].chunks_exact_mut(ADDRESS_ROOM);
                    for ((_, addr), slot) in came.iter().zip(slots) {
                        put_address(slot, *addr);
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    let why = &why.as_bytes()[..why.len().min(news.len() - 5)];
                    news[5..5 + why.len()].copy_from_slice(why);
                }
            }
        }
        if self.size > 1 {
            // The members wait for the newcomers as rank 0 does, up to the start-up timeout
            // (which may be longer than the operation timeout), and then for rank 0's news.
            let timeout = self.operation_timeout();
            let waits = self
                .family
                .config
                .startup_timeout
                .saturating_add(NEWS_GRACE);
            self.set_timeout(timeout.max(waits));
            let told = self.broadcast(&mut news, 0);
            self.set_timeout(timeout);
            told?;
        }
        let (newcomers, _) = took_in?;
        if news[0] != 1 {
            let why = String::from_utf8_lossy(&news[5..]);
            return Err(Error::Bootstrap(format!(
                "rank {}: grow: rank 0 took no new processes in: {}",
                self.rank,
                why.trim_end_matches('\0')
            )));
        }
        let bad_news = |detail: String| Error::Protocol {
            rank: self.rank,
            peer: 0,
            op: Op::Grow,
            detail,
        };
        let base = u32::from_le_bytes([news[1], news[2], news[3], news[4]]) as usize;
        if !(JOINED_FROM..=JOINED_BELOW - count).contains(&base) {
            return Err(bad_news(format!(
                "it gave newcomers the job's ranks from {base}"
            )));
        }
        let addresses = news[5..]
            .chunks_exact(ADDRESS_ROOM)
            .take(count)
            .map(address_in)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_news("it sent a newcomer's address that is not one".into()))?;
        let mut job_rank = self.family.job_rank.to_vec();
        for (i, addr) in addresses.iter().enumerate() {
            job.learn(base + i, *addr)
                .map_err(|why| Error::Bootstrap(format!("rank {}: grow: {why}", self.rank)))?;
            job_rank.push(base + i);
        }
        let job_rank: Arc<[usize]> = job_rank.into();
        let reply_by = deadline_after(HELLO_TIMEOUT);
        for (i, (mut stream, _)) in newcomers.into_iter().enumerate() {
            let welcome = welcome(job.identity().size, self.size + i, &job_rank, &job);
            // One that went away fails the forming below, on every member alike.
            let _ = write_frame(&mut stream, &welcome, reply_by);
        }
        let members: Vec<usize> = (0..self.size).collect();
        let rank = self.rank;
        let formed =
            self.form_of_job_ranks(&members, job_rank, rank, id, (None, None), Watch::Split);
        if formed.is_ok() {
            self.end_split();
        }
        formed
    }

    /// The job's listener, through which new processes join.
    fn job_listener(&self) -> Result<&Arc<JobListener>> {
        self.family.job.as_ref().ok_or_else(|| {
            self.invalid(
                Op::Grow,
                "this process started alone, without a coordinator: it has no listener to \
                 take new processes in (start the job with jaccl launch, or set \
                 JACCL_COORDINATOR)"
                    .into(),
            )
        })
    }

    /// Rank 0's part: the first `count` newcomers to grow `id`, in the order they came, and
    /// the listener each gave, waiting up to the start-up timeout; a member lost meanwhile
    /// or an interrupt ends the wait.
    fn take_in(
        &self,
        job: &JobListener,
        id: u64,
        count: usize,
    ) -> Result<Vec<(TcpStream, SocketAddr)>> {
        let timeout = self.family.config.startup_timeout;
        let deadline = deadline_after(timeout);
        let others: Vec<usize> = (1..self.size).collect();
        let mut came = Vec::with_capacity(count);
        while came.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Bootstrap(format!(
                    "rank {}: grow: {} of {count} new processes joined within the start-up \
                     timeout ({timeout:?}); give each this group's invitation as JACCL_JOIN",
                    self.rank,
                    came.len()
                )));
            }
            let arrival = job
                .take_oldest(Purpose::Join, id)
                .map_err(|why| Error::Bootstrap(format!("rank {}: grow: {why}", self.rank)))?;
            if let Some(mut stream) = arrival {
                let hello_by = deadline.min(deadline_after(HELLO_TIMEOUT));
                let hello = read_frame(&mut stream, hello_by, ADDRESS_ROOM);
                match hello
                    .ok()
                    .and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok())
                {
                    Some(addr) if !gone(&stream) => came.push((stream, addr)),
                    _ => tracing::warn!("grow: a newcomer is gone or sent no address; dropped it"),
                }
                // One that came and went meanwhile (its connection waited here before this
                // grow, say) makes room for the next.
                if came.len() == count {
                    came.retain(|(stream, _)| !gone(stream));
                }
                continue;
            }
            if let Some(liveness) = &self.liveness {
                liveness.check_peers(Op::Grow, &others)?;
                liveness.check_interrupt(Op::Grow, !self.on_progress_thread)?;
            }
            let mut fds = [PollFd::from_borrowed_fd(job.arrivals(), PollFlags::IN)];
            crate::os::poll(&mut fds, left.min(Duration::from_millis(100)))
                .map_err(|e| Error::io(0, "waiting for new processes", e))?;
        }
        Ok(came)
    }
}

/// The first of `count` job's ranks for newcomers, at random in [`JOINED_FROM`],
/// [`JOINED_BELOW`].
fn first_job_rank(count: usize) -> Result<u32> {
    let random = u32::from_le_bytes(
        auth::random_bytes::<4>().map_err(|e| Error::io(0, "numbering new processes", e))?,
    ) as usize;
    let span = JOINED_BELOW - count - JOINED_FROM;
    Ok(to_u32(JOINED_FROM + random % span))
}

/// Whether the newcomer at the other end of `stream` is gone (its end closed, or it sent
/// what it should not have), looked at without waiting.
fn gone(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let gone =
        !matches!(stream.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    gone || stream.set_nonblocking(false).is_err()
}

/// Writes `addr` into `slot` as text after its length.
fn put_address(slot: &mut [u8], addr: SocketAddr) {
    let text = addr.to_string();
    let len = text.len().min(slot.len() - 1);
    slot[0] = u8::try_from(len).unwrap_or(0);
    slot[1..=len].copy_from_slice(&text.as_bytes()[..len]);
}

/// The address [`put_address`] wrote into `slot`, if it is one.
fn address_in(slot: &[u8]) -> Option<SocketAddr> {
    let len = usize::from(*slot.first()?);
    std::str::from_utf8(slot.get(1..=len)?).ok()?.parse().ok()
}

/// What rank 0 tells the newcomer that is rank `rank` of the grown group: the job's size at
/// start-up (which every claim carries), its rank, and each rank's job's rank and address.
fn welcome(job_size: usize, rank: usize, job_rank: &[usize], job: &JobListener) -> Vec<u8> {
    let entries: Vec<Vec<u8>> = job_rank
        .iter()
        .map(|&r| {
            let mut entry = to_u32(r).to_le_bytes().to_vec();
            entry.extend_from_slice(
                job.address(r)
                    .map(|a| a.to_string())
                    .unwrap_or_default()
                    .as_bytes(),
            );
            entry
        })
        .collect();
    let mut b = Vec::new();
    b.extend_from_slice(&to_u32(job_size).to_le_bytes());
    b.extend_from_slice(&to_u32(rank).to_le_bytes());
    b.extend_from_slice(&to_u32(entries.len()).to_le_bytes());
    b.extend_from_slice(&encode_list(&entries));
    b
}

/// What a newcomer reads of [`welcome`]: the job's size, its rank, and each rank's job's rank
/// and address, checked (a rank in range, job's ranks distinct, every address one).
struct Welcome {
    job_size: usize,
    rank: usize,
    ranks: Vec<(usize, SocketAddr)>,
}

impl Welcome {
    fn read(b: &[u8]) -> std::result::Result<Welcome, String> {
        let mut r = Reader(b);
        let job_size = r.u32()? as usize;
        let rank = r.u32()? as usize;
        let size = r.u32()? as usize;
        if !(2..=Config::MAX_SIZE).contains(&size) || rank >= size {
            return Err(format!("rank {rank} of a group of {size}"));
        }
        let entries = decode_list(r.rest(), size)?;
        let mut ranks = Vec::with_capacity(size);
        for entry in entries {
            let (job_rank, addr) = entry.split_at_checked(4).ok_or("a short entry")?;
            let job_rank = u32::from_le_bytes(job_rank.try_into().unwrap_or_default()) as usize;
            let addr = std::str::from_utf8(addr)
                .ok()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| format!("the job's rank {job_rank} has no address"))?;
            if ranks.iter().any(|&(r, _)| r == job_rank) {
                return Err(format!("the job's rank {job_rank} is listed twice"));
            }
            ranks.push((job_rank, addr));
        }
        Ok(Welcome {
            job_size,
            rank,
            ranks,
        })
    }
}

/// Joins the running group that `config.join` invites to (see the module's docs), once its
/// members call [`Group::grow`], within the start-up timeout.
pub(super) fn join(config: &Config, invitation: Invitation) -> Result<Group> {
    // The job's device matrix has no rows for newcomers (they use the first active port);
    // the rest must hold.
    Config {
        devices: None,
        ..config.clone()
    }
    .validate()?;
    let deadline = deadline_after(config.startup_timeout);
    let fail = |why: String| Error::Bootstrap(format!("joining {invitation}: {why}"));
    let token = config.token();
    let tag = u32::from_le_bytes(
        auth::random_bytes::<4>().map_err(|e| Error::io(0, "joining a group", e))?,
    );
    let stranger = Identity {
        rank: tag as usize,
        size: 0,
        token: token.clone(),
    };
    let claim = Claim {
        purpose: Purpose::Join,
        rank: stranger.rank,
        size: 0,
        wire: 0,
        group: invitation.group(),
    };
    let mut stream = dial(
        &stranger,
        0,
        invitation.address(),
        claim,
        deadline,
        &mut || Ok(()),
    )
    .map_err(|e| match e {
        DialError::Failed(why) => fail(why),
        DialError::Stopped(e) => e,
    })?;
    // Listen where the group reaches this process: the address this connection came from.
    let local = stream
        .local_addr()
        .map_err(|e| Error::io(0, "joining a group", e))?;
    let listener = crate::transport::tcp::congestion::listen(SocketAddr::new(local.ip(), 0))
        .map_err(|e| Error::io(0, "listening for the group's connections", e))?;
    let own = listener
        .local_addr()
        .map_err(|e| Error::io(0, "listening for the group's connections", e))?;
    write_frame(&mut stream, own.to_string().as_bytes(), deadline)
        .map_err(|e| fail(format!("telling the group where this process listens: {e}")))?;
    let most = 16 + Config::MAX_SIZE * (4 + 4 + ADDRESS_ROOM);
    let welcome = read_frame(&mut stream, deadline, most).map_err(|e| {
        fail(format!(
            "no welcome from the group within the start-up timeout ({:?}): its members must \
             call grow, with this process counted, while this waits ({e})",
            config.startup_timeout
        ))
    })?;
    let welcome = Welcome::read(&welcome).map_err(|why| fail(format!("a bad welcome: {why}")))?;
    let me = match welcome.ranks.get(welcome.rank) {
        Some(&(me, addr)) if addr == own => me,
        _ => return Err(fail("the welcome gives this rank another address".into())),
    };
    let identity = Identity {
        rank: me,
        size: welcome.job_size,
        token: token.clone(),
    };
    let job = JobListener::start(
        listener,
        identity,
        Box::new(|_| None),
        config.startup_timeout,
    )
    .map_err(|e| Error::io(welcome.rank, "starting the job's listener", e))?;
    for &(job_rank, addr) in &welcome.ranks {
        job.learn(job_rank, addr).map_err(fail)?;
    }
    let config = Config {
        rank: welcome.rank,
        size: welcome.ranks.len(),
        join: None,
        job_token: Some(token),
        ..config.clone()
    };
    let id = invitation.group();
    let registration = job.register(id).map_err(fail)?;
    let job_rank: Arc<[usize]> = welcome.ranks.iter().map(|&(r, _)| r).collect();
    let family = Family {
        config: Arc::new(config.clone()),
        job: Some(Arc::clone(&job)),
        job_rank: Arc::clone(&job_rank),
        id,
        splits: Arc::default(),
        agreements: Arc::default(),
        made_by_members: Arc::default(),
        _registration: Some(Arc::new(registration)),
    };
    let connected = connect::connect_subgroup(&config, job, job_rank, id, Arc::new(|| Ok(())))?;
    Ok(Group::connected(&config, connected, family))
}
