//! A collective's forms: the typed method over slices of `T` and the `_raw` one over bytes
//! for bindings to other languages, both generated from one description over the collective's
//! byte-level method, which checks the arguments and runs the call.

use crate::dtype::Element;

/// A collective's typed method and its `_raw` form, both over its byte-level one: the
/// typed one over slices of `T`, the raw one over bytes holding elements of a `dtype` given
/// after the buffers (checked to be whole numbers of elements), each followed by the
/// collective's other arguments. A variable-size collective's `counts` come before the
/// `dtype`. One description per collective, so a new one is an entry plus its byte-level
/// method.
macro_rules! typed_and_raw {
    (
        $(#[$typed_doc:meta])*
        fn $typed:ident(counts: &[usize] $(, $arg:ident: $ty:ty)*);
        $(#[$raw_doc:meta])*
        fn $raw:ident;
        $op:expr => $bytes:ident
    ) => {
        typed_and_raw! {
            @forms [counts: &[usize]] [$($arg: $ty),*]
            $(#[$typed_doc])* fn $typed; $(#[$raw_doc])* fn $raw; $op => $bytes
        }
    };
    (
        $(#[$typed_doc:meta])*
        fn $typed:ident($($arg:ident: $ty:ty),*);
        $(#[$raw_doc:meta])*
        fn $raw:ident;
        $op:expr => $bytes:ident
    ) => {
        typed_and_raw! {
            @forms [] [$($arg: $ty),*]
            $(#[$typed_doc])* fn $typed; $(#[$raw_doc])* fn $raw; $op => $bytes
        }
    };
    (
        @forms [$($pre:ident: $pre_ty:ty),*] [$($arg:ident: $ty:ty),*]
        $(#[$typed_doc:meta])* fn $typed:ident;
        $(#[$raw_doc:meta])* fn $raw:ident;
        $op:expr => $bytes:ident
    ) => {
        $(#[$typed_doc])*
        pub fn $typed<T: Element>(
            &mut self,
            input: &[T],
            output: &mut [T],
            $($pre: $pre_ty,)*
            $($arg: $ty),*
        ) -> Result<()> {
            typed(input, output, |i, o| self.$bytes(i, o, $($pre,)* T::DTYPE, $($arg),*))
        }

        $(#[$raw_doc])*
        pub fn $raw(
            &mut self,
            input: &[u8],
            output: &mut [u8],
            $($pre: $pre_ty,)*
            dtype: Dtype,
            $($arg: $ty),*
        ) -> Result<()> {
            let buffers = [("input", input.len())];
            self.raw($op, dtype, &buffers, ("output", output), |g, out| {
                g.$bytes(input, out, $($pre,)* dtype, $($arg),*)
            })
        }
    };
}
pub(super) use typed_and_raw;

/// A typed call on bytes: `input` and `output` viewed as the bytes of their elements (`bool`s
/// are normalised on the way back).
pub(super) fn typed<T: Element, R>(
    input: &[T],
    output: &mut [T],
    f: impl FnOnce(&[u8], &mut [u8]) -> R,
) -> R {
    let input = T::as_bytes(input);
    T::with_bytes_mut(output, |out| f(&input, out))
}
