//! Reduction kernels, one per dtype × op, chosen once per call, and the copy kernel.
//!
//! Kernels work on bytes so the algorithms stay untyped. They take the fast path when the bytes
//! are aligned for the element type (always, except for odd buffers passed to the raw API) and
//! an unaligned path otherwise. Operand order is fixed: the result is `own ⊕ received`.
//!
//! Max and min of floating-point values use one total order so the result does not depend on
//! the order in which ranks are combined: NaN wins (propagates), and otherwise IEEE `totalOrder`
//! decides, so `-0 < +0`. Complex numbers compare (re, im) lexicographically under that order.

use std::cmp::Ordering;

use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use num_complex::Complex32;

use crate::dtype::{Dtype, ReduceOp};

/// The kernels for one dtype × op.
#[derive(Clone, Copy)]
pub(crate) struct Reducer {
    elem: usize,
    accumulate: fn(&mut [u8], &[u8]),
    combine: fn(&mut [u8], &[u8], &[u8]),
    /// What turns the reduction over all ranks into the result (`Avg`: divide by the ranks).
    finish: Option<fn(&mut [u8], usize)>,
}

impl Reducer {
    /// The kernels of `op` over `dtype`; `None` where `op` does not apply to `dtype`
    /// ([`ReduceOp::applies_to`]).
    pub(crate) fn new(dtype: Dtype, op: ReduceOp) -> Option<Reducer> {
        if !op.applies_to(dtype) {
            return None;
        }
        macro_rules! arithmetic {
            ($t:ty) => {
                match op {
                    ReduceOp::Sum => Reducer::of::<$t, SumOp>(),
                    ReduceOp::Max => Reducer::of::<$t, MaxOp>(),
                    ReduceOp::Min => Reducer::of::<$t, MinOp>(),
                    ReduceOp::Prod => Reducer::of::<$t, ProdOp>(),
                    ReduceOp::Avg => Reducer {
                        finish: Some(divide::<$t>),
                        ..Reducer::of::<$t, SumOp>()
                    },
                    _ => return None,
                }
            };
        }
        macro_rules! integer {
            ($t:ty) => {
                match op {
                    ReduceOp::BitAnd => Reducer::of::<$t, AndOp>(),
                    ReduceOp::BitOr => Reducer::of::<$t, OrOp>(),
                    ReduceOp::BitXor => Reducer::of::<$t, XorOp>(),
                    _ => arithmetic!($t),
                }
            };
        }
        // f16/bf16 sums (and so averages) convert whole blocks to f32; the rest go element by
        // element.
        macro_rules! half {
            ($t:ty) => {
                match op {
                    ReduceOp::Sum => Reducer::half_sum::<$t>(),
                    ReduceOp::Avg => Reducer {
                        finish: Some(divide::<$t>),
                        ..Reducer::half_sum::<$t>()
                    },
                    _ => arithmetic!($t),
                }
            };
        }
        Some(match dtype {
            Dtype::Bool => match op {
                ReduceOp::Sum | ReduceOp::Max | ReduceOp::BitOr => Reducer::of::<u8, BoolOr>(),
                ReduceOp::Min | ReduceOp::Prod | ReduceOp::BitAnd => Reducer::of::<u8, BoolAnd>(),
                ReduceOp::BitXor => Reducer::of::<u8, BoolXor>(),
                _ => return None,
            },
            Dtype::Int8 => integer!(i8),
            Dtype::Int16 => integer!(i16),
            Dtype::Int32 => integer!(i32),
            Dtype::Int64 => integer!(i64),
            Dtype::UInt8 => integer!(u8),
            Dtype::UInt16 => integer!(u16),
            Dtype::UInt32 => integer!(u32),
            Dtype::UInt64 => integer!(u64),
            Dtype::Float16 => half!(f16),
            Dtype::BFloat16 => half!(bf16),
            Dtype::Float32 => arithmetic!(f32),
            Dtype::Float64 => arithmetic!(f64),
            Dtype::Complex64 => arithmetic!(Complex32),
        })
    }

    fn of<T: Pod, O: Combine<T>>() -> Reducer {
        Reducer {
            elem: size_of::<T>(),
            accumulate: accumulate::<T, O>,
            combine: combine::<T, O>,
            finish: None,
        }
    }

    fn half_sum<H: Pod>() -> Reducer
    where
        [H]: HalfFloatSliceExt,
        SumOp: Combine<H>,
    {
        Reducer {
            elem: size_of::<H>(),
            accumulate: half_sum_accumulate::<H>,
            combine: half_sum_combine::<H>,
            finish: None,
        }
    }

    /// Turns `data`, the reduction over all `ranks`, into the result (`Avg` divides it by
    /// `ranks`; the other reductions are their result already).
    pub(crate) fn finish(&self, data: &mut [u8], ranks: usize) {
        if let Some(finish) = self.finish {
            finish(data, ranks);
        }
    }

    /// Bytes per element.
    pub(crate) fn elem_size(&self) -> usize {
        self.elem
    }

    /// `dst[i] = dst[i] ⊕ src[i]` over the whole elements both slices hold.
    pub(crate) fn accumulate(&self, dst: &mut [u8], src: &[u8]) {
        (self.accumulate)(dst, src);
    }

    /// `dst[i] = own[i] ⊕ src[i]` over the whole elements all three slices hold.
    pub(crate) fn combine(&self, dst: &mut [u8], own: &[u8], src: &[u8]) {
        (self.combine)(dst, own, src);
    }
}

/// One binary operation on one element type.
trait Combine<T> {
    fn apply(own: T, received: T) -> T;
}

struct SumOp;
struct MaxOp;
struct MinOp;
struct ProdOp;
/// Bitwise AND, OR and XOR of integers.
struct AndOp;
struct OrOp;
struct XorOp;
/// `bool` sum, max and OR: logical OR of bytes, normalised to 0/1.
struct BoolOr;
/// `bool` min, product and AND: logical AND of bytes, normalised to 0/1.
struct BoolAnd;
/// `bool` XOR of bytes, normalised to 0/1.
struct BoolXor;

impl Combine<u8> for BoolOr {
    fn apply(a: u8, b: u8) -> u8 {
        u8::from(a != 0 || b != 0)
    }
}

impl Combine<u8> for BoolAnd {
    fn apply(a: u8, b: u8) -> u8 {
        u8::from(a != 0 && b != 0)
    }
}

impl Combine<u8> for BoolXor {
    fn apply(a: u8, b: u8) -> u8 {
        u8::from((a != 0) != (b != 0))
    }
}

macro_rules! integer_ops {
    ($($t:ty),*) => {$(
        impl Combine<$t> for SumOp {
            fn apply(a: $t, b: $t) -> $t { a.wrapping_add(b) }
        }
        impl Combine<$t> for MaxOp {
            fn apply(a: $t, b: $t) -> $t { a.max(b) }
        }
        impl Combine<$t> for MinOp {
            fn apply(a: $t, b: $t) -> $t { a.min(b) }
        }
        impl Combine<$t> for ProdOp {
            fn apply(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
        }
        impl Combine<$t> for AndOp {
            fn apply(a: $t, b: $t) -> $t { a & b }
        }
        impl Combine<$t> for OrOp {
            fn apply(a: $t, b: $t) -> $t { a | b }
        }
        impl Combine<$t> for XorOp {
            fn apply(a: $t, b: $t) -> $t { a ^ b }
        }
    )*};
}
integer_ops!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Division of an element by the number of ranks (`Avg`).
trait Divide: Copy {
    fn divide(self, ranks: usize) -> Self;
}

macro_rules! integer_divide {
    ($($t:ty),*) => {$(
        impl Divide for $t {
            // Rounded toward zero. A count of ranks past the type's range divides to 0.
            fn divide(self, ranks: usize) -> Self {
                match <$t>::try_from(ranks) {
                    Ok(n) if n != 0 => self.wrapping_div(n),
                    _ => 0,
                }
            }
        }
    )*};
}
integer_divide!(i8, i16, i32, i64, u8, u16, u32, u64);

impl Divide for f32 {
    fn divide(self, ranks: usize) -> Self {
        self / ranks as f32
    }
}

impl Divide for f64 {
    fn divide(self, ranks: usize) -> Self {
        self / ranks as f64
    }
}

macro_rules! half_divide {
    ($($t:ty),*) => {$(
        impl Divide for $t {
            fn divide(self, ranks: usize) -> Self {
                <$t>::from_f32(self.to_f32() / ranks as f32)
            }
        }
        impl Combine<$t> for ProdOp {
            fn apply(a: $t, b: $t) -> $t { <$t>::from_f32(a.to_f32() * b.to_f32()) }
        }
    )*};
}
half_divide!(f16, bf16);

impl Divide for Complex32 {
    fn divide(self, ranks: usize) -> Self {
        self / ranks as f32
    }
}

/// Divides every element of `data` by `ranks`.
fn divide<T: Pod + Divide>(data: &mut [u8], ranks: usize) {
    let bytes = whole_elements::<T>(data.len());
    let data = &mut data[..bytes];
    if let Ok(values) = bytemuck::try_cast_slice_mut::<u8, T>(data) {
        for v in values {
            *v = v.divide(ranks);
        }
        return;
    }
    for chunk in data.chunks_exact_mut(size_of::<T>()) {
        let value: T = bytemuck::pod_read_unaligned(chunk);
        chunk.copy_from_slice(bytemuck::bytes_of(&value.divide(ranks)));
    }
}

/// What max/min need of a floating-point type.
trait Float: Copy {
    fn nan(self) -> bool;
    fn total(&self, other: &Self) -> Ordering;
}

macro_rules! float_impl {
    ($($t:ty),*) => {$(
        impl Float for $t {
            fn nan(self) -> bool { self.is_nan() }
            fn total(&self, other: &Self) -> Ordering { self.total_cmp(other) }
        }
    )*};
}
float_impl!(f16, bf16, f32, f64);

/// The order max uses: every NaN above every number, IEEE totalOrder otherwise.
fn max_order<F: Float>(a: F, b: F) -> Ordering {
    match (a.nan(), b.nan()) {
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.total(&b),
    }
}

/// The order min uses: every NaN below every number, IEEE totalOrder otherwise.
fn min_order<F: Float>(a: F, b: F) -> Ordering {
    match (a.nan(), b.nan()) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => a.total(&b),
    }
}

macro_rules! float_ops {
    ($($t:ty),*) => {$(
        impl Combine<$t> for MaxOp {
            fn apply(a: $t, b: $t) -> $t {
                if max_order(a, b) == Ordering::Less { b } else { a }
            }
        }
        impl Combine<$t> for MinOp {
            fn apply(a: $t, b: $t) -> $t {
                if min_order(a, b) == Ordering::Greater { b } else { a }
            }
        }
    )*};
}
float_ops!(f16, bf16, f32, f64);

impl Combine<f32> for SumOp {
    fn apply(a: f32, b: f32) -> f32 {
        a + b
    }
}

impl Combine<f64> for SumOp {
    fn apply(a: f64, b: f64) -> f64 {
        a + b
    }
}

impl Combine<f32> for ProdOp {
    fn apply(a: f32, b: f32) -> f32 {
        a * b
    }
}

impl Combine<f64> for ProdOp {
    fn apply(a: f64, b: f64) -> f64 {
        a * b
    }
}

impl Combine<Complex32> for ProdOp {
    fn apply(a: Complex32, b: Complex32) -> Complex32 {
        a * b
    }
}

/// Element-wise f16/bf16 sum for the unaligned path (the aligned path converts whole blocks).
macro_rules! half_sum_op {
    ($($t:ty),*) => {$(
        impl Combine<$t> for SumOp {
            fn apply(a: $t, b: $t) -> $t { <$t>::from_f32(a.to_f32() + b.to_f32()) }
        }
    )*};
}
half_sum_op!(f16, bf16);

impl Combine<Complex32> for SumOp {
    fn apply(a: Complex32, b: Complex32) -> Complex32 {
        a + b
    }
}

impl Combine<Complex32> for MaxOp {
    fn apply(a: Complex32, b: Complex32) -> Complex32 {
        let order = max_order(a.re, b.re).then_with(|| max_order(a.im, b.im));
        if order == Ordering::Less { b } else { a }
    }
}

impl Combine<Complex32> for MinOp {
    fn apply(a: Complex32, b: Complex32) -> Complex32 {
        let order = min_order(a.re, b.re).then_with(|| min_order(a.im, b.im));
        if order == Ordering::Greater { b } else { a }
    }
}

fn accumulate<T: Pod, O: Combine<T>>(dst: &mut [u8], src: &[u8]) {
    let bytes = whole_elements::<T>(dst.len().min(src.len()));
    let (dst, src) = (&mut dst[..bytes], &src[..bytes]);
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        for (d, s) in d.iter_mut().zip(s) {
            *d = O::apply(*d, *s);
        }
        return;
    }
    let size = size_of::<T>();
    for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
        let value = O::apply(
            bytemuck::pod_read_unaligned(d),
            bytemuck::pod_read_unaligned(s),
        );
        d.copy_from_slice(bytemuck::bytes_of(&value));
    }
}

fn combine<T: Pod, O: Combine<T>>(dst: &mut [u8], own: &[u8], src: &[u8]) {
    let bytes = whole_elements::<T>(dst.len().min(own.len()).min(src.len()));
    let (dst, own, src) = (&mut dst[..bytes], &own[..bytes], &src[..bytes]);
    if let (Ok(d), Ok(a), Ok(b)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(own),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        for ((d, a), b) in d.iter_mut().zip(a).zip(b) {
            *d = O::apply(*a, *b);
        }
        return;
    }
    let size = size_of::<T>();
    for ((d, a), b) in dst
        .chunks_exact_mut(size)
        .zip(own.chunks_exact(size))
        .zip(src.chunks_exact(size))
    {
        let value = O::apply(
            bytemuck::pod_read_unaligned(a),
            bytemuck::pod_read_unaligned(b),
        );
        d.copy_from_slice(bytemuck::bytes_of(&value));
    }
}

/// Copies `src` into `dst` (same length) in 64-byte blocks of vector moves. Used for every copy
/// into or out of shared memory and every copy of a vector inside a collective: glibc's
/// `memcpy` switches to `rep movsb` above about 2 KiB, which on this AMD EPYC VM moved 2.4 GB/s
/// instead of 42 GB/s when the other core held the lines (a rank's area, which its peer just
/// read), and randomly so, by buffer placement; over TCP, with 3 ranks, `memcpy` took 15% of
/// the samples of an in-place all-reduce of 32 KiB (8% out of place), 158 µs instead of 124.
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    let (dst_blocks, dst_tail) = dst.as_chunks_mut::<64>();
    let (src_blocks, src_tail) = src.as_chunks::<64>();
    for (d, s) in dst_blocks.iter_mut().zip(src_blocks) {
        *d = *s;
        // Keeps LLVM from turning this loop back into a `memcpy` call (no instruction).
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    dst_tail.copy_from_slice(src_tail);
}

fn whole_elements<T>(bytes: usize) -> usize {
    bytes - bytes % size_of::<T>()
}

/// f16/bf16 sums convert blocks to f32 with half's vectorised conversions. Elements per block: small enough for the stack, large enough to vectorise.
const HALF_BLOCK: usize = 256;

fn half_sum_accumulate<H: Pod>(dst: &mut [u8], src: &[u8])
where
    [H]: HalfFloatSliceExt,
    SumOp: Combine<H>,
{
    let bytes = whole_elements::<H>(dst.len().min(src.len()));
    let (dst, src) = (&mut dst[..bytes], &src[..bytes]);
    let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, H>(dst),
        bytemuck::try_cast_slice::<u8, H>(src),
    ) else {
        return accumulate::<H, SumOp>(dst, src);
    };
    let (mut a, mut b) = ([0f32; HALF_BLOCK], [0f32; HALF_BLOCK]);
    for (d, s) in d.chunks_mut(HALF_BLOCK).zip(s.chunks(HALF_BLOCK)) {
        let (a, b) = (&mut a[..d.len()], &mut b[..d.len()]);
        d.convert_to_f32_slice(a);
        s.convert_to_f32_slice(b);
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x += *y;
        }
        d.convert_from_f32_slice(a);
    }
}

fn half_sum_combine<H: Pod>(dst: &mut [u8], own: &[u8], src: &[u8])
where
    [H]: HalfFloatSliceExt,
    SumOp: Combine<H>,
{
    let bytes = whole_elements::<H>(dst.len().min(own.len()).min(src.len()));
    dst[..bytes].copy_from_slice(&own[..bytes]);
    half_sum_accumulate::<H>(&mut dst[..bytes], &src[..bytes]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_copies_every_length() {
        for n in [0usize, 1, 63, 64, 65, 1000, 4096 + 17] {
            let src: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let mut dst = vec![0u8; n];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "{n}");
        }
    }

    fn bytes<T: Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    fn reduce<T: Pod + crate::dtype::Element>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
        let r = Reducer::new(T::DTYPE, op).expect("op applies");
        let mut acc = bytes(a);
        r.accumulate(&mut acc, &bytes(b));
        let mut out = vec![0u8; acc.len()];
        r.combine(&mut out, &bytes(a), &bytes(b));
        assert_eq!(acc, out, "in-place and out-of-place kernels agree");
        bytemuck::cast_slice(&acc).to_vec()
    }

    #[test]
    fn integer_sum_wraps() {
        assert_eq!(reduce(ReduceOp::Sum, &[i8::MAX, -3], &[1, 5]), [i8::MIN, 2]);
        assert_eq!(reduce(ReduceOp::Sum, &[u64::MAX], &[2u64]), [1]);
        assert_eq!(reduce(ReduceOp::Max, &[-1i32, 7], &[3, -9]), [3, 7]);
        assert_eq!(reduce(ReduceOp::Min, &[-1i64, 7], &[3, -9]), [-1, -9]);
    }

    #[test]
    fn bool_is_or_and_and_normalises() {
        let r = Reducer::new(Dtype::Bool, ReduceOp::Sum).unwrap();
        let mut acc = vec![0u8, 0, 5, 9];
        r.accumulate(&mut acc, &[0, 3, 0, 1]);
        assert_eq!(acc, [0, 1, 1, 1]);
        let r = Reducer::new(Dtype::Bool, ReduceOp::Min).unwrap();
        let mut acc = vec![0u8, 0, 5, 9];
        r.accumulate(&mut acc, &[0, 3, 0, 200]);
        assert_eq!(acc, [0, 0, 0, 1]);
    }

    #[test]
    fn float_max_min_propagate_nan_and_order_signed_zero() {
        let nan = f32::NAN;
        let max = reduce(
            ReduceOp::Max,
            &[1.0f32, nan, 2.0, -0.0],
            &[nan, 1.0, 3.0, 0.0],
        );
        assert!(max[0].is_nan() && max[1].is_nan());
        assert_eq!(max[2], 3.0);
        assert!(max[3] == 0.0 && max[3].is_sign_positive());
        let min = reduce(
            ReduceOp::Min,
            &[1.0f64, f64::NAN, -0.0],
            &[f64::NAN, 1.0, 0.0],
        );
        assert!(min[0].is_nan() && min[1].is_nan());
        assert!(min[2] == 0.0 && min[2].is_sign_negative());
    }

    #[test]
    fn max_min_do_not_depend_on_operand_order() {
        let vals = [
            f32::NAN,
            -f32::NAN,
            0.0,
            -0.0,
            1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for op in [ReduceOp::Max, ReduceOp::Min] {
            for &a in &vals {
                for &b in &vals {
                    let ab = reduce(op, &[a], &[b])[0];
                    let ba = reduce(op, &[b], &[a])[0];
                    assert_eq!(ab.to_bits(), ba.to_bits(), "{op} {a} {b}");
                }
            }
        }
    }

    #[test]
    fn half_sum_rounds_through_f32_each_step() {
        let a: Vec<f16> = (0..1000).map(|i| f16::from_f32(i as f32 * 0.37)).collect();
        let b: Vec<f16> = (0..1000).map(|i| f16::from_f32(i as f32 * -0.11)).collect();
        let got = reduce(ReduceOp::Sum, &a, &b);
        for ((x, y), g) in a.iter().zip(&b).zip(&got) {
            assert_eq!(
                f16::from_f32(x.to_f32() + y.to_f32()).to_bits(),
                g.to_bits()
            );
        }
        let a: Vec<bf16> = (0..300).map(|i| bf16::from_f32(i as f32 * 1.7)).collect();
        let got = reduce(ReduceOp::Sum, &a, &a);
        for (x, g) in a.iter().zip(&got) {
            assert_eq!(bf16::from_f32(x.to_f32() * 2.0).to_bits(), g.to_bits());
        }
    }

    #[test]
    fn complex_max_is_lexicographic() {
        let a = [Complex32::new(1.0, 5.0), Complex32::new(2.0, 0.0)];
        let b = [Complex32::new(1.0, 6.0), Complex32::new(1.0, 9.0)];
        assert_eq!(reduce(ReduceOp::Max, &a, &b), [b[0], a[1]]);
        assert_eq!(reduce(ReduceOp::Min, &a, &b), [a[0], b[1]]);
        assert_eq!(
            reduce(ReduceOp::Sum, &a, &b),
            [Complex32::new(2.0, 11.0), Complex32::new(3.0, 9.0)]
        );
    }

    #[test]
    fn unaligned_bytes_give_the_same_result() {
        let a: Vec<f64> = (0..33).map(|i| i as f64 * 1.25).collect();
        let b: Vec<f64> = (0..33).map(|i| i as f64 * -0.5).collect();
        let expect = reduce(ReduceOp::Sum, &a, &b);
        let r = Reducer::new(Dtype::Float64, ReduceOp::Sum).unwrap();
        let mut dst = vec![0u8; 33 * 8 + 1];
        let mut src = vec![0u8; 33 * 8 + 1];
        dst[1..].copy_from_slice(&bytes(&a));
        src[1..].copy_from_slice(&bytes(&b));
        r.accumulate(&mut dst[1..], &src[1..]);
        assert_eq!(&dst[1..], &bytes(&expect)[..]);
    }

    #[test]
    fn partial_trailing_element_is_left_alone() {
        let r = Reducer::new(Dtype::Int32, ReduceOp::Sum).unwrap();
        let mut dst = vec![1u8, 0, 0, 0, 9, 9];
        r.accumulate(&mut dst, &[1, 0, 0, 0, 1, 1]);
        assert_eq!(dst, [2, 0, 0, 0, 9, 9]);
    }

    #[test]
    fn products_and_bitwise_ops() {
        assert_eq!(
            reduce(ReduceOp::Prod, &[3i8, -2, 100], &[5, 7, 3]),
            [15, -14, 44]
        );
        assert_eq!(
            reduce(ReduceOp::Prod, &[1.5f32, -2.0], &[4.0, 0.25]),
            [6.0, -0.5]
        );
        let h = reduce(ReduceOp::Prod, &[f16::from_f32(1.5)], &[f16::from_f32(3.0)]);
        assert_eq!(h[0].to_f32(), 4.5);
        let c = reduce(
            ReduceOp::Prod,
            &[Complex32::new(1.0, 2.0)],
            &[Complex32::new(3.0, -1.0)],
        );
        assert_eq!(c, [Complex32::new(5.0, 5.0)]);
        assert_eq!(reduce(ReduceOp::BitAnd, &[0b1100u16], &[0b1010]), [0b1000]);
        assert_eq!(reduce(ReduceOp::BitOr, &[0b1100u16], &[0b1010]), [0b1110]);
        assert_eq!(reduce(ReduceOp::BitXor, &[-1i64], &[5]), [!5]);
        let r = Reducer::new(Dtype::Bool, ReduceOp::BitXor).unwrap();
        let mut acc = vec![0u8, 0, 7, 7];
        r.accumulate(&mut acc, &[0, 2, 0, 1]);
        assert_eq!(acc, [0, 1, 1, 0]);
    }

    #[test]
    fn average_divides_the_sum_and_integers_round_toward_zero() {
        let avg = |op_dtype: Dtype, sum: Vec<u8>, ranks: usize| {
            let r = Reducer::new(op_dtype, ReduceOp::Avg).unwrap();
            let mut data = sum;
            r.finish(&mut data, ranks);
            data
        };
        let got = avg(Dtype::Int32, bytes(&[7i32, -7, 6]), 2);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&got), [3, -3, 3]);
        let got = avg(Dtype::UInt8, bytes(&[255u8]), 300);
        assert_eq!(got, [0], "more ranks than the type holds divide to 0");
        let got = avg(Dtype::Float32, bytes(&[3.0f32]), 4);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&got), [0.75]);
        let got = avg(Dtype::BFloat16, bytes(&[bf16::from_f32(6.0)]), 3);
        assert_eq!(bytemuck::cast_slice::<u8, bf16>(&got)[0].to_f32(), 2.0);
        // Unaligned data divides too.
        let mut data = [0u8; 9];
        data[1..].copy_from_slice(&bytes(&[10.0f64]));
        Reducer::new(Dtype::Float64, ReduceOp::Avg)
            .unwrap()
            .finish(&mut data[1..], 4);
        assert_eq!(&data[1..], &bytes(&[2.5f64])[..]);
        // Sum, max... are their own result.
        let mut data = bytes(&[6i32]);
        Reducer::new(Dtype::Int32, ReduceOp::Sum)
            .unwrap()
            .finish(&mut data, 3);
        assert_eq!(data, bytes(&[6i32]));
    }

    #[test]
    fn ops_that_do_not_apply_have_no_kernels() {
        for dtype in Dtype::ALL {
            for op in ReduceOp::ALL {
                assert_eq!(
                    Reducer::new(dtype, op).is_some(),
                    op.applies_to(dtype),
                    "{op} {dtype}"
                );
            }
        }
        assert!(Reducer::new(Dtype::Float32, ReduceOp::BitAnd).is_none());
        assert!(Reducer::new(Dtype::Bool, ReduceOp::Avg).is_none());
    }
}
