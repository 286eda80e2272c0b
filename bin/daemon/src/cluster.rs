//! A daemon as one node among several over one PostgreSQL database
//! (docs/nodes.md). PostgreSQL decides; this module keeps the node's side
//! of it:
//!
//! - **Its lease**: a heartbeat every quarter lease. The lease is taken to
//!   run until the moment the heartbeat was *sent* plus its length, by
//!   this process's monotonic clock, minus a tenth for clocks that do not
//!   tick alike; another node can fence this one only once PostgreSQL's
//!   clock has seen no heartbeat for a whole lease, which is later.
//!   Tools start only within the lease ([`Ownership::may_act`]).
//! - **Stepping down**: a heartbeat that finds this node fenced (another
//!   took its conversations while it was paused or cut off) says so on
//!   [`Cluster::fenced`], and the daemon exits for its supervisor to start
//!   it again under a new epoch. Its store would refuse every write anyway.
//! - **Taking over**: every quarter lease, stale nodes are fenced and this
//!   node's share of their conversation trees (rendezvous hashing over the
//!   live nodes) is taken and recovered as a restart recovers.
//! - **Claims**: the runtime asks [`Ownership::claim`] before it starts a
//!   conversation; the claim is a row PostgreSQL gives one node only.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use keel_actors::core::ConversationId;
use keel_actors::ownership::Ownership;
use keel_actors::store::{self as keel_store, Nodes};
use keel_actors::Runtime;

use crate::config::NodeConfig;

/// How far inside its lease a node stops starting tools: clocks of two
/// machines do not tick exactly alike.
const MARGIN_DIVISOR: u32 = 10;

/// This node: its handle on the shared tables, its lease, and how it
/// reaches the others.
pub struct Cluster {
    nodes: Nodes,
    pub lease: Duration,
    /// Where the other nodes reach this one; set once the listener is
    /// bound.
    url: OnceLock<String>,
    /// When the lease, as last renewed, runs out by this process's clock.
    lease_until: Mutex<Instant>,
    /// Set once this node finds itself fenced: why.
    fenced: watch::Sender<Option<String>>,
    /// The runtime, once open: each renewal of the lease renews its tool
    /// spawner's too.
    runtime: OnceLock<Runtime>,
    /// Forwards requests to other nodes.
    pub http: reqwest::Client,
}

impl Cluster {
    /// `nodes` was opened just now (`started` is when its open began):
    /// the epoch's claim counts as the first heartbeat.
    pub fn new(
        nodes: Nodes,
        config: &NodeConfig,
        started: Instant,
    ) -> anyhow::Result<Arc<Cluster>> {
        // reqwest is built without a TLS provider of its own (Cargo.toml).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()?;
        let cluster = Arc::new(Cluster {
            nodes,
            lease: config.lease,
            url: OnceLock::new(),
            lease_until: Mutex::new(started + config.lease),
            fenced: watch::Sender::new(None),
            runtime: OnceLock::new(),
            http,
        });
        if let Some(url) = &config.url {
            let _ = cluster.url.set(url.clone());
        }
        Ok(cluster)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        self.nodes.node()
    }

    pub fn nodes(&self) -> &Nodes {
        &self.nodes
    }

    /// The runtime is open: from now on its tool spawner's lease is
    /// renewed with this node's.
    pub fn set_runtime(&self, runtime: Runtime) {
        let _ = self.runtime.set(runtime);
    }

    /// Where the others reach this node, unless `KEEL_NODE_URL` said.
    pub fn set_url(&self, url: String) {
        let _ = self.url.set(url);
    }

    pub fn url(&self) -> &str {
        self.url.get().map_or("", String::as_str)
    }

    /// Why this node was fenced, once it was: the daemon then exits.
    pub fn fenced(&self) -> watch::Receiver<Option<String>> {
        self.fenced.subscribe()
    }

    fn lease_current(&self) -> bool {
        let until = *self
            .lease_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let margin = self.lease / MARGIN_DIVISOR;
        Instant::now() + margin < until
    }

    fn step_down(&self, why: String) {
        metrics::gauge!(crate::telemetry::NODE_LEASE_CURRENT).set(0.0);
        tracing::error!(node = self.name(), %why, "this node was fenced off: stepping down");
        self.fenced.send_if_modified(|fenced| {
            if fenced.is_none() {
                *fenced = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Renew the lease now; steps down if fenced.
    pub async fn heartbeat(&self) {
        let sent = Instant::now();
        match self.nodes.heartbeat(self.url()).await {
            Ok(()) => {
                let until = sent + self.lease;
                *self
                    .lease_until
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
                metrics::gauge!(crate::telemetry::NODE_LEASE_CURRENT).set(1.0);
                if let Some(runtime) = self.runtime.get() {
                    // What is left of the lease, less the margin tools
                    // already keep (`lease_current`).
                    let left = until
                        .saturating_duration_since(Instant::now())
                        .saturating_sub(self.lease / MARGIN_DIVISOR);
                    runtime.renew_tool_lease(left).await;
                }
            }
            Err(error @ keel_store::Error::Fenced { .. }) => self.step_down(error.to_string()),
            Err(error) => {
                tracing::warn!(node = self.name(), %error, "heartbeat failed; the lease runs out unless the next one succeeds");
            }
        }
    }

    /// Fence stale nodes and take over this node's share of their trees,
    /// recovering them. Returns the roots taken.
    pub async fn take_over(&self, runtime: &Runtime) -> Vec<ConversationId> {
        match self.nodes.fence_stale(self.lease).await {
            Ok(fenced) => {
                metrics::counter!(crate::telemetry::NODE_FENCED_TOTAL)
                    .increment(u64::try_from(fenced.len()).unwrap_or(u64::MAX));
                for node in fenced {
                    tracing::warn!(node = %node, by = self.name(), "fenced a node not heard from within its lease");
                }
            }
            Err(error @ keel_store::Error::Fenced { .. }) => {
                self.step_down(error.to_string());
                return Vec::new();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot look for stale nodes");
                return Vec::new();
            }
        }
        let taken = match self.nodes.take_over(self.lease).await {
            Ok(taken) => taken,
            Err(error @ keel_store::Error::Fenced { .. }) => {
                self.step_down(error.to_string());
                return Vec::new();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot take over from fenced nodes");
                return Vec::new();
            }
        };
        let roots: Vec<ConversationId> = taken
            .into_iter()
            .filter_map(|root| ConversationId::new(root).ok())
            .collect();
        if roots.is_empty() {
            return roots;
        }
        metrics::counter!(crate::telemetry::NODE_TAKEOVERS_TOTAL)
            .increment(u64::try_from(roots.len()).unwrap_or(u64::MAX));
        tracing::warn!(
            node = self.name(),
            n = roots.len(),
            "took over conversations of a fenced node"
        );
        match runtime.recover_taken_over(&roots).await {
            Ok(report) => {
                tracing::info!(
                    recovered = report.recovered.len(),
                    cancelled = report.cancelled.len(),
                    failed = report.failed.len(),
                    "recovered what was taken over"
                );
                for (id, why) in &report.failed {
                    tracing::error!(conversation = %id, why, "could not recover after a takeover");
                }
            }
            Err(error) => tracing::error!(%error, "could not recover what was taken over"),
        }
        roots
    }

    /// Heartbeats every quarter lease until the daemon stops.
    pub fn spawn_heartbeats(self: &Arc<Cluster>, stopping: watch::Receiver<bool>) {
        self.every_quarter_lease(stopping, |cluster| async move {
            cluster.heartbeat().await;
        });
    }

    /// Takeovers every quarter lease until the daemon stops.
    pub fn spawn_takeovers(self: &Arc<Cluster>, runtime: Runtime, stopping: watch::Receiver<bool>) {
        self.every_quarter_lease(stopping, move |cluster| {
            let runtime = runtime.clone();
            async move {
                cluster.take_over(&runtime).await;
            }
        });
    }

    /// Run `work` at once and then every quarter lease (a late one waits
    /// its turn, none is skipped into a burst) until the daemon stops.
    fn every_quarter_lease<F, Work>(
        self: &Arc<Cluster>,
        mut stopping: watch::Receiver<bool>,
        work: F,
    ) where
        F: Fn(Arc<Cluster>) -> Work + Send + 'static,
        Work: std::future::Future<Output = ()> + Send,
    {
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(cluster.lease / 4);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = stopping.wait_for(|stopping| *stopping) => return,
                }
                work(Arc::clone(&cluster)).await;
            }
        });
    }
}

/// The runtime's question, answered from PostgreSQL.
pub struct NodeOwnership(pub Arc<Cluster>);

#[async_trait]
impl Ownership for NodeOwnership {
    async fn claim(&self, root: &ConversationId) -> Result<(), String> {
        let cluster = &self.0;
        if !cluster.lease_current() {
            return Err(format!(
                "node {} is not within its lease (it is being fenced off, or cannot reach PostgreSQL)",
                cluster.name()
            ));
        }
        match cluster.nodes.claim(root.as_str(), cluster.lease).await {
            Ok(owner) if owner.node == cluster.name() => Ok(()),
            Ok(owner) => Err(format!(
                "node {} owns it{}",
                owner.node,
                if owner.live {
                    ""
                } else {
                    " (not answering: it is taken over once its lease runs out)"
                }
            )),
            Err(error @ keel_store::Error::Fenced { .. }) => {
                cluster.step_down(error.to_string());
                Err(error.to_string())
            }
            Err(error) => Err(error.to_string()),
        }
    }

    fn may_act(&self) -> bool {
        self.0.lease_current()
    }

    async fn owned(&self) -> Result<Vec<ConversationId>, String> {
        let owned = self
            .0
            .nodes
            .owned()
            .await
            .map_err(|error| error.to_string())?;
        Ok(owned
            .into_iter()
            .filter_map(|root| ConversationId::new(root).ok())
            .collect())
    }
}
