//! The API's pages in a real browser: `animal-store serve` on loopback, headless Chromium
//! (Debian's `chromium`) rendering `/v1/docs` with no network but the gateway, and a page of
//! another origin calling the API with `fetch` under CORS. Checks the rendered DOM, not the
//! HTML source, and leaves a screenshot of the docs page in `target/docs-page.png`. And, over
//! plain HTTP, how the page's script goes out: compressed or whole, and revalidated.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{PETS_ROUTE, Stack, client, links, shipped_config};

const INSTALL: &str = "Chromium is needed for this test: apt-get install -y chromium";

/// Headless Chromium with the flags this sandbox needs, its profile in `profile`.
fn chromium(profile: &Path, args: &[&str], url: &str) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run chromium: {e}. {INSTALL}"));
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dom(dir: &Path, url: &str) -> String {
    let profile = tempfile::tempdir_in(dir).unwrap();
    chromium(profile.path(), &["--dump-dom"], url)
}

#[test]
fn the_docs_page_renders_every_operation_offline_and_marks_get_pet_deprecated() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let docs = stack.url("/v1/docs");
    // Each operation's own view on the page, as its summary reads in the OpenAPI description.
    for (anchor, summary) in [
        ("#/pets/listpets", "List animals"),
        ("#/pets/createpet", "Add an animal"),
        ("#/pets/getpet", "Get an animal (deprecated)"),
        ("#/limits/getratelimit", "Read your key&#39;s limits"),
    ] {
        let rendered = dom(dir.path(), &format!("{docs}{anchor}"));
        let shown = rendered.contains(summary) || rendered.contains(&summary.replace("&#39;", "'"));
        assert!(shown, "{summary} is not on the rendered page at {anchor}");
        if anchor == "#/pets/listpets" {
            // The example requests go to the gateway that served the page (the description's
            // first server is relative), not to the default address of a local deployment.
            let own = stack.url("/v1/pets");
            assert!(rendered.contains(&own), "the example request goes to {own}");
        }
        if anchor == "#/pets/getpet" {
            assert!(
                rendered.contains("Deprecated"),
                "getPet shows as deprecated"
            );
            for header in ["Deprecation", "Sunset", "X-RateLimit-Remaining"] {
                assert!(
                    rendered.contains(header),
                    "{header} is documented on getPet"
                );
            }
        }
    }
    // The browser asked for nothing but the pages: no 401 for an icon, which would spend the
    // visitor's failed-auth budget on each visit.
    let (_, _, metrics) = common::raw_http(
        stack.admin,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let others: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("gateway_responses_total{") && !l.contains("route=\"pages\""))
        .collect();
    assert!(others.is_empty(), "the browser asked for more: {others:?}");
    let shot: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../docs-page.png");
    let profile = tempfile::tempdir_in(dir.path()).unwrap();
    chromium(
        profile.path(),
        &[
            "--window-size=1280,1400",
            &format!("--screenshot={}", shot.display()),
        ],
        &docs,
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot in {}",
        shot.display()
    );
}

#[tokio::test]
async fn the_deprecation_link_points_at_get_pet_on_the_docs_page() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), &shipped_config());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = stack.get(&c, "/v1/pets/1", &key).await;
    let got = links(&r);
    // Relative, so it resolves against the URL the client used, on either listener.
    let link = "</v1/docs#/pets/getpet>; rel=\"deprecation\"";
    assert!(got.contains(&link), "{got:?}");
    let docs = c.get(stack.url("/v1/docs")).send().await.unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("<html"));
    // Typed with a trailing slash, the page is a redirect away, not a 401 asking for a key.
    let r = c.get(stack.url("/v1/docs/")).send().await.unwrap();
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/v1/docs");
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    let followed = reqwest::get(stack.url("/v1/docs/")).await.unwrap();
    assert_eq!(followed.status(), 200);
    assert!(followed.text().await.unwrap().contains("<redoc"));

    // With the address clients use configured, the link is absolute on it.
    let other = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(shipped_config()).unwrap().replace(
        "# public_url = \"https://api.example.com\"",
        "public_url = \"https://api.example.com/\"",
    );
    let config_path = other.path().join("public-url.toml");
    std::fs::write(&config_path, config).unwrap();
    let stack = Stack::start_with(other.path(), &config_path);
    let key = stack.key(&["--plan", "pro"]);
    let r = stack.get(&c, "/v1/pets/1", &key).await;
    let got = links(&r);
    let link = "<https://api.example.com/v1/docs#/pets/getpet>; rel=\"deprecation\"";
    assert!(got.contains(&link), "{got:?}");
}

/// The page's 2.3 MB script goes out compressed to a client that takes gzip, as browsers do
/// (the page test above renders it so in Chromium), whole to any other, and a client's copy is
/// revalidated by its tag with a `304` and no body, over the public listener's usual headers.
#[tokio::test]
async fn the_script_is_sent_compressed_to_clients_that_take_gzip_and_revalidated_by_its_tag() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), &shipped_config());
    let c = client();
    let get = |accept: Option<&str>, tag: Option<&str>| {
        let mut request = c.get(stack.url(animal_store_contract::REDOC_PATH));
        if let Some(accept) = accept {
            request = request.header("Accept-Encoding", accept);
        }
        if let Some(tag) = tag {
            request = request.header("If-None-Match", tag);
        }
        request.send()
    };

    let plain = get(None, None).await.unwrap();
    assert_eq!(plain.status(), 200);
    assert_eq!(plain.headers()["vary"], "Accept-Encoding");
    assert!(plain.headers().get("content-encoding").is_none());
    let plain_tag = plain.headers()["etag"].to_str().unwrap().to_owned();
    let script = plain.bytes().await.unwrap();
    assert!(script == animal_store_contract::REDOC_JS);

    let gzip = get(Some("gzip, deflate, br"), None).await.unwrap();
    assert_eq!(gzip.status(), 200);
    assert_eq!(gzip.headers()["content-encoding"], "gzip");
    assert_eq!(gzip.headers()["vary"], "Accept-Encoding");
    assert_eq!(gzip.headers()["cache-control"], "public, max-age=86400");
    assert!(gzip.headers().get("x-ratelimit-limit").is_some());
    let gzip_tag = gzip.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(gzip_tag, plain_tag, "each form has its own tag");
    let compressed = gzip.bytes().await.unwrap();
    assert!(
        compressed.len() * 3 < script.len(),
        "{} bytes",
        compressed.len()
    );
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert!(unzipped == script, "the same script");
    let refused = get(Some("gzip;q=0, br"), None).await.unwrap();
    assert!(refused.headers().get("content-encoding").is_none());

    for (accept, tag) in [(None, &plain_tag), (Some("gzip"), &gzip_tag)] {
        let current = get(accept, Some(tag)).await.unwrap();
        assert_eq!(current.status(), 304, "{accept:?}");
        assert_eq!(&current.headers()["etag"], tag.as_str());
        assert_eq!(current.headers()["cache-control"], "public, max-age=86400");
        assert!(current.headers().get("content-length").is_none());
        assert!(current.bytes().await.unwrap().is_empty());
    }
    let stale = get(Some("gzip"), Some("\"0-0\"")).await.unwrap();
    assert_eq!(stale.status(), 200, "an old copy gets the script");
    let other_form = get(Some("gzip"), Some(&plain_tag)).await.unwrap();
    assert_eq!(
        other_form.status(),
        200,
        "the other form's tag is not this one's"
    );
}

/// The OpenAPI description and the page are kept by clients but asked for each time
/// (`no-cache`), and a copy that is current gets a `304` without a body; a copy of another
/// page's, or none, gets the page.
#[tokio::test]
async fn the_description_and_the_page_are_revalidated_by_their_tags() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), &shipped_config());
    let c = client();
    let mut tags = Vec::new();
    for (path, content) in [
        (
            animal_store_contract::OPENAPI_PATH,
            animal_store_contract::OPENAPI_YAML,
        ),
        (
            animal_store_contract::DOCS_PATH,
            animal_store_contract::DOCS_HTML,
        ),
    ] {
        let first = c.get(stack.url(path)).send().await.unwrap();
        assert_eq!(first.status(), 200, "{path}");
        assert_eq!(first.headers()["cache-control"], "no-cache", "{path}");
        assert!(first.headers().get("vary").is_none(), "{path}: one form");
        let tag = first.headers()["etag"].to_str().unwrap().to_owned();
        assert_eq!(first.text().await.unwrap(), content, "{path}");
        let again = c
            .get(stack.url(path))
            .header("If-None-Match", &tag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{path}");
        assert_eq!(again.headers()["etag"], tag.as_str(), "{path}");
        assert!(again.headers().get("x-ratelimit-limit").is_some(), "{path}");
        assert!(again.bytes().await.unwrap().is_empty(), "{path}");
        tags.push(tag);
    }
    assert_ne!(tags[0], tags[1]);
    let crossed = c
        .get(stack.url(animal_store_contract::DOCS_PATH))
        .header("If-None-Match", &tags[0])
        .send()
        .await
        .unwrap();
    assert_eq!(
        crossed.status(),
        200,
        "the description's tag is not the page's"
    );
}

/// A page served on `listener` (its own origin) that calls the gateway with `fetch` and writes
/// what it could read of the answer into the DOM; returns the page's URL.
async fn page_server(
    listener: std::net::TcpListener,
    gateway: std::net::SocketAddr,
    key: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let addr = listener.local_addr().unwrap();
    let html = format!(
        r#"<!doctype html><html><body><p id="result">pending</p><script>
fetch("http://{gateway}/v1/pets", {{headers: {{"Authorization": "Bearer {key}"}}}})
  .then(r => {{ document.getElementById("result").textContent = "remaining=" + r.headers.get("X-RateLimit-Remaining"); }})
  .catch(e => {{ document.getElementById("result").textContent = "refused:" + e.name; }});
</script></body></html>"#
    );
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let html = html.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = s.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_of_an_allowed_origin_reads_its_limits_and_another_origin_cannot() {
    let dir = tempfile::tempdir().unwrap();
    // The allowed page's address must be known before the gateway starts: its listener is
    // bound first and kept (a port let go of and bound again could be taken in between, as by
    // a connection's local port).
    let allowed_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed_port = allowed_listener.local_addr().unwrap().port();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "[gateway.cors]\nallowed_origins = [\"http://127.0.0.1:{allowed_port}\"]\n{PETS_ROUTE}"
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let allowed = page_server(allowed_listener, stack.listen, &key).await;
    let other_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = page_server(other_listener, stack.listen, &key).await;
    let dir_path = dir.path().to_owned();
    let (allowed_dom, other_dom) =
        tokio::task::spawn_blocking(move || (dom(&dir_path, &allowed), dom(&dir_path, &other)))
            .await
            .unwrap();
    assert!(
        allowed_dom.contains("<p id=\"result\">remaining=299</p>"),
        "the allowed origin's page read X-RateLimit-Remaining: {allowed_dom}"
    );
    assert!(
        other_dom.contains("<p id=\"result\">refused:TypeError</p>"),
        "the other origin's page was refused: {other_dom}"
    );
}
