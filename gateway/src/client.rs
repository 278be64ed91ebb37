//! The client's address and scheme, behind load balancers too (`gateway.trusted_proxies`).
//!
//! The address is the TCP peer's, unless the peer is a trusted proxy: then it is the rightmost
//! `X-Forwarded-For` entry that is not itself trusted (entries to its right were added by
//! trusted hops; entries to its left were written by the client and prove nothing). With no
//! trusted proxies, `X-Forwarded-For` from clients is never believed, so it cannot be spoofed to
//! dodge the failed-authentication budget. That address is the one the budget, the access log
//! and metrics use.
//!
//! Upstream, the gateway appends that same address to the `X-Forwarded-For` it received from a
//! trusted proxy (as nginx does with its realip module), so the rightmost entry an upstream sees
//! is the client as the gateway judged it. From any other peer the header it sent is dropped and
//! the upstream gets the peer's address alone (as Caddy and Traefik do): an upstream that reads
//! the leftmost entry, as many do, is not fooled by a chain the client wrote.
//!
//! `X-Forwarded-Proto` tells the upstream the scheme the client used (`http` or `https`), for
//! the redirects, absolute links and secure cookies it makes. It is the scheme of the
//! connection the request came on, unless the peer is a trusted proxy that said `http` or
//! `https` itself (a load balancer that ended the client's TLS): then it is the proxy's. A
//! client's own is never believed, as Envoy does.

use std::net::IpAddr;

use bytes::BufMut;
use http::HeaderValue;
use ipnet::IpNet;

/// The proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses CIDRs (`10.0.0.0/8`, `192.0.2.7/32`, `::1/128`) or single addresses.
    pub fn parse(list: &[String]) -> Result<TrustedProxies, String> {
        list.iter()
            .map(|text| {
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("`{text}` is not a CIDR like 10.0.0.0/8 or an address"))
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client address of a request from `peer` carrying these `X-Forwarded-For` values.
    pub fn client<'a>(&self, peer: IpAddr, forwarded: impl Iterator<Item = &'a [u8]>) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let values: Vec<&[u8]> = forwarded.collect();
        let entries = values
            .iter()
            .flat_map(|v| std::str::from_utf8(v).unwrap_or("!").split(','))
            .rev();
        for entry in entries {
            match entry.trim().parse::<IpAddr>() {
                Ok(ip) if self.trusts(ip) => continue,
                Ok(ip) => return canonical(ip),
                // A hop wrote something that is not an address: nothing left of it is known.
                Err(_) => return peer,
            }
        }
        peer
    }

    /// The `X-Forwarded-For` to send upstream for a request from `peer` whose client is
    /// `client`: what was `received`, if `peer` is trusted and it is text, then the `client`.
    pub fn forward(
        &self,
        peer: IpAddr,
        client: IpAddr,
        received: Option<&HeaderValue>,
    ) -> Forwarded {
        let earlier = received
            .filter(|r| r.to_str().is_ok_and(|r| !r.trim().is_empty()) && self.trusts(peer))
            .cloned();
        Forwarded { earlier, client }
    }

    /// The `X-Forwarded-Proto` to send upstream for a request from `peer` that came over TLS
    /// or not: what was `received`, if `peer` is trusted and it is `http` or `https` (any
    /// case), else the connection's. Of a list, the last entry: the one `peer` wrote (a proxy
    /// that appends rather than sets leaves the client's own to its left, which proves
    /// nothing).
    pub fn scheme(&self, peer: IpAddr, tls: bool, received: Option<&HeaderValue>) -> &'static str {
        let said = received
            .filter(|_| self.trusts(peer))
            .and_then(|value| value.as_bytes().rsplit(|&b| b == b',').next())
            .map(<[u8]>::trim_ascii);
        match said {
            Some(said) if said.eq_ignore_ascii_case(b"https") => "https",
            Some(said) if said.eq_ignore_ascii_case(b"http") => "http",
            _ if tls => "https",
            _ => "http",
        }
    }
}

/// The `X-Forwarded-For` value to send upstream ([`TrustedProxies::forward`]), written where it
/// goes rather than built first.
#[derive(Debug)]
pub struct Forwarded {
    /// What a trusted proxy sent: visible text, kept with the value it came in.
    earlier: Option<HeaderValue>,
    client: IpAddr,
}

impl Forwarded {
    /// Writes the value, header text: what was received, if anything, then the client.
    pub fn write(&self, out: &mut impl BufMut) {
        if let Some(earlier) = &self.earlier {
            out.put_slice(earlier.as_bytes());
            out.put_slice(b", ");
        }
        write_ip(out, self.client);
    }
}

/// Writes `ip` as `Display` writes it. An IPv4 address, the common case on every request, is
/// written a digit group at a time: `Display` goes through `fmt` and took 1,260 instructions
/// per request (callgrind), a tenth of the gateway's own work outside the header maps.
fn write_ip(out: &mut impl BufMut, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.put_u8(b'.');
                }
                out.put_slice(itoa::Buffer::new().format(octet).as_bytes());
            }
        }
        IpAddr::V6(v6) => {
            use std::io::Write;
            write!(out.writer(), "{v6}").expect("a growing buffer takes any text");
        }
    }
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they are.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies::parse(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_hop_and_only_behind_trusted_peers() {
        let lb = trusted(&["10.0.0.0/8", "192.0.2.1"]);
        let xff = |v: &'static str| std::iter::once(v.as_bytes());
        // From the load balancer: the rightmost entry it did not add.
        assert_eq!(
            lb.client(ip("10.1.2.3"), xff("203.0.113.9")),
            ip("203.0.113.9")
        );
        assert_eq!(
            lb.client(ip("10.1.2.3"), xff("6.6.6.6, 203.0.113.9, 10.0.0.5")),
            ip("203.0.113.9"),
            "the spoofed leftmost entry is ignored"
        );
        // Several header lines count as one list, in order.
        let lines = [b"6.6.6.6".as_slice(), b"203.0.113.9, 192.0.2.1".as_slice()];
        assert_eq!(
            lb.client(ip("10.1.2.3"), lines.into_iter()),
            ip("203.0.113.9")
        );
        // From anyone else the header is not believed.
        assert_eq!(
            lb.client(ip("198.51.100.4"), xff("203.0.113.9")),
            ip("198.51.100.4")
        );
        assert_eq!(
            TrustedProxies::default().client(ip("127.0.0.1"), xff("1.2.3.4")),
            ip("127.0.0.1")
        );
        // Nothing usable: the peer.
        assert_eq!(
            lb.client(ip("10.1.2.3"), std::iter::empty()),
            ip("10.1.2.3")
        );
        assert_eq!(lb.client(ip("10.1.2.3"), xff("unknown")), ip("10.1.2.3"));
        assert_eq!(lb.client(ip("10.1.2.3"), xff("10.0.0.9")), ip("10.1.2.3"));
    }

    #[test]
    fn the_scheme_upstream_is_the_connections_unless_a_trusted_proxy_said_it() {
        let lb = trusted(&["10.0.0.0/8"]);
        let scheme = |peer, tls, received: Option<&'static str>| {
            lb.scheme(
                ip(peer),
                tls,
                received.map(HeaderValue::from_static).as_ref(),
            )
        };
        // The connection's own.
        assert_eq!(scheme("10.0.0.1", false, None), "http");
        assert_eq!(scheme("10.0.0.1", true, None), "https");
        // A trusted proxy's, whatever the connection from it.
        assert_eq!(scheme("10.0.0.1", false, Some("https")), "https");
        assert_eq!(scheme("10.0.0.1", true, Some("http")), "http");
        assert_eq!(scheme("10.0.0.1", false, Some(" HTTPS ")), "https");
        // Of a list, what the trusted peer appended, not what its client wrote to its left.
        assert_eq!(scheme("10.0.0.1", false, Some("https, http")), "http");
        assert_eq!(scheme("10.0.0.1", false, Some("http,https")), "https");
        // Not a scheme: the connection's.
        assert_eq!(scheme("10.0.0.1", false, Some("wss")), "http");
        assert_eq!(scheme("10.0.0.1", true, Some("")), "https");
        // A client's own is not believed.
        assert_eq!(scheme("192.0.2.1", false, Some("https")), "http");
        assert_eq!(scheme("192.0.2.1", true, Some("http")), "https");
        assert_eq!(
            TrustedProxies::default().scheme(
                ip("127.0.0.1"),
                false,
                Some(&HeaderValue::from_static("https"))
            ),
            "http"
        );
    }

    /// What `forward` writes.
    fn text(forwarded: &Forwarded) -> String {
        let mut out = Vec::new();
        forwarded.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn upstream_sees_the_client_appended_to_what_a_trusted_proxy_sent() {
        let lb = TrustedProxies::parse(&["10.0.0.0/8".to_owned()]).unwrap();
        let forward = |client, received: Option<&'static str>| {
            let received = received.map(HeaderValue::from_static);
            text(&lb.forward(ip("10.0.0.1"), ip(client), received.as_ref()))
        };
        assert_eq!(
            forward("203.0.113.9", Some("203.0.113.9")),
            "203.0.113.9, 203.0.113.9"
        );
        assert_eq!(
            forward("198.51.100.4", Some("1.2.3.4")),
            "1.2.3.4, 198.51.100.4"
        );
        assert_eq!(forward("10.0.0.2", None), "10.0.0.2");
        assert_eq!(forward("10.0.0.2", Some(" ")), "10.0.0.2");
        assert_eq!(
            forward("2001:db8::1", Some("10.0.0.1")),
            "10.0.0.1, 2001:db8::1"
        );
        // A value that is not text (obs-text) is not passed on.
        let opaque = HeaderValue::from_bytes(b"1.2.3.4 \xff").unwrap();
        assert_eq!(
            text(&lb.forward(ip("10.0.0.1"), ip("10.0.0.2"), Some(&opaque))),
            "10.0.0.2"
        );
        // What a peer that is not trusted sent is not passed on.
        let sent = HeaderValue::from_static("1.2.3.4");
        assert_eq!(
            text(&lb.forward(ip("192.0.2.1"), ip("192.0.2.1"), Some(&sent))),
            "192.0.2.1"
        );
        assert_eq!(
            text(&TrustedProxies::default().forward(ip("10.0.0.1"), ip("10.0.0.1"), Some(&sent))),
            "10.0.0.1"
        );
    }

    proptest::proptest! {
        #[test]
        fn an_address_is_written_as_display_writes_it(bits in proptest::prelude::any::<u128>(), v4 in proptest::prelude::any::<bool>()) {
            let ip = if v4 {
                IpAddr::from(std::net::Ipv4Addr::from_bits(bits as u32))
            } else {
                IpAddr::from(std::net::Ipv6Addr::from_bits(bits))
            };
            let mut text = Vec::new();
            write_ip(&mut text, ip);
            proptest::prop_assert_eq!(String::from_utf8(text).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn bad_entries_are_refused_at_start() {
        assert!(TrustedProxies::parse(&["10.0.0.0/33".to_owned()]).is_err());
        assert!(TrustedProxies::parse(&["lb.internal".to_owned()]).is_err());
        assert!(!trusted(&["::ffff:10.0.0.0/104"]).trusts(ip("::1")));
        assert!(trusted(&["10.0.0.0/8"]).trusts(ip("::ffff:10.0.0.1")));
    }
}
