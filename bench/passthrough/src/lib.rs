//! `passthrough LISTEN UPSTREAM [--kept-upstreams]`: pingora 0.9 forwarding every request to one
//! upstream, with nothing else, one worker thread, mimalloc, and the workspace's release
//! profile. The benchmark (`bench/run.sh`) measures the gateway against it: what is left is the
//! gateway's own cost (keys, limits, headers, routing, metrics). Bare, it leaves idle upstream
//! connections to pingora's pool; with `--kept-upstreams` each thread keeps them, as the gateway
//! does (`vendor/README.md`), so that the difference is the gateway's features alone.
//!
//! Built as the gateway is: the proxy in a library, the allocator (`#[global_allocator]`) in the
//! binary (`main.rs`). The compiler builds each request's state machine straight into its box
//! only where the proxy is compiled apart from the allocator (`vendor/README.md`,
//! pingora-proxy), so a pass-through compiled in one crate with it would copy 13.5 KB a request
//! that the gateway does not.

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use pingora_proxy::{ProxyHttp, Session};

/// The one upstream every request goes to.
struct PassThrough(std::net::SocketAddr);

#[async_trait]
impl ProxyHttp for PassThrough {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.0, false, String::new())))
    }
}

/// Runs the pass-through with the command line's `LISTEN UPSTREAM`.
pub fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: passthrough LISTEN UPSTREAM [--kept-upstreams]");
        std::process::exit(2);
    };
    let kept = args.next().is_some_and(|a| a == "--kept-upstreams");
    let upstream = upstream
        .parse()
        .expect("UPSTREAM is an address like 127.0.0.1:8081");
    let conf = ServerConf {
        threads: 1,
        // Driven as the gateway is: single-threaded runtimes, no work stealing.
        work_stealing: false,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora_proxy::http_proxy_service(&server.configuration, PassThrough(upstream));
    if kept {
        proxy.app_logic_mut().unwrap().kept_upstreams =
            Some(server.configuration.upstream_keepalive_pool_size);
    }
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
