//! Several nodes over one PostgreSQL database (docs/nodes.md): who is
//! alive, who owns which conversation tree, and taking over from a node
//! that is gone. Everything that decides correctness is a statement here,
//! judged by PostgreSQL's clock and row locks; the nodes only act on the
//! answers.
//!
//! - **Nodes** are rows of `keel_nodes`: a name, the epoch its current
//!   process writes under (every commit checks it, `postgres_kv.rs`), the
//!   address it answers at, a heartbeat and whether another node fenced it.
//! - **A node is stale** when its heartbeat is older than the lease by
//!   PostgreSQL's `now()`; any node may then fence it: its epoch moves on
//!   (its process can never commit again) and it is marked `fenced`.
//! - **Ownership** is `keel_owners`: one row per conversation tree, keyed
//!   by its root (sub-agents live with their parent). A node claims an
//!   unowned root in a transaction that holds its own epoch; rows of a
//!   fenced node are moved to live nodes, each root to the node rendezvous
//!   hashing picks among them, in a transaction that holds the fenced
//!   nodes' rows so a restart of one waits for it.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::runtime::Handle;

use super::postgres_error::{backend_error, database_error, pool_error};
use crate::error::{Error, Result};

/// A node's handle on the shared tables. Cheap to clone; its calls run on
/// the PostgreSQL backend's own runtime and may be awaited from anywhere.
#[derive(Clone)]
pub struct Nodes {
    runtime: Handle,
    pool: Pool,
    node: String,
    epoch: i64,
}

/// A row of `keel_nodes`, as `/admin/nodes` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    pub node: String,
    /// Where it answers (`http://HOST:PORT`), once it said.
    pub addr: Option<String>,
    pub epoch: i64,
    /// Another node fenced it off: it writes nothing until it starts again.
    pub fenced: bool,
    /// Since its last heartbeat, by PostgreSQL's clock.
    pub heartbeat_age: Duration,
    /// Not fenced, and heard from within the lease.
    pub live: bool,
    /// Conversation trees it owns.
    pub owns: i64,
}

/// Who owns a conversation tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub node: String,
    pub addr: Option<String>,
    /// Not fenced, and heard from within the lease.
    pub live: bool,
}

/// Who appended which seqs of a conversation: one row per node and epoch
/// (`keel_writers`, written by each commit in the same transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    pub node: String,
    pub epoch: i64,
    pub first_seq: i64,
    pub last_seq: i64,
}

/// The lease as PostgreSQL takes it: seconds.
fn seconds(lease: Duration) -> f64 {
    lease.as_secs_f64()
}

const LIVE: &str = "NOT n.fenced AND n.heartbeat_at >= now() - make_interval(secs => $2)";

/// Who owns the tree `$1`, with where it answers and whether it is live
/// within the lease `$2`; read by [`owner_of`].
fn owner_query() -> String {
    format!(
        "SELECT o.node, n.addr, coalesce({LIVE}, false) FROM keel_owners o \
         LEFT JOIN keel_nodes n ON n.node = o.node WHERE o.conversation = $1"
    )
}

fn owner_of(row: &tokio_postgres::Row) -> Owner {
    Owner {
        node: row.get(0),
        addr: row.get(1),
        live: row.get(2),
    }
}

impl Nodes {
    pub(super) fn new(runtime: Handle, pool: Pool, node: String, epoch: i64) -> Nodes {
        Nodes {
            runtime,
            pool,
            node,
            epoch,
        }
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The epoch this process writes under.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Hold this node's row for `transaction` (`FOR SHARE`: a fencing of
    /// it waits), refusing with `Error::Fenced` if its epoch moved on or it
    /// was fenced: a fenced node claims and takes nothing.
    async fn hold_epoch(&self, transaction: &deadpool_postgres::Transaction<'_>) -> Result<()> {
        let held: Option<i64> = transaction
            .query_opt(
                "SELECT epoch FROM keel_nodes WHERE node = $1 AND NOT fenced FOR SHARE",
                &[&self.node],
            )
            .await
            .map_err(database_error)?
            .map(|row| row.get(0));
        if held == Some(self.epoch) {
            Ok(())
        } else {
            Err(self.fenced(held))
        }
    }

    fn fenced(&self, now: Option<i64>) -> Error {
        Error::Fenced {
            node: self.node.clone(),
            epoch: self.epoch,
            now,
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.runtime
            .spawn(work)
            .await
            .map_err(|_| backend_error("its runtime stopped before answering"))?
    }

    /// Say this node is alive and answers at `addr`. `Error::Fenced` once
    /// another node has fenced it off: it must stop.
    pub async fn heartbeat(&self, addr: &str) -> Result<()> {
        let (pool, node, epoch, addr) = (
            self.pool.clone(),
            self.node.clone(),
            self.epoch,
            addr.to_owned(),
        );
        let this = self.clone();
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let updated = client
                .execute(
                    "UPDATE keel_nodes SET heartbeat_at = now(), addr = coalesce(NULLIF($3, ''), addr) \
                     WHERE node = $1 AND epoch = $2 AND NOT fenced",
                    &[&node, &epoch, &addr],
                )
                .await
                .map_err(database_error)?;
            if updated == 1 {
                return Ok(());
            }
            let now: Option<i64> = client
                .query_opt("SELECT epoch FROM keel_nodes WHERE node = $1", &[&node])
                .await
                .map_err(database_error)?
                .map(|row| row.get(0));
            Err(this.fenced(now))
        })
        .await
    }

    /// Leave, at a graceful stop once nothing more is written: this
    /// node's epoch moves on and it is marked fenced, so the others take
    /// its trees over at their next look instead of a lease later.
    pub async fn leave(&self) -> Result<()> {
        let (pool, node, epoch) = (self.pool.clone(), self.node.clone(), self.epoch);
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .execute(
                    "UPDATE keel_nodes SET epoch = epoch + 1, fenced = true \
                     WHERE node = $1 AND epoch = $2",
                    &[&node, &epoch],
                )
                .await
                .map_err(database_error)?;
            Ok(())
        })
        .await
    }

    /// Every node, by name.
    pub async fn list(&self, lease: Duration) -> Result<Vec<NodeRow>> {
        let pool = self.pool.clone();
        let lease = seconds(lease);
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    &format!(
                        "SELECT n.node, n.addr, n.epoch, n.fenced, \
                         EXTRACT(EPOCH FROM now() - n.heartbeat_at)::float8, {LIVE}, \
                         (SELECT count(*) FROM keel_owners o WHERE o.node = n.node) \
                         FROM keel_nodes n WHERE $1::text IS NULL OR n.node = $1 ORDER BY n.node"
                    ),
                    &[&None::<String>, &lease],
                )
                .await
                .map_err(database_error)?;
            Ok(rows
                .into_iter()
                .map(|row| NodeRow {
                    node: row.get(0),
                    addr: row.get(1),
                    epoch: row.get(2),
                    fenced: row.get(3),
                    heartbeat_age: Duration::try_from_secs_f64(row.get::<_, f64>(4).max(0.0))
                        .unwrap_or(Duration::MAX),
                    live: row.get(5),
                    owns: row.get(6),
                })
                .collect())
        })
        .await
    }

    /// The live nodes' names and addresses: not fenced, heard from within
    /// `lease`.
    pub async fn live(&self, lease: Duration) -> Result<Vec<(String, Option<String>)>> {
        Ok(self
            .list(lease)
            .await?
            .into_iter()
            .filter(|row| row.live)
            .map(|row| (row.node, row.addr))
            .collect())
    }

    /// Who owns the tree rooted at `root`, if anyone does.
    pub async fn owner(&self, root: &str, lease: Duration) -> Result<Option<Owner>> {
        let pool = self.pool.clone();
        let (root, lease) = (root.to_owned(), seconds(lease));
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt(&owner_query(), &[&root, &lease])
                .await
                .map_err(database_error)?;
            Ok(row.as_ref().map(owner_of))
        })
        .await
    }

    /// Claim the tree rooted at `root` for this node unless another owns
    /// it; either way, who owns it now. Refused with `Error::Fenced` if
    /// this node was fenced off: a fenced node claims nothing.
    pub async fn claim(&self, root: &str, lease: Duration) -> Result<Owner> {
        let (pool, node, root) = (self.pool.clone(), self.node.clone(), root.to_owned());
        let lease = seconds(lease);
        let this = self.clone();
        self.run(async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            let transaction = client.transaction().await.map_err(database_error)?;
            this.hold_epoch(&transaction).await?;
            transaction
                .execute(
                    "INSERT INTO keel_owners (conversation, node) VALUES ($1, $2) \
                     ON CONFLICT (conversation) DO NOTHING",
                    &[&root, &node],
                )
                .await
                .map_err(database_error)?;
            let row = transaction
                .query_one(&owner_query(), &[&root, &lease])
                .await
                .map_err(database_error)?;
            transaction.commit().await.map_err(database_error)?;
            Ok(owner_of(&row))
        })
        .await
    }

    /// Let go of `root` (it was deleted), if this node owns it.
    pub async fn release(&self, root: &str) -> Result<()> {
        let (pool, node, root) = (self.pool.clone(), self.node.clone(), root.to_owned());
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .execute(
                    "DELETE FROM keel_owners WHERE conversation = $1 AND node = $2",
                    &[&root, &node],
                )
                .await
                .map_err(database_error)?;
            Ok(())
        })
        .await
    }

    /// Who appended `conversation`'s events, in seq order.
    pub async fn writers(&self, conversation: &str) -> Result<Vec<Writer>> {
        let (pool, conversation) = (self.pool.clone(), conversation.to_owned());
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    "SELECT node, epoch, first_seq, last_seq FROM keel_writers \
                     WHERE conversation = $1 ORDER BY first_seq, node, epoch",
                    &[&conversation],
                )
                .await
                .map_err(database_error)?;
            Ok(rows
                .into_iter()
                .map(|row| Writer {
                    node: row.get(0),
                    epoch: row.get(1),
                    first_seq: row.get(2),
                    last_seq: row.get(3),
                })
                .collect())
        })
        .await
    }

    /// The roots this node owns.
    pub async fn owned(&self) -> Result<Vec<String>> {
        let (pool, node) = (self.pool.clone(), self.node.clone());
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    "SELECT conversation FROM keel_owners WHERE node = $1",
                    &[&node],
                )
                .await
                .map_err(database_error)?;
            Ok(rows.into_iter().map(|row| row.get(0)).collect())
        })
        .await
    }

    /// Fence every other node not heard from within `lease` (by
    /// PostgreSQL's clock): its epoch moves on, so it can never commit
    /// again, and its conversations are free to take over. The nodes
    /// fenced by this call.
    pub async fn fence_stale(&self, lease: Duration) -> Result<Vec<String>> {
        let (pool, node, lease) = (self.pool.clone(), self.node.clone(), seconds(lease));
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(
                    "UPDATE keel_nodes SET epoch = epoch + 1, fenced = true \
                     WHERE NOT fenced AND node <> $1 \
                     AND heartbeat_at < now() - make_interval(secs => $2) RETURNING node",
                    &[&node, &lease],
                )
                .await
                .map_err(database_error)?;
            Ok(rows.into_iter().map(|row| row.get(0)).collect())
        })
        .await
    }

    /// Take over, from fenced nodes, the roots rendezvous hashing over the
    /// live nodes gives this one. The fenced nodes' rows are held for the
    /// transaction, so a fenced node starting again meanwhile waits and
    /// then finds these roots gone; this node's own epoch is held too (a
    /// fenced node takes nothing). The roots taken.
    pub async fn take_over(&self, lease: Duration) -> Result<Vec<String>> {
        let (pool, node) = (self.pool.clone(), self.node.clone());
        let lease = seconds(lease);
        let this = self.clone();
        self.run(async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            let transaction = client.transaction().await.map_err(database_error)?;
            this.hold_epoch(&transaction).await?;
            let dead: Vec<String> = transaction
                .query(
                    "SELECT node FROM keel_nodes WHERE fenced ORDER BY node FOR SHARE",
                    &[],
                )
                .await
                .map_err(database_error)?
                .into_iter()
                .map(|row| row.get(0))
                .collect();
            if dead.is_empty() {
                return Ok(Vec::new());
            }
            let orphans: Vec<String> = transaction
                .query(
                    "SELECT conversation FROM keel_owners WHERE node = ANY($1)",
                    &[&dead],
                )
                .await
                .map_err(database_error)?
                .into_iter()
                .map(|row| row.get(0))
                .collect();
            if orphans.is_empty() {
                return Ok(Vec::new());
            }
            let mut live: Vec<String> = transaction
                .query(
                    "SELECT node FROM keel_nodes n WHERE $1::text IS NOT NULL AND NOT n.fenced \
                     AND n.heartbeat_at >= now() - make_interval(secs => $2)",
                    &[&node, &lease],
                )
                .await
                .map_err(database_error)?
                .into_iter()
                .map(|row| row.get(0))
                .collect();
            if !live.contains(&node) {
                live.push(node.clone());
            }
            let mine: Vec<String> = orphans
                .into_iter()
                .filter(|root| rendezvous(root, &live) == Some(node.as_str()))
                .collect();
            if mine.is_empty() {
                return Ok(Vec::new());
            }
            let taken: Vec<String> = transaction
                .query(
                    "UPDATE keel_owners SET node = $1, since = now() \
                     WHERE conversation = ANY($2) AND node = ANY($3) RETURNING conversation",
                    &[&node, &mine, &dead],
                )
                .await
                .map_err(database_error)?
                .into_iter()
                .map(|row| row.get(0))
                .collect();
            transaction.commit().await.map_err(database_error)?;
            Ok(taken)
        })
        .await
    }
}

/// The node that `key` belongs to among `nodes` by rendezvous (highest
/// random weight) hashing: every node computes the same answer from the
/// same list, and a node leaving moves only the keys it had. The hash is
/// FNV-1a with a final mix, fixed here so that nodes built by different
/// compilers agree.
pub fn rendezvous<'a>(key: &str, nodes: &'a [String]) -> Option<&'a str> {
    nodes
        .iter()
        .map(|node| (weight(node, key), node.as_str()))
        .max()
        .map(|(_, node)| node)
}

fn weight(node: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes().chain([0]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser: FNV alone leaves the high bits of similar
    // keys too alike.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn rendezvous_is_stable_and_moves_only_the_keys_of_a_node_that_left() {
        let three = names(&["a", "b", "c"]);
        let two = names(&["a", "c"]);
        let keys: Vec<String> = (0..3000).map(|i| format!("c-{i:016x}")).collect();
        let mut counts = std::collections::HashMap::new();
        for key in &keys {
            let before = rendezvous(key, &three).unwrap();
            *counts.entry(before).or_insert(0) += 1;
            let after = rendezvous(key, &two).unwrap();
            if before != "b" {
                assert_eq!(before, after, "{key} moved though its node stayed");
            }
            assert_ne!(after, "b");
            // The order of the list does not matter.
            let reversed: Vec<String> = three.iter().rev().cloned().collect();
            assert_eq!(rendezvous(key, &reversed), Some(before));
        }
        for node in ["a", "b", "c"] {
            let share = counts[node];
            assert!(
                (800..1200).contains(&share),
                "{node} got {share} of 3000 keys"
            );
        }
        assert_eq!(rendezvous("x", &[]), None);
    }
}
