//! The drain signal as connections watch it.
//!
//! Every open connection waits for the drain (shutdown) while it serves, and
//! its task is polled at least twice per proxied request. A
//! `tokio::sync::watch` receiver locks the channel's waiter list on every
//! poll, and all connections of all workers share that one list: a lock
//! taken on every request, written from every core. [`DrainWatch`] costs one
//! atomic load per poll instead: a connection hands its waker over once,
//! into its worker's own list, and [`Drain::start`] sets the flag and wakes
//! every waker it holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

/// The drain flag and, per worker, the wakers of the connections waiting
/// for it.
#[derive(Debug)]
pub(crate) struct Drain {
    draining: AtomicBool,
    /// One list per worker: a connection registers on its own worker's.
    waiting: Box<[Mutex<Wakers>]>,
}

/// A small slab of wakers: a connection keeps its slot's index.
#[derive(Debug, Default)]
struct Wakers {
    slots: Vec<Option<Waker>>,
    free: Vec<u32>,
}

impl Wakers {
    fn insert(&mut self, waker: Waker) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(waker);
                slot
            }
            None => {
                self.slots.push(Some(waker));
                // Fewer slots than open connections, far below `u32::MAX`.
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn remove(&mut self, slot: u32) {
        if let Some(entry) = self.slots.get_mut(slot as usize)
            && entry.take().is_some()
        {
            self.free.push(slot);
        }
    }
}

impl Drain {
    /// A drain signal for `workers` workers (at least one list).
    pub(crate) fn new(workers: usize) -> Arc<Drain> {
        Arc::new(Drain {
            draining: AtomicBool::new(false),
            waiting: (0..workers.max(1))
                .map(|_| Mutex::new(Wakers::default()))
                .collect(),
        })
    }

    /// Starts the drain: every watch, present and future, completes.
    /// Calling it again does nothing more.
    pub(crate) fn start(&self) {
        // Set before taking the locks: a watch registering concurrently
        // either is in a list when it is emptied here, or sees the flag
        // under the same lock (see `DrainWatch::poll`).
        self.draining.store(true, Ordering::SeqCst);
        for list in self.waiting.iter() {
            let wakers: Vec<Waker> = {
                let mut list = list.lock();
                list.free.clear();
                list.slots.drain(..).flatten().collect()
            };
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Whether the drain has started.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// A future that completes when the drain starts, for a connection on
    /// worker `worker`.
    pub(crate) fn watch(self: &Arc<Self>, worker: usize) -> DrainWatch {
        DrainWatch {
            drain: self.clone(),
            // At most 1024 workers (`[server] workers`).
            list: (worker % self.waiting.len()) as u32,
            slot: UNREGISTERED,
        }
    }
}

/// [`DrainWatch::slot`] before the watch registers its waker.
const UNREGISTERED: u32 = u32::MAX;

/// Completes when the drain starts ([`Drain::watch`]).
///
/// Two 32-bit indexes beside the pointer: every connection's task, idle or
/// not, carries one (16 bytes, against 32 with a `usize` and an
/// `Option<usize>`).
#[derive(Debug)]
pub(crate) struct DrainWatch {
    drain: Arc<Drain>,
    list: u32,
    /// The registered waker's slot in its list, or [`UNREGISTERED`].
    slot: u32,
}

impl Future for DrainWatch {
    type Output = ();

    /// Inlined into the connection's poll: every poll but the first is a
    /// load and a comparison. (A call, with the registration's lock in its
    /// frame, it was ~23 instructions a poll, two polls a denial,
    /// `bench/instructions.sh`.)
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.drain.is_draining() {
            return Poll::Ready(());
        }
        if self.slot == UNREGISTERED {
            return self.register(cx);
        }
        Poll::Pending
    }
}

impl DrainWatch {
    /// The first poll: the task's waker into its worker's list. Once: a
    /// task's wakers all wake the same task, and a connection stays on its
    /// worker's runtime, so the first waker serves for the connection's
    /// life. Out of line: once per connection.
    #[cold]
    #[inline(never)]
    fn register(&mut self, cx: &Context<'_>) -> Poll<()> {
        let mut list = self.drain.waiting[self.list as usize].lock();
        if self.drain.draining.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        let slot = list.insert(cx.waker().clone());
        drop(list);
        self.slot = slot;
        Poll::Pending
    }
}

impl Drop for DrainWatch {
    fn drop(&mut self) {
        if self.slot != UNREGISTERED {
            self.drain.waiting[self.list as usize]
                .lock()
                .remove(self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// Counts its wake-ups.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    #[test]
    fn start_wakes_every_waiting_watch_once_and_completes_it() {
        let drain = Drain::new(2);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut watches: Vec<DrainWatch> = (0..5).map(|i| drain.watch(i)).collect();
        for watch in &mut watches {
            assert_eq!(Pin::new(&mut *watch).poll(&mut cx), Poll::Pending);
            // Polling again registers nothing more.
            assert_eq!(Pin::new(&mut *watch).poll(&mut cx), Poll::Pending);
        }
        drain.start();
        assert_eq!(count.0.load(Ordering::SeqCst), 5);
        for watch in &mut watches {
            assert_eq!(Pin::new(&mut *watch).poll(&mut cx), Poll::Ready(()));
        }
        drain.start();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            5,
            "a second start wakes no one"
        );
    }

    #[test]
    fn a_watch_made_after_the_start_is_ready_at_once() {
        let drain = Drain::new(1);
        drain.start();
        let (count, waker) = counting();
        let mut watch = drain.watch(0);
        let poll = Pin::new(&mut watch).poll(&mut Context::from_waker(&waker));
        assert_eq!(poll, Poll::Ready(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn dropped_watches_leave_their_slot_for_the_next() {
        let drain = Drain::new(1);
        let (count, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..100 {
            let mut watch = drain.watch(0);
            assert_eq!(Pin::new(&mut watch).poll(&mut cx), Poll::Pending);
        }
        assert_eq!(drain.waiting[0].lock().slots.len(), 1, "one slot, reused");
        drain.start();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "the dropped are not woken"
        );
    }

    #[test]
    fn a_start_racing_registrations_loses_no_watch() {
        for _ in 0..200 {
            let drain = Drain::new(2);
            let (count, waker) = counting();
            let mut watches: Vec<DrainWatch> = (0..4).map(|i| drain.watch(i)).collect();
            let completed = std::thread::scope(|scope| {
                let starter = scope.spawn(|| drain.start());
                let mut cx = Context::from_waker(&waker);
                let mut ready = 0;
                for watch in &mut watches {
                    ready += usize::from(Pin::new(watch).poll(&mut cx).is_ready());
                }
                starter.join().unwrap();
                ready
            });
            // Every watch either saw the drain when polled or was woken.
            assert_eq!(completed + count.0.load(Ordering::SeqCst), 4);
        }
    }
}
