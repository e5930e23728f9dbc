//! What a sandbox may reach: IPv4 ranges ([`Cidr`], on the `ipnet` crate), the ranges
//! blocked unless the operator allows them ([`BLOCKED`]), and the plan of one sandbox's
//! routes ([`Fence::plan`]) in the form the helper program takes them.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use ipnet::Ipv4Net;

/// Ranges a sandbox never reaches unless the operator allows them (`network_allow`).
pub const BLOCKED: [(&str, &str); 8] = [
    ("0.0.0.0/8", "\"this\" network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("169.254.0.0/16", "link-local, cloud metadata services"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved, broadcast"),
];

/// An IPv4 range, `a.b.c.d/n` (a bare address is `/32`): an [`Ipv4Net`] with no address
/// bits past its prefix, read strictly (as the operator's `network_allow` is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr(Ipv4Net);

impl Cidr {
    /// The range of `prefix` bits around `addr` (bits past the prefix are cleared; a
    /// prefix over 32 is 32).
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Cidr {
        let net = Ipv4Net::new(addr, prefix.min(32)).expect("a prefix of at most 32");
        Cidr(net.trunc())
    }

    pub fn host(addr: Ipv4Addr) -> Cidr {
        Cidr::new(addr, 32)
    }

    pub fn addr(&self) -> Ipv4Addr {
        self.0.network()
    }

    pub fn prefix(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether `other` lies wholly inside this range.
    pub fn contains(&self, other: &Cidr) -> bool {
        self.0.contains(&other.0)
    }

    pub fn contains_addr(&self, addr: Ipv4Addr) -> bool {
        self.0.contains(&addr)
    }

    /// `<8 hex digits>/<prefix>`, as the helper reads it.
    pub(super) fn helper_form(&self) -> String {
        format!("{:08x}/{}", u32::from(self.addr()), self.prefix())
    }
}

impl From<Cidr> for Ipv4Net {
    fn from(c: Cidr) -> Ipv4Net {
        c.0
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Cidr, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        if addr.contains(':') {
            return Err(format!(
                "{s:?} is an IPv6 range; sandboxes have no IPv6, so only IPv4 ranges can be allowed"
            ));
        }
        let ip: Ipv4Addr = addr.parse().map_err(|_| {
            format!("{s:?} is not an IPv4 range such as 10.1.0.0/16 or 192.168.5.7")
        })?;
        let prefix = match prefix {
            None => 32,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= 32)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?,
        };
        let cidr = Cidr::new(ip, prefix);
        if cidr.addr() != ip {
            return Err(format!(
                "{s:?} has address bits past its prefix length; did you mean {cidr}?"
            ));
        }
        Ok(cidr)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Cidr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The routes that fence one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fence {
    /// Ranges made unreachable.
    pub blocked: Vec<Cidr>,
    /// Allowed ranges inside a blocked one, routed normally through the gateway.
    pub via_gateway: Vec<Cidr>,
}

impl Fence {
    /// The routes for a sandbox at `own` (its address and subnet) behind `gateway`: the
    /// gateway, `host_addrs` (the engine host's addresses) and [`BLOCKED`] are unreachable,
    /// except what `allowed` covers.
    pub fn plan(gateway: Ipv4Addr, own: Cidr, host_addrs: &[Ipv4Addr], allowed: &[Cidr]) -> Fence {
        let mut candidates: Vec<Cidr> = BLOCKED
            .iter()
            .map(|(c, _)| c.parse().expect("valid built-in range"))
            .collect();
        candidates.push(Cidr::host(gateway));
        candidates.extend(
            host_addrs
                .iter()
                .filter(|a| !a.is_loopback() && !a.is_unspecified())
                .map(|a| Cidr::host(*a)),
        );
        // The sandbox's own subnet keeps its connected route: a block equal to it could not
        // be added, and its neighbours are cut off by the network (enable_icc=false).
        candidates.retain(|c| *c != own && !allowed.iter().any(|a| a.contains(c)));
        candidates.sort();
        candidates.dedup();
        // A range inside a wider blocked one needs no route of its own (a host with many
        // private addresses makes few routes), unless it is on the sandbox's subnet, whose
        // connected route would win over the wider block.
        let wider = candidates.clone();
        candidates.retain(|c| own.contains(c) || !wider.iter().any(|b| b != c && b.contains(c)));
        let mut via_gateway: Vec<Cidr> = allowed
            .iter()
            .filter(|a| {
                !own.contains(a)
                    && candidates
                        .iter()
                        .any(|b| b.prefix() < a.prefix() && b.contains(a))
            })
            .copied()
            .collect();
        via_gateway.sort();
        via_gateway.dedup();
        Fence {
            blocked: candidates,
            via_gateway,
        }
    }

    /// The helper's arguments: the gateway routes first, then the unreachable ones.
    pub(super) fn helper_args(&self, gateway: Ipv4Addr) -> Vec<String> {
        let mut args = vec!["routes".to_string()];
        args.extend(
            self.via_gateway
                .iter()
                .map(|c| format!("g{}/{:08x}", c.helper_form(), u32::from(gateway))),
        );
        args.extend(self.blocked.iter().map(|c| format!("u{}", c.helper_form())));
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_strictly() {
        assert_eq!(c("10.1.0.0/16").to_string(), "10.1.0.0/16");
        assert_eq!(c("192.168.5.7").to_string(), "192.168.5.7/32");
        assert_eq!(c("0.0.0.0/0").prefix(), 0);
        let e = "10.1.2.3/8".parse::<Cidr>().unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        assert!("fd00::/8".parse::<Cidr>().unwrap_err().contains("IPv6"));
        assert!("10.0.0.0/33"
            .parse::<Cidr>()
            .unwrap_err()
            .contains("0 to 32"));
        assert!("example.com".parse::<Cidr>().is_err());
        assert!(c("10.0.0.0/8").contains(&c("10.1.0.0/16")));
        assert!(!c("10.1.0.0/16").contains(&c("10.0.0.0/8")));
        assert!(c("0.0.0.0/0").contains(&c("8.8.8.8")));
        assert!(!c("172.16.0.0/12").contains(&c("172.32.0.0/16")));
    }

    #[test]
    fn ranges_hold_what_their_prefix_covers() {
        assert_eq!(Cidr::new("10.1.2.3".parse().unwrap(), 8), c("10.0.0.0/8"));
        assert_eq!(Cidr::new("10.1.2.3".parse().unwrap(), 40), c("10.1.2.3"));
        assert!(c("10.1.2.3").contains(&c("10.1.2.3")));
        assert!(!c("10.1.2.3").contains(&c("10.1.2.4")));
        assert!(c("10.0.0.0/8").contains_addr("10.255.255.255".parse().unwrap()));
        assert!(!c("10.0.0.0/8").contains_addr("11.0.0.0".parse().unwrap()));
        assert!(c("0.0.0.0/0").contains_addr("255.255.255.255".parse().unwrap()));
        assert!(c("0.0.0.0/0").contains(&c("0.0.0.0/0")));
        assert_eq!(c("192.168.0.0/16").helper_form(), "c0a80000/16");
        // Sorted by address, then prefix: the order the fence's routes are added in.
        let mut v = vec![c("10.0.0.0/16"), c("10.0.0.0/8"), c("9.0.0.0/8")];
        v.sort();
        assert_eq!(v, vec![c("9.0.0.0/8"), c("10.0.0.0/8"), c("10.0.0.0/16")]);
    }

    #[test]
    fn the_fence_blocks_host_gateway_and_private_ranges() {
        let gw: Ipv4Addr = "172.18.0.1".parse().unwrap();
        let own = c("172.18.0.0/16");
        let host = ["192.0.2.2".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        let f = Fence::plan(gw, own, &host, &[]);
        for must in [
            "172.18.0.1/32",
            "192.0.2.2/32",
            "169.254.0.0/16",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
        ] {
            assert!(f.blocked.contains(&c(must)), "{must} in {f:?}");
        }
        assert!(
            !f.blocked.iter().any(|b| b.contains(&c("127.0.0.1"))),
            "loopback stays the sandbox's own"
        );
        // The gateway is inside 172.16/12 but keeps its own route: the subnet's connected
        // route (172.18/16) is more specific than the /12.
        let many: Vec<Ipv4Addr> = (1..=200u32)
            .map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 9, 0, 0)) + i))
            .collect();
        let f2 = Fence::plan(gw, own, &many, &[]);
        assert_eq!(f2.blocked.len(), f.blocked.len() - 1, "{f2:?}");
        assert!(f.via_gateway.is_empty());
        assert_eq!(
            f.helper_args(gw)[..2],
            ["routes".to_string(), "u00000000/8".to_string()]
        );
    }

    #[test]
    fn allowed_ranges_are_cut_out_of_the_fence() {
        let gw: Ipv4Addr = "172.18.0.1".parse().unwrap();
        let own = c("172.18.0.0/16");
        let host = ["192.0.2.2".parse().unwrap(), "10.0.0.5".parse().unwrap()];
        let allowed = [c("10.1.0.0/16"), c("192.0.2.0/24"), c("172.18.0.1")];
        let f = Fence::plan(gw, own, &host, &allowed);
        // Blocks inside an allowed range go.
        assert!(!f.blocked.contains(&c("192.0.2.2")), "{f:?}");
        assert!(!f.blocked.contains(&c("172.18.0.1")), "{f:?}");
        // A host address outside every allowed range stays blocked (here by 10/8, which
        // holds it: no route of its own).
        assert!(f.blocked.contains(&c("10.0.0.0/8")), "{f:?}");
        assert!(!f.blocked.contains(&c("10.0.0.5")), "{f:?}");
        // An allowed range inside a blocked one is routed through the gateway; one in no
        // blocked range needs nothing, nor does one on the sandbox's own subnet.
        assert_eq!(f.via_gateway, vec![c("10.1.0.0/16")]);
        let args = f.helper_args(gw);
        assert_eq!(args[1], "g0a010000/16/ac120001");
        // Allowing everything leaves nothing blocked.
        let all = Fence::plan(gw, own, &host, &[c("0.0.0.0/0")]);
        assert!(
            all.blocked.is_empty() && all.via_gateway.is_empty(),
            "{all:?}"
        );
    }

    #[test]
    fn a_subnet_equal_to_a_blocked_range_keeps_its_route() {
        let f = Fence::plan("10.0.0.1".parse().unwrap(), c("10.0.0.0/8"), &[], &[]);
        assert!(!f.blocked.contains(&c("10.0.0.0/8")));
        assert!(f.blocked.contains(&c("10.0.0.1")));
    }
}
