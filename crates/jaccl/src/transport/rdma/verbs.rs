//! Every `unsafe` of the RDMA transport: libibverbs, loaded at run time, behind a small safe
//! interface (devices, ports, GIDs, protection domains, registered memory, completion queues
//! with their channels, reliable-connected queue pairs).
//!
//! Why our own layer: the maintained Rust verbs crates link libibverbs when they are built
//! (bindgen over the installed headers), so a binary built with them does not start where the
//! library is absent. Here the library is opened with `dlopen` (the `libloading` crate) when a
//! group first asks for RDMA, and a missing library is an error the caller can turn into
//! "use another transport". The price is that the structures this code reads and writes are
//! declared by hand, after rdma-core's `infiniband/verbs.h`; the test at the end of this file
//! compiles a C program against that header and checks every size and offset used here.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are inline
//! functions in the header (they call through the context's table of provider functions), so
//! this code calls through that table too.
//!
//! Memory: a [`Region`] registers a [`Mapping`] that it owns, and a [`QueuePair`] owns
//! its completion queue and keeps its protection domain alive, so the library objects are
//! released in a valid order whatever order their owners are dropped in. The device may write registered
//! memory at any time a peer sends; callers read it only where the protocol above says a
//! completed write landed (see `link.rs`).
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::{NonNull, null_mut};
use std::sync::{Arc, Mutex};

use libloading::Library;

use crate::transport::shm::Mapping;

/// The library's name where no path is configured.
pub(crate) const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

// ---- Structures of verbs.h (only what is used; sizes and offsets checked by the test) ----

/// `union ibv_gid`: 16 bytes, 8-byte aligned (it also holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RawGid(pub(crate) [u8; 16]);

#[repr(C)]
struct PortAttr {
    state: c_uint,
    max_mtu: c_uint,
    active_mtu: c_uint,
    gid_tbl_len: c_int,
    port_cap_flags: u32,
    max_msg_sz: u32,
    bad_pkey_cntr: u32,
    qkey_viol_cntr: u32,
    pkey_tbl_len: u16,
    lid: u16,
    sm_lid: u16,
    lmc: u8,
    max_vl_num: u8,
    sm_sl: u8,
    subnet_timeout: u8,
    init_type_reply: u8,
    active_width: u8,
    active_speed: u8,
    phys_state: u8,
    link_layer: u8,
    flags: u8,
    port_cap_flags2: u16,
}

#[repr(C)]
struct GidEntry {
    gid: RawGid,
    gid_index: u32,
    port_num: u32,
    gid_type: u32,
    ndev_ifindex: u32,
}

/// `struct ibv_context_ops`: 32 function pointers, of which four are called here.
#[repr(C)]
struct ContextOps {
    _before_poll_cq: [usize; 11],
    poll_cq: Option<PollCq>,
    req_notify_cq: Option<ReqNotifyCq>,
    _before_post_send: [usize; 12],
    post_send: Option<PostSend>,
    post_recv: Option<PostRecv>,
    _after_post_recv: [usize; 5],
}

type PollCq = unsafe extern "C" fn(*mut Cq, c_int, *mut WorkCompletion) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut Cq, c_int) -> c_int;
type PostSend = unsafe extern "C" fn(*mut Qp, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut Qp, *mut RecvWr, *mut *mut RecvWr) -> c_int;

/// The start of `struct ibv_context`.
#[repr(C)]
struct RawContext {
    device: *mut c_void,
    ops: ContextOps,
}

/// The start of `struct ibv_mr`.
#[repr(C)]
struct RawMr {
    context: *mut RawContext,
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// The start of `struct ibv_cq`.
#[repr(C)]
struct Cq {
    context: *mut RawContext,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
struct CompChannel {
    context: *mut RawContext,
    fd: c_int,
    refcnt: c_int,
}

/// The start of `struct ibv_qp`.
#[repr(C)]
struct Qp {
    context: *mut RawContext,
    qp_context: *mut c_void,
    pd: *mut c_void,
    send_cq: *mut Cq,
    recv_cq: *mut Cq,
    srq: *mut c_void,
    handle: u32,
    qp_num: u32,
}

#[repr(C)]
#[derive(Default)]
struct QpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut Cq,
    recv_cq: *mut Cq,
    srq: *mut c_void,
    cap: QpCap,
    qp_type: c_uint,
    sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Default)]
struct GlobalRoute {
    dgid: RawGid,
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
}

#[repr(C)]
#[derive(Default)]
struct AhAttr {
    grh: GlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
}

#[repr(C)]
#[derive(Default)]
struct QpAttr {
    qp_state: c_uint,
    cur_qp_state: c_uint,
    path_mtu: c_uint,
    path_mig_state: c_uint,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: c_uint,
    cap: QpCap,
    ah_attr: AhAttr,
    alt_ah_attr: AhAttr,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    rate_limit: u32,
}

#[repr(C)]
struct Sge {
    addr: u64,
    length: u32,
    lkey: u32,
}

/// `struct ibv_send_wr`, with the `wr.rdma` member of its first union spelled out.
#[repr(C)]
struct SendWr {
    wr_id: u64,
    next: *mut SendWr,
    sg_list: *mut Sge,
    num_sge: c_int,
    opcode: c_uint,
    send_flags: c_uint,
    imm_data: u32,
    remote_addr: u64,
    rkey: u32,
    _rest_of_wr: [u32; 5],
    _qp_type: u32,
    _bind_mw_or_tso: [u64; 6],
}

#[repr(C)]
struct RecvWr {
    wr_id: u64,
    next: *mut RecvWr,
    sg_list: *mut Sge,
    num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct WorkCompletion {
    wr_id: u64,
    status: c_uint,
    opcode: c_uint,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: c_uint,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

// Constants of verbs.h.
const PORT_ACTIVE: u32 = 4;
const QPT_RC: c_uint = 2;
const QPS_INIT: c_uint = 1;
const QPS_RTR: c_uint = 2;
const QPS_RTS: c_uint = 3;
const QP_STATE: c_int = 1 << 0;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
const ACCESS_LOCAL_WRITE: c_int = 1;
const ACCESS_REMOTE_WRITE: c_int = 1 << 1;
const WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
const SEND_SIGNALED: c_uint = 1 << 1;
const WC_WITH_IMM: c_uint = 1 << 1;

/// `IBV_WC_SUCCESS`, and the statuses that mean the peer is gone rather than a bug.
pub(crate) const WC_SUCCESS: u32 = 0;
pub(crate) const WC_WR_FLUSH_ERR: u32 = 5;
pub(crate) const WC_RETRY_EXC_ERR: u32 = 12;
pub(crate) const WC_RNR_RETRY_EXC_ERR: u32 = 13;

// ---- The library ----

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut RawContext;
type CloseDevice = unsafe extern "C" fn(*mut RawContext) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut RawContext, u8, *mut PortAttr) -> c_int;
type QueryGidEx =
    unsafe extern "C" fn(*mut RawContext, u32, u32, *mut GidEntry, u32, usize) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut RawContext) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut RawMr;
type DeregMr = unsafe extern "C" fn(*mut RawMr) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut RawContext) -> *mut CompChannel;
type DestroyCompChannel = unsafe extern "C" fn(*mut CompChannel) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut RawContext, c_int, *mut c_void, *mut CompChannel, c_int) -> *mut Cq;
type DestroyCq = unsafe extern "C" fn(*mut Cq) -> c_int;
type GetCqEvent = unsafe extern "C" fn(*mut CompChannel, *mut *mut Cq, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut Cq, c_uint);
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut Qp;
type ModifyQp = unsafe extern "C" fn(*mut Qp, *mut QpAttr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut Qp) -> c_int;
type WcStatusStr = unsafe extern "C" fn(c_uint) -> *const c_char;

/// The functions of libibverbs this transport calls by name.
struct Functions {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_port: QueryPort,
    query_gid_ex: QueryGidEx,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
    create_comp_channel: CreateCompChannel,
    destroy_comp_channel: DestroyCompChannel,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    get_cq_event: GetCqEvent,
    ack_cq_events: AckCqEvents,
    create_qp: CreateQp,
    modify_qp: ModifyQp,
    destroy_qp: DestroyQp,
    wc_status_str: WcStatusStr,
}

/// libibverbs, opened. Kept open for the life of the process once opened (providers do not
/// all survive being unloaded), and shared by every object made through it.
pub(crate) struct Verbs {
    fns: Functions,
    /// Holds the library mapped while `fns` may be called.
    _library: Library,
}

impl Verbs {
    /// Opens libibverbs (`path`, else [`DEFAULT_LIBRARY`] from the usual search path), once per
    /// process and path.
    ///
    /// # Errors
    /// Why it cannot be used: not found, or too old (a function is missing).
    pub(crate) fn load(path: Option<&str>) -> Result<Arc<Verbs>, String> {
        static LOADED: Mutex<Vec<(String, Arc<Verbs>)>> = Mutex::new(Vec::new());
        let path = path.unwrap_or(DEFAULT_LIBRARY);
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, verbs)) = loaded.iter().find(|(p, _)| p == path) {
            return Ok(Arc::clone(verbs));
        }
        // SAFETY: libibverbs runs no initialiser that conflicts with anything of ours; opening
        // it is what the C programs linked with it do at start-up.
        let library = unsafe { Library::new(path) }.map_err(|e| {
            format!("cannot load {path} ({e}); install libibverbs1 and a provider (rdma-core)")
        })?;
        let fns = Functions::resolve(&library)
            .map_err(|symbol| format!("{path} lacks {symbol} (rdma-core 32 or newer is needed)"))?;
        let verbs = Arc::new(Verbs {
            fns,
            _library: library,
        });
        loaded.push((path.to_owned(), Arc::clone(&verbs)));
        Ok(verbs)
    }

    /// The names of the RDMA devices, in the library's order.
    ///
    /// # Errors
    /// The library could not list them (no kernel support, no permission).
    pub(crate) fn device_names(&self) -> io::Result<Vec<String>> {
        self.with_devices(|devices| Ok(devices.iter().map(|&(name, _)| name.to_owned()).collect()))
    }

    /// Opens the device called `name`; `None` when there is no such device.
    ///
    /// # Errors
    /// Listing or opening the device failed.
    pub(crate) fn open(self: &Arc<Self>, name: &str) -> io::Result<Option<Arc<Context>>> {
        self.with_devices(|devices| {
            let Some(&(_, device)) = devices.iter().find(|(n, _)| *n == name) else {
                return Ok(None);
            };
            // SAFETY: `device` comes from the list, which is still alive.
            let ptr = unsafe { (self.fns.open_device)(device) };
            let ptr = non_null(ptr)?;
            Ok(Some(Arc::new(Context {
                verbs: Arc::clone(self),
                ptr,
                name: name.to_owned(),
            })))
        })
    }

    /// Runs `f` over the device list as (name, device) pairs, then frees the list.
    fn with_devices<R>(
        &self,
        f: impl FnOnce(&[(&str, *mut c_void)]) -> io::Result<R>,
    ) -> io::Result<R> {
        let mut count: c_int = 0;
        // SAFETY: the count pointer is valid for the call.
        let list = unsafe { (self.fns.get_device_list)(&mut count) };
        let list = non_null(list)?;
        let count = usize::try_from(count).unwrap_or(0);
        let mut devices = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the list holds `count` device pointers (then a null).
            let device = unsafe { *list.as_ptr().add(i) };
            // SAFETY: a device of the list has a NUL-terminated name that lives with the list.
            let name = unsafe { CStr::from_ptr((self.fns.get_device_name)(device)) };
            devices.push((name.to_str().unwrap_or("?"), device));
        }
        let result = f(&devices);
        // SAFETY: frees the list obtained above; opened devices stay valid (verbs.h).
        unsafe { (self.fns.free_device_list)(list.as_ptr()) };
        result
    }

    /// The library's text for a completion status.
    pub(crate) fn status_text(&self, status: u32) -> String {
        // SAFETY: returns a static string for any status value ("unknown" for others).
        let text = unsafe { (self.fns.wc_status_str)(status) };
        if text.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Functions {
    /// Looks every function up; `Err` names the first one missing.
    fn resolve(library: &Library) -> Result<Functions, &'static str> {
        /// # Safety
        /// `T` must be the function's type as verbs.h declares it.
        unsafe fn get<T: Copy>(library: &Library, name: &'static str) -> Result<T, &'static str> {
            // SAFETY: the caller gives the declared type; the pointer is copied out and only
            // used while `Verbs` keeps the library loaded.
            unsafe {
                library
                    .get::<T>(name.as_bytes())
                    .map(|s| *s)
                    .map_err(|_| name)
            }
        }
        // SAFETY: each type is the one verbs.h declares for that name (checked by review of
        // the header; the layout test covers the structures they take).
        unsafe {
            Ok(Functions {
                get_device_list: get(library, "ibv_get_device_list")?,
                free_device_list: get(library, "ibv_free_device_list")?,
                get_device_name: get(library, "ibv_get_device_name")?,
                open_device: get(library, "ibv_open_device")?,
                close_device: get(library, "ibv_close_device")?,
                query_port: get(library, "ibv_query_port")?,
                query_gid_ex: get(library, "_ibv_query_gid_ex")?,
                alloc_pd: get(library, "ibv_alloc_pd")?,
                dealloc_pd: get(library, "ibv_dealloc_pd")?,
                reg_mr: get(library, "ibv_reg_mr")?,
                dereg_mr: get(library, "ibv_dereg_mr")?,
                create_comp_channel: get(library, "ibv_create_comp_channel")?,
                destroy_comp_channel: get(library, "ibv_destroy_comp_channel")?,
                create_cq: get(library, "ibv_create_cq")?,
                destroy_cq: get(library, "ibv_destroy_cq")?,
                get_cq_event: get(library, "ibv_get_cq_event")?,
                ack_cq_events: get(library, "ibv_ack_cq_events")?,
                create_qp: get(library, "ibv_create_qp")?,
                modify_qp: get(library, "ibv_modify_qp")?,
                destroy_qp: get(library, "ibv_destroy_qp")?,
                wc_status_str: get(library, "ibv_wc_status_str")?,
            })
        }
    }
}

/// A null pointer from the library as the `errno` it set.
fn non_null<T>(ptr: *mut T) -> io::Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(|| {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(0) {
            io::Error::other("the RDMA library failed without saying why")
        } else {
            e
        }
    })
}

/// A status code from the library: 0, or an errno value (positive, or -1 with `errno` set).
fn check(rc: c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(io::Error::from_raw_os_error(rc)),
        _ => Err(io::Error::last_os_error()),
    }
}

// SAFETY (for the Send/Sync impls below): libibverbs objects may be used from any thread;
// the library locks internally where it must, and the data path of one queue pair or
// completion queue is used by one thread at a time (its owner holds `&mut`).

// ---- Devices ----

/// An opened device.
pub(crate) struct Context {
    verbs: Arc<Verbs>,
    ptr: NonNull<RawContext>,
    name: String,
}

// SAFETY: see above.
unsafe impl Send for Context {}
// SAFETY: see above; `&Context` only queries and creates objects, which the library allows
// from several threads.
unsafe impl Sync for Context {}

/// What a port says about itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortInfo {
    /// `ibv_port_state`: 4 is active.
    pub(crate) state: u32,
    /// `ibv_mtu` values: 1 = 256 bytes ... 5 = 4096.
    pub(crate) active_mtu: u32,
    pub(crate) lid: u16,
    /// 1 InfiniBand, 2 Ethernet (0 unspecified: InfiniBand).
    pub(crate) link_layer: u8,
    pub(crate) gid_table_len: u32,
}

impl PortInfo {
    pub(crate) fn active(&self) -> bool {
        self.state == PORT_ACTIVE
    }
}

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidInfo {
    pub(crate) index: u32,
    pub(crate) gid: [u8; 16],
    /// `ibv_gid_type`: 0 InfiniBand, 1 RoCE v1, 2 RoCE v2.
    pub(crate) kind: u32,
}

impl Context {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn verbs(&self) -> &Arc<Verbs> {
        &self.verbs
    }

    /// Port `port` (from 1); `None` past the last port.
    pub(crate) fn port(&self, port: u8) -> Option<PortInfo> {
        // SAFETY: PortAttr is plain data; all-zero is a valid value.
        let mut attr: PortAttr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; the exported function fills at most the structure
        // this code declares (its older, shorter form).
        let rc = unsafe { (self.verbs.fns.query_port)(self.ptr.as_ptr(), port, &mut attr) };
        (rc == 0).then_some(PortInfo {
            state: attr.state,
            active_mtu: attr.active_mtu,
            lid: attr.lid,
            link_layer: attr.link_layer,
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
        })
    }

    /// The valid entries of port `port`'s GID table.
    pub(crate) fn gids(&self, port: u8, table_len: u32) -> Vec<GidInfo> {
        (0..table_len)
            .filter_map(|index| {
                // SAFETY: GidEntry is plain data; all-zero is a valid value.
                let mut entry: GidEntry = unsafe { std::mem::zeroed() };
                // SAFETY: the context is open; the entry and its size are ours.
                let rc = unsafe {
                    (self.verbs.fns.query_gid_ex)(
                        self.ptr.as_ptr(),
                        u32::from(port),
                        index,
                        &mut entry,
                        0,
                        size_of::<GidEntry>(),
                    )
                };
                (rc == 0 && entry.gid.0 != [0; 16]).then_some(GidInfo {
                    index,
                    gid: entry.gid.0,
                    kind: entry.gid_type,
                })
            })
            .collect()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object made from the context holds an Arc to it, so none is left.
        unsafe { (self.verbs.fns.close_device)(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub(crate) struct ProtectionDomain {
    context: Arc<Context>,
    ptr: NonNull<c_void>,
}

// SAFETY: see above.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// # Errors
    /// The library refused (resources).
    pub(crate) fn new(context: &Arc<Context>) -> io::Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is open.
        let ptr = non_null(unsafe { (context.verbs.fns.alloc_pd)(context.ptr.as_ptr()) })?;
        Ok(Arc::new(ProtectionDomain {
            context: Arc::clone(context),
            ptr,
        }))
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: regions and queue pairs hold an Arc to their domain, so none is left.
        unsafe { (self.context.verbs.fns.dealloc_pd)(self.ptr.as_ptr()) };
    }
}

// ---- Memory ----

/// A [`Mapping`] registered with a protection domain.
pub(crate) struct Region {
    pd: Arc<ProtectionDomain>,
    mr: NonNull<RawMr>,
    len: usize,
    /// Unmapped after the registration is gone.
    memory: Mapping,
}

// SAFETY: see above.
unsafe impl Send for Region {}
// SAFETY: see above; the keys and address are read-only.
unsafe impl Sync for Region {}

impl Region {
    /// Registers the first `len` bytes of `memory`; with `remote_write`, peers that know the
    /// key may write them.
    ///
    /// # Errors
    /// The library refused: often `ENOMEM` when the locked-memory limit is too low.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        memory: Mapping,
        len: usize,
        remote_write: bool,
    ) -> io::Result<Region> {
        if len > memory.len() {
            return Err(io::Error::other("registering past the end of a mapping"));
        }
        let access = ACCESS_LOCAL_WRITE | if remote_write { ACCESS_REMOTE_WRITE } else { 0 };
        let fns = &pd.context.verbs.fns;
        // SAFETY: the range is inside the mapping, which the Region owns and unmaps only after
        // deregistering (fields drop after `Drop::drop`).
        let mr = unsafe { (fns.reg_mr)(pd.ptr.as_ptr(), memory.base().cast(), len, access) };
        Ok(Region {
            pd: Arc::clone(pd),
            mr: non_null(mr)?,
            len,
            memory,
        })
    }

    /// Bytes registered (from the start of the mapping).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn memory(&self) -> &Mapping {
        &self.memory
    }

    /// The address peers and work requests name the first byte by.
    pub(crate) fn addr(&self) -> u64 {
        self.memory.base() as u64
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR lives as long as self; lkey is set at registration.
        unsafe { self.mr.as_ref().lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { self.mr.as_ref().rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the MR was registered by `new`; the queue pair that used it owns it and is
        // destroyed first (`QueuePair`), and a write still arriving afterwards fails at the
        // device instead of reaching memory.
        unsafe { (self.pd.context.verbs.fns.dereg_mr)(self.mr.as_ptr()) };
    }
}

// ---- Completions ----

/// One completion, as plain data.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Completion {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) vendor_err: u32,
    /// The immediate data of an incoming write, in host order; `None` for other completions.
    pub(crate) imm: Option<u32>,
}

/// A completion queue with its own completion channel (a descriptor to sleep on).
pub(crate) struct CompletionQueue {
    context: Arc<Context>,
    channel: NonNull<CompChannel>,
    cq: NonNull<Cq>,
    /// Events taken from the channel and not yet acknowledged (all are, before destruction).
    unacked: c_uint,
}

// SAFETY: see above.
unsafe impl Send for CompletionQueue {}

impl CompletionQueue {
    /// A queue of `entries` completions.
    ///
    /// # Errors
    /// The library refused (resources).
    pub(crate) fn new(context: &Arc<Context>, entries: usize) -> io::Result<CompletionQueue> {
        let fns = &context.verbs.fns;
        let entries = c_int::try_from(entries).map_err(|_| io::Error::other("too many entries"))?;
        // SAFETY: the context is open.
        let channel = non_null(unsafe { (fns.create_comp_channel)(context.ptr.as_ptr()) })?;
        // SAFETY: a valid channel of the same context.
        let cq = unsafe {
            (fns.create_cq)(
                context.ptr.as_ptr(),
                entries,
                null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let cq = match non_null(cq) {
            Ok(cq) => cq,
            Err(e) => {
                // SAFETY: the channel was created above and is used by nothing.
                unsafe { (fns.destroy_comp_channel)(channel.as_ptr()) };
                return Err(e);
            }
        };
        let queue = CompletionQueue {
            context: Arc::clone(context),
            channel,
            cq,
            unacked: 0,
        };
        rustix::fs::fcntl_setfl(queue.fd(), rustix::fs::OFlags::NONBLOCK)?;
        Ok(queue)
    }

    /// The channel's descriptor: readable when an armed queue got a completion.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's descriptor stays open until the channel is destroyed in drop.
        unsafe { BorrowedFd::borrow_raw(self.channel.as_ref().fd) }
    }

    /// Takes up to `out.len()` completions; returns how many.
    ///
    /// # Errors
    /// The provider failed to poll (a broken queue).
    pub(crate) fn poll(&mut self, out: &mut [Completion]) -> io::Result<usize> {
        const BATCH: usize = 16;
        // SAFETY: WorkCompletion is plain data; all-zero is a valid value.
        let mut wc: [WorkCompletion; BATCH] = unsafe { std::mem::zeroed() };
        let want = c_int::try_from(out.len().min(BATCH)).unwrap_or(0);
        let poll_cq = self.ops().poll_cq.ok_or_else(missing_op)?;
        // SAFETY: the queue is alive and `wc` holds `want` entries.
        let n = unsafe { poll_cq(self.cq.as_ptr(), want, wc.as_mut_ptr()) };
        let n = usize::try_from(n)
            .map_err(|_| io::Error::other("polling the completion queue failed"))?;
        for (dst, wc) in out.iter_mut().zip(&wc[..n]) {
            *dst = Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                vendor_err: wc.vendor_err,
                imm: (wc.wc_flags & WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
            };
        }
        Ok(n)
    }

    /// Asks for an event on the channel at the next completion (poll once more afterwards:
    /// one that arrived before arming raises none).
    ///
    /// # Errors
    /// The provider refused.
    pub(crate) fn arm(&mut self) -> io::Result<()> {
        let req_notify = self.ops().req_notify_cq.ok_or_else(missing_op)?;
        // SAFETY: the queue is alive.
        check(unsafe { req_notify(self.cq.as_ptr(), 0) })
    }

    /// Takes the events waiting on the channel (it is non-blocking) and acknowledges them.
    pub(crate) fn drain_events(&mut self) {
        let fns = &self.context.verbs.fns;
        loop {
            let mut cq = null_mut();
            let mut user = null_mut();
            // SAFETY: the channel is alive; the out pointers are valid for the call.
            let rc = unsafe { (fns.get_cq_event)(self.channel.as_ptr(), &mut cq, &mut user) };
            if rc != 0 {
                break;
            }
            self.unacked += 1;
        }
        if self.unacked > 0 {
            // SAFETY: acknowledges events taken from this queue's channel.
            unsafe { (fns.ack_cq_events)(self.cq.as_ptr(), self.unacked) };
            self.unacked = 0;
        }
    }

    fn ops(&self) -> &ContextOps {
        // SAFETY: the queue's context is the opened context, alive while `self` is.
        unsafe { &(*self.cq.as_ref().context).ops }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        self.drain_events();
        let fns = &self.context.verbs.fns;
        // SAFETY: the queue pair owning this queue was destroyed first; every event was
        // acknowledged above; the channel is destroyed after the queue that used it.
        unsafe {
            (fns.destroy_cq)(self.cq.as_ptr());
            (fns.destroy_comp_channel)(self.channel.as_ptr());
        }
    }
}

fn missing_op() -> io::Error {
    io::Error::other("the RDMA provider lacks a data-path function")
}

// ---- Queue pairs ----

/// What a queue pair needs to know about its remote end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote {
    pub(crate) qp_num: u32,
    pub(crate) psn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    /// Whether to route by GID (always on Ethernet; on InfiniBand between subnets).
    pub(crate) global: bool,
}

/// How this end is set up: port, GID index, path MTU, first packet sequence number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local {
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    /// `ibv_mtu` value.
    pub(crate) mtu: u32,
    pub(crate) psn: u32,
}

/// Ack timeout exponent: 4.096 µs × 2^17 ≈ 0.5 s before a retry; 7 retries make a silent peer
/// an error after about 4 s. Short enough for a vanished host, long enough for a software
/// device on a loaded machine.
const ACK_TIMEOUT: u8 = 17;
const RETRY_COUNT: u8 = 7;
/// 7: retry without limit while the receiver has no receive posted (flow control makes that
/// rare; a stopped peer is found by the liveness check, not here).
const RNR_RETRY: u8 = 7;
/// 12: 0.64 ms between such retries.
const MIN_RNR_TIMER: u8 = 12;

/// An RDMA write with immediate data: `len` bytes of the queue pair's outgoing region from
/// `offset` (none when `len` is 0) to `remote_addr` under `rkey`.
pub(crate) struct Write {
    pub(crate) wr_id: u64,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) imm: u32,
}

/// A reliable-connected queue pair with its own completion queue for both directions, and the
/// two regions its work touches: the outgoing one its writes read, the incoming one the peer
/// writes. It owns them, so by type no posted request outlives the memory it names: they are
/// deregistered only after the queue pair is destroyed (fields drop after `Drop::drop`).
pub(crate) struct QueuePair {
    ptr: NonNull<Qp>,
    outgoing: Region,
    incoming: Region,
    /// Destroyed after the queue pair.
    cq: CompletionQueue,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: see above.
unsafe impl Send for QueuePair {}

impl QueuePair {
    /// A queue pair in the RESET state.
    ///
    /// # Errors
    /// The library refused (resources, or a capacity the device lacks).
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        send_depth: usize,
        recv_depth: usize,
        outgoing: Region,
        incoming: Region,
    ) -> io::Result<QueuePair> {
        let depth = |n: usize| u32::try_from(n).map_err(|_| io::Error::other("queue too deep"));
        let cq = CompletionQueue::new(&pd.context, send_depth + recv_depth)?;
        let cq_ptr = cq.cq.as_ptr();
        let mut attr = QpInitAttr {
            qp_context: null_mut(),
            send_cq: cq_ptr,
            recv_cq: cq_ptr,
            srq: null_mut(),
            cap: QpCap {
                max_send_wr: depth(send_depth)?,
                max_recv_wr: depth(recv_depth)?,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the domain and queue are alive (held below); attr is valid for the call.
        let ptr = unsafe { (pd.context.verbs.fns.create_qp)(pd.ptr.as_ptr(), &mut attr) };
        Ok(QueuePair {
            ptr: non_null(ptr)?,
            outgoing,
            incoming,
            cq,
            pd: Arc::clone(pd),
        })
    }

    /// The region this queue pair's writes read from.
    pub(crate) fn outgoing(&self) -> &Region {
        &self.outgoing
    }

    /// The region the peer writes into.
    pub(crate) fn incoming(&self) -> &Region {
        &self.incoming
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: the queue pair is alive; qp_num is set at creation.
        unsafe { self.ptr.as_ref().qp_num }
    }

    /// RESET → INIT on `port`: receives may be posted from now on.
    ///
    /// # Errors
    /// The device refused the transition.
    pub(crate) fn init(&mut self, port: u8) -> io::Result<()> {
        let mut attr = QpAttr {
            qp_state: QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE) as c_uint,
            ..QpAttr::default()
        };
        self.modify(
            &mut attr,
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("to INIT: {e}")))
    }

    /// INIT → RTR → RTS, connected to `remote`.
    ///
    /// # Errors
    /// The device refused a transition (a bad GID index, MTU, or remote).
    pub(crate) fn ready(&mut self, local: Local, remote: Remote) -> io::Result<()> {
        let mut attr = QpAttr {
            qp_state: QPS_RTR,
            path_mtu: local.mtu,
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 0,
            min_rnr_timer: MIN_RNR_TIMER,
            ah_attr: AhAttr {
                grh: GlobalRoute {
                    dgid: RawGid(remote.gid),
                    sgid_index: local.gid_index,
                    hop_limit: 64,
                    ..GlobalRoute::default()
                },
                dlid: remote.lid,
                is_global: u8::from(remote.global),
                port_num: local.port,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        let rtr = QP_STATE
            | QP_AV
            | QP_PATH_MTU
            | QP_DEST_QPN
            | QP_RQ_PSN
            | QP_MAX_DEST_RD_ATOMIC
            | QP_MIN_RNR_TIMER;
        self.modify(&mut attr, rtr)
            .map_err(|e| io::Error::new(e.kind(), format!("to RTR: {e}")))?;

        let mut attr = QpAttr {
            qp_state: QPS_RTS,
            sq_psn: local.psn,
            timeout: ACK_TIMEOUT,
            retry_cnt: RETRY_COUNT,
            rnr_retry: RNR_RETRY,
            max_rd_atomic: 0,
            ..QpAttr::default()
        };
        let rts =
            QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, rts)
            .map_err(|e| io::Error::new(e.kind(), format!("to RTS: {e}")))
    }

    fn modify(&mut self, attr: &mut QpAttr, mask: c_int) -> io::Result<()> {
        // SAFETY: the queue pair is alive; attr is valid for the call.
        check(unsafe { (self.pd.context.verbs.fns.modify_qp)(self.ptr.as_ptr(), attr, mask) })
    }

    /// Posts `write`, signalled.
    ///
    /// # Errors
    /// The send queue is full or the queue pair is in error.
    pub(crate) fn post_write(&mut self, write: Write) -> io::Result<()> {
        let local = &self.outgoing;
        let Write {
            wr_id,
            offset,
            len,
            remote_addr,
            rkey,
            imm,
        } = write;
        // Bounds: a work request must stay inside the registered range.
        if offset.checked_add(len).is_none_or(|end| end > local.len) {
            return Err(io::Error::other("write outside its registered region"));
        }
        let mut sge = Sge {
            addr: local.addr() + offset as u64,
            length: u32::try_from(len).map_err(|_| io::Error::other("write too long"))?,
            lkey: local.lkey(),
        };
        let mut wr = SendWr {
            wr_id,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: c_int::from(len > 0),
            opcode: WR_RDMA_WRITE_WITH_IMM,
            send_flags: SEND_SIGNALED,
            imm_data: imm.to_be(),
            remote_addr,
            rkey,
            _rest_of_wr: [0; 5],
            _qp_type: 0,
            _bind_mw_or_tso: [0; 6],
        };
        let mut bad = null_mut();
        let post_send = self.ops().post_send.ok_or_else(missing_op)?;
        // SAFETY: the queue pair is alive; the request and its scatter entry are valid for the
        // call (the provider copies them); the bytes it names are registered and in bounds.
        check(unsafe { post_send(self.ptr.as_ptr(), &mut wr, &mut bad) })
    }

    /// Posts `count` receives without buffers, identified by `wr_id` (incoming writes with
    /// immediate data consume one each).
    ///
    /// # Errors
    /// The receive queue is full or the queue pair is in error.
    pub(crate) fn post_receives(&mut self, count: usize, wr_id: u64) -> io::Result<()> {
        let post_recv = self.ops().post_recv.ok_or_else(missing_op)?;
        for _ in 0..count {
            let mut wr = RecvWr {
                wr_id,
                next: null_mut(),
                sg_list: null_mut(),
                num_sge: 0,
            };
            let mut bad = null_mut();
            // SAFETY: the queue pair is alive; the request is valid for the call.
            check(unsafe { post_recv(self.ptr.as_ptr(), &mut wr, &mut bad) })?;
        }
        Ok(())
    }

    /// The completion queue of this queue pair.
    pub(crate) fn completions(&mut self) -> &mut CompletionQueue {
        &mut self.cq
    }

    /// The descriptor that becomes readable when the armed completion queue gets a completion.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.cq.fd()
    }

    fn ops(&self) -> &ContextOps {
        // SAFETY: the queue pair's context is the opened context, alive while `self` is.
        unsafe { &(*self.ptr.as_ref().context).ops }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the queue pair was created by `new`; its regions, queue and domain are still
        // alive (fields of self, dropped after this).
        unsafe { (self.pd.context.verbs.fns.destroy_qp)(self.ptr.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    use super::*;

    /// Every size and offset this file relies on, as Rust sees it, with the C expression that
    /// must give the same number.
    fn layout() -> Vec<(&'static str, usize)> {
        vec![
            ("sizeof(union ibv_gid)", size_of::<RawGid>()),
            ("_Alignof(union ibv_gid)", align_of::<RawGid>()),
            ("sizeof(struct ibv_gid_entry)", size_of::<GidEntry>()),
            (
                "offsetof(struct ibv_gid_entry, gid_type)",
                offset_of!(GidEntry, gid_type),
            ),
            (
                "offsetof(struct ibv_port_attr, state)",
                offset_of!(PortAttr, state),
            ),
            (
                "offsetof(struct ibv_port_attr, active_mtu)",
                offset_of!(PortAttr, active_mtu),
            ),
            (
                "offsetof(struct ibv_port_attr, gid_tbl_len)",
                offset_of!(PortAttr, gid_tbl_len),
            ),
            (
                "offsetof(struct ibv_port_attr, lid)",
                offset_of!(PortAttr, lid),
            ),
            (
                "offsetof(struct ibv_port_attr, link_layer)",
                offset_of!(PortAttr, link_layer),
            ),
            ("sizeof(struct ibv_port_attr)", size_of::<PortAttr>()),
            (
                "offsetof(struct ibv_context, ops)",
                offset_of!(RawContext, ops),
            ),
            ("sizeof(struct ibv_context_ops)", size_of::<ContextOps>()),
            (
                "offsetof(struct ibv_context_ops, poll_cq)",
                offset_of!(ContextOps, poll_cq),
            ),
            (
                "offsetof(struct ibv_context_ops, req_notify_cq)",
                offset_of!(ContextOps, req_notify_cq),
            ),
            (
                "offsetof(struct ibv_context_ops, post_send)",
                offset_of!(ContextOps, post_send),
            ),
            (
                "offsetof(struct ibv_context_ops, post_recv)",
                offset_of!(ContextOps, post_recv),
            ),
            ("offsetof(struct ibv_mr, lkey)", offset_of!(RawMr, lkey)),
            ("offsetof(struct ibv_mr, rkey)", offset_of!(RawMr, rkey)),
            ("offsetof(struct ibv_cq, context)", offset_of!(Cq, context)),
            (
                "offsetof(struct ibv_comp_channel, fd)",
                offset_of!(CompChannel, fd),
            ),
            ("offsetof(struct ibv_qp, context)", offset_of!(Qp, context)),
            ("offsetof(struct ibv_qp, qp_num)", offset_of!(Qp, qp_num)),
            ("sizeof(struct ibv_qp_cap)", size_of::<QpCap>()),
            ("sizeof(struct ibv_qp_init_attr)", size_of::<QpInitAttr>()),
            (
                "offsetof(struct ibv_qp_init_attr, cap)",
                offset_of!(QpInitAttr, cap),
            ),
            (
                "offsetof(struct ibv_qp_init_attr, qp_type)",
                offset_of!(QpInitAttr, qp_type),
            ),
            (
                "offsetof(struct ibv_qp_init_attr, sq_sig_all)",
                offset_of!(QpInitAttr, sq_sig_all),
            ),
            ("sizeof(struct ibv_global_route)", size_of::<GlobalRoute>()),
            (
                "offsetof(struct ibv_global_route, sgid_index)",
                offset_of!(GlobalRoute, sgid_index),
            ),
            (
                "offsetof(struct ibv_global_route, hop_limit)",
                offset_of!(GlobalRoute, hop_limit),
            ),
            ("sizeof(struct ibv_ah_attr)", size_of::<AhAttr>()),
            (
                "offsetof(struct ibv_ah_attr, dlid)",
                offset_of!(AhAttr, dlid),
            ),
            (
                "offsetof(struct ibv_ah_attr, is_global)",
                offset_of!(AhAttr, is_global),
            ),
            (
                "offsetof(struct ibv_ah_attr, port_num)",
                offset_of!(AhAttr, port_num),
            ),
            ("sizeof(struct ibv_qp_attr)", size_of::<QpAttr>()),
            (
                "offsetof(struct ibv_qp_attr, path_mtu)",
                offset_of!(QpAttr, path_mtu),
            ),
            (
                "offsetof(struct ibv_qp_attr, rq_psn)",
                offset_of!(QpAttr, rq_psn),
            ),
            (
                "offsetof(struct ibv_qp_attr, sq_psn)",
                offset_of!(QpAttr, sq_psn),
            ),
            (
                "offsetof(struct ibv_qp_attr, dest_qp_num)",
                offset_of!(QpAttr, dest_qp_num),
            ),
            (
                "offsetof(struct ibv_qp_attr, qp_access_flags)",
                offset_of!(QpAttr, qp_access_flags),
            ),
            (
                "offsetof(struct ibv_qp_attr, ah_attr)",
                offset_of!(QpAttr, ah_attr),
            ),
            (
                "offsetof(struct ibv_qp_attr, pkey_index)",
                offset_of!(QpAttr, pkey_index),
            ),
            (
                "offsetof(struct ibv_qp_attr, max_rd_atomic)",
                offset_of!(QpAttr, max_rd_atomic),
            ),
            (
                "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
                offset_of!(QpAttr, max_dest_rd_atomic),
            ),
            (
                "offsetof(struct ibv_qp_attr, min_rnr_timer)",
                offset_of!(QpAttr, min_rnr_timer),
            ),
            (
                "offsetof(struct ibv_qp_attr, port_num)",
                offset_of!(QpAttr, port_num),
            ),
            (
                "offsetof(struct ibv_qp_attr, timeout)",
                offset_of!(QpAttr, timeout),
            ),
            (
                "offsetof(struct ibv_qp_attr, retry_cnt)",
                offset_of!(QpAttr, retry_cnt),
            ),
            (
                "offsetof(struct ibv_qp_attr, rnr_retry)",
                offset_of!(QpAttr, rnr_retry),
            ),
            ("sizeof(struct ibv_sge)", size_of::<Sge>()),
            ("sizeof(struct ibv_send_wr)", size_of::<SendWr>()),
            (
                "offsetof(struct ibv_send_wr, sg_list)",
                offset_of!(SendWr, sg_list),
            ),
            (
                "offsetof(struct ibv_send_wr, num_sge)",
                offset_of!(SendWr, num_sge),
            ),
            (
                "offsetof(struct ibv_send_wr, opcode)",
                offset_of!(SendWr, opcode),
            ),
            (
                "offsetof(struct ibv_send_wr, send_flags)",
                offset_of!(SendWr, send_flags),
            ),
            (
                "offsetof(struct ibv_send_wr, imm_data)",
                offset_of!(SendWr, imm_data),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
                offset_of!(SendWr, remote_addr),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
                offset_of!(SendWr, rkey),
            ),
            ("sizeof(struct ibv_recv_wr)", size_of::<RecvWr>()),
            (
                "offsetof(struct ibv_recv_wr, num_sge)",
                offset_of!(RecvWr, num_sge),
            ),
            ("sizeof(struct ibv_wc)", size_of::<WorkCompletion>()),
            (
                "offsetof(struct ibv_wc, status)",
                offset_of!(WorkCompletion, status),
            ),
            (
                "offsetof(struct ibv_wc, vendor_err)",
                offset_of!(WorkCompletion, vendor_err),
            ),
            (
                "offsetof(struct ibv_wc, imm_data)",
                offset_of!(WorkCompletion, imm_data),
            ),
            (
                "offsetof(struct ibv_wc, wc_flags)",
                offset_of!(WorkCompletion, wc_flags),
            ),
            ("IBV_PORT_ACTIVE", PORT_ACTIVE as usize),
            ("IBV_QPT_RC", QPT_RC as usize),
            ("IBV_QPS_INIT", QPS_INIT as usize),
            ("IBV_QPS_RTR", QPS_RTR as usize),
            ("IBV_QPS_RTS", QPS_RTS as usize),
            ("IBV_QP_STATE", QP_STATE as usize),
            ("IBV_QP_ACCESS_FLAGS", QP_ACCESS_FLAGS as usize),
            ("IBV_QP_PKEY_INDEX", QP_PKEY_INDEX as usize),
            ("IBV_QP_PORT", QP_PORT as usize),
            ("IBV_QP_AV", QP_AV as usize),
            ("IBV_QP_PATH_MTU", QP_PATH_MTU as usize),
            ("IBV_QP_TIMEOUT", QP_TIMEOUT as usize),
            ("IBV_QP_RETRY_CNT", QP_RETRY_CNT as usize),
            ("IBV_QP_RNR_RETRY", QP_RNR_RETRY as usize),
            ("IBV_QP_RQ_PSN", QP_RQ_PSN as usize),
            ("IBV_QP_MAX_QP_RD_ATOMIC", QP_MAX_QP_RD_ATOMIC as usize),
            ("IBV_QP_MIN_RNR_TIMER", QP_MIN_RNR_TIMER as usize),
            ("IBV_QP_SQ_PSN", QP_SQ_PSN as usize),
            ("IBV_QP_MAX_DEST_RD_ATOMIC", QP_MAX_DEST_RD_ATOMIC as usize),
            ("IBV_QP_DEST_QPN", QP_DEST_QPN as usize),
            ("IBV_ACCESS_LOCAL_WRITE", ACCESS_LOCAL_WRITE as usize),
            ("IBV_ACCESS_REMOTE_WRITE", ACCESS_REMOTE_WRITE as usize),
            (
                "IBV_WR_RDMA_WRITE_WITH_IMM",
                WR_RDMA_WRITE_WITH_IMM as usize,
            ),
            ("IBV_SEND_SIGNALED", SEND_SIGNALED as usize),
            ("IBV_WC_WITH_IMM", WC_WITH_IMM as usize),
            ("IBV_WC_SUCCESS", WC_SUCCESS as usize),
            ("IBV_WC_WR_FLUSH_ERR", WC_WR_FLUSH_ERR as usize),
            ("IBV_WC_RETRY_EXC_ERR", WC_RETRY_EXC_ERR as usize),
            ("IBV_WC_RNR_RETRY_EXC_ERR", WC_RNR_RETRY_EXC_ERR as usize),
        ]
    }

    /// Compiles a C program that prints each expression of [`layout`] with verbs.h, and
    /// compares. Needs a C compiler and libibverbs-dev (CI installs both); skipped, saying so,
    /// where they are missing, unless JACCL_REQUIRE_ALL=1.
    #[test]
    fn declarations_match_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        let compiler = Command::new("cc").arg("--version").output().is_ok();
        if !header.exists() || !compiler {
            assert!(
                std::env::var("JACCL_REQUIRE_ALL").is_err(),
                "verbs.h and a C compiler are required (JACCL_REQUIRE_ALL is set)"
            );
            eprintln!(
                "skipped: needs {} and cc (apt install libibverbs-dev gcc)",
                header.display()
            );
            return;
        }
        let layout = layout();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &layout {
            c += &format!("  printf(\"%zu\\n\", (size_t)({expr}));\n");
        }
        c += "  return 0;\n}\n";
        let dir = std::env::temp_dir().join(format!("jaccl-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c).unwrap();
        let built = Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let c_values: Vec<usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let wrong: Vec<String> = layout
            .iter()
            .zip(&c_values)
            .filter(|((_, rust), c)| rust != *c)
            .map(|((expr, rust), c)| format!("{expr}: C says {c}, this file {rust}"))
            .collect();
        assert_eq!(c_values.len(), layout.len());
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A C type's ABI as the signature check compares it: `i4` (signed, 4 bytes), `u8`,
    /// `p` (any pointer), `v` (nothing); a function pointer is `ret(arg,arg,...)`.
    trait Abi {
        fn abi() -> String;
    }

    macro_rules! int_abi {
        ($($t:ty),*) => {$(
            impl Abi for $t {
                fn abi() -> String {
                    let sign = if <$t>::MIN == 0 { "u" } else { "i" };
                    format!("{sign}{}", size_of::<$t>())
                }
            }
        )*};
    }
    int_abi!(i8, i16, i32, i64, u8, u16, u32, u64, usize);

    impl<T> Abi for *mut T {
        fn abi() -> String {
            "p".into()
        }
    }

    impl<T> Abi for *const T {
        fn abi() -> String {
            "p".into()
        }
    }

    impl Abi for () {
        fn abi() -> String {
            "v".into()
        }
    }

    impl<F: Abi> Abi for Option<F> {
        fn abi() -> String {
            F::abi()
        }
    }

    macro_rules! fn_abi {
        ($($a:ident),*) => {
            impl<R: Abi, $($a: Abi),*> Abi for unsafe extern "C" fn($($a),*) -> R {
                fn abi() -> String {
                    let args: Vec<String> = vec![$($a::abi()),*];
                    format!("{}({})", R::abi(), args.join(","))
                }
            }
        };
    }
    fn_abi!(A);
    fn_abi!(A, B);
    fn_abi!(A, B, C);
    fn_abi!(A, B, C, D);
    fn_abi!(A, B, C, D, E);
    fn_abi!(A, B, C, D, E, F);

    /// Every function this file calls, as a C++ expression of its function pointer type (the
    /// declaration of verbs.h), and this file's type of it.
    fn signatures() -> Vec<(&'static str, String)> {
        type FieldType<T> = Option<T>;
        vec![
            ("decltype(&ibv_get_device_list){}", GetDeviceList::abi()),
            ("decltype(&ibv_free_device_list){}", FreeDeviceList::abi()),
            ("decltype(&ibv_get_device_name){}", GetDeviceName::abi()),
            ("decltype(&ibv_open_device){}", OpenDevice::abi()),
            ("decltype(&ibv_close_device){}", CloseDevice::abi()),
            ("decltype(&ibv_query_port){}", QueryPort::abi()),
            ("decltype(&_ibv_query_gid_ex){}", QueryGidEx::abi()),
            ("decltype(&ibv_alloc_pd){}", AllocPd::abi()),
            ("decltype(&ibv_dealloc_pd){}", DeallocPd::abi()),
            ("decltype(&ibv_reg_mr){}", RegMr::abi()),
            ("decltype(&ibv_dereg_mr){}", DeregMr::abi()),
            (
                "decltype(&ibv_create_comp_channel){}",
                CreateCompChannel::abi(),
            ),
            (
                "decltype(&ibv_destroy_comp_channel){}",
                DestroyCompChannel::abi(),
            ),
            ("decltype(&ibv_create_cq){}", CreateCq::abi()),
            ("decltype(&ibv_destroy_cq){}", DestroyCq::abi()),
            ("decltype(&ibv_get_cq_event){}", GetCqEvent::abi()),
            ("decltype(&ibv_ack_cq_events){}", AckCqEvents::abi()),
            ("decltype(&ibv_create_qp){}", CreateQp::abi()),
            ("decltype(&ibv_modify_qp){}", ModifyQp::abi()),
            ("decltype(&ibv_destroy_qp){}", DestroyQp::abi()),
            ("decltype(&ibv_wc_status_str){}", WcStatusStr::abi()),
            (
                "decltype(ibv_context_ops::poll_cq){}",
                <FieldType<PollCq>>::abi(),
            ),
            (
                "decltype(ibv_context_ops::req_notify_cq){}",
                <FieldType<ReqNotifyCq>>::abi(),
            ),
            (
                "decltype(ibv_context_ops::post_send){}",
                <FieldType<PostSend>>::abi(),
            ),
            (
                "decltype(ibv_context_ops::post_recv){}",
                <FieldType<PostRecv>>::abi(),
            ),
        ]
    }

    /// Compiles a C++ program that describes each function of [`signatures`] as verbs.h
    /// declares it (return and argument types: size, signedness, pointer), and compares with
    /// this file's function pointer types. Needs g++ and libibverbs-dev (CI installs both);
    /// skipped, saying so, where they are missing, unless JACCL_REQUIRE_ALL=1.
    #[test]
    fn function_pointer_types_match_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        let compiler = Command::new("g++").arg("--version").output().is_ok();
        if !header.exists() || !compiler {
            assert!(
                std::env::var("JACCL_REQUIRE_ALL").is_err(),
                "verbs.h and g++ are required (JACCL_REQUIRE_ALL is set)"
            );
            eprintln!("skipped: needs {} and g++", header.display());
            return;
        }
        let signatures = signatures();
        let mut cpp = String::from(
            r#"#include <infiniband/verbs.h>
#include <cstdio>
#include <string>
#include <type_traits>
template <class T> std::string abi() {
  if constexpr (std::is_void_v<T>) return "v";
  else if constexpr (std::is_pointer_v<T>) return "p";
  else if constexpr (std::is_enum_v<T>) return "u" + std::to_string(sizeof(T));
  else if constexpr (std::is_integral_v<T>)
    return std::string(std::is_signed_v<T> ? "i" : "u") + std::to_string(sizeof(T));
  else return "?";
}
template <class R, class... A> std::string sig(R (*)(A...)) {
  std::string s = abi<R>() + "(";
  const char *sep = "";
  ((s += sep, s += abi<A>(), sep = ","), ...);
  return s + ")";
}
int main() {
"#,
        );
        for (expr, _) in &signatures {
            cpp += &format!("  std::printf(\"%s\\n\", sig({expr}).c_str());\n");
        }
        cpp += "}\n";
        let dir = std::env::temp_dir().join(format!("jaccl-verbs-sigs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("sigs.cpp"), dir.join("sigs"));
        std::fs::write(&src, cpp).unwrap();
        let built = Command::new("g++")
            .args(["-std=c++17", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let declared: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(declared.len(), signatures.len());
        let wrong: Vec<String> = signatures
            .iter()
            .zip(&declared)
            .filter(|((_, rust), c)| rust != *c)
            .map(|((expr, rust), c)| format!("{expr}: verbs.h says {c}, this file {rust}"))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Without the library, loading fails with a reason a user can act on.
    #[test]
    fn a_missing_library_is_named() {
        let Err(why) = Verbs::load(Some("/nonexistent/libibverbs.so.1")) else {
            panic!("loaded a library that does not exist");
        };
        assert!(
            why.contains("cannot load /nonexistent/libibverbs.so.1"),
            "{why}"
        );
        assert!(why.contains("install libibverbs1"), "{why}");
    }
}
