//! A request's handler future, kept outside the connection's own future in
//! a block from the thread's spares.
//!
//! An async state machine is as large as its largest state, for as long as
//! it lives: a connection that awaited the handler's future in place (3.5 KB)
//! would carry its room while idle too, 10,000 idle connections 35 MB of it.
//! In a [`Slot`] the handler's future lives in a block of its own that
//! exists only while the request does. Under load every request takes one,
//! so the block comes from a short per-thread list of spares (a pop and a
//! push on a thread-local `Vec`, no lock: a connection is served on one
//! thread), not from the allocator.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::cell::RefCell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// Spare blocks kept per thread and layout; beyond it a block is freed.
const MAX_SPARE: usize = 64;

/// The thread's spare blocks, by layout (one layout in practice: the
/// handler's future).
struct Spares(Vec<(Layout, Vec<NonNull<u8>>)>);

impl Drop for Spares {
    fn drop(&mut self) {
        for (layout, blocks) in self.0.drain(..) {
            for block in blocks {
                // SAFETY: every block here was allocated with `layout`.
                unsafe { dealloc(block.as_ptr(), layout) };
            }
        }
    }
}

thread_local! {
    static SPARE: RefCell<Spares> = const { RefCell::new(Spares(Vec::new())) };
}

/// A block for `layout` (non-zero size) from the spares, or a new one.
fn take_block(layout: Layout) -> NonNull<u8> {
    let spare = SPARE
        .try_with(|spare| {
            let mut spare = spare.try_borrow_mut().ok()?;
            let (_, blocks) = spare.0.iter_mut().find(|(l, _)| *l == layout)?;
            blocks.pop()
        })
        .ok()
        .flatten();
    spare.unwrap_or_else(|| {
        // SAFETY: `layout` has a non-zero size (checked by the caller).
        let block = unsafe { alloc(layout) };
        NonNull::new(block).unwrap_or_else(|| handle_alloc_error(layout))
    })
}

/// Returns a block (its value dropped already) to the spares, or frees it.
fn give_block(layout: Layout, block: NonNull<u8>) {
    let kept = SPARE
        .try_with(|spare| {
            let Ok(mut spare) = spare.try_borrow_mut() else {
                return false;
            };
            let index = match spare.0.iter().position(|(l, _)| *l == layout) {
                Some(index) => index,
                None => {
                    spare.0.push((layout, Vec::new()));
                    spare.0.len() - 1
                }
            };
            let blocks = &mut spare.0[index].1;
            if blocks.len() >= MAX_SPARE {
                return false;
            }
            blocks.push(block);
            true
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: the block was allocated with `layout` and holds no value.
        unsafe { dealloc(block.as_ptr(), layout) };
    }
}

/// A future in a block of its own, pinned there until the slot is dropped.
pub(super) struct Slot<F> {
    value: NonNull<F>,
}

// SAFETY: a `Slot` owns its `F` as a `Box` would.
unsafe impl<F: Send> Send for Slot<F> {}
// SAFETY: as above; `&Slot` gives no access to `F`.
unsafe impl<F: Sync> Sync for Slot<F> {}

impl<F: Future> Slot<F> {
    /// Makes the future with `make` in a block from the thread's spares.
    /// The block is taken first and `make`'s result written into it through
    /// a reference (known writable for a whole `F`), so the compiler can
    /// build the future in place rather than build it aside and copy it in
    /// (a copy of the whole future, 3.5 KB, cost ~650 instructions).
    #[inline(always)]
    pub(super) fn new_with(make: impl FnOnce() -> F) -> Slot<F> {
        let layout = Layout::new::<F>();
        let value_at = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            take_block(layout).cast::<F>()
        };
        // SAFETY: the block is valid for an `F`, holds nothing and is
        // referenced by nothing else.
        let place = unsafe { &mut *value_at.as_ptr().cast::<MaybeUninit<F>>() };
        place.write(make());
        Slot { value: value_at }
    }
}

impl<F> Drop for Slot<F> {
    fn drop(&mut self) {
        let layout = Layout::new::<F>();
        // SAFETY: the slot owns the value, dropped here once, in place (it
        // was pinned: it never moved).
        unsafe { std::ptr::drop_in_place(self.value.as_ptr()) };
        if layout.size() != 0 {
            give_block(layout, self.value.cast());
        }
    }
}

/// The slot itself may move; the future in its block does not.
impl<F> Unpin for Slot<F> {}

impl<F: Future> Future for Slot<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the value stays at its address until the slot drops it.
        let value = unsafe { Pin::new_unchecked(&mut *self.value.as_ptr()) };
        value.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct CountsDrops(Arc<AtomicUsize>, [u64; 64]);

    impl Future for CountsDrops {
        type Output = u64;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u64> {
            Poll::Ready(self.1[63])
        }
    }

    impl Drop for CountsDrops {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn a_slot_runs_its_future_drops_it_once_and_reuses_its_block() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut values = [0u64; 64];
        values[63] = 7;
        let slot = Slot::new_with(|| CountsDrops(drops.clone(), values));
        let first_block = slot.value.as_ptr() as usize;
        assert_eq!(slot.await, 7);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        let again = Slot::new_with(|| CountsDrops(drops.clone(), values));
        assert_eq!(
            again.value.as_ptr() as usize,
            first_block,
            "the spare block"
        );
        drop(again);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn zero_sized_futures_need_no_block() {
        assert_eq!(Slot::new_with(|| std::future::ready(3)).await, 3);
    }
}
