//! Every parser of untrusted input, on the same bytes: request bodies, list queries, cursors,
//! path ids, request paths and `Authorization` headers. None may panic, and each must either
//! accept or refuse with one of the contract's codes for it.
#![no_main]

use animal_store_backend::models;
use animal_store_gateway::auth::authorize;
use animal_store_gateway::key_set::KeySet;
use animal_store_gateway::routes::normalize_path;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = models::parse_new_pet(data) {
        assert_eq!(e.code.status(), 400);
    }
    let _ = authorize(Some(data), &KeySet::default(), 0);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for result in [
        models::parse_list_query(text).map(drop),
        models::decode_cursor(text).map(drop),
        models::parse_pet_id(text).map(drop),
    ] {
        if let Err(e) = result {
            assert_eq!(e.code.as_str(), "invalid_parameter");
        }
    }
    if let Ok(path) = normalize_path(text) {
        // Whatever is accepted is stable: normalizing again changes nothing.
        assert_eq!(normalize_path(&path).as_deref(), Ok(&*path));
    }
});
