//! Connections to Redis, a single server or a cluster, told apart by asking the server.
//!
//! `gateway.redis.url` (or `--redis-url`) is one `redis://host:port[/db]` URL or a
//! comma-separated list of seed nodes; `rediss://` speaks TLS, verifying Redis's certificate
//! against the system's roots or `gateway.redis.ca`. The first node that answers says whether it
//! runs in cluster mode (`INFO cluster`); the gateway then opens either one multiplexed
//! connection that reconnects by itself (`ConnectionManager`) or a cluster connection that
//! follows slot moves.
//! Both pipeline every request of every thread over few sockets, which is what a pool is for.
//!
//! Limit decisions, one per request, go over a connection of the proxy thread's own
//! ([`RedisHub::local_conn`]): a connection's I/O runs as a task of the runtime that made it, and
//! a command sent from another thread costs two thread switches (out and back), about a quarter
//! of a request's CPU time on a busy core.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use once_cell::sync::OnceCell;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

/// Why Redis could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The URL list is malformed.
    #[error("redis url `{url}`: {message}")]
    Url {
        /// The URL at fault (never carries a password: see [`redact`]).
        url: String,
        /// What is wrong.
        message: String,
    },
    /// No node answered in time, or a command failed.
    #[error("redis: {0}")]
    Command(String),
    /// A command took longer than the configured timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
}

impl From<redis::RedisError> for RedisError {
    fn from(e: redis::RedisError) -> Self {
        RedisError::Command(e.to_string())
    }
}

/// Where Redis is: the seed URLs, and the CA certificates (PEM) that sign its certificate when
/// they are `rediss://`, if not the system's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// `redis://` or `rediss://` URLs, one or several seed nodes.
    pub urls: Vec<String>,
    /// PEM CA certificates for `rediss://` URLs; `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
}

impl RedisTarget {
    /// Seed URLs whose certificates, if they speak TLS, the system's roots verify.
    pub fn new(urls: Vec<String>) -> RedisTarget {
        RedisTarget { urls, ca: None }
    }

    /// The certificates a TLS connection to `url` verifies Redis against: `None` for the
    /// system's roots (or no TLS).
    fn certs(&self, url: &str) -> Option<TlsCertificates> {
        let ca = self.ca.as_ref().filter(|_| url.starts_with("rediss://"))?;
        Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        })
    }
}

/// The seed URLs of `--redis-url`: one or several, comma-separated, each checked.
pub fn parse_urls(text: &str) -> Result<Vec<String>, RedisError> {
    let urls: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(RedisError::Url {
            url: String::new(),
            message: "no URL given".to_owned(),
        });
    }
    for url in &urls {
        redis::Client::open(url.as_str()).map_err(|e| RedisError::Url {
            url: redact(url),
            message: format!("{e} (expected redis://host:port[/db])"),
        })?;
    }
    Ok(urls)
}

/// Where `url`'s user information (`USER:PASSWORD` of `redis://USER:PASSWORD@host`) stands.
fn user_info(url: &str) -> Option<std::ops::Range<usize>> {
    let start = url.find("://")? + 3;
    let end = url.rfind('@').filter(|&at| at >= start)?;
    Some(start..end)
}

/// The URL without a password, for logs and errors.
pub fn redact(url: &str) -> String {
    match user_info(url) {
        Some(span) => format!("{}***{}", &url[..span.start], &url[span.end..]),
        None => url.to_owned(),
    }
}

/// Whether `urls` (one URL, or a comma-separated list of seeds) carries a password.
pub fn has_password(urls: &str) -> bool {
    urls.split(',').any(|url| {
        user_info(url).is_some_and(|span| {
            url[span]
                .split_once(':')
                .is_some_and(|(_, pw)| !pw.is_empty())
        })
    })
}

/// A connection to a single Redis or to a cluster. Cloning is cheap and shares the sockets.
#[derive(Clone)]
pub enum RedisConn {
    /// One server (or a primary), reconnecting by itself.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Connects to the first seed of `target` that answers within `timeout` and detects a
    /// cluster.
    pub async fn connect(target: &RedisTarget, timeout: Duration) -> Result<RedisConn, RedisError> {
        let mut last = None;
        for url in &target.urls {
            match within(timeout, Self::connect_one(target, url, timeout)).await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| RedisError::Command("no URL given".to_owned())))
    }

    async fn connect_one(
        target: &RedisTarget,
        url: &str,
        timeout: Duration,
    ) -> Result<RedisConn, RedisError> {
        let certs = target.certs(url);
        let client = match certs.clone() {
            Some(certs) => redis::Client::build_with_tls(url, certs)?,
            None => redis::Client::open(url)?,
        };
        let mut probe = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe)
            .await?;
        if info.contains("cluster_enabled:1") {
            let mut builder = ClusterClient::builder(target.urls.clone())
                .connection_timeout(timeout)
                .response_timeout(CALLER_BOUNDS_COMMANDS)
                .retries(1);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let cluster = builder.build()?;
            return Ok(RedisConn::Cluster(cluster.get_async_connection().await?));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // Commands are bounded by their caller (`within`), e.g. by `gateway.redis.timeout_ms`:
            // a timeout here too would cut a longer configured one short.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        Ok(RedisConn::Single(
            ConnectionManager::new_with_config(client, config).await?,
        ))
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }
}

/// Time allowed to reach Redis when connecting (at start, and again while it is away).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A cluster connection's own response timeout, which it must have: long, because every
/// command is bounded by its caller (`within`), e.g. by `gateway.redis.timeout_ms`.
const CALLER_BOUNDS_COMMANDS: Duration = Duration::from_secs(60);

/// One process's way to Redis: the seed URLs, the connection once made, and a small runtime of
/// its own on which the connection's I/O tasks run. Connections must outlive whichever service
/// first used them (pingora gives each service its own runtime), and the command line, which
/// has no runtime, borrows this one.
pub struct RedisHub {
    target: RedisTarget,
    /// Always `Some` until dropped; see the `Drop` impl.
    runtime: Option<tokio::runtime::Runtime>,
    conn: OnceCell<RedisConn>,
    /// Tells this hub's thread-local connections apart from another hub's.
    id: u64,
    /// Thread-local connections made before the last [`RedisHub::forget_local_conns`] are not
    /// used again.
    generation: AtomicU64,
    /// Dropped with the hub, so threads can let go of connections no hub will use again.
    alive: Arc<()>,
}

/// Source of [`RedisHub`] ids.
static NEXT_HUB: AtomicU64 = AtomicU64::new(0);

/// A thread's own connection to one hub's Redis, made in the background.
struct LocalConn {
    hub: u64,
    generation: u64,
    hub_alive: Weak<()>,
    conn: Arc<OnceCell<RedisConn>>,
    started: Instant,
}

thread_local! {
    static LOCAL_CONNS: RefCell<Vec<LocalConn>> = const { RefCell::new(Vec::new()) };
}

impl Drop for RedisHub {
    /// The last holder may be a task of another runtime, where a blocking shutdown panics.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RedisHub {
    /// A hub for `target`; tries to connect now, for at most [`CONNECT_TIMEOUT`], and returns
    /// either way (see [`RedisHub::conn`]).
    pub fn start(target: RedisTarget) -> Result<Arc<RedisHub>, RedisError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redis-io")
            .enable_all()
            .build()
            .map_err(|e| RedisError::Command(format!("cannot start its runtime: {e}")))?;
        let hub = Arc::new(RedisHub {
            target,
            runtime: Some(runtime),
            conn: OnceCell::new(),
            id: NEXT_HUB.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            alive: Arc::new(()),
        });
        if let Err(e) = hub.block_on(hub.connect()) {
            log::warn!("redis: cannot reach {} yet: {e}", hub.describe());
        }
        Ok(hub)
    }

    /// The connection, if one was ever made (it reconnects by itself afterwards).
    pub fn conn(&self) -> Option<RedisConn> {
        self.conn.get().cloned()
    }

    /// The connection for a command sent from this thread: the thread's own, made on the runtime
    /// it is running, once that exists; the shared one until then, or where no runtime runs.
    /// Only once the shared connection exists (so Redis has answered, and a thread does not
    /// start connecting to a Redis that is away).
    pub fn local_conn(&self) -> Option<RedisConn> {
        let shared = self.conn.get()?;
        let generation = self.generation.load(Ordering::Acquire);
        let local = LOCAL_CONNS.with(|conns| {
            let mut conns = conns.borrow_mut();
            let current = |c: &LocalConn| c.hub == self.id && c.generation == generation;
            if let Some(local) = conns.iter().find(|c| current(c)) {
                if let Some(conn) = local.conn.get() {
                    return Some(conn.clone());
                }
                if local.started.elapsed() < 2 * CONNECT_TIMEOUT {
                    return None; // still connecting
                }
            }
            // None yet, the last attempt failed, or Redis failed since: start one (at most one
            // per thread at a time).
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            conns.retain(|c| c.hub != self.id && c.hub_alive.strong_count() > 0);
            let conn = Arc::new(OnceCell::new());
            conns.push(LocalConn {
                hub: self.id,
                generation,
                hub_alive: Arc::downgrade(&self.alive),
                conn: conn.clone(),
                started: Instant::now(),
            });
            let target = self.target.clone();
            runtime.spawn(async move {
                match RedisConn::connect(&target, CONNECT_TIMEOUT).await {
                    Ok(made) => drop(conn.set(made)),
                    Err(e) => log::debug!("redis: a thread's own connection failed: {e}"),
                }
            });
            None
        });
        Some(local.unwrap_or_else(|| shared.clone()))
    }

    /// Retires every thread's own connection (after Redis failed): each thread makes a new one
    /// at its next command. A connection no command used while Redis was away still holds the
    /// old socket, and would fail the first command after Redis's return.
    pub fn forget_local_conns(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Connects if no connection was made yet; the connection is made once per process.
    pub async fn connect(&self) -> Result<RedisConn, RedisError> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn.clone());
        }
        let conn = RedisConn::connect(&self.target, CONNECT_TIMEOUT).await?;
        let kind = if conn.is_cluster() {
            "cluster"
        } else {
            "server"
        };
        log::info!("redis: connected to the {kind} at {}", self.describe());
        Ok(self.conn.get_or_init(|| conn).clone())
    }

    /// Runs `future` to completion on the hub's runtime (for callers without one).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime().block_on(future)
    }

    /// Runs `future` in the background on the hub's runtime.
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.runtime().spawn(future);
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("present until dropped")
    }

    /// The seed URLs, without passwords.
    pub fn describe(&self) -> String {
        self.target
            .urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Runs `future`, failing with [`RedisError::Timeout`] after `timeout`.
pub async fn within<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    tokio::time::timeout(timeout, future)
        .await
        .map_err(|_| RedisError::Timeout(timeout))?
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_checked_and_redacted() {
        assert_eq!(
            parse_urls("redis://127.0.0.1:7000, redis://127.0.0.1:7001").unwrap(),
            vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        assert!(parse_urls(" , ").is_err());
        let err = parse_urls("http://:secret@host:1").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
        assert_eq!(redact("redis://user:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn a_password_is_found_in_any_seed_and_only_there() {
        assert!(has_password("redis://:secret@h:6379"));
        assert!(has_password("rediss://user:secret@h:6380/0"));
        assert!(has_password("redis://h:7000, redis://:secret@h:7001"));
        assert!(!has_password("redis://h:6379"));
        assert!(!has_password("redis://user@h:6379"));
        assert!(!has_password("redis://:@h:6379"));
        assert!(!has_password("user:secret@h:6379"));
        assert!(!has_password("not a url"));
    }
}
