//! Unit tests of [`super`] (`routes.rs`).

use super::path::check_segments;
use super::*;
use proptest::prelude::*;

#[test]
fn normalization_table() {
    use PathError::*;
    let cases: &[(&str, Result<&str, PathError>)] = &[
        ("/v1/pets", Ok("/v1/pets")),
        ("/v1/pets/12", Ok("/v1/pets/12")),
        ("/v1/%70ets", Ok("/v1/pets")),
        ("/v1/pets/%31", Ok("/v1/pets/1")),
        ("/v1/pets/a%20b", Ok("/v1/pets/a%20b")),
        ("/v1/pets/", Ok("/v1/pets/")),
        ("/", Ok("/")),
        ("/v1/../admin", Err(DotSegment)),
        ("/v1/./pets", Err(DotSegment)),
        ("/v1/pets/..", Err(DotSegment)),
        ("/v1/%2e%2E/admin", Err(DotSegment)),
        ("/v1/.%2e/admin", Err(DotSegment)),
        ("/v1/pets%2F1", Err(EncodedSeparator)),
        ("/v1/pets%2f1", Err(EncodedSeparator)),
        ("/v1/pets%5C1", Err(EncodedSeparator)),
        ("/v1/pets\\1", Err(EncodedSeparator)),
        ("/v1/pets%00", Err(ControlCharacter)),
        ("/v1/pets\0", Err(ControlCharacter)),
        ("/v1//pets", Err(EmptySegment)),
        ("/v1/pets%", Err(BadEscape)),
        ("/v1/pets%zz", Err(BadEscape)),
        ("v1/pets", Err(NotAbsolute)),
        ("*", Err(NotAbsolute)),
        ("/v1/pets/..%2f", Err(EncodedSeparator)),
        ("/v1/pets/...", Ok("/v1/pets/...")),
    ];
    for (input, want) in cases {
        assert_eq!(
            normalize_path(input).as_deref().map_err(|e| *e),
            *want,
            "{input}"
        );
    }
}

#[test]
fn longest_prefix_wins_at_segment_boundaries() {
    let route = |prefix: &str, port: u16| Route {
        prefix: prefix.to_owned(),
        upstream: Upstream::One(SocketAddr::from(([127, 0, 0, 1], port))),
        timeout: Duration::from_secs(1),
        deprecations: Vec::new(),
        tls: None,
        cors: None,
        upstream_duration: crate::metrics::UPSTREAM_DURATION.with_label_values(&[prefix]),
    };
    let routes = Routes::new(vec![
        route("/v1/store", 1),
        route("/v1/store/orders", 2),
        route("/v1/pets", 3),
    ]);
    let port = |path: &str| routes.find(path).map(|r| r.upstream.instances()[0].port());
    assert_eq!(port("/v1/pets"), Some(3));
    assert_eq!(port("/v1/pets/4"), Some(3));
    assert_eq!(port("/v1/petsx"), None);
    assert_eq!(port("/v1/store/orders/9"), Some(2));
    assert_eq!(port("/v1/store/inventory"), Some(1));
    assert_eq!(port("/v2/pets"), None);
}

#[test]
fn a_reload_listing_the_same_instances_in_another_order_keeps_the_running_pool() {
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let routes = |instances: &[SocketAddr]| {
        Routes::new(vec![Route {
            prefix: "/v1/orders".to_owned(),
            upstream: Upstream::Pool(Arc::new(
                Pool::new(instances, Duration::from_secs(1)).unwrap(),
            )),
            timeout: Duration::from_secs(1),
            deprecations: Vec::new(),
            tls: None,
            cors: None,
            upstream_duration: crate::metrics::UPSTREAM_DURATION.with_label_values(&["/v1/orders"]),
        }])
    };
    let pool = |routes: &Routes| match &routes.find("/v1/orders").unwrap().upstream {
        Upstream::Pool(pool) => Arc::clone(pool),
        Upstream::One(_) => unreachable!("a pool"),
    };
    let running = routes(&[addr(2), addr(1)]);
    let reloaded = routes(&[addr(1), addr(2)]).keeping_pools_of(&running);
    assert!(Arc::ptr_eq(&pool(&reloaded), &pool(&running)));
    let other = routes(&[addr(1), addr(3)]).keeping_pools_of(&running);
    assert!(!Arc::ptr_eq(&pool(&other), &pool(&running)));
}

proptest! {
    /// Whatever comes in, the output is refused or has no ambiguity left, and normalizing
    /// it again changes nothing.
    #[test]
    fn normalized_paths_are_unambiguous_and_stable(path in "/[a-zA-Z0-9%./\\\\_~-]{0,40}") {
        if let Ok(norm) = normalize_path(&path) {
            prop_assert!(!norm.contains("\\"));
            prop_assert!(!norm.to_ascii_lowercase().contains("%2f"));
            prop_assert!(!norm.split('/').any(|s| s == "." || s == ".."));
            let again = normalize_path(&norm).map(|c| c.into_owned());
            prop_assert_eq!(again.as_deref(), Ok(&*norm));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(path in "\\PC{0,60}") {
        let _ = normalize_path(&path);
    }

    /// The one-pass segment check refuses what a substring search and a split refuse, in the
    /// same order.
    #[test]
    fn segments_are_checked_as_a_search_and_a_split_would(path in "/[a./]{0,12}") {
        let want = if path.contains("//") {
            Err(PathError::EmptySegment)
        } else if path.split('/').any(|s| s == "." || s == "..") {
            Err(PathError::DotSegment)
        } else {
            Ok(())
        };
        prop_assert_eq!(check_segments(path.as_bytes()), want);
    }
}
