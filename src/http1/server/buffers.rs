//! The buffers a connection on the fast path holds only while it is busy,
//! and the thread's spares they are taken from.
//!
//! A keep-alive connection waiting for its next request holds none of them:
//! thousands of idle connections would otherwise hold thousands of read
//! buffers (8 KiB each) nobody writes into. The connection gives its set
//! back when it goes idle and takes one again when the first bytes of the
//! next request arrive. Under load every request goes through that idle
//! moment, so a set comes from a short per-thread list of spares, not from
//! the allocator: a pop and a push on a thread-local `Vec`, no lock (a
//! connection is served on one thread from accept to close), and the
//! allocations of a busy set are reused as they were before.
//!
//! The first [`KEEP_IDLE`] connections of a thread that go idle keep their
//! set instead, for as long as they stay busy or idle in turn ([`Keeping`]):
//! a few connections each serving one request after another (the usual
//! keep-alive client, a load balancer's pool) then skip the list both ways,
//! and the first read of their next request goes straight into the set. The
//! memory that costs is bounded per thread, not per connection, as the
//! spares are.

use std::cell::{Cell, RefCell};

use bytes::BytesMut;
use http::HeaderMap;

use super::slot::Block;

/// Room for the reads of one connection (grown only while a head is longer).
const READ_BUFFER: usize = 8 * 1024;

/// Response bytes gathered before a write while the body keeps coming.
pub(super) const WRITE_BATCH: usize = 16 * 1024;

/// Spare sets kept per thread: enough for the connections that go idle and
/// come back at once under load; beyond it a set is freed (at most ~0.9 MB
/// per thread sits here, handler blocks included).
const MAX_SPARE: usize = 64;

/// Idle connections per thread that keep their set ([`Keeping`]): at most
/// ~0.9 MB per thread, as the spares.
pub(super) const KEEP_IDLE: usize = 64;

/// Room for the next read into `read`: a new [`READ_BUFFER`] when less than
/// a quarter of one is left (an empty buffer whose bytes are all handed on
/// is taken again from the start of its allocation).
#[inline]
pub(super) fn make_room(read: &mut BytesMut) {
    if read.capacity() - read.len() < READ_BUFFER / 4 {
        read.reserve(READ_BUFFER);
    }
}

/// What a busy connection reads into and writes from.
#[derive(Debug)]
pub(super) struct Buffers {
    /// The bytes read and not yet parsed (a head, a body, pipelined requests).
    pub(super) read: BytesMut,
    /// The response head (and a small body) written with one `write`.
    pub(super) out: Vec<u8>,
    /// The last response's map, emptied: the next request's fields go in it
    /// (its capacity is what is kept).
    pub(super) fields: HeaderMap,
    /// Room for the handler's future of the next request (see `slot`).
    pub(super) block: Option<Block>,
    /// Room for the state of the connection's next busy spell (see
    /// `serve`): outside the set while the connection is busy.
    pub(super) busy: Option<Block>,
}

thread_local! {
    // Boxed: a set moves in and out of the list, and through the
    // connection's states, as one pointer (measured: moving the 152 bytes
    // by value cost ~300 instructions per request).
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<Buffers>>> = const { RefCell::new(Vec::new()) };
    /// Places taken by connections of this thread that keep their set
    /// while idle ([`Keeping`]).
    static KEPT: Cell<usize> = const { Cell::new(0) };
}

/// One of the thread's [`KEEP_IDLE`] places for a connection that keeps
/// its set while idle, held from its first idle moment to the end of its
/// busy spell (a request after another then costs no look at the count),
/// and given up when dropped.
#[derive(Debug)]
pub(super) struct Keeping {
    _counted: (),
}

impl Keeping {
    /// A place, if the thread has one left.
    pub(super) fn try_take() -> Option<Keeping> {
        KEPT.try_with(|kept| {
            let room = kept.get() < KEEP_IDLE;
            if room {
                kept.set(kept.get() + 1);
            }
            room
        })
        .unwrap_or(false)
        // Made only when counted: dropping one gives a place up.
        .then(|| Keeping { _counted: () })
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        // `try_with`: a connection dropped as its thread ends finds the
        // counter gone, and has nothing to tell it.
        let _ = KEPT.try_with(|k| k.set(k.get().saturating_sub(1)));
    }
}

impl Buffers {
    /// Whether the set grew past its usual size (a long head, a large
    /// response batch): it is then freed rather than kept for another.
    fn grown(&self) -> bool {
        Self::grown_parts(&self.read, &self.out)
    }

    /// [`Buffers::grown`] of a set's read and write buffers.
    #[inline]
    pub(super) fn grown_parts(read: &BytesMut, out: &Vec<u8>) -> bool {
        read.capacity() > 2 * READ_BUFFER || out.capacity() > 4 * WRITE_BATCH
    }

    /// A set from the thread's spares, or a new one.
    pub(super) fn take() -> Box<Buffers> {
        let spare = SPARE
            .try_with(|spare| spare.try_borrow_mut().ok().and_then(|mut s| s.pop()))
            .ok()
            .flatten();
        spare.unwrap_or_else(|| {
            Box::new(Buffers {
                read: BytesMut::with_capacity(READ_BUFFER),
                out: Vec::with_capacity(1024),
                fields: HeaderMap::new(),
                block: None,
                busy: None,
            })
        })
    }

    /// Gives the set back to the thread's spares (empty, as `take` hands it
    /// out). A set grown past its usual size, or one the spares have no room
    /// for, is freed instead.
    pub(super) fn give_back(mut self: Box<Self>) {
        if self.grown() {
            return;
        }
        self.read.clear();
        self.out.clear();
        // Emptied by the connection already after each response (clearing
        // a map walks all its slots): only a set given back mid-request
        // holds fields.
        if !self.fields.is_empty() {
            self.fields.clear();
        }
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut()
                && spare.len() < MAX_SPARE
            {
                spare.push(self);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_given_back_is_taken_again_empty_with_its_allocations() {
        let mut set = Buffers::take();
        set.read.extend_from_slice(b"GET / HTTP/1.1\r\n");
        set.out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let read_at = set.read.as_ptr();
        set.give_back();
        let again = Buffers::take();
        assert!(again.read.is_empty() && again.out.is_empty());
        assert_eq!(again.read.as_ptr(), read_at, "the same allocation");
        assert!(again.read.capacity() >= READ_BUFFER);
    }

    #[test]
    fn a_thread_has_at_most_its_bound_of_places_for_sets_kept_while_idle() {
        let before = KEPT.with(Cell::get);
        let mut places = Vec::new();
        while let Some(place) = Keeping::try_take() {
            places.push(place);
        }
        assert_eq!(KEPT.with(Cell::get), KEEP_IDLE);
        assert_eq!(places.len(), KEEP_IDLE - before);
        // A connection whose spell ends gives its place up.
        places.pop();
        assert_eq!(KEPT.with(Cell::get), KEEP_IDLE - 1);
        places.push(Keeping::try_take().expect("a place again"));
        assert!(Keeping::try_take().is_none());
        assert_eq!(KEPT.with(Cell::get), KEEP_IDLE);
        drop(places);
        assert_eq!(KEPT.with(Cell::get), before);
    }

    #[test]
    fn a_grown_set_is_freed_not_kept() {
        // Empty the thread's spares first (tests share no thread, but be sure).
        while SPARE.with(|s| !s.borrow().is_empty()) {
            drop(Buffers::take());
        }
        let mut set = Buffers::take();
        set.out.reserve(8 * WRITE_BATCH);
        set.give_back();
        assert!(SPARE.with(|s| s.borrow().is_empty()));
        for _ in 0..MAX_SPARE + 5 {
            Box::new(Buffers {
                read: BytesMut::with_capacity(READ_BUFFER),
                out: Vec::new(),
                fields: HeaderMap::new(),
                block: None,
                busy: None,
            })
            .give_back();
        }
        assert_eq!(SPARE.with(|s| s.borrow().len()), MAX_SPARE);
    }
}
