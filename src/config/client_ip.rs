//! `[client_ip]`: who the client is behind proxies (trusted hops or
//! networks, `X-Forwarded-For` or `Forwarded`) and the prefix an address is
//! keyed by. Its serde mirror, its validated type and its check.

use ipnet::IpNet;
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;

/// `[client_ip]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientIp {
    pub(crate) trusted_hops: Option<u32>,
    pub(crate) trusted_cidrs: Option<Vec<String>>,
    pub(crate) header: Option<String>,
    pub(crate) ipv6_prefix: Option<u8>,
    pub(crate) ipv4_prefix: Option<u8>,
}

/// `[client_ip]`, checked: how the client's address is found and keyed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClientIpConfig {
    pub(crate) trusted_hops: u32,
    pub(crate) trusted_cidrs: Vec<IpNet>,
    /// Read RFC 7239 `Forwarded` instead of `X-Forwarded-For`.
    pub(crate) forwarded_header: bool,
    pub(crate) ipv4_prefix: u8,
    pub(crate) ipv6_prefix: u8,
}

pub(super) fn check_client_ip(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawClientIp,
) -> ClientIpConfig {
    let mut config = ClientIpConfig {
        trusted_hops: raw.trusted_hops.unwrap_or(0),
        ipv4_prefix: raw.ipv4_prefix.unwrap_or(32),
        ipv6_prefix: raw.ipv6_prefix.unwrap_or(64),
        ..ClientIpConfig::default()
    };
    if config.ipv4_prefix > 32 {
        c.problem(path.key("ipv4_prefix"), "must be between 0 and 32");
    }
    if config.ipv6_prefix > 128 {
        c.problem(path.key("ipv6_prefix"), "must be between 0 and 128");
    }
    if let Some(cidrs) = &raw.trusted_cidrs {
        if raw.trusted_hops.is_some() {
            c.problem(
                path.key("trusted_cidrs"),
                "`trusted_hops` and `trusted_cidrs` are exclusive; set one of them",
            );
        }
        for (i, text) in cidrs.iter().enumerate() {
            match text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
            {
                Ok(net) => config.trusted_cidrs.push(net.trunc()),
                Err(_) => c.problem(
                    path.key("trusted_cidrs").index(i),
                    format!(
                        "`{text}` is not a network; expected CIDR notation like \"10.0.0.0/8\""
                    ),
                ),
            }
        }
    }
    if let Some(header) = &raw.header {
        config.forwarded_header = c.one_of(
            path.key("header"),
            header,
            &["x-forwarded-for", "forwarded"],
        ) == Some("forwarded");
    }
    config
}

#[cfg(test)]
mod tests {
    use crate::config::validate::errors;

    #[test]
    fn trusted_hops_and_cidrs_are_exclusive() {
        let message = errors("[client_ip]\ntrusted_hops = 1\ntrusted_cidrs = [\"10.0.0.0/8\"]\n");
        assert!(message.contains("exclusive"), "{message}");
    }
}
