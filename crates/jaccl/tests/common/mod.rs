//! Shared helpers of the multi-rank tests: groups of threads over real loopback TCP, real shared
//! memory, or both (two pretend hosts), element generators, and a plain reference
//! implementation of the reductions.
#![allow(
    dead_code,
    unused_macros,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod children;
mod every_collective;
#[allow(unused_imports)] // not every test binary calls it
pub use every_collective::every_collective_once;

use std::any::{Any, TypeId};
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Config, Element, Error, Group, JobToken, ReduceOp, Topology, Transport};

/// Group sizes the suites run.
pub const SIZES: [usize; 6] = [1, 2, 3, 4, 5, 8];
/// Wires per neighbour the suites run.
pub const WIRES: [usize; 3] = [1, 2, 4];

/// Runs `f::<T>` for all 14 element types over `net`; over RDMA for one type of each size (1,
/// 2, 4 and 8 bytes) and complex: the links move bytes whatever their type, every type and
/// reduction is checked over every other net, and in the emulated RDMA VM every message costs
/// about a millisecond (all 14 there took most of CI's 30 minutes).
macro_rules! for_all_dtypes {
    ($net:expr, $f:ident, $($arg:expr),*) => {{
        let mut digest: Vec<u64> = Vec::new();
        digest.extend($f::<u8>($($arg),*));
        digest.extend($f::<bf16>($($arg),*));
        digest.extend($f::<f32>($($arg),*));
        digest.extend($f::<i64>($($arg),*));
        digest.extend($f::<Complex32>($($arg),*));
        if $net != Net::Rdma {
            digest.extend(for_other_dtypes!($f, $($arg),*));
        }
        digest
    }};
}

/// The element types [`for_all_dtypes`] leaves out over RDMA.
macro_rules! for_other_dtypes {
    ($f:ident, $($arg:expr),*) => {{
        let mut digest: Vec<u64> = Vec::new();
        digest.extend($f::<bool>($($arg),*));
        digest.extend($f::<i8>($($arg),*));
        digest.extend($f::<i16>($($arg),*));
        digest.extend($f::<i32>($($arg),*));
        digest.extend($f::<u16>($($arg),*));
        digest.extend($f::<u32>($($arg),*));
        digest.extend($f::<u64>($($arg),*));
        digest.extend($f::<f16>($($arg),*));
        digest.extend($f::<f64>($($arg),*));
        digest
    }};
}

/// A random number from the OS-seeded hasher (no extra dependency).
pub fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::Instant::now())
}

/// A new job's secret token, as `jaccl launch` makes them.
pub fn random_token() -> String {
    JobToken::generate().unwrap()
}

/// A coordinator address on a free port below the ephemeral range, so data listeners (which
/// use ephemeral ports) never take it; concurrent tests are kept apart by their job tokens.
pub fn free_coordinator() -> String {
    loop {
        let port = 20_000 + (random_u64() % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
}

/// How the ranks of a test group are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// TCP between all ranks.
    Tcp,
    /// Shared memory between all ranks (the direct collectives).
    Shm,
    /// Two pretend hosts (`Config::host_id`): the first ⌈size/2⌉ ranks and the rest. Shared
    /// memory inside each, `auto`'s choice between them (RDMA where this machine has an active
    /// port, else TCP), so the ring mixes both (with 2 ranks, only the latter).
    Mixed,
    /// RDMA verbs between all ranks (`Transport::Rdma`, the first active port): only where
    /// there is one, as inside ../shared/rdma-vm.
    Rdma,
    /// The mesh topology (a link between every pair of ranks) over TCP.
    Mesh,
    /// The mesh topology with the default transport on one host: shared memory between all
    /// ranks, and the direct collectives.
    MeshLocal,
}

/// The nets the suites run on: `JACCL_TEST_NETS` (comma-separated `tcp`, `shm`, `mixed`,
/// `mesh`, `meshlocal`, `rdma`), by default every one but `rdma`. scripts/test.sh runs the suites again inside the
/// RDMA VM with `rdma,mixed`.
pub fn nets() -> Vec<Net> {
    let list =
        std::env::var("JACCL_TEST_NETS").unwrap_or_else(|_| "tcp,shm,mixed,mesh,meshlocal".into());
    list.split(',')
        .map(|name| match name.trim() {
            "tcp" => Net::Tcp,
            "shm" => Net::Shm,
            "mixed" => Net::Mixed,
            "rdma" => Net::Rdma,
            "mesh" => Net::Mesh,
            "meshlocal" => Net::MeshLocal,
            other => panic!("JACCL_TEST_NETS: unknown net {other:?}"),
        })
        .collect()
}

/// Runs `test` on every net of [`nets`] at once, one thread each: for tests that mostly sleep
/// (several liveness windows), so their waits overlap. A panic in any of them fails the caller.
pub fn on_every_net_at_once(test: impl Fn(Net) + Sync) {
    std::thread::scope(|s| {
        let test = &test;
        let runs: Vec<_> = nets()
            .into_iter()
            .map(|net| (net, s.spawn(move || test(net))))
            .collect();
        for (net, run) in runs {
            if run.join().is_err() {
                panic!("the test failed on {net:?} (its panic is above)");
            }
        }
    });
}

/// Whether this machine has an RDMA port jaccl would use (so `auto` takes RDMA across hosts).
pub fn rdma_here() -> bool {
    static HERE: OnceLock<bool> = OnceLock::new();
    *HERE.get_or_init(|| {
        jaccl::probe::rdma(None).is_ok_and(|devices| {
            devices
                .iter()
                .flat_map(|d| &d.ports)
                .any(|p| p.state == "ACTIVE" && p.chosen_gid.is_some())
        })
    })
}

/// For a test that needs RDMA: whether to run it. Without an RDMA port it is skipped with a
/// note, unless `JACCL_REQUIRE_RDMA=1` (scripts/test.sh sets it inside the RDMA VM): then the
/// missing port is a failure.
pub fn rdma_or_skip(test: &str) -> bool {
    if rdma_here() {
        return true;
    }
    assert!(
        std::env::var("JACCL_REQUIRE_RDMA").is_err(),
        "{test}: JACCL_REQUIRE_RDMA is set but this machine has no active RDMA port"
    );
    eprintln!("{test}: SKIPPED: no active RDMA port here (scripts/test.sh runs it in the RDMA VM)");
    false
}

/// For a test that changes or counts the whole machine's RDMA state (`why`): whether to run it,
/// which is only inside the throw-away RDMA VM (`RDMA_VM` set), where RDMA is then required.
pub fn in_rdma_vm_or_skip(test: &str, why: &str) -> bool {
    if std::env::var("RDMA_VM").is_err() {
        eprintln!("{test}: SKIPPED: {why}, so it runs only inside the RDMA VM (scripts/test.sh)");
        return false;
    }
    assert!(rdma_or_skip(test));
    true
}

impl Net {
    /// The pretend host of `rank` in a group of `size` (`Mixed` only).
    pub fn host(self, rank: usize, size: usize) -> Option<&'static str> {
        (self == Net::Mixed).then_some(if rank < size.div_ceil(2) { "a" } else { "b" })
    }

    /// `cfg` for `rank` of `size` on this net.
    pub fn apply(self, cfg: Config, rank: usize, size: usize) -> Config {
        match self {
            Net::Tcp => cfg.transport(Transport::Tcp),
            Net::Shm => cfg.transport(Transport::Shm),
            Net::Rdma => cfg.transport(Transport::Rdma),
            Net::Mesh => cfg.transport(Transport::Tcp).topology(Topology::Mesh),
            Net::MeshLocal => cfg.topology(Topology::Mesh),
            Net::Mixed => cfg.host_id(self.host(rank, size).unwrap_or_default()),
        }
    }

    /// Whether this net has the mesh topology.
    pub fn mesh(self) -> bool {
        matches!(self, Net::Mesh | Net::MeshLocal)
    }

    /// Whether collectives take the direct path (every rank shares memory).
    pub fn direct(self) -> bool {
        matches!(self, Net::Shm | Net::MeshLocal)
    }

    /// Whether ranks `a` and `b` of `size` share memory on this net.
    pub fn local(self, a: usize, b: usize, size: usize) -> bool {
        match self {
            Net::Shm | Net::MeshLocal => true,
            Net::Mixed => self.host(a, size) == self.host(b, size),
            _ => false,
        }
    }

    /// The transport this net must give between ring neighbours `a` and `b`.
    pub fn between(self, a: usize, b: usize, size: usize) -> Transport {
        match self {
            Net::Tcp | Net::Mesh => Transport::Tcp,
            Net::Shm | Net::MeshLocal => Transport::Shm,
            Net::Rdma => Transport::Rdma,
            Net::Mixed if self.host(a, size) == self.host(b, size) => Transport::Shm,
            Net::Mixed if rdma_here() => Transport::Rdma,
            Net::Mixed => Transport::Tcp,
        }
    }
}

/// The liveness window of test groups: shorter than the default, so a lost rank is found
/// quickly, but long enough for a heartbeat to get the CPU while the suites run dozens of ranks
/// on 2 cores: 500 ms once passed without one inside the RDMA VM (emulated CPUs), and once in
/// CI on the host (8 ranks of a collectives test, `rank 2 has been silent for 500ms`).
pub fn liveness_window() -> Duration {
    // Inside the emulated RDMA VM every thread runs far slower, and a heartbeat thread once
    // waited over 2 s for a CPU there (a mesh send/recv test: its rank declared rank 0
    // silent and left, and the others saw it vanish).
    match std::env::var("RDMA_VM") {
        Ok(_) => Duration::from_secs(5),
        Err(_) => Duration::from_secs(2),
    }
}

/// Configs for one group of `size` ranks on loopback, connected as `net` says.
pub fn configs(net: Net, size: usize, wires: usize, timeout: Duration) -> Vec<Config> {
    let coordinator = free_coordinator();
    let token = JobToken::new(random_token()).unwrap();
    (0..size)
        .map(|rank| {
            let cfg = Config::new(rank, size)
                .coordinator(coordinator.clone())
                .wires(wires)
                .timeout(timeout)
                .liveness(liveness_window())
                .job_token(token.clone());
            net.apply(cfg, rank, size)
        })
        .collect()
}

/// Runs `f` on every rank of a fresh group, one thread per rank, and returns the results in
/// rank order. Retries with another port if the coordinator port was taken in between.
pub fn with_group<R: Send>(
    net: Net,
    size: usize,
    wires: usize,
    f: impl Fn(&mut Group) -> R + Sync,
) -> Vec<R> {
    with_group_timeout(net, size, wires, Duration::from_secs(60), f)
}

pub fn with_group_timeout<R: Send>(
    net: Net,
    size: usize,
    wires: usize,
    timeout: Duration,
    f: impl Fn(&mut Group) -> R + Sync,
) -> Vec<R> {
    with_configs(|| configs(net, size, wires, timeout), f)
}

/// The configurations of ranks on pretend hosts: rank r on host `host_of[r]`, within reach of
/// each other as [`Net::Mixed`]'s, each call waiting up to `timeout`.
pub fn on_pretend_hosts_within(host_of: &[usize], timeout: Duration) -> Vec<Config> {
    let cfgs = configs(Net::Mixed, host_of.len(), 1, timeout);
    let ranks = cfgs.into_iter().enumerate();
    ranks
        .map(|(r, c)| c.host_id(format!("host{}", host_of[r])))
        .collect()
}

/// [`on_pretend_hosts_within`] a minute.
pub fn on_pretend_hosts(host_of: &[usize]) -> Vec<Config> {
    on_pretend_hosts_within(host_of, Duration::from_secs(60))
}

/// Like [`with_group`], with the configs `make` returns (called again for each attempt).
pub fn with_configs<R: Send>(
    make: impl Fn() -> Vec<Config>,
    f: impl Fn(&mut Group) -> R + Sync,
) -> Vec<R> {
    for _attempt in 0..5 {
        let cfgs = make();
        let results: Vec<Result<R, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = cfgs
                .into_iter()
                .map(|cfg| {
                    let f = &f;
                    s.spawn(move || jaccl::init_with(cfg).map(|mut g| f(&mut g)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let port_taken = results.iter().any(|r| {
            matches!(r, Err(Error::Bootstrap(m)) if m.contains("cannot listen on the coordinator") || m.contains("another job"))
        });
        if port_taken {
            continue;
        }
        return results
            .into_iter()
            .enumerate()
            .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}")))
            .collect();
    }
    panic!("could not find a free coordinator port in 5 attempts");
}

/// Element types the tests can generate values for and reduce with a reference.
pub trait TestElem: Element {
    /// A value for rank `rank`, index `i`, chosen so that the reduction `op` is exact
    /// whatever the order of its steps: small integers for sums (and averages), powers of two
    /// and zeros for products; for max/min they include NaN, ±0 and infinities.
    fn value(rank: usize, i: usize, op: ReduceOp) -> Self;
    /// The reference reduction of two values, written independently of the library's kernels.
    fn reference(op: ReduceOp, a: Self, b: Self) -> Self;
    /// The reference average of `sum`, the sum over `ranks` ranks.
    fn average(sum: Self, ranks: usize) -> Self;
    /// The exact bit pattern, for bit-identity checks (NaN != NaN otherwise).
    fn bits(self) -> u64;
    /// The value with -0 parts made +0: a complex product's zero parts take their sign from
    /// the order of the steps (`a.re * b.im + a.im * b.re` of zeros), which the reference does
    /// not follow.
    fn unsigned_zero(self) -> Self {
        self
    }
}

/// The reductions that apply to `T` (all eight for integers).
pub fn ops_of<T: TestElem>() -> Vec<ReduceOp> {
    ReduceOp::ALL
        .into_iter()
        .filter(|op| op.applies_to(T::DTYPE))
        .collect()
}

/// A deterministic pseudo-random number for (rank, i).
pub fn mix(rank: usize, i: usize) -> u64 {
    let mut x = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn value(rank: usize, i: usize, _op: ReduceOp) -> Self { mix(rank, i) as $t }
            fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                    _ => unreachable!("a new reduction: add its reference"),
                }
            }
            fn average(sum: Self, ranks: usize) -> Self {
                // Toward zero; a count of ranks the type cannot hold averages to 0.
                <$t>::try_from(ranks).map_or(0, |n| sum.wrapping_div(n))
            }
            fn bits(self) -> u64 { self as u64 }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

impl TestElem for bool {
    fn value(rank: usize, i: usize, op: ReduceOp) -> Self {
        match op {
            // Mostly true, so that AND is not always false.
            ReduceOp::Min | ReduceOp::Prod | ReduceOp::BitAnd => !mix(rank, i).is_multiple_of(9),
            _ => mix(rank, i).is_multiple_of(3),
        }
    }
    fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::BitOr => a || b,
            ReduceOp::Min | ReduceOp::Prod | ReduceOp::BitAnd => a && b,
            ReduceOp::BitXor => a != b,
            _ => unreachable!("{op} does not apply to bool"),
        }
    }
    fn average(_sum: Self, _ranks: usize) -> Self {
        unreachable!("avg does not apply to bool")
    }
    fn bits(self) -> u64 {
        self as u64
    }
}

/// Values for max/min: special values often, so every NaN/zero/infinity pairing occurs.
fn special_f64(rank: usize, i: usize) -> f64 {
    let m = mix(rank, i);
    match m % 10 {
        0 => f64::NAN,
        1 => 0.0,
        2 => -0.0,
        3 => f64::INFINITY,
        4 => f64::NEG_INFINITY,
        _ => ((m >> 8) % 2001) as f64 / 8.0 - 125.0,
    }
}

fn small_int(rank: usize, i: usize) -> f64 {
    (mix(rank, i) % 17) as f64 - 8.0
}

/// Values for products: ±1/2, ±1, ±2 and (rarely) zeros, so products of any number of ranks
/// are exact in every float type.
fn power_of_two(rank: usize, i: usize) -> f64 {
    let m = mix(rank, i);
    let magnitude = [0.5, 1.0, 1.0, 2.0][(m % 4) as usize];
    match (m >> 8) % 16 {
        0 => 0.0,
        1..=5 => -magnitude,
        _ => magnitude,
    }
}

/// Reference max/min over a float type: NaN wins; otherwise IEEE totalOrder (-0 < +0).
fn float_pick<T: Copy>(
    op: ReduceOp,
    a: T,
    b: T,
    is_nan: impl Fn(T) -> bool,
    less: impl Fn(T, T) -> bool,
) -> T {
    match (is_nan(a), is_nan(b)) {
        (true, false) => a,
        (false, true) => b,
        _ => match op {
            ReduceOp::Max => {
                if less(a, b) {
                    b
                } else {
                    a
                }
            }
            _ => {
                if less(b, a) {
                    b
                } else {
                    a
                }
            }
        },
    }
}

macro_rules! float_elem {
    ($($t:ty => $from:expr, $to:expr, $avg:expr),*) => {$(
        impl TestElem for $t {
            fn value(rank: usize, i: usize, op: ReduceOp) -> Self {
                let from: fn(f64) -> $t = $from;
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => from(small_int(rank, i)),
                    ReduceOp::Prod => from(power_of_two(rank, i)),
                    _ => from(special_f64(rank, i)),
                }
            }
            fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
                let (from, to): (fn(f64) -> $t, fn($t) -> f64) = ($from, $to);
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => from(to(a) + to(b)),
                    ReduceOp::Prod => from(to(a) * to(b)),
                    _ => float_pick(op, a, b, |x| x.is_nan(), |x, y| x.total_cmp(&y).is_lt()),
                }
            }
            fn average(sum: Self, ranks: usize) -> Self {
                let avg: fn($t, usize) -> $t = $avg;
                avg(sum, ranks)
            }
            fn bits(self) -> u64 { self.to_bits() as u64 }
        }
    )*};
}
// Half types divide in f32 (as documented for `ReduceOp::Avg`).
float_elem!(
    f32 => |x| x as f32, |x| x as f64, |s, n| s / n as f32,
    f64 => |x| x, |x| x, |s, n| s / n as f64,
    f16 => f16::from_f64, |x| x.to_f64(), |s, n| f16::from_f32(s.to_f32() / n as f32),
    bf16 => bf16::from_f64, |x| x.to_f64(), |s, n| bf16::from_f32(s.to_f32() / n as f32)
);

impl TestElem for Complex32 {
    fn value(rank: usize, i: usize, op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                Complex32::new(small_int(rank, i) as f32, small_int(rank, i + 7) as f32)
            }
            // Parts in {-1, 0, 1}: products of up to 64 ranks stay small exact integers.
            ReduceOp::Prod => {
                let part = |j: usize| (mix(rank, j) % 3) as f32 - 1.0;
                Complex32::new(part(i), part(i + 7))
            }
            // Few distinct real parts, so ties on re happen and im decides.
            _ => Complex32::new((mix(rank, i) % 3) as f32, special_f64(rank, i) as f32),
        }
    }
    fn reference(op: ReduceOp, a: Self, b: Self) -> Self {
        let key = |x: f32, y: f32| {
            // Under max NaN is greatest, under min least; totalOrder otherwise.
            match (x.is_nan(), y.is_nan()) {
                (true, false) => {
                    if op == ReduceOp::Max {
                        std::cmp::Ordering::Greater
                    } else {
                        std::cmp::Ordering::Less
                    }
                }
                (false, true) => {
                    if op == ReduceOp::Max {
                        std::cmp::Ordering::Less
                    } else {
                        std::cmp::Ordering::Greater
                    }
                }
                _ => x.total_cmp(&y),
            }
        };
        match op {
            ReduceOp::Sum | ReduceOp::Avg => Complex32::new(a.re + b.re, a.im + b.im),
            ReduceOp::Prod => Complex32::new(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re),
            ReduceOp::Max => {
                if key(a.re, b.re).then(key(a.im, b.im)).is_lt() {
                    b
                } else {
                    a
                }
            }
            ReduceOp::Min => {
                if key(a.re, b.re).then(key(a.im, b.im)).is_gt() {
                    b
                } else {
                    a
                }
            }
            _ => unreachable!("{op} does not apply to complex64"),
        }
    }
    fn average(sum: Self, ranks: usize) -> Self {
        Complex32::new(sum.re / ranks as f32, sum.im / ranks as f32)
    }
    fn bits(self) -> u64 {
        (self.re.to_bits() as u64) << 32 | self.im.to_bits() as u64
    }
    fn unsigned_zero(self) -> Self {
        Complex32::new(self.re + 0.0, self.im + 0.0)
    }
}

/// Inputs of every rank for a reduction test (made once for all the rank threads that ask).
pub fn inputs<T: TestElem>(size: usize, len: usize, op: ReduceOp) -> Arc<Vec<Vec<T>>> {
    shared(("inputs", TypeId::of::<T>(), size, len, op), || {
        (0..size)
            .map(|r| (0..len).map(|i| T::value(r, i, op)).collect())
            .collect()
    })
}

/// [`reference_reduce`] of [`inputs`]`(size, len, op)`, made once for all the rank threads.
pub fn expected_reduction<T: TestElem>(size: usize, len: usize, op: ReduceOp) -> Arc<Vec<T>> {
    shared(("reduction", TypeId::of::<T>(), size, len, op), || {
        reference_reduce(&inputs::<T>(size, len, op), op)
    })
}

/// What [`shared`] keeps a value under: what it is, its element type and its shape.
pub type SharedKey = (&'static str, TypeId, usize, usize, ReduceOp);
type SharedCell = Arc<OnceLock<Arc<dyn Any + Send + Sync>>>;

/// The value `make` returns for `key`, made once for every rank thread that asks while it is
/// among the last [`SHARED_KEPT`] asked for: each rank of a group checks the same inputs and
/// references, which otherwise every rank builds again (most of a suite's time with 8 ranks).
/// Threads asking while it is made wait for it.
pub fn shared<V: Any + Send + Sync>(key: SharedKey, make: impl FnOnce() -> V) -> Arc<V> {
    static KEPT: Mutex<VecDeque<(SharedKey, SharedCell)>> = Mutex::new(VecDeque::new());
    let cell = {
        let mut kept = KEPT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match kept.iter().find(|(k, _)| *k == key) {
            Some((_, cell)) => Arc::clone(cell),
            None => {
                if kept.len() == SHARED_KEPT {
                    kept.pop_front();
                }
                let cell = SharedCell::default();
                kept.push_back((key, Arc::clone(&cell)));
                cell
            }
        }
    };
    let value = Arc::clone(cell.get_or_init(|| Arc::new(make())));
    value
        .downcast()
        .expect("a shared key names one type of value")
}

/// How many values [`shared`] keeps: enough for the ranks of the groups of two suites running
/// at once, a call or two apart.
const SHARED_KEPT: usize = 16;

/// The reference all-reduce: a left fold over ranks (then the average's division).
pub fn reference_reduce<T: TestElem>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for input in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(input) {
            *a = T::reference(op, *a, *b);
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = T::average(*a, inputs.len());
        }
    }
    acc
}

pub fn bits<T: TestElem>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.bits()).collect()
}

/// The bits to compare a result of reduction `op` with the reference's: exact, except for the
/// sign of a complex product's zero parts ([`TestElem::unsigned_zero`]).
pub fn bits_for<T: TestElem>(op: ReduceOp, v: &[T]) -> Vec<u64> {
    match op {
        ReduceOp::Prod => v.iter().map(|x| x.unsigned_zero().bits()).collect(),
        _ => bits(v),
    }
}

/// Asserts that `got` is `expect`, naming the first difference (not printing whole vectors).
#[track_caller]
pub fn assert_same(got: &[u64], expect: &[u64], what: &str) {
    assert_eq!(got.len(), expect.len(), "{what}: lengths differ");
    if got == expect {
        return;
    }
    let wrong = got.iter().zip(expect).filter(|(a, b)| a != b).count();
    if let Some(i) = got.iter().zip(expect).position(|(a, b)| a != b) {
        panic!(
            "{what}: {wrong} of {} elements differ, the first at {i}: {:#x} instead of {:#x}",
            got.len(),
            got[i],
            expect[i]
        );
    }
}

/// [`assert_same`] of the values' bits, without making vectors of them (long vectors checked
/// on every rank, for every root, made most of a suite's time).
#[track_caller]
pub fn assert_same_values<T: TestElem>(got: &[T], expect: &[T], what: &str) {
    let same =
        got.len() == expect.len() && got.iter().zip(expect).all(|(a, b)| a.bits() == b.bits());
    if !same {
        assert_same(&bits(got), &bits(expect), what);
    }
}

/// Lengths that exercise the edges: empty, one, primes, not divisible by ranks × wires × 2,
/// around the small-message threshold, and large enough for both directions on every wire.
pub fn edge_lengths(size: usize, wires: usize) -> Vec<usize> {
    let lanes = size * wires * 2;
    let mut v = vec![
        0,
        1,
        2,
        3,
        7,
        13,
        97,
        lanes - 1,
        lanes,
        lanes + 1,
        4099,
        8193,
        40_009,
    ];
    v.sort_unstable();
    v.dedup();
    v
}
