//! An address range in `trusted_proxies` (`STAMPEDE_TRUSTED_PROXIES`): a single
//! address (`10.0.0.7`, `::1`) or a CIDR range (`10.0.0.0/8`, `fd00::/8`), parsed
//! when the configuration is read, so a typo stops the start with a clear error.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network: an address and how many of its leading bits count.
/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.7`) is matched as the IPv4 one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` lies in this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask_v4(u32::from(ip), self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask_v6(u128::from(ip), self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// `bits` with all but the first `prefix` bits cleared.
fn mask_v4(bits: u32, prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => bits & (u32::MAX << (32 - u32::from(p))),
    }
}

fn mask_v6(bits: u128, prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p => bits & (u128::MAX << (128 - u32::from(p))),
    }
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an address or a range (like 10.0.0.7, 10.0.0.0/8 or fd00::/8)")
        })?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{s:?}: the prefix length must be 0 to {max}")),
            },
        };
        let net = IpNet { addr, prefix };
        let masked = match addr {
            IpAddr::V4(a) => IpAddr::V4(mask_v4(u32::from(a), prefix).into()),
            IpAddr::V6(a) => IpAddr::V6(mask_v6(u128::from(a), prefix).into()),
        };
        if masked != addr {
            return Err(format!(
                "{s:?} has address bits set past its /{prefix}: write {masked}/{prefix}"
            ));
        }
        Ok(net)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

impl fmt::Debug for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<'de> serde::Deserialize<'de> for IpNet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_single_address_is_a_range_of_one() {
        let n = net("10.0.0.7");
        assert!(n.contains(ip("10.0.0.7")));
        assert!(n.contains(ip("::ffff:10.0.0.7")));
        assert!(!n.contains(ip("10.0.0.8")));
        assert_eq!(n.to_string(), "10.0.0.7");
        assert!(net("::1").contains(ip("::1")));
        assert!(!net("::1").contains(ip("127.0.0.1")));
    }

    #[test]
    fn ipv4_ranges_hold_their_addresses_and_no_others() {
        let n = net("10.0.0.0/8");
        assert!(n.contains(ip("10.0.0.0")) && n.contains(ip("10.255.255.255")));
        assert!(n.contains(ip("::ffff:10.1.2.3")));
        assert!(!n.contains(ip("11.0.0.0")) && !n.contains(ip("9.255.255.255")));
        assert!(
            !n.contains(ip("::a00:1")),
            "an IPv6 address is never in an IPv4 range"
        );
        let n = net("192.168.4.0/22");
        assert!(n.contains(ip("192.168.7.255")) && !n.contains(ip("192.168.8.0")));
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!net("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert_eq!(n.to_string(), "192.168.4.0/22");
    }

    #[test]
    fn ipv6_ranges_hold_their_addresses_and_no_others() {
        let n = net("fd00::/8");
        assert!(n.contains(ip("fd12:3456::1")) && n.contains(ip("fdff:ffff::")));
        assert!(!n.contains(ip("fe80::1")) && !n.contains(ip("fc00::1")));
        assert!(!n.contains(ip("10.0.0.1")));
        let n = net("2001:db8:0:1::/64");
        assert!(n.contains(ip("2001:db8:0:1:ffff::1")) && !n.contains(ip("2001:db8:0:2::1")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
    }

    #[test]
    fn bad_ranges_are_refused_with_a_clear_reason() {
        for (bad, says) in [
            ("10.0.0/8", "not an address or a range"),
            ("example.com", "not an address or a range"),
            ("", "not an address or a range"),
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("10.0.0.0/-1", "0 to 32"),
            ("10.0.0.0/", "0 to 32"),
            ("10.0.0.0/x", "0 to 32"),
            ("10.0.0.1/8", "write 10.0.0.0/8"),
            ("fd00::1/8", "write fd00::/8"),
        ] {
            let err = bad.parse::<IpNet>().expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
