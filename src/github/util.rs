//! Small pure helpers of the GitHub client: base64 (the contents API), RFC 3339 times
//! (`expires_at`), percent-encoding of path segments, and the Probot conventions for
//! `PRIVATE_KEY`. (`Link` headers are octocrab's [`Page`](octocrab::Page).)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Decodes standard base64, skipping ASCII whitespace (GitHub wraps `content` every 60
/// characters with `\n`). Padding is optional; anything else is an error.
pub(crate) fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{general_purpose, DecodePaddingMode, GeneralPurpose};
    use base64::Engine as _;
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        general_purpose::PAD.with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let compact: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    ENGINE
        .decode(compact)
        .map_err(|e| format!("invalid base64: {e}"))
}

/// Parses an RFC 3339 time as GitHub writes it (`2016-07-11T22:14:10Z`, optionally with
/// fractional seconds or a `+hh:mm` offset). `None` before 1970.
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    let secs = u64::try_from(t.timestamp()).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, t.timestamp_subsec_nanos()))
}

/// What a path segment keeps unencoded: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one path segment: everything but RFC 3986 unreserved characters.
pub(crate) fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// Percent-encodes a repository file path segment by segment, keeping the `/`s.
pub(crate) fn encode_path(path: &str) -> String {
    path.split('/')
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

/// Turns the `PRIVATE_KEY` value into PEM text the way Probot does: literal `\n` sequences
/// become newlines, surrounding quotes and blanks go, and a value without a PEM header is
/// tried as base64 of the whole PEM file.
pub(crate) fn normalize_private_key(raw: &str) -> Result<String, String> {
    let mut text = raw.trim();
    for quote in ['"', '\''] {
        if text.len() >= 2 && text.starts_with(quote) && text.ends_with(quote) {
            text = text[1..text.len() - 1].trim();
        }
    }
    let text = text.replace("\\r\\n", "\n").replace("\\n", "\n");
    let text = text.replace("\r\n", "\n");
    if text.is_empty() {
        return Err("it is empty".into());
    }
    if text.contains("-----BEGIN") {
        return Ok(text);
    }
    match base64_decode(&text)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
    {
        Some(decoded) if decoded.contains("-----BEGIN") => Ok(decoded.trim().to_string()),
        _ => Err(
            "it is not PEM text (no \"-----BEGIN RSA PRIVATE KEY-----\" line), \
                  nor base64 of a PEM file"
                .into(),
        ),
    }
}

/// Why a PEM block is not an RSA private key, from its label, when that can be told.
pub(crate) fn pem_label_problem(pem: &str) -> Option<String> {
    let label = pem
        .lines()
        .find_map(|l| l.trim().strip_prefix("-----BEGIN "))?
        .trim_end_matches('-')
        .trim();
    match label {
        "RSA PRIVATE KEY" | "PRIVATE KEY" => None,
        "ENCRYPTED PRIVATE KEY" => Some(
            "it is encrypted with a passphrase; give the unencrypted key GitHub handed out".into(),
        ),
        "PUBLIC KEY" | "RSA PUBLIC KEY" => {
            Some("it is a public key; the App needs its private key".into())
        }
        "EC PRIVATE KEY" | "OPENSSH PRIVATE KEY" | "CERTIFICATE" => Some(format!(
            "it is a \"{label}\" block; GitHub App keys are RSA (\"RSA PRIVATE KEY\")"
        )),
        other => Some(format!("it is a \"{other}\" block, not an RSA private key")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_ignores_newlines() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVs\nbG8h\n").unwrap(), b"hello!");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("/+8=").unwrap(), vec![0xff, 0xef]);
        assert!(base64_decode("aGVsbG8*").is_err());
        assert!(base64_decode("a").is_err());
        assert!(base64_decode("aG=Vs").is_err());
    }

    #[test]
    fn rfc3339_times() {
        let t = |s: &str| parse_rfc3339(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(t("2016-07-11T22:14:10Z"), Some(1_468_275_250));
        assert_eq!(t("2024-02-29T12:00:00.123Z"), Some(1_709_208_000));
        assert_eq!(t("2016-07-12T00:14:10+02:00"), Some(1_468_275_250));
        assert_eq!(t("2016-07-11T22:14:10"), None);
        assert_eq!(t("2016-13-11T22:14:10Z"), None);
        assert_eq!(t("yesterday"), None);
        assert_eq!(t("1969-12-31T23:59:59Z"), None);
    }

    #[test]
    fn paths_are_encoded_per_segment() {
        assert_eq!(encode_segment("dependabot[bot]"), "dependabot%5Bbot%5D");
        assert_eq!(encode_path(".github/kodx.yml"), ".github/kodx.yml");
        assert_eq!(encode_path("a b/c?d#"), "a%20b/c%3Fd%23");
        assert_eq!(encode_segment("Az09-._~%é"), "Az09-._~%25%C3%A9");
    }

    #[test]
    fn private_key_conventions() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----";
        let literal = pem.replace('\n', "\\n");
        assert_eq!(normalize_private_key(&literal).unwrap(), pem);
        assert_eq!(
            normalize_private_key(&format!("\"{literal}\"\n")).unwrap(),
            pem
        );
        assert_eq!(
            normalize_private_key(&pem.replace('\n', "\r\n")).unwrap(),
            pem
        );
        let b64 = "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlCCi0tLS0tRU5EIFJTQSBQUklWQVRFIEtFWS0tLS0t";
        assert_eq!(normalize_private_key(b64).unwrap(), pem);
        assert!(normalize_private_key("  ").unwrap_err().contains("empty"));
        assert!(normalize_private_key("not a key")
            .unwrap_err()
            .contains("PEM"));
        assert_eq!(pem_label_problem(pem), None);
        assert!(pem_label_problem("-----BEGIN PUBLIC KEY-----\n")
            .unwrap()
            .contains("public key"));
        assert!(pem_label_problem("-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
            .unwrap()
            .contains("passphrase"));
    }
}
