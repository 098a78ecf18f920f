//! Fuzz target for client-IP resolution: arbitrary bytes as forwarding-header
//! lines, through `resolve` under both header kinds and both trust modes.
//!
//! Beyond "never panics", it checks what must hold for *any* input: with no
//! header the answer is the TCP peer, and `client_net` of the answer (with
//! prefixes out of range, too) contains it.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use tollgate::identity::client_ip::{ClientIpPolicy, ForwardHeader, Trust, client_net, resolve};

fuzz_target!(|data: &[u8]| {
    // First byte: hop count and peer choice; the rest: header lines split at
    // b'\n' (a real header line cannot contain one).
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let hops = u32::from(control & 0x0f);
    let peer = if control & 0x10 == 0 {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
    } else {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1))
    };
    let nets: Vec<ipnet::IpNet> = ["10.0.0.0/8", "fd00::/8", "::ffff:192.168.0.0/112"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    for header in [ForwardHeader::XForwardedFor, ForwardHeader::Forwarded] {
        for trust in [Trust::Hops(hops), Trust::Cidrs(nets.clone())] {
            let policy = ClientIpPolicy {
                trust,
                header,
                ipv4_prefix: control.rotate_left(3) % 40,
                ipv6_prefix: control.wrapping_mul(7),
            };
            let client = resolve(peer, rest.split(|&b| b == b'\n'), &policy);
            // Resolution never invents an address: with nothing to read, the
            // answer is the peer.
            if rest.is_empty() {
                assert_eq!(client, peer, "invented {client} from no input");
            }
            let net = client_net(client, &policy);
            let normalised = match client {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
                v4 => v4,
            };
            assert!(net.contains(&normalised), "{net} does not contain {client}");
        }
    }
});
