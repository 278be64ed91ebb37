//! The OpenAPI description: served by the running gateway without a key, identical to the file,
//! and in agreement with the codes and operations the services implement. (Schemathesis, run by
//! `.ci/run`, checks the running service's behaviour against it.)

mod common;

use animal_store_contract::{ErrorCode, OPENAPI_PATH};
use common::{Stack, client};

const FILE: &str = include_str!("../contract/openapi.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_the_description_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let r = client().get(stack.url(OPENAPI_PATH)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/yaml");
    assert!(r.headers().get("x-request-id").is_some());
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "60",
        "fetching it spends no budget"
    );
    assert_eq!(r.text().await.unwrap(), FILE);
}

#[test]
fn the_description_lists_every_error_code_and_operation() {
    assert!(FILE.starts_with("openapi: 3.1.0\n"));
    // Valid YAML, or the docs page renders nothing (a `: ` in a plain description is enough).
    let parsed: serde_yaml::Value = serde_yaml::from_str(FILE).expect("the description parses");
    assert!(parsed["paths"]["/pets"]["get"]["responses"]["200"].is_mapping());
    for code in ErrorCode::ALL {
        assert!(
            FILE.contains(&format!("\n            - {}\n", code.as_str())),
            "code {} is documented",
            code.as_str()
        );
        if code.status() != 405 {
            assert!(
                FILE.contains(&format!("'{}'", code.status())),
                "status {} is documented",
                code.status()
            );
        }
    }
    for operation in ["listPets", "createPet", "getPet"] {
        assert!(FILE.contains(&format!("operationId: {operation}\n")));
    }
    assert!(FILE.contains("\n  /pets:\n") && FILE.contains("\n  /pets/{petId}:\n"));
    let get_pet = &FILE[FILE.find("operationId: getPet").unwrap()..];
    assert!(get_pet[..200].contains("deprecated: true"));
    for header in [
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "RateLimit-Policy",
        "RateLimit",
        "X-Request-Id",
        "Retry-After",
        "Deprecation",
        "Sunset",
        "WWW-Authenticate",
        "Location",
        "Link",
        "Idempotent-Replayed",
    ] {
        assert!(
            FILE.contains(&format!("{header}:")),
            "header {header} is documented"
        );
    }
}
