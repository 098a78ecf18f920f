//! The binary's global allocator: mimalloc, called the way its own aligned
//! entry points would end up calling it, minus their detour.
//!
//! The `mimalloc` crate's `GlobalAlloc` sends every request through
//! `mi_malloc_aligned`, even for the common case where the alignment asked
//! for is no more than what plain `mi_malloc` already guarantees. For blocks
//! above mimalloc's small size class (1 KiB: read buffers, boxed futures) that
//! entry point takes its generic path before arriving at the same plain
//! allocation, which the allow-path profile showed at ~1k instructions per
//! request. Here a layout mimalloc calls "naturally aligned" (alignment ≤ 16
//! and ≤ size; `mi_malloc_is_naturally_aligned` in its `alloc-aligned.c`)
//! goes straight to `mi_malloc`; any other keeps the aligned call.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// mimalloc's guarantee for plain allocations: every block of at least this
/// size is aligned to it (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGNMENT: usize = 16;

/// mimalloc as the global allocator (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct Allocator;

/// Whether a plain `mi_malloc(size)` is guaranteed to be `align`-aligned.
#[inline]
fn plain_suffices(size: usize, align: usize) -> bool {
    align <= PLAIN_ALIGNMENT && align <= size
}

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free`
// frees blocks from both the plain and the aligned entry points); alignment
// is either requested explicitly or guaranteed by `plain_suffices`.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc accepts any size; a null return reports failure.
        unsafe {
            if plain_suffices(layout.size(), layout.align()) {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if plain_suffices(layout.size(), layout.align()) {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a block this allocator returned.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller passes a block this allocator returned with
        // `layout`; the new block keeps that alignment either way.
        unsafe {
            if plain_suffices(new_size, layout.align()) {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [usize; 14] = [
        1,
        7,
        8,
        15,
        16,
        24,
        40,
        100,
        1000,
        1025,
        4096,
        8200,
        70_000,
        1 << 20,
    ];
    const ALIGNS: [usize; 7] = [1, 2, 8, 16, 32, 64, 4096];

    #[test]
    fn every_layout_gets_its_alignment_and_keeps_its_bytes() {
        let allocator = Allocator;
        for size in SIZES {
            for align in ALIGNS {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: the layout has a non-zero size; the block is freed
                // with the allocator and layout it came from.
                unsafe {
                    let block = allocator.alloc(layout);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "size {size} align {align}");
                    block.write_bytes(0xA5, size);

                    let grown = size * 3 + 5;
                    let moved = allocator.realloc(block, layout, grown);
                    assert_eq!(
                        moved as usize % align,
                        0,
                        "realloc {size}→{grown} align {align}"
                    );
                    assert!((0..size).all(|i| *moved.add(i) == 0xA5), "bytes kept");

                    let shrunk = size.div_ceil(2);
                    let grown_layout = Layout::from_size_align(grown, align).unwrap();
                    let back = allocator.realloc(moved, grown_layout, shrunk);
                    assert_eq!(
                        back as usize % align,
                        0,
                        "realloc {grown}→{shrunk} align {align}"
                    );
                    assert!((0..shrunk).all(|i| *back.add(i) == 0xA5), "bytes kept");
                    allocator.dealloc(back, Layout::from_size_align(shrunk, align).unwrap());
                }
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_and_aligned() {
        let allocator = Allocator;
        for size in SIZES {
            for align in ALIGNS {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: as above.
                unsafe {
                    let block = allocator.alloc_zeroed(layout);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0);
                    assert!((0..size).all(|i| *block.add(i) == 0));
                    allocator.dealloc(block, layout);
                }
            }
        }
    }

    #[test]
    fn the_plain_path_is_taken_only_where_mimalloc_guarantees_it() {
        assert!(plain_suffices(16, 16));
        assert!(plain_suffices(24, 8));
        assert!(plain_suffices(8192, 8));
        assert!(!plain_suffices(8, 16), "a block smaller than its alignment");
        assert!(!plain_suffices(4096, 64), "beyond the plain guarantee");
        assert!(!plain_suffices(0, 1));
    }
}
