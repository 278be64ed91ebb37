//! A second service for the platform guide (README, "Adding a service"): the store's orders, a
//! few lines of warp. Run one instance per address given:
//!
//! ```sh
//! cargo run --release --example orders -- 127.0.0.1:9101 127.0.0.1:9102
//! ```
//!
//! It trusts the gateway in front of it: the caller is named by `X-Api-Key-Id`, which the
//! gateway sets (and a client cannot forge), and it answers which instance served the request.

use std::net::SocketAddr;

use warp::Filter;

#[tokio::main]
async fn main() {
    let addrs: Vec<SocketAddr> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("addresses like 127.0.0.1:9101"))
        .collect();
    assert!(!addrs.is_empty(), "usage: orders ADDR [ADDR ...]");
    let servers: Vec<_> = addrs
        .into_iter()
        .map(|addr| {
            let instance = addr.to_string();
            let caller = warp::header::optional::<String>("x-api-key-id");
            let one = warp::path!("v1" / "store" / "orders" / u64)
                .and(warp::get())
                .and(caller)
                .map({
                    let instance = instance.clone();
                    move |id: u64, key: Option<String>| {
                        warp::reply::json(&serde_json::json!({
                            "id": id, "status": "placed", "key_id": key, "instance": instance,
                        }))
                    }
                });
            let all = warp::path!("v1" / "store" / "orders")
                .and(warp::get())
                .map(move || {
                    warp::reply::json(&serde_json::json!([{"id": 1, "status": "placed"}]))
                });
            println!("orders instance listening on http://{addr}");
            tokio::spawn(async move {
                let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
                warp::serve(one.or(all)).incoming(listener).run().await;
            })
        })
        .collect();
    for server in servers {
        server.await.expect("an orders instance stopped");
    }
}
