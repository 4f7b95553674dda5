//! keypool's global allocator: [mimalloc](https://github.com/microsoft/mimalloc), called
//! through its plain entry points (`mi_malloc`, `mi_zalloc`, `mi_realloc`) whenever the
//! alignment a [`Layout`] asks for is one those already give, and through the `_aligned`
//! ones only otherwise.
//!
//! Why not the `mimalloc` crate's `MiMalloc`: it passes every request to
//! `mi_malloc_aligned`, even those asking for the 8 or 16 bytes every block has. For a
//! block of at most 1 KiB mimalloc takes its fast path either way, but above 1 KiB with
//! a size class that is not a power of two (a request's ~2.8 KB attempt future, say),
//! `mi_malloc_aligned` over-allocates by `align - 1` bytes and marks the page as holding
//! interior pointers, which also slows every later free on that page. keypool's request
//! path makes about three such allocations per request (`docs/BENCHMARKS.md`, issue 22).
//!
//! The rule for the plain entry points is `malloc`'s contract, which mimalloc keeps (it
//! can replace `malloc`): a block of `n` bytes is aligned for any object of at most `n`
//! bytes whose alignment is at most `max_align_t`'s (`MI_MAX_ALIGN_SIZE`, 16 bytes on
//! the targets keypool builds for). So a layout whose alignment is at most 16 and
//! divides its size (an array of that many 16-, 8-, 4-… byte values would fit) gets a
//! correctly aligned block from `mi_malloc`. A [`Layout`]'s size need not be a multiple
//! of its alignment (`Layout::from_size_align(24, 16)` is valid, and `malloc`'s contract
//! promises a 24-byte block only 8-byte alignment): such a layout takes the `_aligned` entry point. The
//! tests check every size class up to 64 KiB and every alignment up to 4 KiB, and
//! `debug_assert!`s check each block in debug builds.
//!
//! Dependencies: `libmimalloc-sys` only (the C library, built without its secure mode,
//! whose guard padding is the one configuration where the rule above would not hold).

#![cfg_attr(not(test), no_std)]

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of at least this many bytes has
/// (`MI_MAX_ALIGN_SIZE`, `sizeof(max_align_t)` on x86-64 and aarch64).
pub const MIN_ALIGN: usize = 16;

/// The global allocator: `#[global_allocator] static A: keypool_alloc::Mimalloc =
/// keypool_alloc::Mimalloc;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mimalloc;

/// Whether a block of `size` bytes from mimalloc's plain entry points is aligned to
/// `align` (a power of two, as every [`Layout`]'s is): `align` is at most
/// [`MIN_ALIGN`] and divides `size`.
#[inline]
pub const fn plain_suffices(size: usize, align: usize) -> bool {
    align <= MIN_ALIGN && size != 0 && size.is_multiple_of(align)
}

#[allow(unsafe_code)]
// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes blocks
// of both the plain and the aligned entry points); a block is aligned to the layout's
// alignment by `plain_suffices` (mimalloc's guarantee, see the crate docs) or by the
// `_aligned` entry point; a null return (out of memory) is passed on as null.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let block = if plain_suffices(layout.size(), layout.align()) {
            // SAFETY: no precondition beyond a size (a zero-sized layout never reaches
            // a global allocator).
            unsafe { mi::mi_malloc(layout.size()) }
        } else {
            // SAFETY: `layout.align()` is a power of two.
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()) }
        };
        debug_assert!(block.is_null() || (block as usize).is_multiple_of(layout.align()));
        block.cast()
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let block = if plain_suffices(layout.size(), layout.align()) {
            // SAFETY: as in `alloc`.
            unsafe { mi::mi_zalloc(layout.size()) }
        } else {
            // SAFETY: as in `alloc`.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) }
        };
        debug_assert!(block.is_null() || (block as usize).is_multiple_of(layout.align()));
        block.cast()
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a block this allocator gave (GlobalAlloc's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let block = if plain_suffices(new_size, layout.align()) {
            // SAFETY: `ptr` is a live block of this allocator (GlobalAlloc's contract).
            unsafe { mi::mi_realloc(ptr.cast::<c_void>(), new_size) }
        } else {
            // SAFETY: as above, and `layout.align()` is a power of two.
            unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()) }
        };
        debug_assert!(block.is_null() || (block as usize).is_multiple_of(layout.align()));
        block.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Allocates `layout` every way, checks the alignment, writes every byte and reads
    /// it back, grows and shrinks it, and frees it.
    #[allow(unsafe_code)]
    fn round_trip(size: usize, align: usize, new_size: usize) {
        let layout = Layout::from_size_align(size, align).expect("a valid layout");
        let a = Mimalloc;
        // SAFETY: a non-zero size; each block is freed once with its layout.
        unsafe {
            let zeroed = a.alloc_zeroed(layout);
            assert!(!zeroed.is_null());
            assert_eq!(zeroed as usize % align, 0, "alloc_zeroed({size}, {align})");
            assert!((0..size).all(|i| *zeroed.add(i) == 0));
            a.dealloc(zeroed, layout);

            let block = a.alloc(layout);
            assert!(!block.is_null());
            assert_eq!(block as usize % align, 0, "alloc({size}, {align})");
            for i in 0..size {
                *block.add(i) = (i % 251) as u8;
            }
            let moved = a.realloc(block, layout, new_size);
            assert!(!moved.is_null());
            assert_eq!(
                moved as usize % align,
                0,
                "realloc({size} -> {new_size}, {align})"
            );
            for i in 0..size.min(new_size) {
                assert_eq!(*moved.add(i), (i % 251) as u8);
            }
            a.dealloc(
                moved,
                Layout::from_size_align(new_size, align).expect("valid"),
            );
        }
    }

    #[test]
    fn the_plain_rule() {
        assert!(plain_suffices(8, 8));
        assert!(plain_suffices(2816, 8));
        assert!(plain_suffices(48, 16));
        // `malloc` promises a 24-byte block only 8-byte alignment
        assert!(!plain_suffices(24, 16));
        assert!(!plain_suffices(4, 8));
        assert!(!plain_suffices(64, 32));
        assert!(!plain_suffices(0, 1));
    }

    #[test]
    fn every_size_class_and_alignment_is_honoured() {
        // Many live blocks of each class, so that blocks deep inside a page are checked
        // too, not only a page's first.
        for shift in 0..=12 {
            let align = 1usize << shift;
            for size in (1..=4096).chain((4097..=65536).step_by(509)) {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                #[allow(unsafe_code)]
                // SAFETY: a non-zero size; each block is freed once with its layout.
                unsafe {
                    let blocks: [*mut u8; 4] = core::array::from_fn(|_| Mimalloc.alloc(layout));
                    for block in blocks {
                        assert!(!block.is_null());
                        assert_eq!(block as usize % align, 0, "({size}, {align})");
                    }
                    for block in blocks {
                        Mimalloc.dealloc(block, layout);
                    }
                }
            }
        }
    }

    proptest! {
        #[test]
        fn any_layout_round_trips(size in 1usize..20_000, shift in 0u32..13, new_size in 1usize..20_000) {
            round_trip(size, 1 << shift, new_size);
        }
    }
}
