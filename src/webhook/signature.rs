//! Webhook signature verification (SPEC §2 `WEBHOOK_SECRET`, §3).
//!
//! GitHub signs every delivery with the header
//! `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw request
//! body keyed with the webhook secret. The legacy `X-Hub-Signature` (SHA-1)
//! header is never accepted on its own.
//!
//! Several secrets may be configured at once so that a secret can be rotated
//! without dropping deliveries: `WEBHOOK_SECRET` holds a comma-separated list
//! and a signature is valid when it matches any of them.

use std::fmt;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix GitHub puts before the hex digest, exactly as it sends it.
const PREFIX: &str = "sha256=";

/// Length in hex characters of a SHA-256 digest.
const HEX_LEN: usize = 64;

/// Why a delivery's signature was refused, or why the secret configuration is
/// unusable. The HTTP layer answers `401` for `Missing`, `Malformed` and
/// `Mismatch`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// `WEBHOOK_SECRET` holds no non-empty secret.
    #[error("no webhook secret configured")]
    NoSecret,
    /// The request has no `X-Hub-Signature-256` header.
    #[error("missing X-Hub-Signature-256 header")]
    Missing,
    /// The header is not `sha256=` followed by 64 hex digits.
    #[error("malformed X-Hub-Signature-256 header")]
    Malformed,
    /// The header is well formed but matches none of the secrets.
    #[error("webhook signature mismatch")]
    Mismatch,
}

/// The configured webhook secrets, in order; never empty.
///
/// Each is a `secrecy` [`SecretSlice`]: `Debug` shows `[REDACTED]` in its place, and it is
/// zeroed on drop.
#[derive(Clone, Debug)]
pub struct WebhookSecrets {
    secrets: Vec<SecretSlice<u8>>,
}

impl WebhookSecrets {
    /// From the `WEBHOOK_SECRET` value: comma-separated, whitespace around
    /// each item trimmed, empty items ignored. `Err(NoSecret)` when no
    /// non-empty secret remains.
    pub fn parse(value: &str) -> Result<WebhookSecrets, SignatureError> {
        let secrets: Vec<SecretSlice<u8>> = value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| SecretSlice::from(s.as_bytes().to_vec()))
            .collect();
        if secrets.is_empty() {
            return Err(SignatureError::NoSecret);
        }
        Ok(WebhookSecrets { secrets })
    }

    /// One secret, commas and all: the secret of one App as GitHub holds it (setup's
    /// saved file), never a rotation list. `Err(NoSecret)` when it is empty.
    pub fn one(value: &str) -> Result<WebhookSecrets, SignatureError> {
        if value.is_empty() {
            return Err(SignatureError::NoSecret);
        }
        Ok(WebhookSecrets {
            secrets: vec![SecretSlice::from(value.as_bytes().to_vec())],
        })
    }

    /// Checks the `X-Hub-Signature-256` header value against the raw body.
    ///
    /// Each secret's HMAC is compared in constant time, and every secret is
    /// tried whatever the outcome of the others.
    pub fn verify(&self, header: Option<&str>, body: &[u8]) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let expected = decode_header(header)?;
        let mut matched = false;
        for secret in &self.secrets {
            matched |= mac(secret.expose_secret(), body)
                .verify_slice(&expected)
                .is_ok();
        }
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    /// Starts checking a body that arrives in pieces: the header is read now (so a missing
    /// or malformed one is refused before any of the body), the body is fed to
    /// [`Verifier::update`] as it comes, and [`Verifier::finish`] gives the verdict
    /// [`verify`](Self::verify) would give for the whole body.
    pub fn verifier(&self, header: Option<&str>) -> Result<Verifier, SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        let expected = decode_header(header)?;
        Ok(Verifier {
            expected,
            macs: self
                .secrets
                .iter()
                .map(|secret| mac(secret.expose_secret(), b""))
                .collect(),
        })
    }

    /// The header value GitHub would send for `body` with the first secret
    /// (for tests and fakes).
    pub fn sign(&self, body: &[u8]) -> String {
        let digest = mac(self.secrets[0].expose_secret(), body)
            .finalize()
            .into_bytes();
        format!("{PREFIX}{}", hex::encode(digest))
    }
}

/// The HMACs of a body that is still arriving, one per secret (see
/// [`WebhookSecrets::verifier`]).
pub struct Verifier {
    expected: Vec<u8>,
    macs: Vec<HmacSha256>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Verifier")
    }
}

impl Verifier {
    /// Absorbs the next piece of the body.
    pub fn update(&mut self, piece: &[u8]) {
        for mac in &mut self.macs {
            mac.update(piece);
        }
    }

    /// Whether the body absorbed so far carries the signature: every secret's HMAC is
    /// compared in constant time.
    pub fn finish(self) -> Result<(), SignatureError> {
        let mut matched = false;
        for mac in self.macs {
            matched |= mac.verify_slice(&self.expected).is_ok();
        }
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// A keyed HMAC-SHA256 that has absorbed `body`.
fn mac(secret: &[u8], body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    mac
}

/// `sha256=<64 hex digits, either case>` to the 32 digest bytes.
fn decode_header(header: &str) -> Result<Vec<u8>, SignatureError> {
    let digits = header
        .strip_prefix(PREFIX)
        .ok_or(SignatureError::Malformed)?;
    if digits.len() != HEX_LEN {
        return Err(SignatureError::Malformed);
    }
    hex::decode(digits).map_err(|_| SignatureError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's documented example ("Validating webhook deliveries").
    const DOC_SECRET: &str = "It's a Secret to Everybody";
    const DOC_BODY: &[u8] = b"Hello, World!";
    const DOC_HEADER: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn doc_secrets() -> WebhookSecrets {
        WebhookSecrets::parse(DOC_SECRET).unwrap()
    }

    #[test]
    fn github_documented_example_verifies() {
        assert_eq!(doc_secrets().verify(Some(DOC_HEADER), DOC_BODY), Ok(()));
    }

    #[test]
    fn sign_matches_github_documented_example() {
        assert_eq!(doc_secrets().sign(DOC_BODY), DOC_HEADER);
    }

    #[test]
    fn sign_then_verify_round_trips() {
        let secrets = WebhookSecrets::parse("s3cret").unwrap();
        let body = br#"{"action":"created"}"#;
        assert_eq!(secrets.verify(Some(&secrets.sign(body)), body), Ok(()));
    }

    #[test]
    fn a_body_verified_in_pieces_gets_the_same_verdict() {
        let secrets = WebhookSecrets::parse(&format!("new-secret, {DOC_SECRET}")).unwrap();
        for (header, body, want) in [
            (DOC_HEADER, DOC_BODY, Ok(())),
            (
                DOC_HEADER,
                &b"Hello, World?"[..],
                Err(SignatureError::Mismatch),
            ),
        ] {
            for split in 0..=body.len() {
                let mut v = secrets.verifier(Some(header)).unwrap();
                v.update(&body[..split]);
                v.update(&body[split..]);
                assert_eq!(v.finish(), want, "split at {split}");
            }
        }
        assert_eq!(secrets.verifier(None).unwrap_err(), SignatureError::Missing);
        assert_eq!(
            secrets.verifier(Some("sha1=00")).unwrap_err(),
            SignatureError::Malformed
        );
    }

    #[test]
    fn one_byte_change_in_body_fails() {
        assert_eq!(
            doc_secrets().verify(Some(DOC_HEADER), b"Hello, World?"),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            doc_secrets().verify(Some(DOC_HEADER), b"Hello, World!\n"),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn one_digit_change_in_signature_fails() {
        let header = DOC_HEADER.replace("e17", "e18");
        assert_eq!(
            doc_secrets().verify(Some(&header), DOC_BODY),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn wrong_secret_fails() {
        let secrets = WebhookSecrets::parse("not the secret").unwrap();
        assert_eq!(
            secrets.verify(Some(DOC_HEADER), DOC_BODY),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn uppercase_hex_accepted() {
        let header = format!("sha256={}", DOC_HEADER[PREFIX.len()..].to_uppercase());
        assert_eq!(doc_secrets().verify(Some(&header), DOC_BODY), Ok(()));
    }

    #[test]
    fn uppercase_prefix_rejected() {
        let header = DOC_HEADER.replacen("sha256=", "SHA256=", 1);
        assert_eq!(
            doc_secrets().verify(Some(&header), DOC_BODY),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn rotation_second_secret_matches() {
        let secrets = WebhookSecrets::parse(&format!("new-secret, {DOC_SECRET}")).unwrap();
        assert_eq!(secrets.verify(Some(DOC_HEADER), DOC_BODY), Ok(()));
        // sign() uses the first secret.
        assert_ne!(secrets.sign(DOC_BODY), DOC_HEADER);
        assert_eq!(
            secrets.sign(DOC_BODY),
            WebhookSecrets::parse("new-secret").unwrap().sign(DOC_BODY)
        );
    }

    fn mac_header(secret: &str) -> String {
        let digest = mac(secret.as_bytes(), DOC_BODY).finalize().into_bytes();
        format!("{PREFIX}{}", hex::encode(digest))
    }

    #[test]
    fn one_secret_keeps_its_commas() {
        let one = WebhookSecrets::one("long,x").unwrap();
        assert_eq!(one.verify(Some(&mac_header("long,x")), DOC_BODY), Ok(()));
        assert_eq!(
            one.verify(Some(&mac_header("x")), DOC_BODY),
            Err(SignatureError::Mismatch)
        );
        assert!(WebhookSecrets::one("").is_err());
    }

    #[test]
    fn parse_trims_items_and_ignores_empty_ones() {
        let secrets = WebhookSecrets::parse(&format!(" ,  {DOC_SECRET}  ,, ")).unwrap();
        assert_eq!(secrets.sign(DOC_BODY), DOC_HEADER);
    }

    #[test]
    fn missing_header() {
        assert_eq!(
            doc_secrets().verify(None, DOC_BODY),
            Err(SignatureError::Missing)
        );
    }

    #[test]
    fn sha1_header_is_malformed() {
        let header = "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59";
        assert_eq!(
            doc_secrets().verify(Some(header), DOC_BODY),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn empty_header_is_malformed() {
        assert_eq!(
            doc_secrets().verify(Some(""), DOC_BODY),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            doc_secrets().verify(Some("sha256="), DOC_BODY),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn wrong_length_is_malformed() {
        let digits = &DOC_HEADER[PREFIX.len()..];
        let short = format!("sha256={}", &digits[..63]);
        let long = format!("sha256={digits}0");
        for header in [short, long] {
            assert_eq!(
                doc_secrets().verify(Some(&header), DOC_BODY),
                Err(SignatureError::Malformed),
                "{header}"
            );
        }
    }

    #[test]
    fn non_hex_is_malformed() {
        let header = DOC_HEADER.replace("e17", "e1g");
        assert_eq!(
            doc_secrets().verify(Some(&header), DOC_BODY),
            Err(SignatureError::Malformed)
        );
        // 64 bytes long but with a multi-byte character.
        let header = format!("sha256=é{}", &DOC_HEADER[PREFIX.len() + 2..]);
        assert_eq!(
            doc_secrets().verify(Some(&header), DOC_BODY),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn surrounding_whitespace_is_malformed() {
        let header = format!(" {DOC_HEADER}");
        assert_eq!(
            doc_secrets().verify(Some(&header), DOC_BODY),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn no_secret_configured() {
        for value in ["", "   ", " , ,\t,", "\n"] {
            assert_eq!(
                WebhookSecrets::parse(value).unwrap_err(),
                SignatureError::NoSecret,
                "{value:?}"
            );
        }
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let secrets = WebhookSecrets::parse("hunter2, other-secret").unwrap();
        let shown = format!("{secrets:?} {secrets:#?}");
        assert!(shown.contains("[REDACTED]"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("other-secret"), "{shown}");
    }

    #[test]
    fn error_texts_are_short() {
        for e in [
            SignatureError::NoSecret,
            SignatureError::Missing,
            SignatureError::Malformed,
            SignatureError::Mismatch,
        ] {
            let text = e.to_string();
            assert!(!text.is_empty() && text.len() < 60 && !text.contains('\n'));
        }
    }
}
