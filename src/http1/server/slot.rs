//! A request's handler future, kept outside the connection's own future in
//! a block that the connection holds only while it is busy.
//!
//! An async state machine is as large as its largest state, for as long as
//! it lives: a connection that awaited the handler's future in place (3.5 KB)
//! would carry its room while idle too, 10,000 idle connections 35 MB of it.
//! In a [`Slot`] the handler's future lives in a [`Block`] of its own, which
//! travels with the connection's buffer set (`buffers`): taken from the
//! thread's spares with them when a request arrives, used by one request
//! after another, and given back with them when the connection goes idle.
//! So a request costs no allocation and no second look at the spares.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// An allocation with room for one value of `layout` (non-zero size),
/// holding none.
#[derive(Debug)]
pub(super) struct Block {
    at: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a `Block` is an owned allocation holding no value.
unsafe impl Send for Block {}
// SAFETY: as above; `&Block` gives no access to its memory.
unsafe impl Sync for Block {}

impl Block {
    fn new(layout: Layout) -> Block {
        // SAFETY: `layout` has a non-zero size (checked by the caller).
        let at = unsafe { alloc(layout) };
        Block {
            at: NonNull::new(at).unwrap_or_else(|| handle_alloc_error(layout)),
            layout,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated with `layout`, and holds no value.
        unsafe { dealloc(self.at.as_ptr(), self.layout) };
    }
}

/// A future in a block of its own, pinned there until the slot ends.
pub(super) struct Slot<F> {
    value: NonNull<F>,
    /// The block the value is in (`None` for a zero-sized `F`).
    block: Option<Block>,
}

// SAFETY: a `Slot` owns its `F` as a `Box` would.
unsafe impl<F: Send> Send for Slot<F> {}
// SAFETY: as above; `&Slot` gives no access to `F`.
unsafe impl<F: Sync> Sync for Slot<F> {}

impl<F: Future> Slot<F> {
    /// Makes the future with `make` in the block `spare` holds (one is
    /// allocated if it holds none with room for it). The block is taken first and
    /// `make`'s result written into it through a reference (known writable
    /// for a whole `F`), so the compiler may build the future in place
    /// rather than aside and copy it in.
    #[inline(always)]
    pub(super) fn new_with(spare: &mut Option<Block>, make: impl FnOnce() -> F) -> Slot<F> {
        let layout = Layout::new::<F>();
        let block = if layout.size() == 0 {
            None
        } else {
            Some(match spare.take() {
                // Room enough: a connection over TLS and a plain one on
                // the same thread hand each other their blocks.
                Some(block)
                    if block.layout.size() >= layout.size()
                        && block.layout.align() >= layout.align() =>
                {
                    block
                }
                _ => Block::new(layout),
            })
        };
        let value = block
            .as_ref()
            .map_or(NonNull::dangling(), |block| block.at.cast::<F>());
        // SAFETY: the block is valid for an `F`, holds nothing and is
        // referenced by nothing else.
        let place = unsafe { &mut *value.as_ptr().cast::<MaybeUninit<F>>() };
        place.write(make());
        Slot { value, block }
    }
}

impl<F> Slot<F> {
    /// Drops the future and puts its block in `spare`, for the next one.
    pub(super) fn finish(mut self, spare: &mut Option<Block>) {
        // SAFETY: the slot owns the value, dropped here once, in place.
        unsafe { std::ptr::drop_in_place(self.value.as_ptr()) };
        *spare = self.block.take();
        std::mem::forget(self);
    }
}

impl<F> Drop for Slot<F> {
    fn drop(&mut self) {
        // SAFETY: the slot owns the value, dropped here once, in place (it
        // was pinned: it never moved); the block is freed after it.
        unsafe { std::ptr::drop_in_place(self.value.as_ptr()) };
    }
}

/// The slot itself may move; the future in its block does not.
impl<F> Unpin for Slot<F> {}

impl<F: Future> Slot<F> {
    /// The slot awaited by value: its future's output and its block (for
    /// the next one) once the future is done. The caller's own future then
    /// keeps neither the slot beside a reference to it nor a place for
    /// the block across the wait (32 bytes of every idle connection's
    /// task: an async function is as large as its largest state).
    pub(super) fn finishing(self) -> Finishing<F> {
        Finishing(Some(self))
    }
}

/// [`Slot::finishing`]'s future.
pub(super) struct Finishing<F>(Option<Slot<F>>);

impl<F: Future> Future for Finishing<F> {
    type Output = (F::Output, Option<Block>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let slot = self
            .0
            .as_mut()
            .expect("`Finishing` polled after it completed");
        let output = std::task::ready!(Pin::new(slot).poll(cx));
        let mut spare = None;
        if let Some(slot) = self.0.take() {
            slot.finish(&mut spare);
        }
        Poll::Ready((output, spare))
    }
}

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
    async fn a_slot_runs_its_future_drops_it_once_and_hands_its_block_on() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut values = [0u64; 64];
        values[63] = 7;
        let mut spare = None;
        let mut slot = Slot::new_with(&mut spare, || CountsDrops(drops.clone(), values));
        let first_block = slot.value.as_ptr() as usize;
        assert_eq!((&mut slot).await, 7);
        slot.finish(&mut spare);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        assert!(spare.is_some());
        let again = Slot::new_with(&mut spare, || CountsDrops(drops.clone(), values));
        assert_eq!(again.value.as_ptr() as usize, first_block, "the same block");
        assert!(spare.is_none());
        // Awaited by value: the output, then the block for the next one.
        let (value, block) = again.finishing().await;
        assert_eq!((value, drops.load(Ordering::Relaxed)), (7, 2));
        assert_eq!(
            block.as_ref().map(|b| b.at.as_ptr() as usize),
            Some(first_block)
        );
        spare = block;
        // Dropped unfinished (a cancelled request): value and block go.
        let unfinished = Slot::new_with(&mut spare, || CountsDrops(drops.clone(), values));
        drop(unfinished);
        assert_eq!(drops.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_block_too_small_is_replaced_a_larger_one_used_and_zero_sized_futures_need_none() {
        let mut spare = Some(Block::new(Layout::new::<[u8; 3]>()));
        let slot = Slot::new_with(&mut spare, || std::future::ready(5u64));
        assert_eq!(
            slot.block.as_ref().unwrap().layout,
            Layout::new::<std::future::Ready<u64>>()
        );
        let larger = Layout::new::<[u64; 4]>();
        let mut spare = Some(Block::new(larger));
        let in_larger = Slot::new_with(&mut spare, || std::future::ready(6u64));
        assert!(spare.is_none());
        assert_eq!(in_larger.block.as_ref().unwrap().layout, larger);
        assert_eq!(in_larger.await, 6);
        let mut none = None;
        assert_eq!(
            Slot::new_with(&mut none, || std::future::ready(())).await,
            ()
        );
        assert!(none.is_none());
        assert_eq!(slot.await, 5);
    }
}
