//! Pins the hot-path claim of `src/metrics.rs`: once a series exists,
//! recording a request, a decision or an upstream error allocates nothing.
//! A test binary of its own, because it installs a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use tollgate::metrics::{Metrics, Outcome};

/// Counts allocations made by the current thread only, so tests running in
/// parallel on other threads do not disturb the count.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn recording_into_an_existing_series_does_not_allocate() {
    let metrics = Metrics::new();
    let (route, limit, upstream): (Arc<str>, Arc<str>, Arc<str>) =
        (Arc::from("api"), Arc::from("per_ip"), Arc::from("backend"));
    let record = |metrics: &Metrics| {
        metrics.record_request(&route, 200, Duration::from_millis(2));
        metrics.record_request(metrics.no_route(), 404, Duration::from_micros(80));
        metrics.record_decision(&route, &limit, Outcome::Allowed);
        metrics.record_near_limit(&route, &limit);
        metrics.record_upstream_error(&upstream, "timeout");
        metrics.set_limiter_keys(&limit, 7);
    };
    // The first call creates the series (allocates, once per label set);
    // seeing it also shows the counter works.
    let start = allocations();
    record(&metrics);
    assert!(
        allocations() > start,
        "the counting allocator counts nothing"
    );
    let before = allocations();
    for _ in 0..100 {
        record(&metrics);
    }
    assert_eq!(allocations() - before, 0, "the hot path allocated");
}
