//! What a reload does to the traffic listeners: from the endpoints served
//! and the endpoints the new configuration lists, which are kept, which are
//! bound and which are closed. A pure plan; the `Server` (`workers`) applies it
//! (binding on every worker, closing on every worker).
//!
//! Kept endpoints are not touched: their sockets and open connections carry
//! on. A removed endpoint stops accepting (its open connections carry on).
//! An address that turned from plain to TLS or back is the one case where
//! a close must come before a bind, or the new kind could not bind it.
//!
//! ```text
//! served   [a plain, b plain, c plain]
//! wanted   [a plain, b tls,   d plain]
//! flipped  [b plain]   closed first: b is wanted as TLS
//! bind     [b tls, d plain]
//! close    [c plain]
//! kept     a plain     (in both lists, untouched)
//! ```

use std::net::SocketAddr;

use crate::config::ServerConfig;

/// A configured listener: its address (as configured, perhaps port 0) and
/// whether it is a `[server.tls]` one. Two listeners on port 0 of one
/// address are two endpoints.
pub(super) type Endpoint = (SocketAddr, bool);

/// The endpoints `server` lists: `listen`, then `[server.tls] listen`.
pub(super) fn wanted(server: &ServerConfig) -> Vec<Endpoint> {
    let mut wanted: Vec<Endpoint> = server
        .listen
        .iter()
        .map(|address| (*address, false))
        .collect();
    if let Some(tls) = &server.tls {
        wanted.extend(tls.listen.iter().map(|address| (*address, true)));
    }
    wanted
}

/// The changes that take the served endpoints to the wanted ones, in the
/// order to apply them: `flipped`, then `bind`, then `close`. Each endpoint
/// appears at most once in each list.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Served, no longer wanted, and wanted as the other kind (plain ↔
    /// TLS) on the same address: closed before anything is bound.
    pub(super) flipped: Vec<Endpoint>,
    /// Wanted and not served: bound, in the order listed.
    pub(super) bind: Vec<Endpoint>,
    /// Served and no longer wanted (the flipped ones excepted): closed once
    /// the new ones listen.
    pub(super) close: Vec<Endpoint>,
}

impl Plan {
    /// The plan from `served` to `wanted`.
    pub(super) fn new(served: &[Endpoint], wanted: &[Endpoint]) -> Plan {
        let mut plan = Plan {
            flipped: Vec::new(),
            bind: Vec::new(),
            close: Vec::new(),
        };
        for &(address, tls) in served {
            if wanted.contains(&(address, tls)) {
                continue;
            }
            let list = if wanted.contains(&(address, !tls)) {
                &mut plan.flipped
            } else {
                &mut plan.close
            };
            push_once(list, (address, tls));
        }
        for &endpoint in wanted {
            if !served.contains(&endpoint) {
                push_once(&mut plan.bind, endpoint);
            }
        }
        plan
    }
}

fn push_once(list: &mut Vec<Endpoint>, endpoint: Endpoint) {
    if !list.contains(&endpoint) {
        list.push(endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(port: u16) -> Endpoint {
        (SocketAddr::from(([127, 0, 0, 1], port)), false)
    }

    fn tls(port: u16) -> Endpoint {
        (SocketAddr::from(([127, 0, 0, 1], port)), true)
    }

    fn plan(flipped: &[Endpoint], bind: &[Endpoint], close: &[Endpoint]) -> Plan {
        Plan {
            flipped: flipped.to_vec(),
            bind: bind.to_vec(),
            close: close.to_vec(),
        }
    }

    #[test]
    fn the_same_list_keeps_every_listener() {
        let served = [plain(8080), plain(8081), tls(8443)];
        assert_eq!(Plan::new(&served, &served), plan(&[], &[], &[]));
        // The order of the list is no change.
        let reordered = [tls(8443), plain(8081), plain(8080)];
        assert_eq!(Plan::new(&served, &reordered), plan(&[], &[], &[]));
    }

    #[test]
    fn an_added_address_is_bound_and_the_others_kept() {
        let served = [plain(8080)];
        let wanted = [plain(8080), plain(8081), tls(8443)];
        assert_eq!(
            Plan::new(&served, &wanted),
            plan(&[], &[plain(8081), tls(8443)], &[])
        );
    }

    #[test]
    fn a_removed_address_is_closed_and_the_others_kept() {
        let served = [plain(8080), plain(8081), tls(8443)];
        let wanted = [plain(8081)];
        assert_eq!(
            Plan::new(&served, &wanted),
            plan(&[], &[], &[plain(8080), tls(8443)])
        );
    }

    #[test]
    fn a_replaced_address_is_bound_before_the_old_one_closes() {
        let served = [plain(8080), plain(8081)];
        let wanted = [plain(8080), plain(9090)];
        // `bind` before `close`: the new address listens before the old one
        // stops, and 8080 is not touched.
        assert_eq!(
            Plan::new(&served, &wanted),
            plan(&[], &[plain(9090)], &[plain(8081)])
        );
    }

    #[test]
    fn an_address_turned_tls_is_closed_before_it_is_bound_again() {
        let served = [plain(8080), plain(8443)];
        let wanted = [plain(8080), tls(8443)];
        assert_eq!(
            Plan::new(&served, &wanted),
            plan(&[plain(8443)], &[tls(8443)], &[])
        );
        // And back.
        assert_eq!(
            Plan::new(&wanted, &served),
            plan(&[tls(8443)], &[plain(8443)], &[])
        );
    }

    #[test]
    fn the_module_doc_example() {
        let served = [plain(1), plain(2), plain(3)];
        let wanted = [plain(1), tls(2), plain(4)];
        assert_eq!(
            Plan::new(&served, &wanted),
            plan(&[plain(2)], &[tls(2), plain(4)], &[plain(3)])
        );
    }

    #[test]
    fn everything_removed_closes_everything() {
        let served = [plain(8080), tls(8443)];
        assert_eq!(
            Plan::new(&served, &[]),
            plan(&[], &[], &[plain(8080), tls(8443)])
        );
    }

    #[test]
    fn two_port_zero_listeners_of_one_address_are_kept_as_they_are() {
        // Two endpoints that compare equal: both served, both kept.
        let served = [plain(0), plain(0)];
        assert_eq!(Plan::new(&served, &served), plan(&[], &[], &[]));
        // Removed, they are closed once (closing stops every socket of the
        // endpoint on every worker).
        assert_eq!(Plan::new(&served, &[]), plan(&[], &[], &[plain(0)]));
    }
}
