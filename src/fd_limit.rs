//! The process's open-file limit, raised at start to what `max_connections`
//! needs.
//!
//! Every proxied connection holds two descriptors (the client's and the
//! upstream's), and Linux distributions often start services with a soft
//! `RLIMIT_NOFILE` of 1024 while the hard limit is far higher: a gateway
//! configured for 10,000 connections would start refusing at about 500,
//! with `accept` errors that say nothing about the configuration. So `run`
//! raises the soft limit to the hard one (which needs no privilege), says
//! so, and warns when even the hard limit is short of what
//! `server.max_connections` needs.

/// Descriptors needed for `max_connections` proxied connections: two each,
/// plus room for listeners, the admin listener, logs and the pools' spares.
pub(crate) fn needed(max_connections: usize) -> u64 {
    (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(64)
}

/// Raises the soft open-file limit to the hard one and logs what it did;
/// warns when the limit stays below [`needed`] for `max_connections`.
pub fn raise_for(max_connections: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes a `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read the open-file limit");
        return;
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `setrlimit` reads a valid `rlimit`; raising the soft limit
        // up to the hard one is always permitted.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
            tracing::info!(
                from = before,
                to = limit.rlim_cur,
                "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
            );
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot raise the open-file limit");
        }
    }
    let want = needed(max_connections);
    if limit.rlim_cur < want {
        tracing::warn!(
            limit = limit.rlim_cur,
            needed = want,
            max_connections,
            "the open-file limit is below what server.max_connections needs (two per proxied connection): \
             lower max_connections or raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd)"
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_descriptors_a_connection_plus_spares() {
        assert_eq!(super::needed(10_000), 20_064);
        assert_eq!(super::needed(usize::MAX), u64::MAX);
    }
}
