//! Link options of the Lambda bootstrap, `skein-function`, in release builds
//! (docs/benchmarks.md, "Package size").
//!
//! - Identical code folding: optimised builds compile a generic function
//!   once per crate that uses it, so much of the binary is byte-identical
//!   copies (the SQL AST's derived `Hash`, `Clone` and drop code, per crate
//!   and per hasher). lld keeps one of each. Rust promises nothing about
//!   function addresses, so folding is sound. lld does not fold functions
//!   with unwinding tables of their own, which is why it pays only with the
//!   release profile's `panic = "abort"`.
//! - No PIE: a position-independent executable carries a relocation per
//!   pointer in its vtables and tables (6 MB) and applies them at every
//!   cold start.
//!
//! Only where the linker is lld, rustc's default on x86_64 Linux (GNU ld
//! has no `--icf`); elsewhere the binary links as usual.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    if target == "x86_64-unknown-linux-gnu" && profile == "release" {
        println!("cargo::rustc-link-arg-bin=skein-function=-Wl,--icf=all");
        println!("cargo::rustc-link-arg-bin=skein-function=-no-pie");
    }
}
