//! `jaccl_config_t`: an explicit start-up (`jaccl_comm_init`), versioned by its size so that
//! later fields can be added without breaking callers compiled against an older header.
#![allow(unsafe_code)] // Exported functions (`no_mangle`), and the pointers C passes them.

use std::ffi::{CStr, c_char, c_int};
use std::mem::size_of;
use std::time::Duration;

use crate::comm::jaccl_comm_t;
use crate::errors::{Failure, guard, invalid};
use crate::types::SHORTEST_TIMEOUT;
use crate::types::*;

/// `jaccl_config_t.magic` of a configuration `jaccl_config_init` filled.
pub const JACCL_CONFIG_MAGIC: u32 = 0x6a63_6366; // "jccf"

/// An explicit configuration for `jaccl_comm_init`. Fill it with `jaccl_config_init` first
/// (it sets `struct_size`, `magic` and every default), then set what you need. The
/// strings are read during `jaccl_comm_init` only.
#[repr(C)]
pub struct jaccl_config_t {
    /// `sizeof(jaccl_config_t)` of the caller's header (set by `jaccl_config_init`). Later
    /// versions add fields at the end only, and take this size's fields from a program built
    /// against this header (the rest at their defaults).
    pub struct_size: usize,
    /// `JACCL_CONFIG_MAGIC` (set by `jaccl_config_init`).
    pub magic: u32,
    /// This rank, `0 .. size-1`.
    pub rank: c_int,
    /// The number of ranks.
    pub size: c_int,
    /// `"host:port"` where rank 0 listens for the others at start-up (`"[v6]:port"` for IPv6);
    /// NULL only for a size of 1.
    pub coordinator: *const c_char,
    /// The job's secret (at least 16 bytes; every rank passes the same), which every
    /// connection proves knowledge of and which never crosses the network. NULL: derived from
    /// the coordinator's address, which keeps jobs apart but is no secret.
    pub job_token: *const c_char,
    /// `"auto"` (NULL: the default: shared memory between ranks of a host, else RDMA if
    /// present, else TCP), `"tcp"`, `"shm"` or `"rdma"`.
    pub transport: *const c_char,
    /// Parallel connections to each ring neighbour, 1 to 4; 0: the default.
    pub wires: c_int,
    /// Seconds an operation may wait without progress before `JACCL_TIMEOUT`; 0: the default
    /// (30 minutes: a dead or stopped peer is found by liveness long before); `INFINITY`: none.
    pub timeout: f64,
    /// Seconds start-up may take; 0: the default (120).
    pub startup_timeout: f64,
    /// Seconds a rank may be silent (stopped, hung, its host gone) before the others fail with
    /// `JACCL_PEER_LOST`; 0: the default (10); `INFINITY`: off.
    pub liveness: f64,
    /// A running group's invitation (`jaccl_comm_invitation`): join it at its members' next
    /// `jaccl_comm_grow` instead of starting a group (`rank`, `size` and `coordinator` are then
    /// not used; `job_token` must be the group's). NULL: start a group.
    pub join: *const c_char,
}

/// The defaults, with this header's size and the magic.
fn defaults() -> jaccl_config_t {
    jaccl_config_t {
        struct_size: size_of::<jaccl_config_t>(),
        magic: JACCL_CONFIG_MAGIC,
        rank: -1,
        size: 0,
        coordinator: std::ptr::null(),
        job_token: std::ptr::null(),
        transport: std::ptr::null(),
        wires: 0,
        timeout: 0.0,
        startup_timeout: 0.0,
        liveness: 0.0,
        join: std::ptr::null(),
    }
}

/// Fills `config` with the defaults and its `struct_size` and `magic`; `rank` -1 and `size` 0,
/// which `jaccl_comm_init` refuses until they are set.
///
/// # Safety
/// `config` is valid for a write of a `jaccl_config_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_config_init(config: *mut jaccl_config_t) -> jaccl_result_t {
    // SAFETY: by the caller's contract.
    guard("config_init", None, || unsafe {
        crate::comm::write_out(config, None, "config_init", "config", defaults())
    })
}

/// Joins the group `config` describes (collective: every rank of the job calls it, each with
/// its rank). On success `*comm` is the new communicator, else NULL.
///
/// # Safety
/// `config` is null or a `jaccl_config_t` filled by `jaccl_config_init` whose strings are
/// NUL-ended; `comm` is valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jaccl_comm_init(
    config: *const jaccl_config_t,
    comm: *mut *mut jaccl_comm_t,
) -> jaccl_result_t {
    // SAFETY: by the caller's contract.
    guard("init", None, || unsafe {
        crate::comm::write_out(comm, None, "init", "comm", std::ptr::null_mut())?;
        let config = read(config)?;
        let group = jaccl::init_with(config)?;
        comm.write(jaccl_comm_t::into_raw(group));
        Ok(())
    })
}

/// The caller's configuration as jaccl's.
///
/// # Safety
/// As `jaccl_comm_init`'s `config`.
unsafe fn read(config: *const jaccl_config_t) -> Result<jaccl::Config, Failure> {
    if config.is_null() || !config.addr().is_multiple_of(align_of::<jaccl_config_t>()) {
        return Err(invalid(None, "init", "config is NULL or misaligned"));
    }
    // The size and magic first: a caller's struct may be larger than ours (a newer header).
    // SAFETY: every version of the struct starts with these two fields.
    let (given, magic) = unsafe { ((*config).struct_size, (*config).magic) };
    if magic != JACCL_CONFIG_MAGIC || given < size_of::<jaccl_config_t>() {
        let why =
            "config: not filled by jaccl_config_init first (its magic or struct_size is wrong)";
        return Err(invalid(None, "init", why));
    }
    // A field's value that cannot work is a configuration error.
    let refuse = |why: String| Failure::from(jaccl::Error::Config(format!("jaccl_config_t.{why}")));
    // The fields this library knows (a newer header's later ones are not read).
    // SAFETY: the caller's struct has at least as many readable bytes as ours; all of it is
    // plain data (pointers, integers, floats).
    let c = unsafe { config.read() };
    // SAFETY: by the caller's contract, the strings are NUL-ended (or NULL).
    let text = |field: &str, ptr: *const c_char| unsafe { string(field, ptr) };
    let join: Option<jaccl::Invitation> = match text("join", c.join)? {
        Some(invitation) => Some(invitation.parse()?),
        None => None,
    };
    // A process that joins gets its rank and size from the group.
    let (rank, size) = match (&join, usize::try_from(c.rank), usize::try_from(c.size)) {
        (Some(_), _, _) => (0, 1),
        (None, Ok(rank), Ok(size)) => (rank, size),
        (None, _, _) => {
            let why = format!(
                "rank {} and size {}: neither may be negative",
                c.rank, c.size
            );
            return Err(refuse(why));
        }
    };
    let mut cfg = jaccl::Config::new(rank, size);
    cfg.join = join;
    if let Some(coordinator) = text("coordinator", c.coordinator)? {
        cfg = cfg.coordinator(coordinator);
    }
    if let Some(token) = text("job_token", c.job_token)? {
        cfg = cfg.job_token(jaccl::JobToken::new(token)?);
    }
    if let Some(transport) = text("transport", c.transport)? {
        cfg = cfg.transport(
            transport
                .parse()
                .map_err(|e| refuse(format!("transport: {e}")))?,
        );
    }
    match usize::try_from(c.wires) {
        Ok(0) => {}
        Ok(wires) => cfg = cfg.wires(wires),
        Err(_) => return Err(refuse(format!("wires {} is negative", c.wires))),
    }
    cfg = cfg.timeout(seconds(
        "timeout",
        c.timeout,
        jaccl::Config::DEFAULT_TIMEOUT,
    )?);
    cfg = cfg.startup_timeout(seconds(
        "startup_timeout",
        c.startup_timeout,
        jaccl::Config::DEFAULT_STARTUP_TIMEOUT,
    )?);
    cfg = cfg.liveness(seconds(
        "liveness",
        c.liveness,
        jaccl::Config::DEFAULT_LIVENESS,
    )?);
    cfg.validate()?;
    Ok(cfg)
}

/// A field's string, if set.
///
/// # Safety
/// `ptr` is null or NUL-ended.
unsafe fn string(field: &str, ptr: *const c_char) -> Result<Option<String>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: by the caller's contract.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| jaccl::Error::Config(format!("jaccl_config_t.{field} is not UTF-8")).into())
}

/// A field's seconds: 0 is `default`, infinity is none.
fn seconds(field: &str, value: f64, default: Duration) -> Result<Duration, Failure> {
    if value == 0.0 {
        return Ok(default);
    }
    timeout(value).ok_or_else(|| {
        let why = format!(
            "jaccl_config_t.{field}: {value} s is not a time (0, or at least {SHORTEST_TIMEOUT} s)"
        );
        jaccl::Error::Config(why).into()
    })
}
