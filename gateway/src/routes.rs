//! Routes: which upstream serves a path, decided on exactly the path that is forwarded.
//!
//! [`normalize_path`] first turns the request path into one unambiguous form or refuses it:
//! percent-encoded unreserved characters are decoded (`%70ets` is `pets`), and anything that
//! different servers could read differently (dot-segments, encoded `/` or `\`, NUL, empty
//! segments, broken escapes) is refused. Routing, limits, deprecation and forwarding then all
//! use that one form.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::lb::health_check::{HealthCheck, TcpHealthCheck};
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, LoadBalancer};

use crate::deprecation::Deprecation;

mod path;

pub use path::{PathError, normalize_path};

/// Where a route's requests go.
#[derive(Debug, Clone)]
pub struct Route {
    /// Path prefix under `/v1`, matched at segment boundaries.
    pub prefix: String,
    /// Where requests go: one address, or a pool of instances.
    pub upstream: Upstream,
    /// How long the upstream may take to answer before the client gets 504.
    pub timeout: Duration,
    /// Deprecated operations within the route.
    pub deprecations: Vec<Arc<Deprecation>>,
    /// TLS to the upstream, if the route asks for it.
    pub tls: Option<UpstreamTls>,
    /// Which browser origins may call this route (its own, or `[gateway.cors]`).
    pub cors: Option<Arc<crate::cors::CorsPolicy>>,
    /// The route's series of `gateway_upstream_duration_seconds`, looked up once.
    pub upstream_duration: prometheus::Histogram,
}

/// A route's upstream.
#[derive(Clone)]
pub enum Upstream {
    /// One address.
    One(SocketAddr),
    /// Several instances, balanced round-robin, with active and passive health checks.
    Pool(Arc<Pool>),
}

impl Upstream {
    /// The instances, as configured.
    pub fn instances(&self) -> Vec<SocketAddr> {
        match self {
            Upstream::One(addr) => vec![*addr],
            Upstream::Pool(pool) => pool.failures.at.iter().map(|(addr, _)| *addr).collect(),
        }
    }

    /// How many instances take traffic now (a single address always counts as one).
    pub fn healthy(&self) -> usize {
        match self {
            Upstream::One(_) => 1,
            Upstream::Pool(pool) => pool.rotation().iter().filter(|(_, takes)| *takes).count(),
        }
    }

    /// The instance for the next request, skipping `avoid` (one the gateway just could not
    /// connect to); instances out of the rotation only when none in it is left.
    pub fn pick(&self, avoid: Option<SocketAddr>) -> Option<SocketAddr> {
        match self {
            Upstream::One(addr) => Some(*addr),
            Upstream::Pool(pool) => {
                let other = |b: &Backend| b.addr.as_inet().copied() != avoid;
                let lb = &pool.lb;
                lb.select_with(b"", 256, |b, healthy| {
                    healthy && other(b) && !pool.failures.failed_since_check(b)
                })
                .or_else(|| lb.select_with(b"", 256, |b, _| other(b)))
                .and_then(|b| b.addr.as_inet().copied())
            }
        }
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.instances()).finish()
    }
}

/// A pool's instances, balanced round-robin (`pingora-load-balancing`). An instance is in the
/// rotation while it passes its active health check (a TCP connect) and no connection to it has
/// failed since the last check that passed (passive health, nginx's `max_fails=1`): one failed
/// connection takes it out at once instead of at the next check.
pub struct Pool {
    lb: LoadBalancer<RoundRobin>,
    failures: Arc<Failures>,
}

impl Pool {
    /// A pool of `instances`, each checked by connecting within `check_timeout`.
    pub fn new(instances: &[SocketAddr], check_timeout: Duration) -> std::io::Result<Pool> {
        let mut lb = LoadBalancer::<RoundRobin>::try_from_iter(instances)?;
        // In address order, as the balancer keeps them, so a reload that lists the same
        // instances in another order keeps the running pool.
        let mut sorted = instances.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let failures = Arc::new(Failures {
            epoch: Instant::now(),
            at: sorted.into_iter().map(|a| (a, AtomicU64::new(0))).collect(),
        });
        let mut tcp = TcpHealthCheck::new();
        tcp.peer_template.options.connection_timeout = Some(check_timeout);
        lb.set_health_check(Box::new(PassiveAware {
            tcp,
            failures: Arc::clone(&failures),
        }));
        Ok(Pool { lb, failures })
    }

    /// Runs one round of health checks, all instances at once.
    pub async fn check(&self) {
        self.lb.backends().run_health_check(true).await;
    }

    /// Takes `instance` out of the rotation until a health check started after now passes.
    pub fn connection_failed(&self, instance: SocketAddr) {
        if let Some((_, at)) = self.failures.at.iter().find(|(a, _)| *a == instance) {
            at.store(self.failures.now(), Relaxed);
        }
    }

    /// Each instance, and whether it is in the rotation.
    pub fn rotation(&self) -> Vec<(SocketAddr, bool)> {
        self.lb
            .backends()
            .get_backend()
            .iter()
            .filter_map(|b| Some((*b.addr.as_inet()?, self.takes_traffic(b))))
            .collect()
    }

    fn takes_traffic(&self, backend: &Backend) -> bool {
        self.lb.backends().ready(backend) && !self.failures.failed_since_check(backend)
    }
}

/// When a connection to each instance last failed, unless a health check has passed since.
struct Failures {
    epoch: Instant,
    /// Per instance: nanoseconds after `epoch`, plus one, of the last failure; 0: none since
    /// the last passing check.
    at: Vec<(SocketAddr, AtomicU64)>,
}

impl Failures {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn slot(&self, backend: &Backend) -> Option<&AtomicU64> {
        let addr = backend.addr.as_inet()?;
        self.at.iter().find(|(a, _)| a == addr).map(|(_, at)| at)
    }

    /// Whether a connection to `backend` has failed since its last passing check.
    fn failed_since_check(&self, backend: &Backend) -> bool {
        self.slot(backend).is_some_and(|at| at.load(Relaxed) != 0)
    }
}

/// pingora's TCP health check, which also puts an instance taken out by a failed connection
/// back once a check that started after that failure passes.
struct PassiveAware {
    tcp: Box<TcpHealthCheck>,
    failures: Arc<Failures>,
}

#[async_trait]
impl HealthCheck for PassiveAware {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let started = self.failures.now();
        self.tcp.check(target).await?;
        if let Some(at) = self.failures.slot(target) {
            // A failure after this check began stays: the check may have raced it.
            let _ = at.fetch_update(Relaxed, Relaxed, |failed| (failed < started).then_some(0));
        }
        Ok(())
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.tcp.health_threshold(success)
    }
}

/// How the gateway speaks TLS to a route's upstream.
#[derive(Clone)]
pub struct UpstreamTls {
    /// The name sent as SNI and verified against the upstream's certificate.
    pub sni: String,
    /// The CA certificates to verify it with; `None`: the system's roots.
    pub ca: Option<Arc<pingora::protocols::tls::CaType>>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("sni", &self.sni)
            .field("ca", &self.ca.as_ref().map(|ca| ca.len()))
            .finish()
    }
}

impl Route {
    /// Sets `gateway_upstream_healthy` for each instance of this route's pool.
    pub fn publish_rotation(&self) {
        if let Upstream::Pool(pool) = &self.upstream {
            for (instance, in_rotation) in pool.rotation() {
                crate::metrics::UPSTREAM_HEALTHY
                    .with_label_values(&[self.prefix.as_str(), &instance.to_string()])
                    .set(i64::from(in_rotation));
            }
        }
    }

    /// Whether `path` (normalized) falls under this route.
    pub fn matches(&self, path: &str) -> bool {
        path.strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// The deprecation that applies to `method` on `path`, if any.
    pub fn deprecation(&self, method: &str, path: &str) -> Option<&Arc<Deprecation>> {
        self.deprecations.iter().find(|d| d.applies(method, path))
    }
}

/// The route table: the longest matching prefix wins.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    routes: Vec<Arc<Route>>,
}

impl Routes {
    /// A table of `routes`, in any order.
    pub fn new(mut routes: Vec<Route>) -> Routes {
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Routes {
            routes: routes.into_iter().map(Arc::new).collect(),
        }
    }

    /// This table with the running pools of `old` in place of new pools of the same instances,
    /// so a reload keeps what the health checks learned (an instance found down stays down).
    pub fn keeping_pools_of(&self, old: &Routes) -> Routes {
        let routes = self
            .routes
            .iter()
            .map(|route| {
                let mut route = Route::clone(route);
                if let Upstream::Pool(_) = &route.upstream {
                    let instances = route.upstream.instances();
                    let running = old.routes.iter().find(|r| {
                        matches!(r.upstream, Upstream::Pool(_))
                            && r.upstream.instances() == instances
                    });
                    if let Some(running) = running {
                        route.upstream = running.upstream.clone();
                    }
                }
                route
            })
            .collect();
        Routes::new(routes)
    }

    /// Every route.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }

    /// The route for a normalized path.
    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.matches(path))
    }
}

#[cfg(test)]
mod tests;
