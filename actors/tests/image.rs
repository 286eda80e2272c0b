//! Attached images: validation, downscaling to each provider's limits, the
//! content hash, and the check made again when history is rendered. The
//! images are generated here, so the tests need no files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use image::codecs::gif::GifEncoder;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::{Delay, Frame, ImageEncoder, RgbImage, RgbaImage};
use keel_actors::image::{
    content_hash, image_data, prepare, prepare_blocking, prepare_uploads, refit, ImageFormat,
    ImageLimits, ImageProblem, ImageUpload, MAX_DECODE_SIDE, MAX_UPLOAD_BYTES,
};
use keel_actors::Error;
use keel_core::message::ImageRef;
use keel_core::ProviderKind;

/// A smooth gradient: compresses well, so even a large one is quick to make.
fn gradient(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 128])
    })
}

fn png(image: &RgbImage) -> Vec<u8> {
    let mut bytes = Vec::new();
    // Fast compression with the Up filter keeps a 24-megapixel test image
    // cheap to make in a debug build.
    PngEncoder::new_with_quality(&mut bytes, CompressionType::Fast, FilterType::Up)
        .write_image(
            image.as_raw(),
            image.width(),
            image.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    bytes
}

fn jpeg(image: &RgbImage) -> Vec<u8> {
    let mut bytes = Vec::new();
    JpegEncoder::new_with_quality(&mut bytes, 90)
        .encode_image(image)
        .unwrap();
    bytes
}

fn decoded_size(bytes: &[u8]) -> (u32, u32) {
    let image = image::load_from_memory(bytes).unwrap();
    (image.width(), image.height())
}

#[test]
fn a_large_png_is_downscaled_within_the_limits_keeping_its_aspect_ratio() {
    let upload = png(&gradient(6000, 4000));
    let limits = ImageLimits::for_provider(ProviderKind::Anthropic);

    let prepared = prepare(upload.clone(), "image/png", &limits).unwrap();

    let image = &prepared.image;
    assert!(prepared.reencoded);
    assert_eq!((image.width, image.height), (1568, 1045));
    assert_eq!(image.media_type, "image/png");
    assert!(image.width.max(image.height) <= limits.long_edge);
    assert!(image.size <= limits.max_bytes);
    assert_eq!(image.size, prepared.bytes.len() as u64);
    // 6000:4000 is 1.5; rounding down to whole pixels moves it by less than
    // one pixel's worth.
    let ratio = f64::from(image.width) / f64::from(image.height);
    assert!((ratio - 1.5).abs() < 1.5 / 1045.0, "{ratio}");
    // The stored bytes are what the reference describes.
    assert_eq!(ImageFormat::detect(&prepared.bytes), Some(ImageFormat::Png));
    assert_eq!(decoded_size(&prepared.bytes), (1568, 1045));
    assert_eq!(image.hash, content_hash(&prepared.bytes));
    assert_ne!(image.hash, content_hash(&upload));
}

#[test]
fn each_provider_gets_its_own_size_and_jpeg_stays_jpeg() {
    let upload = jpeg(&gradient(3000, 1500));

    let for_openai = prepare(upload.clone(), "image/jpeg", &ImageLimits::OPENAI).unwrap();
    assert_eq!(for_openai.image.media_type, "image/jpeg");
    assert_eq!(
        (for_openai.image.width, for_openai.image.height),
        (2000, 1000)
    );
    assert_eq!(
        ImageFormat::detect(&for_openai.bytes),
        Some(ImageFormat::Jpeg)
    );

    let for_anthropic = prepare(upload, "image/jpeg", &ImageLimits::ANTHROPIC).unwrap();
    assert_eq!(
        (for_anthropic.image.width, for_anthropic.image.height),
        (1568, 784)
    );
}

#[test]
fn a_small_image_passes_untouched_with_the_same_hash() {
    let upload = png(&gradient(800, 600));
    let prepared = prepare(upload.clone(), "image/png", &ImageLimits::ANTHROPIC).unwrap();

    assert!(!prepared.reencoded);
    assert_eq!(prepared.bytes, upload);
    assert_eq!(prepared.image.hash, content_hash(&upload));
    assert_eq!(
        prepared.image,
        ImageRef {
            hash: content_hash(&upload),
            media_type: "image/png".to_owned(),
            width: 800,
            height: 600,
            size: upload.len() as u64,
        }
    );
    // The same upload always gets the same name.
    let again = prepare(upload, "image/png", &ImageLimits::ANTHROPIC).unwrap();
    assert_eq!(again.image.hash, prepared.image.hash);
}

#[test]
fn a_truncated_jpeg_is_rejected_with_a_clear_error() {
    let whole = jpeg(&gradient(640, 480));
    let cut = whole[..whole.len() * 2 / 3].to_vec();

    let problem = prepare(cut, "image/jpeg", &ImageLimits::ANTHROPIC).unwrap_err();

    assert!(
        matches!(
            problem,
            ImageProblem::Undecodable {
                format: ImageFormat::Jpeg,
                ..
            }
        ),
        "{problem:?}"
    );
    let message = problem.to_string();
    assert!(
        message.starts_with("the JPEG image cannot be decoded (truncated or corrupt)"),
        "{message}"
    );
}

#[test]
fn a_truncated_png_is_rejected_too() {
    let whole = png(&gradient(640, 480));
    let cut = whole[..whole.len() / 2].to_vec();
    let problem = prepare(cut, "image/png", &ImageLimits::ANTHROPIC).unwrap_err();
    assert!(
        matches!(
            problem,
            ImageProblem::Undecodable {
                format: ImageFormat::Png,
                ..
            }
        ),
        "{problem:?}"
    );
}

#[test]
fn data_after_the_end_of_a_jpeg_is_tolerated() {
    let mut upload = jpeg(&gradient(64, 48));
    upload.extend_from_slice(b"trailer some cameras write");
    let prepared = prepare(upload.clone(), "image/jpeg", &ImageLimits::ANTHROPIC).unwrap();
    assert_eq!(prepared.bytes, upload);
}

#[test]
fn an_image_too_large_to_process_is_refused_by_its_header() {
    let strip = RgbImage::from_pixel(MAX_DECODE_SIDE + 1, 1, image::Rgb([9, 9, 9]));
    let problem = prepare(png(&strip), "image/png", &ImageLimits::ANTHROPIC).unwrap_err();
    assert_eq!(
        problem,
        ImageProblem::TooManyPixels {
            width: MAX_DECODE_SIDE + 1,
            height: 1,
            limit: MAX_DECODE_SIDE,
        }
    );
}

#[test]
fn a_mismatched_media_type_is_rejected() {
    let upload = png(&gradient(64, 64));
    let problem = prepare(upload, "image/jpeg", &ImageLimits::ANTHROPIC).unwrap_err();
    assert_eq!(
        problem,
        ImageProblem::MediaTypeMismatch {
            declared: "image/jpeg".to_owned(),
            detected: ImageFormat::Png,
        }
    );
    assert_eq!(
        problem.to_string(),
        "the image was declared as \"image/jpeg\" but its content is PNG"
    );
}

#[test]
fn media_types_are_matched_leniently_but_only_the_four_formats_pass() {
    let upload = jpeg(&gradient(64, 64));
    let prepared = prepare(upload.clone(), "Image/JPG", &ImageLimits::ANTHROPIC).unwrap();
    assert_eq!(prepared.image.media_type, "image/jpeg");

    assert_eq!(
        prepare(upload, "image/bmp", &ImageLimits::ANTHROPIC).unwrap_err(),
        ImageProblem::UnsupportedMediaType {
            declared: "image/bmp".to_owned()
        }
    );
    assert_eq!(
        prepare(
            b"BM not a png".to_vec(),
            "image/png",
            &ImageLimits::ANTHROPIC
        )
        .unwrap_err(),
        ImageProblem::UnknownFormat
    );
    assert_eq!(
        prepare(Vec::new(), "image/png", &ImageLimits::ANTHROPIC).unwrap_err(),
        ImageProblem::Empty
    );
}

#[test]
fn an_oversized_upload_is_refused_before_decoding() {
    let mut upload = png(&gradient(16, 16));
    upload.resize(MAX_UPLOAD_BYTES + 1, 0);
    let problem = prepare(upload, "image/png", &ImageLimits::ANTHROPIC).unwrap_err();
    assert_eq!(
        problem,
        ImageProblem::TooLarge {
            size: MAX_UPLOAD_BYTES + 1,
            limit: MAX_UPLOAD_BYTES,
        }
    );
    assert!(problem.to_string().contains("at most 20971520 bytes"));
}

#[test]
fn an_image_over_the_byte_cap_is_compressed_until_it_fits() {
    // Noise does not compress: as PNG it is larger than the cap.
    let mut state = 0x2545_f491_u32;
    let noise = RgbImage::from_fn(900, 900, |_, _| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let [a, b, c, _] = state.to_le_bytes();
        image::Rgb([a, b, c])
    });
    let upload = png(&noise);
    let limits = ImageLimits {
        long_edge: 1568,
        max_side: 8000,
        max_bytes: 1_000_000,
    };
    assert!(upload.len() > 1_000_000);

    let prepared = prepare(upload, "image/png", &limits).unwrap();

    assert!(prepared.reencoded);
    assert!(prepared.image.size <= limits.max_bytes);
    // An opaque PNG may become a JPEG to fit.
    assert_eq!(
        ImageFormat::from_media_type(&prepared.image.media_type),
        ImageFormat::detect(&prepared.bytes)
    );
}

#[test]
fn an_animated_gif_becomes_a_png_of_its_first_frame() {
    let mut upload = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut upload);
        let frames = [[255, 0, 0, 255], [0, 0, 255, 255]].map(|color| {
            Frame::from_parts(
                RgbaImage::from_pixel(40, 30, image::Rgba(color)),
                0,
                0,
                Delay::from_numer_denom_ms(100, 1),
            )
        });
        encoder.encode_frames(frames).unwrap();
    }
    let prepared = prepare(upload, "image/gif", &ImageLimits::OPENAI).unwrap();
    assert!(prepared.reencoded);
    assert_eq!(prepared.image.media_type, "image/png");
    assert_eq!((prepared.image.width, prepared.image.height), (40, 30));
    let first = image::load_from_memory(&prepared.bytes).unwrap().to_rgba8();
    assert_eq!(first.get_pixel(0, 0).0, [255, 0, 0, 255]);
}

#[test]
fn history_is_checked_against_the_limits_of_the_request_it_goes_into() {
    // Attached under looser limits (a custom provider size): 2400×1200.
    let loose = ImageLimits {
        long_edge: 2400,
        max_side: 8000,
        max_bytes: 20 * 1024 * 1024,
    };
    let stored = prepare(png(&gradient(2400, 1200)), "image/png", &loose).unwrap();
    assert!(!stored.reencoded);

    // Anthropic takes it in a request with up to 20 images…
    let few = ImageLimits::for_request(ProviderKind::Anthropic, 20);
    assert!(few.fits(&stored.image));
    assert_eq!(refit(&stored.image, &stored.bytes, &few).unwrap(), None);

    // …but with more than 20 the limit drops to 2000 px per side.
    let many = ImageLimits::for_request(ProviderKind::Anthropic, 21);
    assert_eq!(many.max_side, 2000);
    assert!(!many.fits(&stored.image));
    let refitted = refit(&stored.image, &stored.bytes, &many)
        .unwrap()
        .expect("a smaller copy");
    assert!(many.fits(&refitted.image));
    assert_eq!((refitted.image.width, refitted.image.height), (1568, 784));

    // OpenAI's limit is 2000 px regardless of the count.
    assert!(!ImageLimits::for_request(ProviderKind::OpenAi, 1).fits(&stored.image));
    assert!(ImageLimits::for_request(ProviderKind::OpenAi, 1).fits(&refitted.image));
}

#[test]
fn image_data_is_standard_base64_of_the_bytes() {
    let upload = png(&gradient(8, 8));
    let data = image_data("image/png", &upload);
    assert_eq!(data.media_type, "image/png");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&data.base64)
            .unwrap(),
        upload
    );
}

#[test]
fn the_content_hash_is_lowercase_hex_sha256() {
    assert_eq!(
        content_hash(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[tokio::test]
async fn preparing_runs_on_the_blocking_pool() {
    let upload = jpeg(&gradient(2500, 500));
    let prepared = prepare_blocking(upload, "image/jpeg".to_owned(), ImageLimits::ANTHROPIC)
        .await
        .unwrap();
    assert_eq!((prepared.image.width, prepared.image.height), (1568, 313));

    let problem = prepare_blocking(
        b"nope".to_vec(),
        "image/png".to_owned(),
        ImageLimits::ANTHROPIC,
    )
    .await
    .unwrap_err();
    assert_eq!(problem, ImageProblem::UnknownFormat);
}

#[test]
fn uploads_are_stored_within_every_providers_limits() {
    let upload = ImageLimits::for_upload();
    for provider in [
        ProviderKind::Anthropic,
        ProviderKind::OpenAi,
        ProviderKind::Mock,
    ] {
        for n_images in [1, 21, 100] {
            let request = ImageLimits::for_request(provider, n_images);
            assert!(
                upload.long_edge <= request.long_edge,
                "{provider:?} {n_images}"
            );
            assert!(
                upload.max_side <= request.max_side,
                "{provider:?} {n_images}"
            );
            assert!(
                upload.max_bytes <= request.max_bytes,
                "{provider:?} {n_images}"
            );
        }
    }
    // Not smaller than it has to be.
    assert_eq!(upload.long_edge, ImageLimits::ANTHROPIC.long_edge);
    assert_eq!(upload.max_side, ImageLimits::ANTHROPIC_MANY_IMAGES_SIDE);
    assert_eq!(upload.max_bytes, ImageLimits::ANTHROPIC.max_bytes);
}

#[tokio::test]
async fn uploads_are_prepared_in_order_and_the_first_bad_one_is_named() {
    let good = png(&gradient(3000, 1500));
    let prepared = prepare_uploads(vec![
        ImageUpload::new("image/png", good.clone()),
        ImageUpload::new("image/jpeg", jpeg(&gradient(40, 30))),
    ])
    .await
    .unwrap();
    assert_eq!(prepared.len(), 2);
    assert_eq!(
        (prepared[0].image.width, prepared[0].image.height),
        (1568, 784)
    );
    assert_eq!(prepared[1].image.media_type, "image/jpeg");

    let error = prepare_uploads(vec![
        ImageUpload::new("image/png", good),
        ImageUpload::new("image/png", b"not an image".to_vec()),
        ImageUpload::new("image/png", Vec::new()),
    ])
    .await
    .unwrap_err();
    let Error::InvalidImage {
        index,
        count,
        problem,
    } = &error
    else {
        panic!("expected InvalidImage, got {error:?}");
    };
    assert_eq!((*index, *count), (1, 3));
    assert_eq!(*problem, ImageProblem::UnknownFormat);
    assert_eq!(
        error.to_string(),
        "image 2 of 3 was refused: the data is not a PNG, JPEG, GIF or WebP image"
    );
}

#[test]
fn an_upload_prints_its_size_not_its_bytes() {
    let upload = ImageUpload::new("image/png", vec![7_u8; 5000]);
    assert_eq!(
        format!("{upload:?}"),
        "ImageUpload { media_type: \"image/png\", bytes: 5000 bytes }"
    );
}

#[test]
fn stored_bytes_that_no_longer_match_their_hash_are_refused_when_rendered() {
    let stored = prepare(png(&gradient(64, 64)), "image/png", &ImageLimits::ANTHROPIC).unwrap();
    let mut damaged = stored.bytes.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xFF;
    assert_eq!(
        refit(&stored.image, &damaged, &ImageLimits::ANTHROPIC),
        Err(ImageProblem::Damaged)
    );
    assert_eq!(
        refit(&stored.image, &stored.bytes, &ImageLimits::ANTHROPIC),
        Ok(None)
    );
}
