//! The gateway's background services, beside the proxy: the embedded store's snapshots and the
//! health checks of upstream pools.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::routes;
use crate::settings::Settings;
use crate::store::LimitStore;

/// How often the embedded store's snapshot is written: at most this much of the counts is lost
/// to a SIGKILL.
const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// Writes the embedded store's snapshot every [`SNAPSHOT_INTERVAL`].
pub(crate) struct Snapshots(pub(crate) Arc<LimitStore>);

#[async_trait]
impl BackgroundService for Snapshots {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if !matches!(*self.0, LimitStore::Embedded(_)) {
            return;
        }
        let mut tick = tokio::time::interval(SNAPSHOT_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    let store = self.0.clone();
                    // File I/O off the runtime's threads.
                    let _ = tokio::task::spawn_blocking(move || store.persist()).await;
                }
            }
        }
    }
}

/// How often the health loop looks at the interval in force, so a reload's new
/// `health_check_interval_ms` applies without waiting out the old one.
const HEALTH_CHECK_POLL: Duration = Duration::from_millis(100);

/// Health-checks the instances of every route's pool in the configuration in force (a reload
/// brings new pools, checked from the next round), every `health_check_interval_ms`, and
/// publishes which instances are in the rotation in `/metrics`.
pub(crate) struct UpstreamHealth(pub(crate) Arc<ArcSwap<Settings>>);

#[async_trait]
impl BackgroundService for UpstreamHealth {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let round = Instant::now();
            let settings = self.0.load_full();
            for route in settings.routes.iter() {
                if let routes::Upstream::Pool(pool) = &route.upstream {
                    pool.check().await;
                    route.publish_rotation();
                }
            }
            drop(settings);
            while round.elapsed() < self.0.load().health_check_every {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(HEALTH_CHECK_POLL) => {}
                }
            }
        }
    }
}
