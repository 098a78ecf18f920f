//! An admitted request's hold: the wait its stack decided before it goes
//! on — a token bucket's `wait` (the request was charged as admitted, and
//! leaves when its tokens would have been there) or a leaky bucket in
//! `mode = "delay"` (it leaves at the bucket's rate), like nginx
//! `limit_req` without `nodelay`.
//!
//! The front that forwards (the proxy) or answers (`/auth`) awaits
//! [`wait_out`] between the decision and its next step (the proxy spells
//! it out, the timer and [`record_wait`], in its size-checked future). The hold is one
//! timer (`tokio::time::sleep`), no polling; a client that goes away drops
//! the request's future and with it the timer. Its tokens stay charged:
//! they were taken when the stack admitted it, as nginx keeps a delayed
//! request's place.
//!
//! A completed hold counts in `tollgate_queue_wait_seconds{limit}` under
//! the limit that held the request longest, and adds to the ticket's
//! [`waited`](Ticket::waited), the `queued_ms` of its log line. A wait
//! made elsewhere before the request goes on (a queue for a slot) is
//! recorded the same way with [`record_wait`].

use std::time::Duration;

use super::Ticket;
use super::ticket::Hold;
use crate::app::{App, RoutePlan, Snapshot};

/// Holds the admitted request of `ticket` for as long as its stack
/// decided, then records the wait; returns at once when there is none.
pub(crate) async fn wait_out(
    app: &App,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &mut Ticket<'_>,
) {
    let Some(hold) = ticket.hold() else {
        return;
    };
    tokio::time::sleep(Duration::from_nanos(hold.wait)).await;
    record_wait(app, snapshot, plan, ticket, hold);
}

/// Records that the admitted request of `ticket` waited `waited.wait` ns
/// for the limit at `waited.position` of its stack:
/// `tollgate_queue_wait_seconds`, and its log line's `queued_ms` (waits
/// add up).
pub(crate) fn record_wait(
    app: &App,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &mut Ticket<'_>,
    waited: Hold,
) {
    let micros = u32::try_from(waited.wait / 1_000).unwrap_or(u32::MAX);
    ticket.waited_us = ticket.waited_us.saturating_add(micros);
    if let Some(&id) = plan.stack.get(waited.position) {
        app.metrics()
            .record_queue_wait(snapshot.limit_label(id), Duration::from_nanos(waited.wait));
    }
}
