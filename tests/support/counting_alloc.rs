//! A global allocator that counts allocations, shared by the tests and
//! benches that prove (or report) how many a code path makes. Include it with
//! `#[path = ".../tests/support/counting_alloc.rs"] mod counting_alloc;` —
//! declaring it installs it as the binary's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counting every allocation.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Const-initialised: reading it never allocates, so the allocator may.
    static THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // `try_with`: a thread being torn down has no slot left.
        let _ = THIS_THREAD.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by the whole process so far (the benches report it).
#[allow(dead_code)]
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Allocations made by the calling thread so far: what a single-threaded
/// code path under test made, whatever the test harness's own threads do
/// meanwhile (its main thread allocates while it waits on a slow test).
#[allow(dead_code)]
pub fn this_thread_allocations() -> u64 {
    THIS_THREAD.with(Cell::get)
}
