//! The manifests agree with each other where the build depends on it: the fuzz target is a
//! workspace of its own (`fuzz/Cargo.toml`), so the root's `[patch.crates-io]` does not reach it.
//! A crate the root patches and the fuzz workspace does not is built there from crates.io, and
//! the fuzz target then exercises code the binary does not run, or fails to build once the
//! gateway uses a patched crate's addition (`vendor/README.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The `[patch.crates-io]` entries of the manifest at `manifest`: crate name to the vendored
/// directory it points at, resolved against the manifest's own directory.
fn patches(manifest: &Path) -> BTreeMap<String, PathBuf> {
    let text = std::fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    let parsed: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("parsing {}: {e}", manifest.display()));
    let dir = manifest.parent().expect("a manifest is in a directory");
    let Some(entries) = parsed
        .get("patch")
        .and_then(|patch| patch.get("crates-io"))
        .and_then(toml::Value::as_table)
    else {
        return BTreeMap::new();
    };
    entries
        .iter()
        .map(|(name, entry)| {
            let path = entry
                .get("path")
                .and_then(toml::Value::as_str)
                .unwrap_or_else(|| panic!("{}: patch of {name} has no path", manifest.display()));
            let resolved = dir
                .join(path)
                .canonicalize()
                .unwrap_or_else(|e| panic!("{}: patch of {name}: {path}: {e}", manifest.display()));
            (name.clone(), resolved)
        })
        .collect()
}

#[test]
fn the_fuzz_workspace_patches_the_crates_the_root_patches_with_the_same_sources() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = patches(&root.join("Cargo.toml"));
    let fuzz = patches(&root.join("fuzz/Cargo.toml"));
    assert!(
        !binary.is_empty(),
        "the root manifest patches no crate: this test reads the wrong section"
    );
    assert_eq!(
        fuzz, binary,
        "fuzz/Cargo.toml's [patch.crates-io] must list the root's entries, pointing at the same \
         vendored directories"
    );
}
