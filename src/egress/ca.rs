//! A run's own certificate authority (SPEC §12, "Egress by name"): made fresh for each run
//! that has a secret injected on the wire, trusted by that run's sandbox alone, and used
//! by kodx's egress proxy to sign a leaf certificate for each host the sandbox reaches
//! through it. Its private key is made in this process and never leaves its memory: it is
//! not written, printed or sent, and [`RunCa`]'s `Debug` shows only its name and validity.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long a run's CA (and every leaf it signs) is valid: longer than any run.
pub const CA_VALIDITY: Duration = Duration::from_secs(2 * 24 * 3600);
/// How far back a certificate's validity starts, for a sandbox whose clock is a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);

/// A run's CA: its certificate (the PEM the sandbox trusts) and the key that signs leaves.
pub struct RunCa {
    name: String,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl fmt::Debug for RunCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunCa")
            .field("name", &self.name)
            .field("not_after", &self.not_after)
            .field("key", &"[kept in memory, never shown]")
            .finish()
    }
}

/// A leaf certificate and its key, as rustls serves them.
pub struct Leaf {
    /// The leaf, then the run's CA.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl RunCa {
    /// A fresh CA (ECDSA P-256, valid from an hour ago for [`CA_VALIDITY`]) named
    /// `kodx run <label> egress CA`.
    pub fn new(label: &str) -> Result<RunCa, String> {
        let name = format!("kodx run {label} egress CA");
        let key =
            KeyPair::generate().map_err(|e| format!("could not make the run's CA key: {e}"))?;
        let now = SystemTime::now();
        let (not_before, not_after) = (now - BACKDATE, now + CA_VALIDITY);
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, name.as_str());
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, not_before, not_after);
        params.serial_number = Some(serial()?);
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("could not sign the run's CA: {e}"))?;
        Ok(RunCa {
            name,
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            not_before,
            not_after,
        })
    }

    /// The CA's certificate in PEM: what the sandbox trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's certificate in DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// A leaf certificate for `host` (a DNS name, or an IP address as an IP SAN) signed by
    /// this CA, with a key of its own, valid as long as the CA.
    pub fn leaf(&self, host: &str) -> Result<Leaf, String> {
        let san = match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|e| format!("{host:?} cannot be a certificate's name: {e}"))?,
            ),
        };
        let key = KeyPair::generate().map_err(|e| format!("could not make a leaf key: {e}"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.subject_alt_names = vec![san];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, self.not_before, self.not_after);
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("could not sign a leaf for {host}: {e}"))?;
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }
}

/// A random positive 16-byte serial number.
fn serial() -> Result<SerialNumber, String> {
    let mut bytes = vec![0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness for a serial number".to_string())?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from(bytes))
}

/// Sets a certificate's validity (whole seconds).
fn validity(params: &mut CertificateParams, from: SystemTime, to: SystemTime) {
    let secs = |t: SystemTime| {
        Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
    };
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + secs(from);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + secs(to);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    /// Whether a client trusting only `ca` accepts `leaf` for `name`.
    fn verifies(ca: &RunCa, leaf: &Leaf, name: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        verifier
            .verify_server_cert(
                &leaf.chain[0],
                &leaf.chain[1..],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
    }

    #[test]
    fn a_leaf_for_a_name_is_trusted_for_that_name_only() {
        let ca = RunCa::new("r1").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let leaf = ca.leaf("secret.test").unwrap();
        verifies(&ca, &leaf, "secret.test").unwrap();
        let other = verifies(&ca, &leaf, "other.test").unwrap_err();
        assert!(other.to_string().contains("not valid for name"), "{other}");
        // Another run's CA does not vouch for this run's leaves.
        let stranger = RunCa::new("r2").unwrap();
        let e = verifies(&stranger, &leaf, "secret.test").unwrap_err();
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    }

    #[test]
    fn a_leaf_for_an_ip_carries_it_as_an_ip() {
        let ca = RunCa::new("r1").unwrap();
        for ip in ["127.0.0.1", "2001:db8::1"] {
            let leaf = ca.leaf(ip).unwrap();
            verifies(&ca, &leaf, ip).unwrap();
            assert!(verifies(&ca, &leaf, "127.0.0.2").is_err());
        }
        assert!(ca.leaf("bücher.test").is_err());
    }

    #[test]
    fn debug_shows_no_key() {
        let ca = RunCa::new("r1").unwrap();
        let shown = format!("{ca:?}");
        assert!(shown.contains("kodx run r1 egress CA"), "{shown}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(
            !shown.contains("KeyPair") && !shown.contains("serialized_der"),
            "{shown}"
        );
    }
}
