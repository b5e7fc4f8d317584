//! `jaccl_comm_t`: a `jaccl::Group` behind a lock, with its abort handle (used without the
//! lock, from any thread) and its last error; start-up from the environment, information,
//! sub-groups, the elastic calls, and destruction.
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crate::errors::{Failure, LastError, guard, invalid, record};
use crate::types::SHORTEST_TIMEOUT;
use crate::types::*;

/// Set in a live communicator, cleared when it is destroyed: a pointer that is not one (a
/// destroyed one, while its memory is not reused, or a pointer to something else) is an
/// argument error instead of a crash.
const LIVE: u64 = 0x6a61_6363_6c5f_636d; // "jaccl_cm"

/// A communicator: one rank's membership of a group of ranks. Opaque to C.
pub struct jaccl_comm_t {
    live: u64,
    /// The group; gone once aborted, as soon as no call holds it: dropping it closes the
    /// connections, so the peers hear of the abort at once.
    group: Mutex<Option<jaccl::Group>>,
    aborted: AtomicBool,
    abort: jaccl::AbortHandle,
    rank: usize,
    size: usize,
    last_error: Arc<LastError>,
}

impl jaccl_comm_t {
    /// The communicator `ptr` points to, if it is one.
    ///
    /// # Safety
    /// `ptr` is null or points to readable memory of a `jaccl_comm_t`'s size that stays
    /// valid for `'a` (a communicator not destroyed during the call).
    pub(crate) unsafe fn from_ptr<'a>(ptr: *const jaccl_comm_t) -> Option<&'a jaccl_comm_t> {
        // SAFETY: by the caller's contract, non-null `ptr` is readable for `'a`.
        let comm = unsafe { ptr.as_ref() }?;
        (comm.live == LIVE).then_some(comm)
    }

    /// A new communicator for C, owning `group`.
    pub(crate) fn into_raw(group: jaccl::Group) -> *mut jaccl_comm_t {
        let comm = jaccl_comm_t {
            live: LIVE,
            abort: group.abort_handle(),
            rank: group.rank(),
            size: group.size(),
            group: Mutex::new(Some(group)),
            aborted: AtomicBool::new(false),
            last_error: Arc::default(),
        };
        Box::into_raw(Box::new(comm))
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn last_error(&self) -> &Arc<LastError> {
        &self.last_error
    }

    /// Runs `f` on the group, after the call another thread is in.
    pub(crate) fn with_group<R>(
        &self,
        op: &str,
        f: impl FnOnce(&mut jaccl::Group) -> jaccl::Result<R>,
    ) -> Result<R, Failure> {
        let Ok(slot) = self.group.lock() else {
            return Err(self.broken(op));
        };
        self.run(slot, f)
    }

    /// [`jaccl_comm_t::with_group`] if no other thread is in a call; `f` back if one is.
    pub(crate) fn try_with_group<R, F>(&self, op: &str, f: F) -> Result<Result<R, Failure>, F>
    where
        F: FnOnce(&mut jaccl::Group) -> jaccl::Result<R>,
    {
        match self.group.try_lock() {
            Ok(slot) => Ok(self.run(slot, f)),
            Err(TryLockError::WouldBlock) => Err(f),
            Err(TryLockError::Poisoned(_)) => Ok(Err(self.broken(op))),
        }
    }

    /// Runs `f` on the group `slot` holds, then lets the lock go; a group aborted meanwhile
    /// goes then.
    fn run<R>(
        &self,
        mut slot: MutexGuard<'_, Option<jaccl::Group>>,
        f: impl FnOnce(&mut jaccl::Group) -> jaccl::Result<R>,
    ) -> Result<R, Failure> {
        let Some(group) = slot.as_mut() else {
            return Err(jaccl::Error::Aborted { rank: self.rank }.into());
        };
        let result = f(group);
        drop(slot);
        // An abort that came while this call held the lock could not drop the group: it goes
        // now (the flag is set before the abort tries the lock, and read after this unlocks).
        if self.aborted.load(Ordering::SeqCst) {
            self.drop_if_free();
        }
        Ok(result?)
    }

    /// The error of a call after a panic poisoned the lock.
    fn broken(&self, op: &str) -> Failure {
        let why = "an earlier call panicked (a bug in jaccl); the communicator is unusable";
        Failure::Panic(format!("rank {}: {op}: {why}", self.rank).into())
    }

    /// Drops the group unless a call holds it (which then drops it as it returns).
    fn drop_if_free(&self) {
        match self.group.try_lock() {
            Ok(mut slot) => *slot = None,
            Err(TryLockError::Poisoned(poisoned)) => *poisoned.into_inner() = None,
            Err(TryLockError::WouldBlock) => {}
        }
    }

    /// Aborts the group: the call in flight stops; the group is dropped now if no call holds
    /// it, else when that call returns.
    fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.abort.abort();
        self.drop_if_free();
    }
}

/// Runs an entry point's `body` on the communicator `comm` points to; its failure (or a
/// panic) is recorded as the thread's and the communicator's last error.
///
/// # Safety
/// `comm` is null or a communicator that is not destroyed during the call.
pub(crate) unsafe fn on_comm(
    comm: *const jaccl_comm_t,
    op: &str,
    body: impl FnOnce(&jaccl_comm_t) -> Result<(), Failure>,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    match unsafe { jaccl_comm_t::from_ptr(comm) } {
        Some(comm) => guard(op, Some(comm.last_error()), || body(comm)),
        None => record(&not_a_comm(op, comm), op, None),
    }
}

fn not_a_comm(op: &str, comm: *const jaccl_comm_t) -> Failure {
    match comm.is_null() {
        true => invalid(None, op, "comm is NULL"),
        false => invalid(None, op, "comm is not a communicator (destroyed already?)"),
    }
}

/// Where a function writes what it returns: `out`, checked not to be null.
///
/// # Safety
/// `out` is null, misaligned, or valid for a write of a `T`.
pub(crate) unsafe fn write_out<T>(
    out: *mut T,
    rank: Option<usize>,
    op: &str,
    what: &str,
    value: T,
) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid(rank, op, format!("{what} is NULL")));
    }
    if !out.addr().is_multiple_of(align_of::<T>()) {
        let why = format!(
            "{what} ({out:p}) is not aligned to {} bytes",
            align_of::<T>()
        );
        return Err(invalid(rank, op, why));
    }
    // SAFETY: non-null, and by the caller's contract valid for a write.
    unsafe { out.write(value) };
    Ok(())
}

/// A rank or count as C's `int` (a group has at most `jaccl::Config::MAX_SIZE` ranks).
pub(crate) fn as_int(value: usize) -> c_int {
    c_int::try_from(value).unwrap_or(c_int::MAX)
}

/// Writes a new communicator (or NULL) to `out`, which is first cleared.
///
/// # Safety
/// `out` is null or valid for a write of a pointer.
unsafe fn make(
    out: *mut *mut jaccl_comm_t,
    rank: Option<usize>,
    op: &str,
    made: impl FnOnce() -> Result<Option<jaccl::Group>, Failure>,
) -> Result<(), Failure> {
    // SAFETY: as this function's contract.
    unsafe {
        write_out(
            out,
            rank,
            op,
            "the output communicator",
            std::ptr::null_mut(),
        )?;
    }
    let comm = made()?.map_or(std::ptr::null_mut(), jaccl_comm_t::into_raw);
    // SAFETY: as above (checked non-null by the first write).
    unsafe { out.write(comm) };
    Ok(())
}

/// Joins the group the environment describes, as `jaccl::init` does: `JACCL_RANK`,
/// `JACCL_SIZE`, `JACCL_COORDINATOR` (set by `jaccl launch`), torchrun's, Open MPI's, PMI's or
/// Slurm's variables, and `JACCL_*` settings; a group of one when nothing is set. Collective:
/// every rank of the job calls it. On success `*comm` is the new communicator, else NULL.
///
/// # Safety
/// `comm` is valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_init_env(comm: *mut *mut jaccl_comm_t) -> jaccl_result_t {
    // SAFETY: by the caller's contract.
    guard("init", None, || unsafe {
        make(comm, None, "init", || Ok(Some(jaccl::init()?)))
    })
}

/// Leaves the group and frees `comm`: says goodbye to the peers (their later calls fail with
/// `JACCL_PEER_LOST`), ends the operations of `_start` forms still running (they end with
/// `JACCL_CLOSED`: their buffers are no longer used once this returns) and closes the
/// connections. NULL does nothing. No other thread may be using `comm`.
///
/// # Safety
/// `comm` is NULL or a communicator that no other thread uses, and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_destroy(comm: *mut jaccl_comm_t) -> jaccl_result_t {
    if comm.is_null() {
        return JACCL_SUCCESS;
    }
    // SAFETY: by the caller's contract, a communicator not destroyed yet, or not one.
    if unsafe { jaccl_comm_t::from_ptr(comm) }.is_none() {
        return record(&not_a_comm("destroy", comm), "destroy", None);
    }
    guard("destroy", None, || {
        // SAFETY: `comm` came from `jaccl_comm_t::into_raw` (it is live) and, by the
        // caller's contract, nothing else uses it now or later.
        let mut owned = unsafe { Box::from_raw(comm) };
        owned.live = 0;
        drop(owned);
        Ok(())
    })
}

/// Aborts `comm` from any thread: the call in flight on another thread (blocking or a
/// `_start` form's) stops at its next wait and fails with `JACCL_ABORTED`, as does every later
/// call; the connections close at once, or as that call returns (the peers' calls fail with
/// `JACCL_PEER_LOST`). It does not wait for a blocking call of another thread (it may wait
/// for a `_start` form's operation to stop). `comm` still needs `jaccl_comm_destroy`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_abort(comm: *mut jaccl_comm_t) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "abort", |c| {
            c.abort();
            Ok(())
        })
    }
}

/// Revokes `comm` for every member, from any thread (as MPI's `MPIX_Comm_revoke`): each
/// member's operation in flight stops at its next wait, and every later one fails with
/// `JACCL_REVOKED`. The members can still `jaccl_comm_agree` and `jaccl_comm_shrink`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_revoke(comm: *mut jaccl_comm_t) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "revoke", |c| {
            c.abort.revoke();
            Ok(())
        })
    }
}

/// This rank in `comm`, `0 .. size-1`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `rank` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_rank(
    comm: *const jaccl_comm_t,
    rank: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "comm_rank", |c| {
            write_out(rank, Some(c.rank), "comm_rank", "rank", as_int(c.rank))
        })
    }
}

/// The number of ranks in `comm`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `size` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_size(
    comm: *const jaccl_comm_t,
    size: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "comm_size", |c| {
            write_out(size, Some(c.rank), "comm_size", "size", as_int(c.size))
        })
    }
}

/// Sets how long an operation of `comm` may wait without progress before it fails with
/// `JACCL_TIMEOUT` (seconds, at least 0.001; `INFINITY`: none).
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_set_timeout(
    comm: *mut jaccl_comm_t,
    seconds: f64,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "set_timeout", |c| {
            let Some(timeout) = timeout(seconds) else {
                let why = format!("{seconds} s is not a timeout (at least {SHORTEST_TIMEOUT} s)");
                return Err(invalid(Some(c.rank), "set_timeout", why));
            };
            c.with_group("set_timeout", |g| {
                g.set_timeout(timeout);
                Ok(())
            })
        })
    }
}

/// Splits `comm` as MPI's `MPI_Comm_split`: the ranks that pass the same `color` (at least 0)
/// form a new communicator, ordered by `key` then by rank in `comm`; a rank passing
/// `JACCL_SPLIT_NOCOLOR` joins none and gets NULL. Collective over `comm`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `newcomm` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_split(
    comm: *mut jaccl_comm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut jaccl_comm_t,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "split", |c| {
            crate::pending::outside(c.rank, "split")?;
            let color = match color {
                JACCL_SPLIT_NOCOLOR => None,
                c if c >= 0 => Some(c.unsigned_abs()),
                other => {
                    let why =
                        format!("color {other} is neither at least 0 nor JACCL_SPLIT_NOCOLOR");
                    return Err(invalid(Some(c.rank), "split", why));
                }
            };
            // Keys order ranks: flipping the sign bit keeps that order in u32.
            let key = key.cast_unsigned() ^ 0x8000_0000;
            make(newcomm, Some(c.rank), "split", || {
                c.with_group("split", |g| g.split(color, key))
            })
        })
    }
}

/// The communicator of `nranks` ranks of `comm`, listed in `ranks` (each once; their order
/// is the new ranks'); a rank not listed gets NULL. Collective over `comm`: every rank passes
/// the same list.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `ranks` points to
/// `nranks` ints; `newcomm` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_subgroup(
    comm: *mut jaccl_comm_t,
    ranks: *const c_int,
    nranks: usize,
    newcomm: *mut *mut jaccl_comm_t,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "subgroup", |c| {
            crate::pending::outside(c.rank, "subgroup")?;
            let site = crate::buffers::Site {
                rank: c.rank,
                op: "subgroup",
            };
            let ranks = crate::buffers::ranks(ranks, nranks, c.size, site)?;
            make(newcomm, Some(c.rank), "subgroup", || {
                c.with_group("subgroup", |g| g.subgroup(&ranks))
            })
        })
    }
}

/// Agrees among the ranks alive on the AND of `*flag` (in: this rank's, out: the agreed one)
/// and on which ranks are alive, as MPI's `MPIX_Comm_agree`; works on a failed or revoked
/// communicator.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `flag` is valid for a
/// read and a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_agree(
    comm: *mut jaccl_comm_t,
    flag: *mut c_int,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "agree", |c| {
            crate::pending::outside(c.rank, "agree")?;
            let given = flag.cast_const();
            if given.is_null() || !given.addr().is_multiple_of(align_of::<c_int>()) {
                return Err(invalid(Some(c.rank), "agree", "flag is NULL or misaligned"));
            }
            let agreed = c.with_group("agree", |g| g.agree(given.read() != 0))?;
            flag.write(c_int::from(agreed.flag));
            Ok(())
        })
    }
}

/// After a rank was lost (`JACCL_PEER_LOST`, `JACCL_REVOKED`), the communicator of the ranks
/// alive, in their order in `comm` (as torch's `shrink_group`, MPI's `MPIX_Comm_shrink`).
/// Every surviving rank calls it. `comm` still needs `jaccl_comm_destroy`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `newcomm` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_shrink(
    comm: *mut jaccl_comm_t,
    newcomm: *mut *mut jaccl_comm_t,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "shrink", |c| {
            crate::pending::outside(c.rank, "shrink")?;
            make(newcomm, Some(c.rank), "shrink", || {
                c.with_group("shrink", |g| g.shrink().map(Some))
            })
        })
    }
}

/// Writes the invitation a new process joins `comm`'s next `jaccl_comm_grow` with
/// (`jaccl_config_t.join`, or `JACCL_JOIN` for `jaccl_comm_init_env`) to `buf`, NUL-ended:
/// `len` bytes are enough at 128; a shorter `buf` is an argument error.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `buf` is valid for
/// writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_invitation(
    comm: *mut jaccl_comm_t,
    buf: *mut c_char,
    len: usize,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "invitation", |c| {
            let text = c.with_group("invitation", |g| g.invitation())?.to_string();
            if buf.is_null() || len <= text.len() {
                let why = format!(
                    "buf holds {len} bytes; the invitation needs {}",
                    text.len() + 1
                );
                return Err(invalid(Some(c.rank), "invitation", why));
            }
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
            buf.add(text.len()).write(0);
            Ok(())
        })
    }
}

/// Takes `count` new processes into the group (they join with `comm`'s invitation): every
/// member calls it; members keep their ranks, newcomers follow. `comm` still needs
/// `jaccl_comm_destroy`.
///
/// # Safety
/// `comm` is a communicator that is not destroyed during the call; `newcomm` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_grow(
    comm: *mut jaccl_comm_t,
    count: c_int,
    newcomm: *mut *mut jaccl_comm_t,
) -> jaccl_result_t {
    // SAFETY: as this function's contract.
    unsafe {
        on_comm(comm, "grow", |c| {
            crate::pending::outside(c.rank, "grow")?;
            let Ok(count) = usize::try_from(count) else {
                return Err(invalid(
                    Some(c.rank),
                    "grow",
                    format!("count {count} is negative"),
                ));
            };
            make(newcomm, Some(c.rank), "grow", || {
                c.with_group("grow", |g| g.grow(count).map(Some))
            })
        })
    }
}

/// The library's version, `MAJOR * 10000 + MINOR * 100 + PATCH` (compare with the header's
/// `JACCL_VERSION_*`).
///
/// # Safety
/// `version` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_get_version(version: *mut c_int) -> jaccl_result_t {
    let code = JACCL_VERSION_MAJOR * 10000 + JACCL_VERSION_MINOR * 100 + JACCL_VERSION_PATCH;
    // SAFETY: by the caller's contract.
    guard("get_version", None, || unsafe {
        write_out(version, None, "get_version", "version", code)
    })
}

/// The message of `comm`'s last error (rank, operation and cause), from whichever thread made
/// the call (a request's, when it was waited for), or `""`. Valid until the next call on
/// `comm` that fails, or `jaccl_comm_destroy`. `comm` NULL: as `jaccl_get_last_error`.
///
/// # Safety
/// `comm` is NULL or a communicator that is not destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_get_last_error(comm: *const jaccl_comm_t) -> *const c_char {
    // SAFETY: by the caller's contract, `comm` is null or a live communicator.
    match unsafe { jaccl_comm_t::from_ptr(comm) } {
        Some(comm) => comm.last_error().get(),
        None => crate::errors::jaccl_get_last_error(),
    }
}
