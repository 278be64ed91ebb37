//! mimalloc as the global allocator, as the `mimalloc` crate provides it, but with mimalloc's
//! plain calls (`mi_malloc`, `mi_zalloc`, `mi_realloc`) wherever their blocks already have the
//! alignment asked for, which is nearly every allocation a Rust program makes.
//!
//! The `mimalloc` crate passes every allocation to `mi_malloc_aligned`, with Rust's alignment.
//! In mimalloc 3, when that call's fast path finds no free block at hand (every block larger than
//! 1 KiB, and a small one whenever its page's free list runs out), it takes the plain path only
//! for block sizes that are powers of two; anything else, a 1,248-byte header map of alignment 8
//! say, goes through a slower path that allocates its size plus the alignment. In the bench's
//! pass-through that was 15 of the 70 or so
//! allocations of a proxied GET. With the plain calls the gateway makes 72,909 instructions a GET
//! against 75,848 (callgrind, 3.9%), as `bench/history.md` reports (the run of 01:21 on
//! 2026-11-28 against that of 21:50 the day before). The `mimalloc` crate has the same change
//! proposed (purpleprotocol/mimalloc_rust pull request 170).
//!
//! When is a plain block aligned enough? mimalloc's block sizes are multiples of 8, every page's
//! first block is aligned to 16 at least, and a block of 16 bytes or more is aligned to 16
//! (mimalloc asserts so in `mi_page_malloc_zero`, `alloc.c`). So a plain block serves any alignment up to
//! 8, and an alignment of 16 for 16 bytes or more; the aligned calls serve the rest. This holds
//! without mimalloc's padding (its `secure` and `debug` builds), which the workspace does not
//! enable.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// mimalloc, with plain calls wherever they give the alignment asked for (see the crate's
/// documentation). Set it as the binary's `#[global_allocator]`.
pub struct MiMalloc;

/// Whether mimalloc's plain calls give `size` bytes aligned to `align`.
#[inline]
fn plain_suffices(size: usize, align: usize) -> bool {
    align <= 8 || (align <= 16 && size >= 16)
}

/// `layout`'s block from mimalloc's `plain` call where it gives the alignment, else from its
/// `aligned` one.
///
/// # Safety
/// `plain` and `aligned` must be a pair of mimalloc's allocation calls (`mi_malloc` and
/// `mi_malloc_aligned`, or `mi_zalloc` and `mi_zalloc_aligned`).
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn allocate(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: the caller's: mimalloc's allocation calls have no preconditions.
    unsafe {
        if plain_suffices(layout.size(), layout.align()) {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

// SAFETY: every call is one of mimalloc's, which returns memory of at least `size` bytes aligned
// as asked (the aligned calls by contract; the plain ones where `plain_suffices`, see above), or
// null; `mi_free` takes a pointer from any of them.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocation calls have no preconditions.
        unsafe {
            allocate(
                layout,
                libmimalloc_sys::mi_malloc,
                libmimalloc_sys::mi_malloc_aligned,
            )
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe {
            allocate(
                layout,
                libmimalloc_sys::mi_zalloc,
                libmimalloc_sys::mi_zalloc_aligned,
            )
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract), so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator, so from mimalloc; either call moves the block
        // if it must, and mimalloc's `realloc` of a block it over-allocated for alignment
        // copies from where the block's data begins.
        unsafe {
            if plain_suffices(new_size, layout.align()) {
                libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}
