//! The Lambda package: a zip with one entry, `bootstrap`, mode 0755 (the
//! layout of runtime `provided.al2023`, as cargo-lambda builds it).

use std::io::{Cursor, Write};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

/// Zip `binary` as `bootstrap`. `deflate` compresses; storing is much faster
/// for the big debug binaries tests use.
pub fn bootstrap_zip(binary: &[u8], deflate: bool) -> std::io::Result<Vec<u8>> {
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let options = SimpleFileOptions::default()
        .compression_method(method)
        .unix_permissions(0o755)
        .large_file(binary.len() >= u32::MAX as usize);
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    zip.start_file("bootstrap", options)
        .map_err(std::io::Error::other)?;
    zip.write_all(binary)?;
    Ok(zip.finish().map_err(std::io::Error::other)?.into_inner())
}

/// Lambda's `CodeSha256`: base64 of the zip's SHA-256.
pub fn code_sha256(zip: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Sha256::digest(zip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_executable_entry() {
        let zip = bootstrap_zip(b"#!/bin/true\n", true).unwrap();
        let mut archive = zip::ZipArchive::new(Cursor::new(zip)).unwrap();
        assert_eq!(archive.len(), 1);
        let entry = archive.by_index(0).unwrap();
        assert_eq!(entry.name(), "bootstrap");
        assert_eq!(entry.unix_mode().map(|m| m & 0o777), Some(0o755));
    }
}
