//! Attached images (REQ-BED-013): validated, decoded and downscaled when they
//! are attached, so an image that a provider would refuse never enters the
//! history (one oversized image there breaks every later request), and
//! checked again when history is rendered for a provider whose limits are
//! tighter.
//!
//! Accepted are PNG, JPEG, GIF and WebP, recognised by their content; the
//! declared media type must agree. An image larger than the provider's
//! recommended size is scaled down, keeping its aspect ratio, and
//! re-encoded: PNG stays PNG, JPEG stays JPEG (quality 85), GIF and WebP
//! become PNG. An image that needs nothing is kept byte for byte, so the
//! same upload always has the same content hash.
//!
//! Images come in as [`ImageUpload`]s through
//! [`ConversationHandle::send`](crate::ConversationHandle::send), which
//! runs [`prepare_uploads`]: every image of the message is checked and
//! scaled to [`ImageLimits::for_upload`] before any is stored, and the first
//! refusal is [`Error::InvalidImage`], naming the image and why.
//!
//! Decoding and resizing take real CPU time (a 24-megapixel photo takes
//! a good fraction of a second) and memory (up to 512 MiB each, the
//! decoder's allocation limit): actors call [`prepare_blocking`] and [`refit_blocking`], which
//! run on tokio's blocking pool, at most [`decode_slots`] (one per core)
//! at once in the process. More wait their turn, so many images at once
//! cost time, not memory without bound, and leave blocking threads for
//! the store's reads.
//!
//! # Provider limits
//!
//! - Anthropic (Claude vision docs, "Evaluate image size" and "General
//!   limits"): an image larger than 8000×8000 px is refused, and with more
//!   than 20 images in one request the limit drops to 2000×2000 px. Images
//!   whose long edge exceeds 1568 px are scaled down by the API anyway
//!   (costing latency, gaining nothing), so keel stores them at 1568 px.
//!   The per-image cap is 5 MB of base64, so at most 3.75 MiB of bytes.
//! - OpenAI (vision guide, "Image input requirements"): PNG, JPEG, WebP and
//!   non-animated GIF, up to 20 MB per image; high detail looks at up to
//!   2000 px on the long side and 768 px on the short one. keel stores
//!   images at 2000 px on the long side and turns an animated GIF into a
//!   PNG of its first frame.
//! - The mock provider speaks Anthropic's format and gets its limits.

use std::fmt;
use std::io::Cursor;
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use image::codecs::gif::GifDecoder;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType as PngFilter, PngEncoder};
use image::{AnimationDecoder, ColorType, DynamicImage, ImageDecoder, ImageReader, Limits};
use keel_core::message::ImageRef;
use keel_core::wire::ImageData;
use keel_core::ProviderKind;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::Error;

/// Largest upload accepted, before any processing.
pub const MAX_UPLOAD_BYTES: usize = 20 * 1024 * 1024;

/// Largest width or height keel decodes at all: a guard against images
/// whose few compressed bytes unpack into gigabytes.
pub const MAX_DECODE_SIDE: u32 = 16_384;

/// Quality of JPEGs keel encodes: no visible loss, a fraction of the size.
const JPEG_QUALITY: u8 = 85;

/// The smallest long edge keel shrinks to while trying to meet a byte cap;
/// below it the image would be useless to the model.
const MIN_LONG_EDGE: u32 = 256;

/// An image as a user attaches it: its bytes and the media type they were
/// declared as. Neither is trusted; [`prepare_uploads`] checks both.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageUpload {
    /// The declared type, such as `image/png` (a `Content-Type`, a data
    /// URL's type); it must agree with what the bytes are.
    pub media_type: String,
    pub bytes: Vec<u8>,
}

impl ImageUpload {
    pub fn new(media_type: impl Into<String>, bytes: impl Into<Vec<u8>>) -> ImageUpload {
        ImageUpload {
            media_type: media_type.into(),
            bytes: bytes.into(),
        }
    }
}

/// The size of the bytes, not the bytes: an upload may be megabytes.
impl fmt::Debug for ImageUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageUpload")
            .field("media_type", &self.media_type)
            .field("bytes", &format_args!("{} bytes", self.bytes.len()))
            .finish()
    }
}

/// The formats providers accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageFormat {
    pub fn media_type(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Gif => "image/gif",
            ImageFormat::Webp => "image/webp",
        }
    }

    /// The format a media type names. Case and parameters
    /// (`; charset=…`) are ignored, and `image/jpg`, a common misspelling,
    /// is taken for `image/jpeg`.
    pub fn from_media_type(media_type: &str) -> Option<ImageFormat> {
        let essence = media_type.split(';').next().unwrap_or("").trim();
        match essence.to_ascii_lowercase().as_str() {
            "image/png" => Some(ImageFormat::Png),
            "image/jpeg" | "image/jpg" => Some(ImageFormat::Jpeg),
            "image/gif" => Some(ImageFormat::Gif),
            "image/webp" => Some(ImageFormat::Webp),
            _ => None,
        }
    }

    /// The format of `bytes`, by their signature.
    pub fn detect(bytes: &[u8]) -> Option<ImageFormat> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(ImageFormat::Gif)
        } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some(ImageFormat::Webp)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Gif => "GIF",
            ImageFormat::Webp => "WebP",
        }
    }

    fn codec(self) -> image::ImageFormat {
        match self {
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::Gif => image::ImageFormat::Gif,
            ImageFormat::Webp => image::ImageFormat::WebP,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a provider accepts, and the size keel scales images to for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Images with a longer side than this are scaled down to it: the
    /// provider's recommended size (it would scale them itself, at a cost in
    /// latency). Never more than `max_side`.
    pub long_edge: u32,
    /// The largest width or height the provider accepts at all.
    pub max_side: u32,
    /// The largest encoded image the provider accepts, in bytes.
    pub max_bytes: u64,
}

impl ImageLimits {
    /// One image in a request to Anthropic (see "Provider limits").
    pub const ANTHROPIC: ImageLimits = ImageLimits {
        long_edge: 1568,
        max_side: 8000,
        // 5 MiB of base64 holds 3.75 MiB of bytes.
        max_bytes: 5 * 1024 * 1024 / 4 * 3,
    };

    /// Anthropic's limit per side when a request holds more than
    /// [`ImageLimits::ANTHROPIC_MANY_IMAGES`] images.
    pub const ANTHROPIC_MANY_IMAGES_SIDE: u32 = 2000;

    /// More images than this in one Anthropic request tighten the limit.
    pub const ANTHROPIC_MANY_IMAGES: usize = 20;

    /// OpenAI and compatible servers (see "Provider limits").
    pub const OPENAI: ImageLimits = ImageLimits {
        long_edge: 2000,
        max_side: 2000,
        max_bytes: 20 * 1024 * 1024,
    };

    /// The limits for a request to `provider` holding `n_images` images.
    pub fn for_request(provider: ProviderKind, n_images: usize) -> ImageLimits {
        match provider {
            ProviderKind::Anthropic | ProviderKind::Mock => {
                let mut limits = ImageLimits::ANTHROPIC;
                if n_images > ImageLimits::ANTHROPIC_MANY_IMAGES {
                    limits.max_side = ImageLimits::ANTHROPIC_MANY_IMAGES_SIDE;
                    limits.long_edge = limits.long_edge.min(limits.max_side);
                }
                limits
            }
            ProviderKind::OpenAi => ImageLimits::OPENAI,
        }
    }

    /// The limits for one image in a request to `provider`.
    pub fn for_provider(provider: ProviderKind) -> ImageLimits {
        ImageLimits::for_request(provider, 1)
    }

    /// The limits an attached image is stored under: the tightest of every
    /// provider keel speaks, however many images a request holds. The
    /// stored copy then goes into any request as it is, whichever model the
    /// conversation uses now, changes to later or falls back to, and
    /// rendering history never has to decode it.
    pub fn for_upload() -> ImageLimits {
        let anthropic = ImageLimits::for_request(ProviderKind::Anthropic, usize::MAX);
        let openai = ImageLimits::for_request(ProviderKind::OpenAi, usize::MAX);
        ImageLimits {
            long_edge: anthropic.long_edge.min(openai.long_edge),
            max_side: anthropic.max_side.min(openai.max_side),
            max_bytes: anthropic.max_bytes.min(openai.max_bytes),
        }
    }

    /// `image` (already stored) can be sent as it is under these limits.
    /// Only the hard limits count: an image above the recommended
    /// `long_edge` is accepted and scaled by the provider itself.
    pub fn fits(&self, image: &ImageRef) -> bool {
        image.width <= self.max_side
            && image.height <= self.max_side
            && image.size <= self.max_bytes
            && ImageFormat::from_media_type(&image.media_type).is_some()
    }
}

/// Why an image was refused. The message is meant for the user who
/// attached it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageProblem {
    #[error("the image is empty")]
    Empty,
    #[error("the image is {size} bytes; at most {limit} bytes are accepted")]
    TooLarge { size: usize, limit: usize },
    #[error(
        "media type {declared:?} is not supported; use image/png, image/jpeg, image/gif or image/webp"
    )]
    UnsupportedMediaType { declared: String },
    #[error("the data is not a PNG, JPEG, GIF or WebP image")]
    UnknownFormat,
    #[error("the image was declared as {declared:?} but its content is {detected}")]
    MediaTypeMismatch {
        declared: String,
        detected: ImageFormat,
    },
    #[error(
        "the image is {width}×{height} pixels; at most {limit} pixels per side can be processed"
    )]
    TooManyPixels { width: u32, height: u32, limit: u32 },
    #[error("the {format} image cannot be decoded (truncated or corrupt): {reason}")]
    Undecodable { format: ImageFormat, reason: String },
    #[error("the image cannot be made smaller than {limit} bytes without becoming unreadable")]
    CannotFit { limit: u64 },
    #[error("the image could not be re-encoded: {reason}")]
    Encode { reason: String },
    /// Stored bytes that are not those the image was stored as: the hash
    /// in the history names other content.
    #[error("the stored bytes of the image are damaged (they no longer match its hash)")]
    Damaged,
    /// The work on the blocking pool did not finish (the decoder panicked,
    /// or the runtime is shutting down).
    #[error("the image could not be processed: {reason}")]
    Failed { reason: String },
}

/// An image ready to store and send: its reference (hash, type, size) and
/// its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedImage {
    pub image: ImageRef,
    pub bytes: Vec<u8>,
    /// The bytes were re-encoded (scaled down, de-animated or compressed);
    /// `false` means they are the upload, byte for byte.
    pub reencoded: bool,
}

/// Validates `bytes` declared as `declared_media_type` and makes them fit
/// `limits`. Pure CPU work that can take a while: see [`prepare_blocking`].
pub fn prepare(
    bytes: Vec<u8>,
    declared_media_type: &str,
    limits: &ImageLimits,
) -> Result<PreparedImage, ImageProblem> {
    if bytes.is_empty() {
        return Err(ImageProblem::Empty);
    }
    if bytes.len() > MAX_UPLOAD_BYTES {
        return Err(ImageProblem::TooLarge {
            size: bytes.len(),
            limit: MAX_UPLOAD_BYTES,
        });
    }
    let declared = ImageFormat::from_media_type(declared_media_type).ok_or_else(|| {
        ImageProblem::UnsupportedMediaType {
            declared: declared_media_type.to_owned(),
        }
    })?;
    let format = ImageFormat::detect(&bytes).ok_or(ImageProblem::UnknownFormat)?;
    if format != declared {
        return Err(ImageProblem::MediaTypeMismatch {
            declared: declared_media_type.to_owned(),
            detected: format,
        });
    }

    let decoded = decode(&bytes, format)?;
    let animated = format == ImageFormat::Gif && is_animated_gif(&bytes);
    let (width, height) = (decoded.width(), decoded.height());
    let too_long = width.max(height) > limits.long_edge.min(limits.max_side);
    let too_heavy = bytes.len() as u64 > limits.max_bytes;
    if !(too_long || too_heavy || animated) {
        return Ok(PreparedImage {
            image: image_ref(&bytes, format, width, height),
            bytes,
            reencoded: false,
        });
    }
    reencode(&decoded, format, limits)
}

/// `image`, stored with `bytes`, made to fit `limits` if it does not yet:
/// `None` when it can be sent as it is. For rendering history to a
/// provider whose limits are tighter than those it was attached under.
///
/// The bytes are checked against the image's hash first: bytes damaged in
/// storage would otherwise go to the provider, which refuses the request,
/// and every later one of the conversation with it.
pub fn refit(
    image: &ImageRef,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<Option<PreparedImage>, ImageProblem> {
    if content_hash(bytes) != image.hash {
        return Err(ImageProblem::Damaged);
    }
    if limits.fits(image) {
        return Ok(None);
    }
    prepare(bytes.to_vec(), &image.media_type, limits).map(Some)
}

/// How many decodes run at once in the process: one per core (what
/// `std::thread::available_parallelism` reports, 1 if it cannot tell).
/// Decoding is CPU work, so more at once would not finish sooner, and each
/// may hold up to 512 MiB.
pub fn decode_slots() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The [`decode_slots`] every decode of the process takes one of.
static DECODES: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(decode_slots())));

/// [`prepare`] on tokio's blocking pool, off the calling actor's thread,
/// once one of the [`decode_slots`] is free.
pub async fn prepare_blocking(
    bytes: Vec<u8>,
    declared_media_type: String,
    limits: ImageLimits,
) -> Result<PreparedImage, ImageProblem> {
    bounded(&DECODES, move || {
        prepare(bytes, &declared_media_type, &limits)
    })
    .await?
}

/// [`refit`] on tokio's blocking pool, off the calling actor's thread
/// (hashing a few megabytes is blocking work too), once one of the
/// [`decode_slots`] is free.
pub async fn refit_blocking(
    image: ImageRef,
    bytes: Vec<u8>,
    limits: ImageLimits,
) -> Result<Option<PreparedImage>, ImageProblem> {
    bounded(&DECODES, move || refit(&image, &bytes, &limits)).await?
}

/// Run `work` on the blocking pool holding one of `slots`' permits. The
/// blocking thread holds it until `work` ends, even when the caller has
/// gone (a cancelled send), so the bound counts what really runs.
async fn bounded<T, Work>(slots: &Arc<Semaphore>, work: Work) -> Result<T, ImageProblem>
where
    T: Send + 'static,
    Work: FnOnce() -> T + Send + 'static,
{
    let permit = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ImageProblem::Failed {
            reason: "keel is shutting down".to_owned(),
        })?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(unfinished)
}

fn unfinished(error: tokio::task::JoinError) -> ImageProblem {
    let reason = if error.is_panic() {
        "the decoder failed"
    } else {
        "keel is shutting down"
    };
    ImageProblem::Failed {
        reason: reason.to_owned(),
    }
}

/// Validates every image of one message, in order, and scales each to
/// [`ImageLimits::for_upload`], on tokio's blocking pool. The first image
/// refused ends it with [`Error::InvalidImage`], which names the image and
/// why; none of the images is kept then, so a message goes in with all its
/// images or not at all.
pub async fn prepare_uploads(uploads: Vec<ImageUpload>) -> Result<Vec<PreparedImage>, Error> {
    let count = uploads.len();
    let limits = ImageLimits::for_upload();
    let mut prepared = Vec::with_capacity(count);
    for (index, upload) in uploads.into_iter().enumerate() {
        let image = prepare_blocking(upload.bytes, upload.media_type, limits)
            .await
            .map_err(|problem| Error::InvalidImage {
                index,
                count,
                problem,
            })?;
        prepared.push(image);
    }
    Ok(prepared)
}

/// The bytes as a provider request carries them.
pub fn image_data(media_type: &str, bytes: &[u8]) -> ImageData {
    ImageData {
        media_type: media_type.to_owned(),
        base64: base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

/// Lowercase hex SHA-256 of `bytes`: the name an image is stored under.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest.iter() {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0F)]));
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn image_ref(bytes: &[u8], format: ImageFormat, width: u32, height: u32) -> ImageRef {
    ImageRef {
        hash: content_hash(bytes),
        media_type: format.media_type().to_owned(),
        width,
        height,
        size: bytes.len() as u64,
    }
}

/// Decodes the whole image, upright (EXIF orientation applied), refusing
/// anything cut short or corrupt.
fn decode(bytes: &[u8], format: ImageFormat) -> Result<DynamicImage, ImageProblem> {
    let undecodable = |reason: String| ImageProblem::Undecodable { format, reason };
    if format == ImageFormat::Jpeg && !jpeg_has_end(bytes) {
        // The JPEG decoder fills a missing tail with grey rather than fail.
        return Err(undecodable(
            "the data ends before the image does".to_owned(),
        ));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.codec());
    // The default allocation limit (512 MiB) stays in force; the side
    // limit is checked below for a clearer message.
    reader.limits(Limits::default());
    let mut decoder = reader
        .into_decoder()
        .map_err(|error| problem(error, format))?;
    let (width, height) = decoder.dimensions();
    if width.max(height) > MAX_DECODE_SIDE {
        return Err(ImageProblem::TooManyPixels {
            width,
            height,
            limit: MAX_DECODE_SIDE,
        });
    }
    let orientation = decoder.orientation().ok();
    let mut image = DynamicImage::from_decoder(decoder).map_err(|error| problem(error, format))?;
    if let Some(orientation) = orientation {
        image.apply_orientation(orientation);
    }
    Ok(image)
}

fn problem(error: image::ImageError, format: ImageFormat) -> ImageProblem {
    let reason = match error {
        image::ImageError::Limits(_) => {
            "it would take more memory to decode than keel allows for one image".to_owned()
        }
        error => error.to_string(),
    };
    ImageProblem::Undecodable { format, reason }
}

/// The last scan of a JPEG is followed by an EOI marker (`FF D9`). Inside
/// scan data `FF` is always escaped, so the last start-of-scan (`FF DA`)
/// found is a real one, after any embedded thumbnail; data a writer
/// appends after EOI is allowed.
fn jpeg_has_end(bytes: &[u8]) -> bool {
    let last_scan = bytes
        .windows(2)
        .rposition(|pair| pair == [0xFF, 0xDA])
        .unwrap_or(0);
    bytes[last_scan..]
        .windows(2)
        .any(|pair| pair == [0xFF, 0xD9])
}

/// More than one frame. OpenAI refuses animated GIFs; every provider looks
/// at the first frame only, so that is what keel keeps.
fn is_animated_gif(bytes: &[u8]) -> bool {
    let Ok(decoder) = GifDecoder::new(Cursor::new(bytes)) else {
        return false;
    };
    decoder.into_frames().take(2).count() > 1
}

/// Scales `image` down to `limits.long_edge` (further if needed to meet
/// `max_bytes`) and encodes it.
fn reencode(
    image: &DynamicImage,
    source: ImageFormat,
    limits: &ImageLimits,
) -> Result<PreparedImage, ImageProblem> {
    let target = match source {
        ImageFormat::Jpeg => ImageFormat::Jpeg,
        ImageFormat::Png | ImageFormat::Gif | ImageFormat::Webp => ImageFormat::Png,
    };
    let mut long_edge = limits
        .long_edge
        .min(limits.max_side)
        .min(image.width().max(image.height()));
    loop {
        let scaled = scale_to(image, long_edge);
        let bytes = encode(&scaled, target)?;
        if bytes.len() as u64 <= limits.max_bytes {
            return Ok(PreparedImage {
                image: image_ref(&bytes, target, scaled.width(), scaled.height()),
                bytes,
                reencoded: true,
            });
        }
        // A PNG photo is heavy; the same pixels as JPEG are a fraction.
        if target == ImageFormat::Png && !scaled.color().has_alpha() {
            let bytes = encode(&scaled, ImageFormat::Jpeg)?;
            if bytes.len() as u64 <= limits.max_bytes {
                return Ok(PreparedImage {
                    image: image_ref(&bytes, ImageFormat::Jpeg, scaled.width(), scaled.height()),
                    bytes,
                    reencoded: true,
                });
            }
        }
        if long_edge <= MIN_LONG_EDGE {
            return Err(ImageProblem::CannotFit {
                limit: limits.max_bytes,
            });
        }
        long_edge = (long_edge / 4 * 3).max(MIN_LONG_EDGE);
    }
}

/// `image` with its longer side `long_edge` pixels (or as it is, if it is
/// not longer), aspect ratio kept.
fn scale_to(image: &DynamicImage, long_edge: u32) -> DynamicImage {
    let (width, height) = (image.width(), image.height());
    let longer = width.max(height);
    if longer <= long_edge {
        return image.clone();
    }
    let scale = |side: u32| {
        let scaled = u64::from(side) * u64::from(long_edge) / u64::from(longer);
        u32::try_from(scaled).unwrap_or(long_edge).max(1)
    };
    let (new_width, new_height) = if width >= height {
        (long_edge, scale(height))
    } else {
        (scale(width), long_edge)
    };
    // Area averaging: for shrinking, as good as a windowed filter and
    // several times faster.
    image.thumbnail_exact(new_width, new_height)
}

fn encode(image: &DynamicImage, format: ImageFormat) -> Result<Vec<u8>, ImageProblem> {
    let mut bytes = Vec::new();
    let failed = |error: image::ImageError| ImageProblem::Encode {
        reason: error.to_string(),
    };
    match format {
        ImageFormat::Jpeg => {
            let rgb = image.to_rgb8();
            JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
                .encode_image(&rgb)
                .map_err(failed)?;
        }
        ImageFormat::Png | ImageFormat::Gif | ImageFormat::Webp => {
            // Eight bits per channel is all a model looks at; grey stays grey.
            let image = match image.color() {
                ColorType::L8 | ColorType::L16 => DynamicImage::ImageLuma8(image.to_luma8()),
                ColorType::La8 | ColorType::La16 => {
                    DynamicImage::ImageLumaA8(image.to_luma_alpha8())
                }
                color if color.has_alpha() => DynamicImage::ImageRgba8(image.to_rgba8()),
                _ => DynamicImage::ImageRgb8(image.to_rgb8()),
            };
            let encoder = PngEncoder::new_with_quality(
                &mut bytes,
                CompressionType::Default,
                PngFilter::Adaptive,
            );
            image.write_with_encoder(encoder).map_err(failed)?;
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::mpsc;

    use super::*;

    /// Six decodes against two slots: two run, the others wait for a slot,
    /// and at no time do more than two run. Each decode is held at its own
    /// gate until the test lets it go, so what runs at once is known.
    #[tokio::test]
    async fn no_more_decodes_run_at_once_than_there_are_slots() {
        const SLOTS: usize = 2;
        const DECODES_WANTED: usize = 6;
        let slots = Arc::new(Semaphore::new(SLOTS));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let mut gates = Vec::new();
        let mut decodes = Vec::new();
        for index in 0..DECODES_WANTED {
            let (open, gate) = std::sync::mpsc::channel::<()>();
            gates.push(Some(open));
            let (slots, running, most, started_tx) = (
                slots.clone(),
                running.clone(),
                most.clone(),
                started_tx.clone(),
            );
            decodes.push(tokio::spawn(async move {
                bounded(&slots, move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let _ = started_tx.send(index);
                    let _ = gate.recv();
                    running.fetch_sub(1, Ordering::SeqCst);
                    index
                })
                .await
            }));
        }
        for _ in 0..DECODES_WANTED / SLOTS {
            // Two start; no third can until one of them ends.
            let first = started.recv().await.unwrap();
            let second = started.recv().await.unwrap();
            assert_eq!(running.load(Ordering::SeqCst), SLOTS);
            for index in [first, second] {
                gates[index].take().unwrap().send(()).unwrap();
            }
        }
        for (index, decode) in decodes.into_iter().enumerate() {
            assert_eq!(decode.await.unwrap().unwrap(), index);
        }
        assert_eq!(most.load(Ordering::SeqCst), SLOTS);
        assert_eq!(
            slots.available_permits(),
            SLOTS,
            "every slot was given back"
        );
    }
}
