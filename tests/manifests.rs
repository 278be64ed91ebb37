//! The manifests agree with each other where the build depends on it: the fuzz target is a
//! workspace of its own (`fuzz/Cargo.toml`), so the root's `[patch.crates-io]` does not reach it.
//! A crate the root patches and the fuzz workspace does not is built there from crates.io, and
//! the fuzz target then exercises code the binary does not run, or fails to build once the
//! gateway uses a patched crate's addition (`vendor/README.md`). Its `Cargo.lock` is its own
//! too, and must pin the root's versions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The TOML file at `path`, parsed.
fn toml_file(path: &Path) -> toml::Table {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The `[patch.crates-io]` entries of the manifest at `manifest`: crate name to the vendored
/// directory it points at, resolved against the manifest's own directory.
fn patches(manifest: &Path) -> BTreeMap<String, PathBuf> {
    let parsed = toml_file(manifest);
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

/// The packages a `Cargo.lock` pins: name to the versions of it (a crate may be there twice).
fn locked(lock: &Path) -> BTreeMap<String, Vec<String>> {
    let parsed = toml_file(lock);
    let mut packages: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for package in parsed
        .get("package")
        .and_then(toml::Value::as_array)
        .unwrap_or_else(|| panic!("{}: no [[package]] entries", lock.display()))
    {
        let field = |name: &str| {
            package
                .get(name)
                .and_then(toml::Value::as_str)
                .unwrap_or_else(|| panic!("{}: a package without {name}", lock.display()))
                .to_owned()
        };
        packages
            .entry(field("name"))
            .or_default()
            .push(field("version"));
    }
    packages
}

/// The fuzz workspace has a lock of its own: it must build what the binary is built of, or the
/// fuzz target tests other versions of the crates that parse untrusted input than the ones that
/// ship.
#[test]
fn the_fuzz_workspace_locks_the_versions_the_root_locks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = locked(&root.join("Cargo.lock"));
    let fuzz = locked(&root.join("fuzz/Cargo.lock"));
    let differing: Vec<String> = fuzz
        .iter()
        .filter_map(|(name, versions)| {
            let shipped = binary.get(name)?;
            (versions.iter().any(|v| !shipped.contains(v)))
                .then(|| format!("{name}: fuzz {versions:?}, root {shipped:?}"))
        })
        .collect();
    assert!(
        fuzz.contains_key("tokio") && fuzz.contains_key("animal-store-gateway"),
        "fuzz/Cargo.lock lacks the gateway's crates: this test reads the wrong file"
    );
    assert!(
        differing.is_empty(),
        "fuzz/Cargo.lock pins other versions than Cargo.lock ({}); to take the root's, run \
         `cp Cargo.lock fuzz/Cargo.lock && cargo metadata --manifest-path fuzz/Cargo.toml \
         --format-version 1 >/dev/null`",
        differing.join("; ")
    );
}
