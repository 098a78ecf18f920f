//! The client's IP address behind trusted proxies (contract §4), and the
//! network it is keyed by.
//!
//! This module owns the *trust walk*: which entry of `X-Forwarded-For` (or of
//! RFC 7239 `Forwarded`) names the client, given how much of the list we may
//! believe. Parsing single entries lives in the private `identity::forwarded` module.
//!
//! # Why a walk from the right
//!
//! Every proxy appends the address it saw to the right of the list, so only
//! the right-hand end was written by machines we trust; everything to the left
//! of the first trusted proxy's entry was written by the client and may be
//! anything. Both trust modes therefore start at the right and stop as soon as
//! they leave the part of the list our proxies wrote:
//!
//! - [`Trust::Hops`]`(N)`: exactly N proxies stand in front of us. The client
//!   is the N-th entry from the right (N = 1: the last entry, which the one
//!   proxy wrote from its TCP peer). With fewer than N entries, the leftmost.
//! - [`Trust::Cidrs`]: start at the TCP peer; while the current address is
//!   inside a trusted network, step one entry left. The first address outside
//!   every trusted network is the client; if every entry is trusted, the
//!   leftmost.
//!
//! In both modes an entry that does not parse as an address ends the walk, and
//! the client is the address to its right — the last one that parsed, or the
//! TCP peer if the rightmost entry is already garbage. A trusted proxy always
//! writes an address, so garbage means we have walked into client-written (or
//! misconfigured) territory, and the last address we could vouch for is the
//! best answer.
//!
//! Worked example, `X-Forwarded-For: 6.6.6.6, 1.1.1.1, 10.0.0.2`, TCP peer
//! `10.0.0.1`:
//!
//! | policy | walk | client |
//! | --- | --- | --- |
//! | `Hops(0)` | header ignored | `10.0.0.1` |
//! | `Hops(1)` | `10.0.0.2` | `10.0.0.2` |
//! | `Hops(2)` | `10.0.0.2`, `1.1.1.1` | `1.1.1.1` |
//! | `Hops(9)` | runs out at the left | `6.6.6.6` |
//! | `Cidrs([10.0.0.0/8])` | peer trusted, `10.0.0.2` trusted, `1.1.1.1` not | `1.1.1.1` |
//!
//! and with `X-Forwarded-For: 1.1.1.1, bogus, 10.0.0.2`, `Hops(3)` and
//! `Cidrs([10.0.0.0/8])` both answer `10.0.0.2`.
//!
//! # Multiple header lines, empty elements
//!
//! Header lines are read in order and a later line continues the list
//! (RFC 9110 §5.3). Empty list elements (`a,,b`, a blank line, a trailing
//! comma) are not entries (RFC 9110 §5.6.1 says to ignore them).
//!
//! For `Forwarded`, elements are split at *every* comma, even one inside a
//! quoted string. No address contains a comma, so this only splits values we
//! would reject anyway — and it means a client who opens a quote it never
//! closes cannot swallow the elements our proxies append after it.
//!
//! # Cost
//!
//! One forward pass over the header bytes, no allocation: the list is not
//! materialised. `Cidrs` keeps one candidate address; `Hops(N)` keeps the last
//! N parsed entries in a stack ring (on the heap only for N > 8, which no real
//! deployment has).

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::forwarded::{normalize, parse_forwarded_element, parse_xff_entry};

/// How much of the forwarding header we believe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Exactly this many proxies stand in front of tollgate, each appending
    /// the address it saw. `Hops(0)`: the TCP peer is the client and the
    /// header is ignored.
    Hops(u32),
    /// A TCP peer or list entry inside one of these networks is a trusted
    /// proxy. An empty list trusts no one (the peer is the client).
    Cidrs(Vec<IpNet>),
}

/// Which header carries the chain of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`; only the `for=`
    /// parameter of each element is read.
    Forwarded,
}

impl ForwardHeader {
    /// The header's name, lowercase, as `http::HeaderName` accepts it.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            ForwardHeader::XForwardedFor => "x-forwarded-for",
            ForwardHeader::Forwarded => "forwarded",
        }
    }
}

/// The validated `[client_ip]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIpPolicy {
    /// Which proxies' entries are believed.
    pub trust: Trust,
    /// Which header the proxies write.
    pub header: ForwardHeader,
    /// IPv4 clients are keyed by this prefix (0–32; larger is treated as 32).
    pub ipv4_prefix: u8,
    /// IPv6 clients are keyed by this prefix (0–128; larger is treated as
    /// 128). 64 by default: one customer usually owns a whole /64, so keying
    /// by /128 would let them rotate addresses past any limit.
    pub ipv6_prefix: u8,
}

impl Default for ClientIpPolicy {
    fn default() -> Self {
        ClientIpPolicy {
            trust: Trust::Hops(0),
            header: ForwardHeader::XForwardedFor,
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
}

/// Up to this many hops are remembered on the stack.
const INLINE_HOPS: usize = 8;

/// The client address for a request from `peer` carrying `header_values`
/// (every line of `policy.header`, in order), per contract §4 and the module
/// doc. IPv4-mapped IPv6 addresses, the peer's included, come back as IPv4.
///
/// Never fails: when the header cannot be believed the answer falls back to
/// an address we can vouch for (ultimately the TCP peer).
pub fn resolve<'a>(
    peer: IpAddr,
    header_values: impl Iterator<Item = &'a [u8]>,
    policy: &ClientIpPolicy,
) -> IpAddr {
    resolve_with(peer, || header_values, policy)
}

/// [`resolve`], asking for the header lines only when the policy reads them:
/// with `Hops(0)` or an untrusted peer the header is never looked up (for a
/// request, a header-map lookup of a custom name costs more than the rest of
/// the walk).
///
/// Inlined for the default policy, which trusts no proxy: its answer is the
/// peer, and the call of the whole walk cost every request ~33 instructions
/// (`bench/instructions.sh`).
#[inline(always)]
pub(crate) fn resolve_with<'a, I: Iterator<Item = &'a [u8]>>(
    peer: IpAddr,
    header_values: impl FnOnce() -> I,
    policy: &ClientIpPolicy,
) -> IpAddr {
    if let Trust::Hops(0) = policy.trust {
        return normalize(peer);
    }
    resolve_behind_proxies(peer, header_values, policy)
}

/// [`resolve_with`] where a proxy may be trusted.
#[inline(never)]
fn resolve_behind_proxies<'a, I: Iterator<Item = &'a [u8]>>(
    peer: IpAddr,
    header_values: impl FnOnce() -> I,
    policy: &ClientIpPolicy,
) -> IpAddr {
    let peer = normalize(peer);
    match &policy.trust {
        Trust::Hops(0) => peer,
        Trust::Hops(n) => resolve_hops(peer, header_values(), policy.header, *n),
        Trust::Cidrs(nets) => {
            if !is_trusted(nets, peer) {
                return peer;
            }
            let header_values = header_values();
            // `candidate` is where the right-to-left walk over the entries
            // seen so far would stop; `None` means "at the peer" (no entry
            // yet, or the newest entry was garbage, whose right neighbour is
            // whatever comes next). See the module doc.
            let mut candidate: Option<IpAddr> = None;
            for_each_entry(header_values, policy.header, |entry| match entry {
                Some(ip) if !is_trusted(nets, ip) => candidate = Some(ip),
                // Trusted: the walk passes through it, so an earlier stop
                // stands; with no stop yet it is the leftmost so far.
                Some(ip) => {
                    candidate.get_or_insert(ip);
                }
                None => candidate = None,
            });
            candidate.unwrap_or(peer)
        }
    }
}

/// `Hops(n)` for n ≥ 1: remember the last `n` entries, then walk them from
/// the newest, stopping at garbage.
fn resolve_hops<'a>(
    peer: IpAddr,
    header_values: impl Iterator<Item = &'a [u8]>,
    header: ForwardHeader,
    n: u32,
) -> IpAddr {
    let cap = usize::try_from(n).unwrap_or(usize::MAX);
    let mut inline = [None::<IpAddr>; INLINE_HOPS];
    // Only touched (and only ever grown to the number of entries actually
    // present, never to `n`) when more than INLINE_HOPS hops are configured.
    let mut heap: Vec<Option<IpAddr>> = Vec::new();
    let mut seen: usize = 0;
    for_each_entry(header_values, header, |entry| {
        let slot = seen % cap;
        if cap <= INLINE_HOPS {
            inline[slot] = entry;
        } else if slot < heap.len() {
            heap[slot] = entry;
        } else {
            debug_assert_eq!(slot, heap.len());
            heap.push(entry);
        }
        seen += 1;
    });
    let ring: &[Option<IpAddr>] = if cap <= INLINE_HOPS {
        &inline[..cap]
    } else {
        &heap
    };
    let mut client = peer;
    for back in 1..=seen.min(cap) {
        match ring[(seen - back) % cap] {
            Some(ip) => client = ip,
            None => break,
        }
    }
    client
}

/// Calls `f` with every non-empty entry of the list, left to right: the
/// parsed address, or `None` for an entry that is not one.
fn for_each_entry<'a>(
    header_values: impl Iterator<Item = &'a [u8]>,
    header: ForwardHeader,
    mut f: impl FnMut(Option<IpAddr>),
) {
    for line in header_values {
        for raw in line.split(|&b| b == b',') {
            if raw.iter().all(|&b| b == b' ' || b == b'\t') {
                continue;
            }
            f(match header {
                ForwardHeader::XForwardedFor => parse_xff_entry(raw),
                ForwardHeader::Forwarded => parse_forwarded_element(raw),
            });
        }
    }
}

/// Whether the TCP peer itself is a proxy `policy` trusts: `trusted_hops`
/// of at least 1, or an address inside `trusted_cidrs`.
pub(crate) fn peer_is_trusted(peer: IpAddr, policy: &ClientIpPolicy) -> bool {
    match &policy.trust {
        Trust::Hops(n) => *n > 0,
        Trust::Cidrs(nets) => is_trusted(nets, normalize(peer)),
    }
}

/// One address written alone (`X-Real-IP`), read as one
/// `X-Forwarded-For` entry is: spaces, a port and IPv6 brackets allowed.
pub(crate) fn parse_address(value: &[u8]) -> Option<IpAddr> {
    parse_xff_entry(value)
}

/// Whether `ip` (already normalised) is inside a trusted network. An
/// IPv4-mapped network written in the config (`::ffff:10.0.0.0/104`) still
/// matches, by also testing the mapped form.
fn is_trusted(nets: &[IpNet], ip: IpAddr) -> bool {
    let mapped = match ip {
        IpAddr::V4(v4) => Some(IpAddr::V6(v4.to_ipv6_mapped())),
        IpAddr::V6(_) => None,
    };
    nets.iter()
        .any(|net| net.contains(&ip) || mapped.is_some_and(|m| net.contains(&m)))
}

/// The network `ip` is keyed by: masked to `ipv4_prefix` or `ipv6_prefix`
/// (an IPv4-mapped address counts as IPv4). Prefixes beyond the address
/// width are clamped, so this cannot fail.
pub fn client_net(ip: IpAddr, policy: &ClientIpPolicy) -> IpNet {
    match normalize(ip) {
        IpAddr::V4(v4) => {
            // The clamp makes `new_assert`'s only panic unreachable.
            IpNet::V4(Ipv4Net::new_assert(v4, policy.ipv4_prefix.min(32)).trunc())
        }
        IpAddr::V6(v6) => IpNet::V6(Ipv6Net::new_assert(v6, policy.ipv6_prefix.min(128)).trunc()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test literal")
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("test literal")
    }

    fn policy(trust: Trust, header: ForwardHeader) -> ClientIpPolicy {
        ClientIpPolicy {
            trust,
            header,
            ..ClientIpPolicy::default()
        }
    }

    fn run(peer: &str, lines: &[&str], policy: &ClientIpPolicy) -> IpAddr {
        resolve(ip(peer), lines.iter().map(|l| l.as_bytes()), policy)
    }

    const PEER: &str = "10.0.0.1";

    #[test]
    fn the_header_is_asked_for_only_when_the_policy_reads_it() {
        let lines = ["1.1.1.1"];
        let cases = [
            (Trust::Hops(0), PEER, false, PEER),
            (Trust::Hops(1), PEER, true, "1.1.1.1"),
            (Trust::Cidrs(vec![]), PEER, false, PEER),
            (Trust::Cidrs(vec![net("192.168.0.0/16")]), PEER, false, PEER),
            (Trust::Cidrs(vec![net("10.0.0.0/8")]), PEER, true, "1.1.1.1"),
        ];
        for (trust, peer, reads, client) in cases {
            let p = policy(trust.clone(), ForwardHeader::XForwardedFor);
            let mut asked = false;
            let got = resolve_with(
                ip(peer),
                || {
                    asked = true;
                    lines.iter().map(|l| l.as_bytes())
                },
                &p,
            );
            assert_eq!((asked, got), (reads, ip(client)), "{trust:?}");
        }
    }

    #[test]
    fn default_policy() {
        let p = ClientIpPolicy::default();
        assert_eq!(p.trust, Trust::Hops(0));
        assert_eq!(p.header, ForwardHeader::XForwardedFor);
        assert_eq!((p.ipv4_prefix, p.ipv6_prefix), (32, 64));
    }

    #[test]
    fn hops_table() {
        // (hops, header lines, expected client)
        let cases: &[(u32, &[&str], &str)] = &[
            // Hops(0) ignores the header entirely.
            (0, &["1.1.1.1"], PEER),
            (0, &["garbage"], PEER),
            // Absent or empty header: the peer.
            (1, &[], PEER),
            (1, &[""], PEER),
            (1, &[" , ,"], PEER),
            (2, &[], PEER),
            // N-th from the right.
            (1, &["6.6.6.6, 1.1.1.1, 2.2.2.2"], "2.2.2.2"),
            (2, &["6.6.6.6, 1.1.1.1, 2.2.2.2"], "1.1.1.1"),
            (3, &["6.6.6.6, 1.1.1.1, 2.2.2.2"], "6.6.6.6"),
            // Fewer than N entries: the leftmost.
            (4, &["6.6.6.6, 1.1.1.1, 2.2.2.2"], "6.6.6.6"),
            (1000, &["6.6.6.6, 1.1.1.1, 2.2.2.2"], "6.6.6.6"),
            (u32::MAX, &["1.1.1.1"], "1.1.1.1"),
            // Spaces and tabs, no spaces.
            (2, &["  6.6.6.6 ,\t1.1.1.1\t,2.2.2.2  "], "1.1.1.1"),
            (2, &["6.6.6.6,1.1.1.1,2.2.2.2"], "1.1.1.1"),
            // Ports and brackets.
            (1, &["1.2.3.4:5678"], "1.2.3.4"),
            (1, &["[2001:db8::1]:443"], "2001:db8::1"),
            (2, &["[2001:db8::1]:443, 1.2.3.4:5678"], "2001:db8::1"),
            (1, &["2001:db8::1"], "2001:db8::1"),
            // IPv4-mapped counts as IPv4.
            (1, &["::ffff:1.2.3.4"], "1.2.3.4"),
            // Multiple lines continue the list.
            (1, &["6.6.6.6", "1.1.1.1"], "1.1.1.1"),
            (2, &["6.6.6.6", "1.1.1.1"], "6.6.6.6"),
            (2, &["6.6.6.6, 7.7.7.7", "1.1.1.1"], "7.7.7.7"),
            (3, &["6.6.6.6", "", "7.7.7.7, 1.1.1.1"], "6.6.6.6"),
            // Empty elements are not entries.
            (2, &["6.6.6.6,, 1.1.1.1,"], "6.6.6.6"),
            // Garbage ends the walk: the address to its right.
            (1, &["garbage"], PEER),
            (2, &["6.6.6.6, garbage, 1.1.1.1"], "1.1.1.1"),
            (3, &["6.6.6.6, garbage, 1.1.1.1"], "1.1.1.1"),
            (9, &["6.6.6.6, garbage, 1.1.1.1"], "1.1.1.1"),
            (2, &["6.6.6.6, 1.1.1.1, unknown"], PEER),
            // ... but garbage left of the N-th entry is never reached.
            (2, &["garbage, 6.6.6.6, 1.1.1.1"], "6.6.6.6"),
            (1, &["garbage, 1.1.1.1"], "1.1.1.1"),
            (2, &["1.1.1.1, 2.2.2.2:99999"], PEER),
            // More hops than fit on the stack, with a wrap-around ring.
            (
                9,
                &[
                    "1.0.0.1, 1.0.0.2, 1.0.0.3, 1.0.0.4, 1.0.0.5, 1.0.0.6, 1.0.0.7, 1.0.0.8, 1.0.0.9, 1.0.0.10, 1.0.0.11",
                ],
                "1.0.0.3",
            ),
            (
                9,
                &[
                    "1.0.0.1, 1.0.0.2, 1.0.0.3, x, 1.0.0.5, 1.0.0.6, 1.0.0.7, 1.0.0.8, 1.0.0.9, 1.0.0.10, 1.0.0.11",
                ],
                "1.0.0.5",
            ),
            (
                8,
                &[
                    "1.0.0.1, 1.0.0.2, 1.0.0.3, 1.0.0.4, 1.0.0.5, 1.0.0.6, 1.0.0.7, 1.0.0.8, 1.0.0.9, 1.0.0.10, 1.0.0.11",
                ],
                "1.0.0.4",
            ),
        ];
        for (hops, lines, want) in cases {
            let p = policy(Trust::Hops(*hops), ForwardHeader::XForwardedFor);
            assert_eq!(run(PEER, lines, &p), ip(want), "Hops({hops}) {lines:?}");
        }
    }

    #[test]
    fn cidrs_table() {
        let trusted = Trust::Cidrs(vec![net("10.0.0.0/8"), net("2001:db8:ffff::/48")]);
        let p = policy(trusted, ForwardHeader::XForwardedFor);
        // (peer, header lines, expected client)
        let cases: &[(&str, &[&str], &str)] = &[
            // An untrusted peer is the client, whatever it sends.
            ("1.1.1.1", &["6.6.6.6"], "1.1.1.1"),
            ("::ffff:1.1.1.1", &["6.6.6.6"], "1.1.1.1"),
            // Trusted peer, no header: the peer.
            (PEER, &[], PEER),
            (PEER, &[""], PEER),
            // Step left past trusted entries to the first untrusted one.
            (PEER, &["1.1.1.1"], "1.1.1.1"),
            (PEER, &["6.6.6.6, 1.1.1.1, 10.0.0.2"], "1.1.1.1"),
            (PEER, &["6.6.6.6, 1.1.1.1, 10.0.0.2, 10.0.0.3"], "1.1.1.1"),
            (PEER, &["6.6.6.6", "1.1.1.1", "10.0.0.2"], "1.1.1.1"),
            // A trusted address further left does not matter once stopped.
            (PEER, &["10.9.9.9, 1.1.1.1, 10.0.0.2"], "1.1.1.1"),
            // All trusted: the leftmost.
            (PEER, &["10.0.0.3, 10.0.0.2"], "10.0.0.3"),
            // Ports, brackets, IPv6 trusted networks, mapped addresses.
            (PEER, &["1.1.1.1:443, 10.0.0.2:80"], "1.1.1.1"),
            (
                "2001:db8:ffff::1",
                &["[2001:db8::1]:443, [2001:db8:ffff::2]:80"],
                "2001:db8::1",
            ),
            ("::ffff:10.0.0.1", &["::ffff:10.0.0.2, 1.1.1.1"], "1.1.1.1"),
            (PEER, &["1.1.1.1, ::ffff:10.0.0.2"], "1.1.1.1"),
            // Garbage ends the walk: the address to its right.
            (PEER, &["1.1.1.1, garbage"], PEER),
            (PEER, &["1.1.1.1, garbage, 10.0.0.2"], "10.0.0.2"),
            (
                PEER,
                &["1.1.1.1, garbage", "10.0.0.2, 10.0.0.3"],
                "10.0.0.2",
            ),
            (PEER, &["garbage, 1.1.1.1, 10.0.0.2"], "1.1.1.1"),
            (PEER, &["1.1.1.1, [2001:db8::1, 10.0.0.2"], "10.0.0.2"),
            // Empty elements are skipped, not garbage.
            (PEER, &["1.1.1.1, , 10.0.0.2,"], "1.1.1.1"),
        ];
        for (peer, lines, want) in cases {
            assert_eq!(run(peer, lines, &p), ip(want), "peer {peer} {lines:?}");
        }
    }

    #[test]
    fn empty_cidr_list_trusts_no_one() {
        let p = policy(Trust::Cidrs(vec![]), ForwardHeader::XForwardedFor);
        assert_eq!(run(PEER, &["1.1.1.1"], &p), ip(PEER));
    }

    #[test]
    fn mapped_trusted_network_matches_ipv4_peer() {
        let p = policy(
            Trust::Cidrs(vec![net("::ffff:10.0.0.0/104")]),
            ForwardHeader::XForwardedFor,
        );
        assert_eq!(run(PEER, &["1.1.1.1"], &p), ip("1.1.1.1"));
    }

    #[test]
    fn forwarded_header() {
        let hops = |n| policy(Trust::Hops(n), ForwardHeader::Forwarded);
        let cidrs = policy(
            Trust::Cidrs(vec![net("10.0.0.0/8")]),
            ForwardHeader::Forwarded,
        );
        let cases: &[(&ClientIpPolicy, &[&str], &str)] = &[
            (
                &hops(1),
                &["for=192.0.2.60;proto=http;by=203.0.113.43"],
                "192.0.2.60",
            ),
            (
                &hops(1),
                &["for=\"[2001:db8:cafe::17]:4711\""],
                "2001:db8:cafe::17",
            ),
            (
                &hops(2),
                &["for=192.0.2.43, for=198.51.100.17"],
                "192.0.2.43",
            ),
            (
                &hops(2),
                &["for=192.0.2.43", "for=198.51.100.17"],
                "192.0.2.43",
            ),
            (
                &hops(2),
                &["for=_hidden, for=198.51.100.17"],
                "198.51.100.17",
            ),
            (&hops(1), &["for=unknown"], PEER),
            (&hops(1), &["proto=https"], PEER),
            (&hops(1), &["for=\"_gazonk\""], PEER),
            // An unterminated quote cannot swallow later elements.
            (&hops(1), &["for=\"6.6.6.6, for=1.1.1.1"], "1.1.1.1"),
            (&hops(2), &["for=\"6.6.6.6, for=1.1.1.1"], "1.1.1.1"),
            (&cidrs, &["for=1.1.1.1, for=10.0.0.2"], "1.1.1.1"),
            (&cidrs, &["for=1.1.1.1, for=_x, for=10.0.0.2"], "10.0.0.2"),
            (&cidrs, &["for=10.0.0.3;proto=https"], "10.0.0.3"),
        ];
        for (p, lines, want) in cases {
            assert_eq!(run(PEER, lines, p), ip(want), "{:?} {lines:?}", p.trust);
        }
    }

    #[test]
    fn client_net_masks() {
        let p = ClientIpPolicy {
            ipv4_prefix: 24,
            ipv6_prefix: 48,
            ..ClientIpPolicy::default()
        };
        assert_eq!(client_net(ip("1.2.3.4"), &p), net("1.2.3.0/24"));
        assert_eq!(client_net(ip("::ffff:1.2.3.4"), &p), net("1.2.3.0/24"));
        assert_eq!(
            client_net(ip("2001:db8:1:2:3::4"), &p),
            net("2001:db8:1::/48")
        );
        let d = ClientIpPolicy::default();
        assert_eq!(client_net(ip("1.2.3.4"), &d), net("1.2.3.4/32"));
        assert_eq!(
            client_net(ip("2001:db8:1:2:3::4"), &d),
            net("2001:db8:1:2::/64")
        );
        let wide = ClientIpPolicy {
            ipv4_prefix: 200,
            ipv6_prefix: 0,
            ..ClientIpPolicy::default()
        };
        assert_eq!(client_net(ip("1.2.3.4"), &wide), net("1.2.3.4/32"));
        assert_eq!(client_net(ip("2001:db8::1"), &wide), net("::/0"));
    }

    /// What a client may put in front of the entries our proxies append:
    /// valid addresses (with and without ports), junk, quotes, separators.
    fn client_fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<std::net::Ipv4Addr>().prop_map(|a| a.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|a| format!("[{a}]:1")),
            any::<std::net::Ipv4Addr>().prop_map(|a| format!("for={a}")),
            Just(",".to_string()),
            Just("\"".to_string()),
            Just("for=\"".to_string()),
            Just("unknown".to_string()),
            "[ -~]{0,12}",
        ]
    }

    /// The client's own header lines: each a sequence of fragments.
    fn client_lines() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(
            prop::collection::vec(client_fragment(), 0..5).prop_map(|f| f.join(", ")),
            0..3,
        )
    }

    /// Appends `addr` the way an honest proxy does: onto the last line, or as
    /// a new line when `new_line` (both are legal and seen in practice).
    fn append(lines: &mut Vec<String>, addr: IpAddr, header: ForwardHeader, new_line: bool) {
        let entry = match (header, addr) {
            (ForwardHeader::XForwardedFor, a) => a.to_string(),
            (ForwardHeader::Forwarded, IpAddr::V4(a)) => format!("for={a}"),
            (ForwardHeader::Forwarded, IpAddr::V6(a)) => format!("for=\"[{a}]\""),
        };
        match lines.last_mut() {
            Some(last) if !new_line => {
                last.push_str(", ");
                last.push_str(&entry);
            }
            _ => lines.push(entry),
        }
    }

    fn header_kind() -> impl Strategy<Value = ForwardHeader> {
        prop_oneof![
            Just(ForwardHeader::XForwardedFor),
            Just(ForwardHeader::Forwarded)
        ]
    }

    /// An address that is not IPv4-mapped (those come back normalised, so
    /// comparing them with `==` would need normalising the expectation too).
    fn real_ip() -> impl Strategy<Value = IpAddr> {
        any::<IpAddr>().prop_map(normalize)
    }

    proptest! {
        /// N honest proxies, whatever the client wrote: the resolved client is
        /// the address the first trusted proxy saw.
        #[test]
        fn hops_never_trust_client_written_entries(
            client_written in client_lines(),
            client in real_ip(),
            proxies in prop::collection::vec(real_ip(), 1..12),
            new_lines in prop::collection::vec(any::<bool>(), 12),
            header in header_kind(),
        ) {
            let mut lines = client_written;
            // The first proxy saw the client; each further proxy saw the one
            // before it; tollgate's peer is the last proxy.
            append(&mut lines, client, header, new_lines[0]);
            for (i, seen) in proxies[..proxies.len() - 1].iter().enumerate() {
                append(&mut lines, *seen, header, new_lines[i + 1]);
            }
            let peer = proxies[proxies.len() - 1];
            let hops = u32::try_from(proxies.len()).expect("at most 12");
            let p = policy(Trust::Hops(hops), header);
            let got = resolve(peer, lines.iter().map(|l| l.as_bytes()), &p);
            prop_assert_eq!(got, client, "lines {:?}", lines);
        }

        /// Same for trusted networks: proxies inside 10.0.0.0/8 or
        /// fd00::/8, the client outside both.
        #[test]
        fn cidrs_never_trust_client_written_entries(
            client_written in client_lines(),
            client in real_ip().prop_filter("untrusted", |a| !is_trusted(&test_nets(), *a)),
            proxy_hosts in prop::collection::vec((any::<bool>(), any::<u32>()), 1..12),
            new_lines in prop::collection::vec(any::<bool>(), 12),
            header in header_kind(),
        ) {
            let proxies: Vec<IpAddr> = proxy_hosts
                .iter()
                .map(|&(v6, host)| {
                    if v6 {
                        IpAddr::V6(std::net::Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(host)))
                    } else {
                        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | (host & 0x00ff_ffff)))
                    }
                })
                .collect();
            let mut lines = client_written;
            append(&mut lines, client, header, new_lines[0]);
            for (i, seen) in proxies[..proxies.len() - 1].iter().enumerate() {
                append(&mut lines, *seen, header, new_lines[i + 1]);
            }
            let peer = proxies[proxies.len() - 1];
            let p = policy(Trust::Cidrs(test_nets()), header);
            let got = resolve(peer, lines.iter().map(|l| l.as_bytes()), &p);
            prop_assert_eq!(got, client, "lines {:?}", lines);
        }

        /// Arbitrary bytes never panic, and the answer is always the peer or
        /// an address that appears in the input.
        #[test]
        fn arbitrary_bytes_are_harmless(
            lines in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..4),
            hops in 0u32..20,
            header in header_kind(),
        ) {
            let peer = ip("10.0.0.1");
            for trust in [Trust::Hops(hops), Trust::Cidrs(test_nets())] {
                let p = policy(trust, header);
                let got = resolve(peer, lines.iter().map(|l| l.as_slice()), &p);
                prop_assert!(got == peer || !lines.is_empty());
            }
        }
    }

    /// Contract §4 read literally: materialise the list, then walk it from
    /// the right. Allocates, and is structured differently from the one-pass
    /// `resolve` on purpose, so the two can check each other.
    fn reference(peer: IpAddr, lines: &[String], policy: &ClientIpPolicy) -> IpAddr {
        let peer = normalize(peer);
        let mut entries = Vec::new();
        for_each_entry(lines.iter().map(|l| l.as_bytes()), policy.header, |e| {
            entries.push(e)
        });
        match &policy.trust {
            Trust::Hops(0) => peer,
            Trust::Hops(n) => {
                let mut client = peer;
                for entry in entries.iter().rev().take(*n as usize) {
                    match entry {
                        Some(ip) => client = *ip,
                        None => break,
                    }
                }
                client
            }
            Trust::Cidrs(nets) => {
                let mut current = peer;
                let mut left = entries.len();
                while is_trusted(nets, current) && left > 0 {
                    left -= 1;
                    match entries[left] {
                        Some(ip) => current = ip,
                        None => break,
                    }
                }
                current
            }
        }
    }

    /// Entries drawn so that trusted, untrusted, garbage and empty ones mix.
    fn mixed_entry() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..4).prop_map(|h| format!("10.0.0.{h}")),
            (0u8..4).prop_map(|h| format!("[fd00::{h}]:80")),
            (0u8..4).prop_map(|h| format!("1.1.1.{h}")),
            (0u8..4).prop_map(|h| format!("::ffff:10.0.0.{h}")),
            Just("garbage".to_string()),
            Just(String::new()),
        ]
    }

    proptest! {
        /// The one-pass walk agrees with the literal one on every mix of
        /// entries, lines, trust modes and header kinds.
        #[test]
        fn one_pass_matches_literal_walk(
            lines in prop::collection::vec(prop::collection::vec(mixed_entry(), 0..6), 0..4),
            peer in prop_oneof![Just("10.0.0.9"), Just("1.1.1.9"), Just("::ffff:10.0.0.9")],
            hops in 0u32..12,
            header in header_kind(),
        ) {
            let lines: Vec<String> = lines
                .iter()
                .map(|entries| {
                    let entries: Vec<String> = entries
                        .iter()
                        .map(|e| match header {
                            ForwardHeader::XForwardedFor => e.clone(),
                            ForwardHeader::Forwarded if e.is_empty() => String::new(),
                            ForwardHeader::Forwarded => format!("for=\"{e}\""),
                        })
                        .collect();
                    entries.join(",")
                })
                .collect();
            for trust in [Trust::Hops(hops), Trust::Cidrs(test_nets())] {
                let p = policy(trust, header);
                let got = resolve(ip(peer), lines.iter().map(|l| l.as_bytes()), &p);
                prop_assert_eq!(got, reference(ip(peer), &lines, &p), "{:?} {:?}", p.trust, lines);
            }
        }
    }

    fn test_nets() -> Vec<IpNet> {
        vec![net("10.0.0.0/8"), net("fd00::/8")]
    }
}
