//! Bodies the gateway writes itself at flood rates (a 429's problem, a
//! quota route's JSON), cut from one buffer per thread
//! ([`arena_body`]) instead of allocated one by one.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

/// Room a thread's bodies are cut from: a 429 is written out and its body
/// dropped before the next answer, so the room is taken again from its
/// start, and a denial allocates nothing (two allocations, a `String` and
/// the `Bytes` header, and on every denial mimalloc retiring the page of
/// the one live body: ~150 instructions).
const ARENA: usize = 16 * 1024;

/// One thread's bodies: the text, built in a reused `String`, then cut
/// from `arena` as a `Bytes` that shares it.
struct Bodies {
    text: String,
    arena: BytesMut,
}

thread_local! {
    static BODIES: RefCell<Bodies> = RefCell::new(Bodies {
        text: String::with_capacity(512),
        arena: BytesMut::new(),
    });
}

/// A body written by `write` (into an empty `String`), cut from the
/// thread's arena. A body still being sent (a slow client) keeps its part of
/// the arena alive; the arena then takes new room, and the old one goes with
/// the last body in it.
pub(crate) fn arena_body(write: impl FnOnce(&mut String)) -> Bytes {
    let mut write = Some(write);
    let cut = BODIES.try_with(|bodies| {
        let mut bodies = bodies.try_borrow_mut().ok()?;
        let Bodies { text, arena } = &mut *bodies;
        text.clear();
        (write.take()?)(text);
        if arena.capacity() < text.len() {
            arena.reserve(ARENA.max(text.len()));
        }
        arena.extend_from_slice(text.as_bytes());
        if text.capacity() > 4 * 1024 {
            // A very long body (a long limit name): not kept.
            *text = String::with_capacity(512);
        }
        Some(arena.split().freeze())
    });
    match cut {
        Ok(Some(body)) => body,
        // Re-entered or the thread ending: a body of its own.
        _ => {
            let mut text = String::new();
            if let Some(write) = write {
                write(&mut text);
            }
            Bytes::from(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_kept_while_others_are_cut_stays_as_written() {
        // A slow client still sending its 429 holds its body; the arena
        // then takes new room rather than writing over it.
        let held = arena_body(|text| text.push_str("first"));
        let long = "x".repeat(ARENA / 3);
        let mut others = Vec::new();
        for i in 0..20 {
            let body = arena_body(|text| {
                text.push_str(&long);
                text.push_str(&i.to_string());
            });
            assert!(body.ends_with(i.to_string().as_bytes()));
            others.push(body);
        }
        assert_eq!(&held[..], b"first");
        // Bodies dropped: their room is taken again from its start.
        drop(others);
        let a = arena_body(|text| text.push_str("again"));
        assert_eq!(&a[..], b"again");
        // Longer than the arena: still whole.
        let huge = "y".repeat(2 * ARENA);
        assert_eq!(arena_body(|text| text.push_str(&huge)).len(), 2 * ARENA);
    }
}
