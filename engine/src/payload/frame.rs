//! How a payload's Arrow data is compressed, and decompressing it within a cap.

use serde::{Deserialize, Serialize};

/// Most bytes one payload's `data` may decompress to. Senders split their
/// output so no fragment exceeds it (see `encode_to_fit`), so a larger
/// claim is hostile: refusing it keeps a zstd or lz4 bomb from allocating
/// without bound.
pub const MAX_DECODED_BYTES: usize = 256 * 1024 * 1024;

/// How a payload's Arrow data is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// zstd (the default).
    #[default]
    Zstd,
    /// LZ4 block with its size prepended.
    Lz4,
    /// Not compressed.
    None,
}

/// A payload encoding name that is not one of ours.
#[derive(Debug, thiserror::Error)]
#[error("unknown encoding {0:?} (zstd, lz4, none)")]
pub struct UnknownEncoding(String);

impl std::str::FromStr for Encoding {
    type Err = UnknownEncoding;
    fn from_str(s: &str) -> Result<Self, UnknownEncoding> {
        match s {
            "zstd" => Ok(Encoding::Zstd),
            "lz4" => Ok(Encoding::Lz4),
            "none" => Ok(Encoding::None),
            other => Err(UnknownEncoding(other.to_string())),
        }
    }
}

pub(crate) fn compress(encoding: Encoding, raw: &[u8]) -> Vec<u8> {
    match encoding {
        Encoding::None => raw.to_vec(),
        Encoding::Zstd => zstd::bulk::compress(raw, 1).expect("zstd compression of memory"),
        Encoding::Lz4 => lz4_flex::block::compress_prepend_size(raw),
    }
}

/// Why a compressed frame of a payload does not decompress.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("frame claims {0} bytes, above the cap of {1}")]
    TooLarge(u64, usize),
    #[error("zstd frame without content size")]
    NoContentSize,
    #[error("no zstd frame header")]
    NotZstd,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Lz4(#[from] lz4_flex::block::DecompressError),
}

/// Decompress at most [`MAX_DECODED_BYTES`]: the size a frame claims is
/// checked before anything is allocated for it.
pub(super) fn decompress(
    encoding: Encoding,
    data: &[u8],
) -> std::result::Result<Vec<u8>, FrameError> {
    decompress_within(encoding, data, MAX_DECODED_BYTES)
}

/// Decompress at most `cap` bytes, checked as [`decompress`] does.
pub(crate) fn decompress_within(
    encoding: Encoding,
    data: &[u8],
    cap: usize,
) -> std::result::Result<Vec<u8>, FrameError> {
    let check = |size: u64| {
        if size > cap as u64 {
            Err(FrameError::TooLarge(size, cap))
        } else {
            Ok(size as usize)
        }
    };
    match encoding {
        Encoding::None => Ok(data.to_vec()),
        Encoding::Zstd => {
            let size = zstd::zstd_safe::get_frame_content_size(data)
                .map_err(|_| FrameError::NotZstd)?
                .ok_or(FrameError::NoContentSize)?;
            // The output buffer is the claimed size: a frame that lies
            // about it fails instead of growing it.
            Ok(zstd::bulk::decompress(data, check(size)?)?)
        }
        Encoding::Lz4 => {
            let (size, rest) = lz4_flex::block::uncompressed_size(data)?;
            Ok(lz4_flex::block::decompress(rest, check(size as u64)?)?)
        }
    }
}
