//! Element types: the 14 [`Dtype`]s, the sealed [`Element`] trait that maps Rust types onto them,
//! and [`ReduceOp`].

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use num_complex::Complex32;

/// The element types jaccl reduces and moves. The numeric ids are upstream JACCL's (a wire and ABI
/// contract): `Bool = 0` ... `Complex64 = 13`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Dtype {
    /// `bool`; travels as one byte, 0 or 1.
    Bool = 0,
    /// `i8`.
    Int8 = 1,
    /// `i16`.
    Int16 = 2,
    /// `i32`.
    Int32 = 3,
    /// `i64`.
    Int64 = 4,
    /// `u8`.
    UInt8 = 5,
    /// `u16`.
    UInt16 = 6,
    /// `u32`.
    UInt32 = 7,
    /// `u64`.
    UInt64 = 8,
    /// IEEE half precision, [`half::f16`].
    Float16 = 9,
    /// bfloat16, [`half::bf16`].
    BFloat16 = 10,
    /// `f32`.
    Float32 = 11,
    /// `f64`.
    Float64 = 12,
    /// Two `f32`s, [`num_complex::Complex32`].
    Complex64 = 13,
}

impl Dtype {
    /// All 14 dtypes in id order.
    pub const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::UInt8,
        Dtype::UInt16,
        Dtype::UInt32,
        Dtype::UInt64,
        Dtype::Float16,
        Dtype::BFloat16,
        Dtype::Float32,
        Dtype::Float64,
        Dtype::Complex64,
    ];

    /// The upstream id (0..=13).
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The dtype with upstream id `id`, if there is one.
    pub fn from_id(id: u8) -> Option<Dtype> {
        Dtype::ALL.get(usize::from(id)).copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Int8 | Dtype::UInt8 => 1,
            Dtype::Int16 | Dtype::UInt16 | Dtype::Float16 | Dtype::BFloat16 => 2,
            Dtype::Int32 | Dtype::UInt32 | Dtype::Float32 => 4,
            Dtype::Int64 | Dtype::UInt64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    /// The short name used in messages and by `jaccl bench --dtype` (`f32`, `bf16`, `c64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Int8 => "i8",
            Dtype::Int16 => "i16",
            Dtype::Int32 => "i32",
            Dtype::Int64 => "i64",
            Dtype::UInt8 => "u8",
            Dtype::UInt16 => "u16",
            Dtype::UInt32 => "u32",
            Dtype::UInt64 => "u64",
            Dtype::Float16 => "f16",
            Dtype::BFloat16 => "bf16",
            Dtype::Float32 => "f32",
            Dtype::Float64 => "f64",
            Dtype::Complex64 => "c64",
        }
    }

    /// The upstream (MLX/numpy) name: `float32`, `bfloat16`, `complex64`, ...
    pub fn long_name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::UInt8 => "uint8",
            Dtype::UInt16 => "uint16",
            Dtype::UInt32 => "uint32",
            Dtype::UInt64 => "uint64",
            Dtype::Float16 => "float16",
            Dtype::BFloat16 => "bfloat16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Complex64 => "complex64",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = String;

    /// Accepts the short and the long names (`f32`, `float32`), case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == lower || d.long_name() == lower)
            .ok_or_else(|| {
                let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
                format!("unknown dtype '{s}' (expected one of {})", names.join(", "))
            })
    }
}

/// How a reduction (all-reduce, reduce-scatter, reduce...) combines the ranks' elements.
///
/// | op | integers | `bool` | floats (`f16`, `bf16`, `f32`, `f64`) | `Complex32` |
/// |---|---|---|---|---|
/// | `Sum` | wrapping sum | OR | sum | sum |
/// | `Max`, `Min` | | OR, AND | NaN propagates; `-0 < +0` | (re, im) lexicographic |
/// | `Prod` | wrapping product | AND | product | complex product |
/// | `Avg` | wrapping sum ÷ ranks, rounded toward zero | — | sum ÷ ranks | sum ÷ ranks |
/// | `BitAnd`, `BitOr`, `BitXor` | bitwise | AND, OR, XOR | — | — |
///
/// A dash is [`crate::Error::InvalidArgument`] ([`ReduceOp::applies_to`]). `f16` and `bf16`
/// are computed in `f32` and rounded back after each step. `Avg` sums in the fixed order every
/// reduction uses, then each rank divides the same sum by the number of ranks, so every rank
/// gets the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum; integers wrap, `bool` acts as OR.
    Sum = 0,
    /// Maximum; floats propagate NaN, complex numbers compare (re, im), `bool` acts as OR.
    Max = 1,
    /// Minimum; floats propagate NaN, complex numbers compare (re, im), `bool` acts as AND.
    Min = 2,
    /// Product; integers wrap, `bool` acts as AND.
    Prod = 3,
    /// The sum divided by the number of ranks (integers: rounded toward zero). Not for `bool`.
    Avg = 4,
    /// Bitwise AND of integers (`bool`: AND). Not for floats or complex numbers.
    BitAnd = 5,
    /// Bitwise OR of integers (`bool`: OR). Not for floats or complex numbers.
    BitOr = 6,
    /// Bitwise XOR of integers (`bool`: XOR). Not for floats or complex numbers.
    BitXor = 7,
}

impl ReduceOp {
    /// Every reduction, in id order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::Avg,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// `sum`, `max`, `min`, `prod`, `avg`, `band`, `bor` or `bxor`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
            ReduceOp::Avg => "avg",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// Whether this reduction is defined for `dtype` (the table of [`ReduceOp`]).
    pub fn applies_to(self, dtype: Dtype) -> bool {
        let integer = !matches!(
            dtype,
            Dtype::Float16 | Dtype::BFloat16 | Dtype::Float32 | Dtype::Float64 | Dtype::Complex64
        );
        match self {
            ReduceOp::Sum | ReduceOp::Prod => true,
            ReduceOp::Max | ReduceOp::Min => true,
            ReduceOp::Avg => dtype != Dtype::Bool,
            ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => integer,
        }
    }

    pub(crate) fn from_id(id: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(id)).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = String;

    /// The names of [`ReduceOp::name`], and `product`, `mean`, `bitand`, `bitor`, `bitxor`
    /// (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "product" => "prod",
            "mean" | "average" => "avg",
            "bitand" => "band",
            "bitor" => "bor",
            "bitxor" => "bxor",
            other => other,
        };
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == alias)
            .ok_or_else(|| {
                let names: Vec<&str> = ReduceOp::ALL.iter().map(|op| op.name()).collect();
                format!(
                    "unknown reduction '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// A Rust type jaccl can move and reduce. Implemented for exactly the 14 [`Dtype`]s: `bool`,
/// `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32`, `u64`, [`half::f16`], [`half::bf16`], `f32`,
/// `f64` and [`num_complex::Complex32`]. Sealed: other crates cannot implement it.
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static
{
    /// The dtype of this type.
    const DTYPE: Dtype;
}

pub(crate) mod sealed {
    use std::borrow::Cow;

    /// Byte views of element slices. Types whose every bit pattern is valid are viewed in place;
    /// `bool` goes through a byte copy, so bytes from the network never become an invalid `bool`.
    pub trait Sealed: Sized {
        /// The elements as bytes.
        fn as_bytes(values: &[Self]) -> Cow<'_, [u8]>;
        /// Runs `f` on the elements as writable bytes, and makes the result valid elements again.
        fn with_bytes_mut<R>(values: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R;
    }
}

macro_rules! plain_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn as_bytes(values: &[Self]) -> Cow<'_, [u8]> {
                Cow::Borrowed(bytemuck::cast_slice(values))
            }
            fn with_bytes_mut<R>(values: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R {
                f(bytemuck::cast_slice_mut(values))
            }
        }
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

plain_element!(
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    u8 => UInt8, u16 => UInt16, u32 => UInt32, u64 => UInt64,
    f16 => Float16, bf16 => BFloat16, f32 => Float32, f64 => Float64,
    Complex32 => Complex64,
);

impl sealed::Sealed for bool {
    fn as_bytes(values: &[Self]) -> Cow<'_, [u8]> {
        Cow::Owned(values.iter().map(|&b| u8::from(b)).collect())
    }

    fn with_bytes_mut<R>(values: &mut [Self], f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut bytes: Vec<u8> = values.iter().map(|&b| u8::from(b)).collect();
        let result = f(&mut bytes);
        for (value, byte) in values.iter_mut().zip(&bytes) {
            *value = *byte != 0;
        }
        result
    }
}

impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_upstream_ids_and_round_trip() {
        for (i, d) in Dtype::ALL.iter().enumerate() {
            assert_eq!(usize::from(d.id()), i);
            assert_eq!(Dtype::from_id(d.id()), Some(*d));
            assert_eq!(d.name().parse::<Dtype>(), Ok(*d));
            assert_eq!(d.long_name().parse::<Dtype>(), Ok(*d));
        }
        assert_eq!(Dtype::from_id(14), None);
        assert_eq!(Dtype::Float32 as u8, 11);
        assert_eq!(Dtype::Complex64 as u8, 13);
        assert!("float128".parse::<Dtype>().is_err());
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_id(op as u8), Some(op));
            assert_eq!(op.name().parse::<ReduceOp>(), Ok(op));
        }
        assert_eq!("PRODUCT".parse::<ReduceOp>(), Ok(ReduceOp::Prod));
        assert!("xor".parse::<ReduceOp>().is_err());
        assert!(!ReduceOp::BitXor.applies_to(Dtype::Float32));
        assert!(ReduceOp::BitXor.applies_to(Dtype::Bool));
        assert!(!ReduceOp::Avg.applies_to(Dtype::Bool));
        assert!(ReduceOp::Avg.applies_to(Dtype::Int8));
    }

    #[test]
    fn sizes_match_rust_types() {
        fn check<T: Element>() {
            assert_eq!(T::DTYPE.size(), size_of::<T>(), "{}", T::DTYPE);
        }
        check::<bool>();
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f16>();
        check::<bf16>();
        check::<f32>();
        check::<f64>();
        check::<Complex32>();
    }

    #[test]
    fn bool_bytes_are_normalised() {
        use sealed::Sealed;
        let mut v = [true, false, true];
        bool::with_bytes_mut(&mut v, |b| {
            assert_eq!(b, &[1, 0, 1]);
            b.copy_from_slice(&[0, 7, 255]);
        });
        assert_eq!(v, [false, true, true]);
    }
}
