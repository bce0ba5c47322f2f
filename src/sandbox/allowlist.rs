//! Which hosts an agent's commands may reach through the egress proxy
//! ([`super::proxy`]): `sandbox.allowedDomains` as Claude Code documents it, the model API's
//! endpoint, and the vetting of what an allowed name resolves to (never the host itself, its
//! private networks, link-local or reserved space).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The refusal reason of a host no entry names; the proxy's 403 says it too.
pub(super) const NOT_LISTED: &str = "host not in sandbox.allowedDomains";

/// Host patterns as Claude Code documents them for `allowedDomains`: `example.com` is that host
/// exactly, `*.example.com` any subdomain of it (not `example.com` itself); case-insensitive.
/// A bare entry admits ports 80 and 443; `host:port` admits that port only. Endpoints
/// (`host`, `port`) — the model API's, from the adapter's own configuration, not the agent's —
/// are allowed on that port, and their addresses are not vetted.
#[derive(Debug, Clone, Default)]
pub struct DomainAllowlist {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Lower case, without brackets or a trailing dot; `*.` kept for a wildcard.
    pattern: String,
    /// `None`: 80 and 443.
    port: Option<u16>,
    trusted: bool,
}

/// What an allowlist says about a target.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Allowed; `vet` says whether the resolved addresses must be public.
    Allowed {
        vet: bool,
    },
    Refused(String),
}

/// `[v6]`, `Host.` → `v6`, `host`.
pub(super) fn normal_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

impl DomainAllowlist {
    /// `patterns` as `sandbox.allowedDomains` holds them (validated by the config).
    pub fn new(patterns: &[String]) -> Self {
        let entries = patterns
            .iter()
            .map(|p| match p.rsplit_once(':') {
                Some((host, port)) if port.parse::<u16>().is_ok() => Entry {
                    pattern: normal_host(host),
                    port: port.parse().ok(),
                    trusted: false,
                },
                _ => Entry {
                    pattern: normal_host(p),
                    port: None,
                    trusted: false,
                },
            })
            .collect();
        DomainAllowlist { entries }
    }

    /// Also allows `host` on `port` (and nothing else of it), without vetting its addresses.
    pub fn with_endpoint(mut self, host: &str, port: u16) -> Self {
        self.entries.push(Entry {
            pattern: normal_host(host),
            port: Some(port),
            trusted: true,
        });
        self
    }

    pub(super) fn admit(&self, host: &str, port: u16) -> Admission {
        let host = normal_host(host);
        let named: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| match e.pattern.strip_prefix("*.") {
                Some(base) => host.len() > base.len() + 1 && host.ends_with(&format!(".{base}")),
                None => e.pattern == host,
            })
            .collect();
        if named.is_empty() {
            return Admission::Refused(NOT_LISTED.into());
        }
        match named.iter().find(|e| match e.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        }) {
            // An IP literal is only ever named by an entry that is that literal.
            Some(e) => Admission::Allowed {
                vet: !e.trusted && host.parse::<IpAddr>().is_err(),
            },
            // The model API's endpoint names its port only: other ports of its host are as
            // unlisted as any host.
            None if named.iter().all(|e| e.trusted) => Admission::Refused(NOT_LISTED.into()),
            None => Admission::Refused(format!(
                "port {port} not allowed: ports 80 and 443 only, unless sandbox.allowedDomains lists {host}:{port}"
            )),
        }
    }
}

/// Whether an agent may reach `ip` through an allowed name: not the host itself, its private
/// networks, link-local (cloud metadata), multicast or reserved space.
pub(super) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            // IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) carry a v4 address.
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a, b, c, d));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || v6 == Ipv6Addr::from(1u128)) // ::1 spelled otherwise
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || a == 0 // "this network", 0.0.0.0 included
        || a >= 240 // reserved
        || (a == 100 && (64..128).contains(&b))) // CGNAT 100.64.0.0/10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass_the_vetting() {
        for private in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "ff02::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.1.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn wildcard_matches_subdomains_only_and_exact_names_match_exactly() {
        let a = DomainAllowlist::new(&["*.Example.com".into(), "registry.npmjs.org".into()]);
        let allows = |h: &str| a.admit(h, 443) != Admission::Refused(NOT_LISTED.into());
        assert!(allows("api.example.com"));
        assert!(allows("a.b.EXAMPLE.com."));
        assert!(!allows("example.com"));
        assert!(!allows("evilexample.com"));
        assert!(allows("registry.npmjs.org"));
        assert!(!allows("registry.npmjs.org.evil.com"));
        assert!(matches!(
            DomainAllowlist::default().admit("localhost", 80),
            Admission::Refused(_)
        ));
    }
}
