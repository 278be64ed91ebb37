//! Unit tests of [`super`] (`models.rs`).

use super::*;
use animal_store_contract::ErrorCode;
use proptest::prelude::*;

fn code_of(body: &str) -> Option<ErrorCode> {
    parse_new_pet(body.as_bytes()).err().map(|e| e.code)
}

#[test]
fn create_validation_table() {
    use ErrorCode::*;
    let cases: &[(&str, Option<ErrorCode>)] = &[
        (r#"{"name":"Rex","categoryId":1}"#, None),
        (
            r#"{"name":"Rex","categoryId":9223372036854775807,"status":"sold"}"#,
            None,
        ),
        (
            r#"{"name":"Rex","categoryId":9223372036854775808}"#,
            Some(ValidationFailed),
        ),
        (r#"{"name":"Rex","categoryId":0}"#, Some(ValidationFailed)),
        (r#"{"name":"Rex","categoryId":-4}"#, Some(ValidationFailed)),
        (r#"{"name":"Rex","categoryId":1.5}"#, Some(ValidationFailed)),
        (r#"{"name":"Rex","categoryId":1.0}"#, None),
        (r#"{"name":"Rex","categoryId":1e3}"#, None),
        (r#"{"name":"Rex","categoryId":0.0}"#, Some(ValidationFailed)),
        (
            r#"{"name":"Rex","categoryId":1e300}"#,
            Some(ValidationFailed),
        ),
        (r#"{"name":"Rex","categoryId":"1"}"#, Some(ValidationFailed)),
        (
            r#"{"name":"Rex","categoryId":null}"#,
            Some(ValidationFailed),
        ),
        (r#"{"name":"Rex"}"#, Some(ValidationFailed)),
        (r#"{"categoryId":1}"#, Some(ValidationFailed)),
        (r#"{"name":"","categoryId":1}"#, Some(ValidationFailed)),
        (r#"{"name":"   ","categoryId":1}"#, Some(ValidationFailed)),
        (
            r#"{"name":"a\u0007b","categoryId":1}"#,
            Some(ValidationFailed),
        ),
        (r#"{"name":5,"categoryId":1}"#, Some(ValidationFailed)),
        (
            r#"{"name":"Rex","categoryId":1,"status":"lost"}"#,
            Some(ValidationFailed),
        ),
        (
            r#"{"name":"Rex","categoryId":1,"status":1}"#,
            Some(ValidationFailed),
        ),
        (
            r#"{"name":"Rex","categoryId":1,"id":7}"#,
            Some(ValidationFailed),
        ),
        (
            r#"{"name":"Rex","categoryId":1,"name":"Max"}"#,
            Some(ValidationFailed),
        ),
        (
            r#"{"name":"Rex","categoryId":1,"categoryId":1}"#,
            Some(ValidationFailed),
        ),
        (
            r#"{"name":"Rex","categoryId":1,"tags":{"a":1,"a":2}}"#,
            Some(ValidationFailed),
        ),
        (r#"[1,2]"#, Some(InvalidJson)),
        (r#"[{"name":"Rex","categoryId":1}]"#, Some(InvalidJson)),
        (r#"null"#, Some(InvalidJson)),
        (r#"true"#, Some(InvalidJson)),
        (r#"1.5"#, Some(InvalidJson)),
        (r#"{"name":"Rex","categoryId":1} x"#, Some(InvalidJson)),
        (r#""Rex""#, Some(InvalidJson)),
        (r#"{"name":"Rex","#, Some(InvalidJson)),
        ("", Some(InvalidJson)),
        ("  \n", Some(InvalidJson)),
    ];
    for (body, want) in cases {
        assert_eq!(code_of(body), *want, "body {body}");
    }
}

#[test]
fn every_unknown_field_is_named_in_one_refusal() {
    let message = |body: &str| parse_new_pet(body.as_bytes()).unwrap_err().message;
    let allowed = "allowed fields are name, categoryId and status";
    assert_eq!(
        message(r#"{"name":"Rex","categoryId":1,"species":"dog"}"#),
        format!("unknown field `species`; {allowed}")
    );
    assert_eq!(
        message(r#"{"name":"Rex","species":"dog","extra":1}"#),
        format!("unknown fields `extra` and `species`; {allowed}")
    );
    assert_eq!(
        message(r#"{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"name":"Rex"}"#),
        format!("unknown fields `a`, `b`, `c`, `d`, `e` and 2 more; {allowed}")
    );
}

#[test]
fn name_length_counts_characters_not_bytes() {
    let ok = format!(r#"{{"name":"{}","categoryId":1}}"#, "é".repeat(100));
    assert!(parse_new_pet(ok.as_bytes()).is_ok());
    let long = format!(r#"{{"name":"{}","categoryId":1}}"#, "é".repeat(101));
    assert_eq!(code_of(&long), Some(ErrorCode::ValidationFailed));
}

#[test]
fn status_defaults_to_available() {
    let pet = parse_new_pet(br#"{"name":"Rex","categoryId":3}"#).unwrap();
    assert_eq!(pet.status, PetStatus::Available);
}

#[test]
fn list_query_table() {
    assert_eq!(
        parse_list_query("").unwrap(),
        ListQuery {
            limit: 20,
            status: None,
            after: None
        }
    );
    let q = parse_list_query("limit=100&status=sold&cursor=42").unwrap();
    assert_eq!(
        q,
        ListQuery {
            limit: 100,
            status: Some(PetStatus::Sold),
            after: Some(42)
        }
    );
    for bad in [
        "limit=0",
        "limit=101",
        "limit=abc",
        "limit=-1",
        "limit=+5",
        "limit=",
        "status=lost",
        "cursor=x",
        "cursor=-3",
        "foo=1",
        "limit=5&limit=6",
    ] {
        let err = parse_list_query(bad).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameter, "query {bad}");
    }
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Err(e) = parse_new_pet(&body) {
            prop_assert!(matches!(e.code, ErrorCode::InvalidJson | ErrorCode::ValidationFailed));
        }
    }

    #[test]
    fn arbitrary_queries_never_panic(q in ".{0,64}") {
        if let Err(e) = parse_list_query(&q) {
            prop_assert_eq!(e.code, ErrorCode::InvalidParameter);
        }
    }

    #[test]
    fn cursor_round_trips(id in 0i64..) {
        prop_assert_eq!(decode_cursor(&encode_cursor(id)).unwrap(), id);
    }

    /// Every cursor the contract's pattern allows is accepted (schemathesis found one past
    /// `i64::MAX` refused).
    #[test]
    fn every_cursor_of_the_contract_is_accepted(cursor in "[0-9]{1,19}") {
        prop_assert!(decode_cursor(&cursor).is_ok());
    }

    #[test]
    fn accepted_names_respect_the_rules(name in "\\PC{0,120}") {
        let body = serde_json::json!({"name": name, "categoryId": 1}).to_string();
        if let Ok(pet) = parse_new_pet(body.as_bytes()) {
            let n = pet.name.chars().count();
            prop_assert!((1..=MAX_NAME_CHARS).contains(&n));
            prop_assert!(!pet.name.chars().all(char::is_whitespace));
            prop_assert!(!pet.name.chars().any(char::is_control));
        }
    }
}

#[test]
fn a_pet_id_is_a_decimal_int64_and_a_refusal_says_the_range() {
    for (segment, id) in [
        ("42", 42),
        ("0", 0),
        ("-7", -7),
        ("9223372036854775807", i64::MAX),
    ] {
        assert_eq!(parse_pet_id(segment).unwrap(), id, "{segment}");
    }
    for segment in [
        "abc",
        "+1",
        "1.0",
        "",
        "9223372036854775808",
        "99999999999999999999",
    ] {
        let error = parse_pet_id(segment).unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidParameter, "{segment}");
        assert_eq!(
            error.message,
            "`petId` must be an integer (int64), from -9223372036854775808 to 9223372036854775807",
            "{segment}"
        );
    }
}
