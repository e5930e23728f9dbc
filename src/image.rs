//! An image given to the model (SPEC §12, "Steering and pictures"): its kind found from
//! its first bytes (PNG, JPEG, GIF, WebP; nothing else is an image here), its size in
//! pixels read from its header, and the tokens each provider bills for it.
//!
//! The bytes travel with the conversation only in memory: a transcript stores an
//! [`Image`] as its kind, size, pixels and SHA-256 (the record [`ImageRecord`]), and one
//! read back from a transcript has no bytes ([`Image::bytes`] is `None`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What the bytes of an image are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageKind {
    /// The kind of `bytes` from their magic bytes, if they are one of the four.
    pub fn sniff(bytes: &[u8]) -> Option<ImageKind> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageKind::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageKind::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(ImageKind::Gif)
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(ImageKind::Webp)
        } else {
            None
        }
    }

    /// The media type the model APIs and the run page use.
    pub fn media_type(self) -> &'static str {
        match self {
            ImageKind::Png => "image/png",
            ImageKind::Jpeg => "image/jpeg",
            ImageKind::Gif => "image/gif",
            ImageKind::Webp => "image/webp",
        }
    }

    /// `PNG`, `JPEG`, `GIF`, `WebP`.
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::Png => "PNG",
            ImageKind::Jpeg => "JPEG",
            ImageKind::Gif => "GIF",
            ImageKind::Webp => "WebP",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::Png => "png",
            ImageKind::Jpeg => "jpeg",
            ImageKind::Gif => "gif",
            ImageKind::Webp => "webp",
        }
    }

    pub fn parse(s: &str) -> Option<ImageKind> {
        [
            ImageKind::Png,
            ImageKind::Jpeg,
            ImageKind::Gif,
            ImageKind::Webp,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// An image of the conversation. Two images are equal when their kind, size and SHA-256
/// are: one read back from a transcript (no bytes) equals the one that was sent.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "ImageRecord", from = "ImageRecord")]
pub struct Image {
    pub kind: ImageKind,
    /// Pixels, from the header (`None` when the header could not be read).
    pub dimensions: Option<(u32, u32)>,
    /// Bytes.
    pub size: u64,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    /// The bytes; `None` for an image read back from a transcript.
    pub bytes: Option<Arc<[u8]>>,
}

impl Image {
    /// The image of `bytes`, `None` when they are none of the four kinds.
    pub fn from_bytes(bytes: Vec<u8>) -> Option<Image> {
        use sha2::{Digest, Sha256};
        let kind = ImageKind::sniff(&bytes)?;
        Some(Image {
            kind,
            dimensions: dimensions(kind, &bytes),
            size: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
            bytes: Some(bytes.into()),
        })
    }

    /// The bytes in base64 (`None` without bytes).
    pub fn base64(&self) -> Option<String> {
        use base64::Engine as _;
        let bytes = self.bytes.as_ref()?;
        Some(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// What a model is told in place of an image whose bytes kodx no longer has (one read
    /// back from a transcript: a resumed run goes on without the earlier run's images).
    pub fn not_sent_note(&self) -> String {
        format!(
            "[kodx: an image ({}) was shown here to an earlier run; it is not sent again]",
            self.describe()
        )
    }

    /// What the image is, in words: `PNG, 800×600, 12 KB`.
    pub fn describe(&self) -> String {
        let size = match self.size {
            s if s >= 1 << 20 => format!("{:.1} MB", s as f64 / (1 << 20) as f64),
            s => format!("{} KB", s.div_ceil(1024)),
        };
        match self.dimensions {
            Some((w, h)) => format!("{}, {w}×{h}, {size}", self.kind.name()),
            None => format!("{}, {size}", self.kind.name()),
        }
    }

    /// An upper bound of the prompt tokens of this image whichever provider reads it: the
    /// larger of [`anthropic_tokens`] and [`openai_tokens`] (an image whose header could not
    /// be read counts as the largest either would bill).
    pub fn token_upper_bound(&self) -> u64 {
        let (w, h) = self
            .dimensions
            .unwrap_or((ANTHROPIC_LONG_EDGE, ANTHROPIC_LONG_EDGE));
        let worst_openai = openai_tokens(768, 2048);
        match self.dimensions {
            Some(_) => anthropic_tokens(w, h).max(openai_tokens(w, h)),
            None => anthropic_tokens(w, h).max(worst_openai),
        }
    }
}

impl PartialEq for Image {
    fn eq(&self, other: &Image) -> bool {
        self.kind == other.kind
            && self.size == other.size
            && self.sha256 == other.sha256
            && self.dimensions == other.dimensions
    }
}

impl std::fmt::Debug for Image {
    /// Never the bytes (they would flood a log).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("kind", &self.kind)
            .field("dimensions", &self.dimensions)
            .field("size", &self.size)
            .field("sha256", &self.sha256)
            .field("bytes", &self.bytes.as_ref().map(|b| b.len()))
            .finish()
    }
}

/// An image as a transcript stores it: everything but its bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    pub kind: ImageKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    pub size: u64,
    pub sha256: String,
}

impl From<Image> for ImageRecord {
    fn from(i: Image) -> ImageRecord {
        ImageRecord {
            kind: i.kind,
            width: i.dimensions.map(|d| d.0),
            height: i.dimensions.map(|d| d.1),
            size: i.size,
            sha256: i.sha256,
        }
    }
}

impl From<ImageRecord> for Image {
    fn from(r: ImageRecord) -> Image {
        Image {
            kind: r.kind,
            dimensions: r.width.zip(r.height),
            size: r.size,
            sha256: r.sha256,
            bytes: None,
        }
    }
}

/// The longest edge Anthropic keeps: a larger image is scaled down to it first.
pub const ANTHROPIC_LONG_EDGE: u32 = 1568;

/// Anthropic's tokens for an image of `w`×`h` pixels: `w·h/750` after scaling the long
/// edge down to [`ANTHROPIC_LONG_EDGE`] (docs.anthropic.com, *Vision*, "Calculate image
/// costs"), rounded up.
pub fn anthropic_tokens(w: u32, h: u32) -> u64 {
    let (w, h) = scale_to_fit(w, h, ANTHROPIC_LONG_EDGE, ANTHROPIC_LONG_EDGE);
    (w * h).div_ceil(750)
}

/// OpenAI's tokens for an image of `w`×`h` pixels at `detail: high` (what a data URL
/// without `detail` gets for a large image): scaled to fit 2048×2048, then its short side
/// down to 768; 85 tokens plus 170 per 512-pixel tile.
pub fn openai_tokens(w: u32, h: u32) -> u64 {
    let (w, h) = scale_to_fit(w, h, 2048, 2048);
    let short = w.min(h);
    let (w, h) = if short > 768 {
        (
            (w * 768).div_ceil(short).max(1),
            (h * 768).div_ceil(short).max(1),
        )
    } else {
        (w, h)
    };
    let tiles = w.div_ceil(512) * h.div_ceil(512);
    85 + 170 * tiles
}

/// `w`×`h` scaled down (never up) to fit `max_w`×`max_h`, keeping its aspect, as `u64`s.
fn scale_to_fit(w: u32, h: u32, max_w: u32, max_h: u32) -> (u64, u64) {
    let (w, h) = (u64::from(w.max(1)), u64::from(h.max(1)));
    let (max_w, max_h) = (u64::from(max_w), u64::from(max_h));
    if w <= max_w && h <= max_h {
        return (w, h);
    }
    // The tighter of the two ratios decides.
    if w * max_h >= h * max_w {
        (max_w, (h * max_w).div_ceil(w).max(1))
    } else {
        ((w * max_h).div_ceil(h).max(1), max_h)
    }
}

/// The size in pixels written in the header of an image of `kind`.
pub fn dimensions(kind: ImageKind, b: &[u8]) -> Option<(u32, u32)> {
    let le16 = |i: usize| Some(u16::from_le_bytes([*b.get(i)?, *b.get(i + 1)?]) as u32);
    let be32 = |i: usize| Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let le24 = |i: usize| {
        let s = b.get(i..i + 3)?;
        Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
    };
    let found = match kind {
        ImageKind::Png if b.get(12..16) == Some(b"IHDR") => (be32(16)?, be32(20)?),
        ImageKind::Png => return None,
        ImageKind::Gif => (le16(6)?, le16(8)?),
        ImageKind::Jpeg => return jpeg_dimensions(b),
        ImageKind::Webp => match b.get(12..16)? {
            b"VP8 " if b.get(23..26) == Some(&[0x9d, 0x01, 0x2a]) => {
                (le16(26)? & 0x3fff, le16(28)? & 0x3fff)
            }
            b"VP8L" if b.get(20) == Some(&0x2f) => {
                let bits = u32::from_le_bytes(b.get(21..25)?.try_into().ok()?);
                ((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            }
            b"VP8X" => (le24(24)? + 1, le24(27)? + 1),
            _ => return None,
        },
    };
    (found.0 > 0 && found.1 > 0).then_some(found)
}

/// A JPEG's size from its first start-of-frame segment, walking the segments before it.
fn jpeg_dimensions(b: &[u8]) -> Option<(u32, u32)> {
    let be16 = |i: usize| Some(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]) as u32);
    let mut i = 2;
    loop {
        // Markers may be padded with fill bytes.
        while *b.get(i)? != 0xFF {
            i += 1;
        }
        while *b.get(i)? == 0xFF {
            i += 1;
        }
        let marker = *b.get(i)?;
        i += 1;
        match marker {
            0xD0..=0xD9 | 0x01 => continue,
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let (h, w) = (be16(i + 3)?, be16(i + 5)?);
                return (w > 0 && h > 0).then_some((w, h));
            }
            _ => i += be16(i)? as usize,
        }
    }
}

#[cfg(test)]
pub(crate) mod samples {
    //! Small valid headers of each kind, for tests.

    /// A 1×1 PNG (a real, complete file).
    pub const PNG_1X1: &[u8] = &[
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F,
        0x15, 0xC4, 0x89, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0xF8,
        0xCF, 0xC0, 0xF0, 0x1F, 0x00, 0x05, 0x00, 0x01, 0xFF, 0x89, 0x99, 0x3D, 0x1D, 0x00, 0x00,
        0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
    ];

    /// A PNG header claiming `w`×`h`.
    pub fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = PNG_1X1.to_vec();
        b[16..20].copy_from_slice(&w.to_be_bytes());
        b[20..24].copy_from_slice(&h.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    #[test]
    fn kinds_and_sizes_come_from_the_bytes() {
        let png = Image::from_bytes(png(800, 600)).unwrap();
        assert_eq!(png.kind, ImageKind::Png);
        assert_eq!(png.dimensions, Some((800, 600)));
        let mut gif = b"GIF89a".to_vec();
        gif.extend([0x40, 0x01, 0xF0, 0x00, 0, 0, 0]);
        assert_eq!(dimensions(ImageKind::Gif, &gif), Some((320, 240)));
        // A JPEG: SOI, an APP0 segment of 16 bytes, then SOF0 (precision, height, width).
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        jpeg.extend([0u8; 14]);
        jpeg.extend([0xFF, 0xC0, 0x00, 0x11, 0x08, 0x01, 0xE0, 0x02, 0x80]);
        assert_eq!(ImageKind::sniff(&jpeg), Some(ImageKind::Jpeg));
        assert_eq!(dimensions(ImageKind::Jpeg, &jpeg), Some((640, 480)));
        // WebP, lossy (VP8), lossless (VP8L) and extended (VP8X).
        let mut vp8 = b"RIFF\0\0\0\0WEBPVP8 \0\0\0\0".to_vec();
        vp8.extend([0, 0, 0, 0x9d, 0x01, 0x2a, 0x20, 0x03, 0x58, 0x02]);
        assert_eq!(dimensions(ImageKind::Webp, &vp8), Some((800, 600)));
        let mut vp8l = b"RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f".to_vec();
        let bits: u32 = (100 - 1) | ((50 - 1) << 14);
        vp8l.extend(bits.to_le_bytes());
        assert_eq!(dimensions(ImageKind::Webp, &vp8l), Some((100, 50)));
        let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\0\0\0\0\0\0\0\0".to_vec();
        vp8x.extend([0xFF, 0x0F, 0x00, 0x37, 0x04, 0x00]);
        assert_eq!(dimensions(ImageKind::Webp, &vp8x), Some((4096, 1080)));
        assert_eq!(ImageKind::sniff(b"<html><body>"), None);
        assert!(Image::from_bytes(b"<!doctype html>".to_vec()).is_none());
        // A truncated JPEG has no size, and reading it stays in bounds.
        assert_eq!(dimensions(ImageKind::Jpeg, &[0xFF, 0xD8, 0xFF, 0xE0]), None);
    }

    #[test]
    fn tokens_follow_each_providers_formula() {
        // Anthropic: 1000×1000 → 1334; 3136×1568 is scaled to 1568×784.
        assert_eq!(anthropic_tokens(1000, 1000), 1334);
        assert_eq!(anthropic_tokens(3136, 1568), 1568 * 784 / 750 + 1);
        assert_eq!(anthropic_tokens(200, 200), 54);
        // OpenAI's documented examples: 1024×1024 → 765; 2048×4096 → 1105.
        assert_eq!(openai_tokens(1024, 1024), 765);
        assert_eq!(openai_tokens(2048, 4096), 1105);
        assert_eq!(openai_tokens(100, 100), 255);
        let img = Image::from_bytes(png(1000, 1000)).unwrap();
        assert_eq!(img.token_upper_bound(), 1334);
        let mut unknown = img.clone();
        unknown.dimensions = None;
        assert_eq!(unknown.token_upper_bound(), anthropic_tokens(1568, 1568));
    }

    #[test]
    fn a_transcript_keeps_no_bytes_and_the_image_stays_equal() {
        let img = Image::from_bytes(png(800, 600)).unwrap();
        let json = serde_json::to_string(&img).unwrap();
        assert!(!json.contains(&img.base64().unwrap()), "{json}");
        insta::assert_snapshot!(json, @r#"{"kind":"png","width":800,"height":600,"size":70,"sha256":"df0908049c5e5c6b0084c86940f21effb1788b0722b65759ccea77bee1f38506"}"#);
        let back: Image = serde_json::from_str(&json).unwrap();
        assert!(back.bytes.is_none());
        assert_eq!(back, img);
        assert_eq!(back.describe(), "PNG, 800×600, 1 KB");
        assert!(!format!("{img:?}").contains("137, 80"), "{img:?}");
    }
}
