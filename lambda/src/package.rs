//! The Lambda package: a zip with one entry, `bootstrap`, mode 0755 (the
//! layout of runtime `provided.al2023`, as cargo-lambda builds it).

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

use crate::error::{LambdaError, Result};

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

/// The skein-function binary to package: `given`, or the one next to the
/// running binary.
pub fn function_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let me = std::env::current_exe().map_err(|source| LambdaError::File {
        path: "the running binary".into(),
        source,
    })?;
    let sibling = me.with_file_name("skein-function");
    if !sibling.exists() {
        return Err(LambdaError::refused(format!(
            "{} not found: build it (cargo build --bin skein-function) or pass --function-binary",
            sibling.display()
        )));
    }
    Ok(sibling)
}

/// The binary stripped of symbols and debug info (a debug build is past
/// Lambda's 250 MB unzipped limit, stripped well under it); as is when
/// `strip` is missing.
pub fn stripped(binary: &Path) -> Result<Vec<u8>> {
    let out = std::env::temp_dir().join(format!("skein-bootstrap-{}", std::process::id()));
    let ok = std::process::Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&out)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    let bytes = if ok {
        std::fs::read(&out)
    } else {
        std::fs::read(binary)
    };
    let _ = std::fs::remove_file(&out);
    bytes.map_err(|source| LambdaError::File {
        path: binary.display().to_string(),
        source,
    })
}

/// Whether `binary` links DataFusion's SQL front end, which a function
/// never runs: sqlparser leaves its source paths in the code's panic
/// locations. True of a `skein-function` built together with `skein`
/// (cargo unifies features within one build); the package is built on its
/// own without it (docs/lambda.md, "Package size").
pub fn carries_sql_front_end(binary: &[u8]) -> bool {
    const MARK: &[u8] = b"/sqlparser-";
    binary.windows(MARK.len()).any(|w| w == MARK)
}

/// The zip to deploy: `zip` as it is, or the stripped `binary` stored
/// (deflating a debug build takes minutes).
pub fn deployable_zip(zip: Option<&Path>, binary: Option<&Path>) -> Result<Vec<u8>> {
    match zip {
        Some(p) => std::fs::read(p).map_err(|source| LambdaError::File {
            path: p.display().to_string(),
            source,
        }),
        None => {
            let binary = function_binary(binary)?;
            bootstrap_zip(&stripped(&binary)?, false).map_err(|source| LambdaError::File {
                path: binary.display().to_string(),
                source,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_sql_front_end_by_its_source_paths() {
        assert!(carries_sql_front_end(
            b"\0registry/src/index.crates.io-1/sqlparser-0.62.0/src/ast/mod.rs\0"
        ));
        assert!(!carries_sql_front_end(
            b"\0datafusion-expr-55.2.0/src/expr.rs\0"
        ));
    }

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
