#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::unreadable_literal)]
#![allow(clippy::missing_safety_doc)]
#![allow(clippy::upper_case_acronyms)]
#![allow(clippy::uninlined_format_args)]
#![no_std]

use ::core::ptr;

/// Common error message for converting between C `size_t` and Rust `usize`;
pub const SIZE_T_ERROR: &str =
    "conversion between C type 'size_t' and Rust type 'usize' overflowed.";

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(not(feature = "bindgen"))]
include!(concat!("bindings/", bindings_env!("TARGET"), ".rs"));

#[cfg(target_pointer_width = "64")]
include!("inlines/ptr_64.rs");

#[cfg(target_pointer_width = "32")]
include!("inlines/ptr_32_nan_boxing.rs");

include!("inlines/common.rs");

// Portico's additions to quickjs.c (PORTICO.md).
extern "C" {
    /// A plain object with `count` distinct properties `atoms` = `values` (taken over), writable,
    /// enumerable and configurable, made from the shape earlier objects of the same keys left.
    pub fn JS_NewPlainObjectFrom(
        ctx: *mut JSContext,
        count: ::core::ffi::c_int,
        atoms: *const JSAtom,
        values: *mut JSValue,
    ) -> JSValue;
    /// An ordinary object's own enumerable string-keyed data properties in key order, borrowed; -1 for any
    /// other object (see quickjs.c).
    pub fn JS_GetOwnDataProperties(
        ctx: *mut JSContext,
        obj: JSValue,
        atoms: *mut JSAtom,
        values: *mut JSValue,
        max: ::core::ffi::c_int,
    ) -> ::core::ffi::c_int;
    /// A fast array's elements, borrowed.
    pub fn JS_GetFastArrayValues(
        ctx: *mut JSContext,
        obj: JSValue,
        values: *mut *mut JSValue,
        count: *mut u32,
    ) -> bool;
}
