//! Who a request comes from: the client's address behind trusted proxies, and the
//! subject text a per-IP policy counts it under.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use actix_web::HttpRequest;
use actix_web::http::header::HeaderValue;

use crate::config::IpNet;

/// The client's address: the socket peer, or, when the peer is a trusted proxy,
/// the rightmost `X-Forwarded-For` hop that is not a trusted proxy. Hops are
/// parsed, so nothing a client wrote reaches a key as text.
pub fn client_ip(req: &HttpRequest, trusted_proxies: &[IpNet]) -> IpAddr {
    let peer = req
        .peer_addr()
        .map(|a| a.ip().to_canonical())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let forwarded = req.headers().get_all("x-forwarded-for");
    forwarded_client(peer, forwarded, trusted_proxies)
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|t| t.contains(ip))
}

/// Walks `X-Forwarded-For` from the right (the hop our proxy appended) past our
/// own proxies. A hop that does not parse stops the walk at the nearest trusted
/// hop: what lies left of it was written by someone we do not trust.
fn forwarded_client<'a>(
    peer: IpAddr,
    values: impl Iterator<Item = &'a HeaderValue>,
    trusted: &[IpNet],
) -> IpAddr {
    if !is_trusted(peer, trusted) {
        return peer;
    }
    // Bytes that are not text (a client may send any) make a hop that does not
    // parse, where they stand: the hops our proxies appended right of them still
    // count (taking the peer instead put such a client in the proxy's budget).
    let texts: Vec<std::borrow::Cow<'_, str>> = values
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .collect();
    let hops: Vec<&str> = texts
        .iter()
        .flat_map(|t| t.split(','))
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        match parse_hop(hop) {
            Some(ip) if is_trusted(ip, trusted) => nearest = ip,
            Some(ip) => return ip,
            None => return nearest,
        }
    }
    nearest
}

/// `203.0.113.7`, `2001:db8::1`, `203.0.113.7:4711` or `[2001:db8::1]:4711`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The subject text of an address. IPv4 as is; IPv6 by its /64, since anyone with
/// IPv6 holds at least a /64 and could otherwise use a fresh address per request.
pub fn ip_subject(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// The subject text of an address's network, for a `subnet` policy: IPv4 by its
/// /24, IPv6 by its /56 (what a household or a small office is given), so a
/// reseller's rack of neighbouring addresses shares one budget.
pub fn subnet_subject(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let net = Ipv6Addr::new(s[0], s[1], s[2], s[3] & 0xff00, 0, 0, 0, 0);
            format!("{net}/56")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> Vec<HeaderValue> {
        values
            .iter()
            .map(|v| HeaderValue::from_str(v).unwrap())
            .collect()
    }

    #[test]
    fn peer_is_the_client_unless_it_is_a_trusted_proxy() {
        let h = xff(&["6.6.6.6"]);
        assert_eq!(
            forwarded_client(ip("1.2.3.4"), h.iter(), &[]),
            ip("1.2.3.4")
        );
        let trusted = [net("10.0.0.1"), net("10.0.0.2")];
        assert_eq!(
            forwarded_client(ip("1.2.3.4"), h.iter(), &trusted),
            ip("1.2.3.4"),
            "an untrusted peer's X-Forwarded-For is ignored"
        );
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("6.6.6.6")
        );
    }

    #[test]
    fn rightmost_untrusted_hop_wins() {
        let trusted = [net("10.0.0.1"), net("10.0.0.2")];
        // The client forged the first hop; our two proxies appended the rest.
        let h = xff(&["1.1.1.1, 203.0.113.9", "10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        let h = xff(&["[2001:db8::7]:443, 203.0.113.9:5555"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        // Garbage stops the walk at the nearest trusted hop.
        let h = xff(&["8.8.8.8, {evil}, 10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("10.0.0.2")
        );
        // Bytes that are not text left of our proxies' hops (a proxy that appends
        // to what the client sent): the hop appended for the client still counts,
        // not the proxy (which shares its budget with everyone behind it).
        let h = [
            HeaderValue::from_bytes(b"9.9.9.9\xff, 203.0.113.9").unwrap(),
            HeaderValue::from_static("10.0.0.2"),
        ];
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        let h = [HeaderValue::from_bytes(b"203.0.113.9, \xff, 10.0.0.2").unwrap()];
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("10.0.0.2")
        );
        // Only trusted hops: the leftmost one.
        let h = xff(&["10.0.0.2"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &trusted),
            ip("10.0.0.2")
        );
        // No header: the peer.
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), std::iter::empty(), &trusted),
            ip("10.0.0.1")
        );
        // IPv4-mapped IPv6 peers match IPv4 proxies.
        let h = xff(&["198.51.100.1"]);
        assert_eq!(
            forwarded_client(ip("10.0.0.1"), h.iter(), &[net("::ffff:10.0.0.1")]),
            ip("198.51.100.1")
        );
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn trusted_ranges_are_walked_past_like_single_proxies() {
        let trusted = [net("10.0.0.0/8"), net("fd00::/8")];
        // A client behind two proxies of the ranges (an ingress, a pod network).
        let h = xff(&["203.0.113.9, fd00::1:2, 10.44.0.3"]);
        assert_eq!(
            forwarded_client(ip("10.1.2.3"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(
            forwarded_client(ip("fd12::7"), h.iter(), &trusted),
            ip("203.0.113.9")
        );
        // A peer outside the ranges is the client, whatever it writes.
        assert_eq!(
            forwarded_client(ip("11.0.0.1"), h.iter(), &trusted),
            ip("11.0.0.1")
        );
        assert_eq!(
            forwarded_client(ip("fe80::1"), h.iter(), &trusted),
            ip("fe80::1")
        );
    }

    #[test]
    fn subnets_are_the_24_and_the_56() {
        assert_eq!(subnet_subject(ip("203.0.113.9")), "203.0.113.0/24");
        assert_eq!(subnet_subject(ip("::ffff:203.0.113.200")), "203.0.113.0/24");
        assert_ne!(
            subnet_subject(ip("203.0.113.9")),
            subnet_subject(ip("203.0.114.9"))
        );
        assert_eq!(
            subnet_subject(ip("2001:db8:aa:bbcc:1:2:3:4")),
            "2001:db8:aa:bb00::/56"
        );
        assert_eq!(
            subnet_subject(ip("2001:db8:aa:bbff::1")),
            subnet_subject(ip("2001:db8:aa:bb00::9"))
        );
        assert_ne!(
            subnet_subject(ip("2001:db8:aa:bb00::1")),
            subnet_subject(ip("2001:db8:aa:bc00::1"))
        );
    }

    #[test]
    fn subjects_are_canonical_and_ipv6_counts_per_64() {
        assert_eq!(ip_subject(ip("203.0.113.9")), "203.0.113.9");
        assert_eq!(ip_subject(ip("::ffff:203.0.113.9")), "203.0.113.9");
        assert_eq!(
            ip_subject(ip("2001:db8:aa:bb:1:2:3:4")),
            "2001:db8:aa:bb::/64"
        );
        assert_eq!(
            ip_subject(ip("2001:db8:aa:bb:ffff::1")),
            ip_subject(ip("2001:db8:aa:bb::9"))
        );
    }
}
