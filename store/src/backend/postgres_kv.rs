//! PostgreSQL: the store's ordered key-value space as one table,
//! `keel_kv (key bytea PRIMARY KEY, value bytea)`, so `Store` builds the
//! same log, index, snapshots and blobs on it as on redb, with the same
//! group commit (docs/postgres.md).
//!
//! - **A commit is one transaction**: the batch's final state per key
//!   (a key put and removed in one batch ends as its last change says),
//!   as at most one `DELETE … = ANY($1)` and one `INSERT … SELECT FROM
//!   unnest($1, $2) ON CONFLICT DO UPDATE`, whatever the batch's size,
//!   pipelined on one connection and committed once. PostgreSQL answers
//!   `COMMIT` only once the WAL is flushed (`synchronous_commit`, on
//!   unless the server was told otherwise), so an append returns only
//!   once durable.
//! - **Order**: `bytea` compares byte by byte, as the store's keys are
//!   laid out (keys.rs), so a range scan is an index scan in key order.
//!   A long scan streams its rows in chunks, not a whole result.
//! - **The driver** is tokio-postgres with a deadpool pool, on a small
//!   tokio runtime of the backend's own. [`Backend`] is synchronous and is
//!   called from the committer's thread, tokio's blocking pool and, at
//!   open, an async task: each call hands its work to that runtime and
//!   waits on a plain channel, which blocks nothing but the caller and
//!   never nests one runtime in another.
//! - **One keel per database** until nodes share one under leases: the
//!   store holds a session advisory lock on a connection of its own for
//!   its life; a second keel is refused, naming the database. The lock
//!   goes with the connection, so a killed keel frees it at once.
//! - **Or a node among several** ([`PostgresBackend::open_node`]): no
//!   lock, but a row in `keel_nodes` whose epoch this process takes a new
//!   value of at open; every commit reads it back `FOR SHARE` in its own
//!   transaction and commits nothing if it moved: a node that another
//!   fenced off (it was paused or cut off past its lease, and its
//!   conversations were taken over) can never write again, and its store
//!   stops at its first attempt (docs/postgres.md, "Fencing").
//! - **The schema** is made and brought up to date at open
//!   ([`MIGRATIONS`], recorded in `keel_schema`), under a transaction
//!   advisory lock so that two keels starting together do not race. A
//!   database written by a newer keel is refused.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::{pin_mut, TryStreamExt};
use tokio::runtime::Runtime;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use super::postgres_error::{backend_error, database_error, pool_error, with_causes, NAME};
use super::{Backend, Entry, Reclaim, Visit, Write};
use crate::error::{Error, Result};

/// The schema, one step per version: step `i` takes the database from
/// version `i` to `i + 1`. Steps are never edited once released; a change
/// is a new step.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE keel_kv (key bytea PRIMARY KEY, value bytea NOT NULL);
     ALTER TABLE keel_kv ALTER COLUMN value SET STORAGE EXTERNAL;",
    // The nodes that write the database, each under an epoch that a node
    // taking over from it moves on (docs/postgres.md, "Fencing").
    "CREATE TABLE keel_nodes (node text PRIMARY KEY, epoch bigint NOT NULL,
         heartbeat_at timestamptz NOT NULL DEFAULT now());",
    // Where each node answers, whether another fenced it off, and which
    // node owns each conversation tree (by its root; docs/nodes.md).
    "ALTER TABLE keel_nodes ADD COLUMN addr text,
         ADD COLUMN fenced boolean NOT NULL DEFAULT false;
     CREATE TABLE keel_owners (conversation text PRIMARY KEY, node text NOT NULL,
         since timestamptz NOT NULL DEFAULT now());
     CREATE INDEX keel_owners_by_node ON keel_owners (node);
     CREATE TABLE keel_writers (conversation text NOT NULL, node text NOT NULL,
         epoch bigint NOT NULL, first_seq bigint NOT NULL, last_seq bigint NOT NULL,
         PRIMARY KEY (conversation, node, epoch));",
];

/// The advisory lock keys: one held for the store's life (one keel per
/// database), one for the length of a migration.
const OWNER_LOCK: i64 = 0x6b65_656c_0001;
const MIGRATION_LOCK: i64 = 0x6b65_656c_0002;

/// Connections in the pool: the committer's, and reads beside it.
const POOL_SIZE: usize = 8;

/// How long a new connection may take, and a request for a free one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Rows a range scan hands over at a time.
const CHUNK: usize = 256;

/// A node's commit records, per conversation it appended to, the seqs it
/// wrote under its epoch: who wrote what, for drills and operators to
/// check that no two epochs ever interleave (docs/nodes.md).
const WRITERS: &str = "INSERT INTO keel_writers (conversation, node, epoch, first_seq, last_seq) \
     SELECT c, $2, $3, f, l FROM unnest($1::text[], $4::bigint[], $5::bigint[]) AS t(c, f, l) \
     ON CONFLICT (conversation, node, epoch) DO UPDATE \
     SET first_seq = LEAST(keel_writers.first_seq, EXCLUDED.first_seq), \
         last_seq = GREATEST(keel_writers.last_seq, EXCLUDED.last_seq)";

const DELETE: &str = "DELETE FROM keel_kv WHERE key = ANY($1)";
const UPSERT: &str =
    "INSERT INTO keel_kv (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value";
const RANGE: &str =
    "SELECT key, value FROM keel_kv WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3";
const TAIL: &str =
    "SELECT key, value FROM keel_kv WHERE key >= $1 AND key < $2 ORDER BY key DESC LIMIT $3";

pub struct PostgresBackend {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
    pool: Pool,
    /// Holds the owner lock (or, for a node, just the connection it
    /// claimed its epoch on) for as long as the store is open; `None`
    /// only while dropping.
    owner: Option<Client>,
    /// Set for a node among several: its name and the epoch it writes
    /// under.
    claim: Option<Claim>,
}

/// A node's claim: its name, and the epoch every commit checks.
#[derive(Debug, Clone)]
struct Claim {
    node: String,
    epoch: i64,
}

/// How this process holds the database.
enum Holding {
    /// Alone: the advisory lock.
    Alone,
    /// As the node of this name, under a new epoch, with this lease.
    Node(String, Duration),
}

/// Where the URL points, without its password: for messages.
fn shown(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "database {:?} on {}:{} as {:?}",
        config.get_dbname().unwrap_or("(default)"),
        hosts.join(","),
        ports.join(","),
        config.get_user().unwrap_or("(default)"),
    )
}

impl PostgresBackend {
    /// Connect to the database at `url` (a `postgres://` URL or a libpq
    /// `key=value` string), bring its schema up to date, and take it for
    /// this process.
    pub fn open(url: &str) -> Result<PostgresBackend> {
        PostgresBackend::open_with(url, Holding::Alone)
    }

    /// Connect as the node `node`, one of several writing this database:
    /// its row in `keel_nodes` is given a new epoch, which every commit of
    /// this backend checks (a restart of the same node fences its earlier
    /// incarnation off too).
    ///
    /// A transaction of a node left open longer than half its `lease` is
    /// ended by the server (`idle_in_transaction_session_timeout`): a node
    /// paused in the middle of a commit must not hold its row's lock, and
    /// with it every other node's fencing of it, for as long as it stays
    /// paused.
    pub fn open_node(url: &str, node: &str, lease: Duration) -> Result<PostgresBackend> {
        if node.is_empty() || node.len() > 200 {
            return Err(backend_error("a node's name is 1 to 200 bytes"));
        }
        PostgresBackend::open_with(url, Holding::Node(node.to_owned(), lease))
    }

    /// The epoch this backend writes under, for a node.
    pub fn epoch(&self) -> Option<i64> {
        self.claim.as_ref().map(|claim| claim.epoch)
    }

    /// For a node: its handle on the nodes' shared tables (heartbeats,
    /// ownership, takeover), on this backend's connections. It works
    /// while the backend is open.
    pub fn nodes(&self) -> Option<super::postgres_nodes::Nodes> {
        let claim = self.claim.as_ref()?;
        let runtime = self.runtime.as_ref()?;
        Some(super::postgres_nodes::Nodes::new(
            runtime.handle().clone(),
            self.pool.clone(),
            claim.node.clone(),
            claim.epoch,
        ))
    }

    fn open_with(url: &str, holding: Holding) -> Result<PostgresBackend> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|error| {
            backend_error(format!(
                "KEEL_DATABASE_URL is not a PostgreSQL URL: {error}"
            ))
        })?;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("keel");
        if let Holding::Node(_, lease) = &holding {
            let idle = (*lease / 2).max(Duration::from_millis(100));
            config.options(format!(
                "-c idle_in_transaction_session_timeout={}",
                idle.as_millis()
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("keel-postgres")
            .enable_all()
            .build()
            .map_err(|error| backend_error(format!("starting its runtime: {error}")))?;
        match connect(&runtime, config, holding) {
            Ok((owner, claim, pool)) => Ok(PostgresBackend {
                runtime: Some(runtime),
                pool,
                owner: Some(owner),
                claim,
            }),
            Err(error) => {
                // Without waiting: the caller may be an async task.
                runtime.shutdown_background();
                Err(error)
            }
        }
    }

    /// Runs `work` on the backend's runtime and waits for its answer.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        match &self.runtime {
            Some(runtime) => wait(runtime, work),
            None => Err(Error::Closed),
        }
    }
}

/// The owner's connection, holding the store's lock (or the node's new
/// epoch), with the schema up to date; then the pool.
fn connect(
    runtime: &Runtime,
    config: tokio_postgres::Config,
    holding: Holding,
) -> Result<(Client, Option<Claim>, Pool)> {
    let where_ = shown(&config);
    let owner_config = config.clone();
    let (owner, claim) = wait(runtime, async move {
        let (mut client, connection) = owner_config.connect(NoTls).await.map_err(|error| {
            backend_error(format!("connecting to {where_}: {}", with_causes(&error)))
        })?;
        tokio::spawn(connection);
        if let Holding::Alone = holding {
            let locked: bool = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&OWNER_LOCK])
                .await
                .map_err(database_error)?
                .get(0);
            if !locked {
                return Err(backend_error(format!(
                    "{where_} is in use by another keel (it holds the store's lock); one keel per database"
                )));
            }
        }
        migrate(&mut client).await?;
        let claim = match holding {
            Holding::Alone => None,
            Holding::Node(node, _) => {
                let epoch: i64 = client
                    .query_one(
                        "INSERT INTO keel_nodes (node, epoch) VALUES ($1, 1) \
                         ON CONFLICT (node) DO UPDATE \
                         SET epoch = keel_nodes.epoch + 1, heartbeat_at = now(), fenced = false \
                         RETURNING epoch",
                        &[&node],
                    )
                    .await
                    .map_err(database_error)?
                    .get(0);
                Some(Claim { node, epoch })
            }
        };
        Ok((client, claim))
    })?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let _entered = runtime.enter();
    let pool = Pool::builder(manager)
        .max_size(POOL_SIZE)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(CONNECT_TIMEOUT))
        .wait_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(backend_error)?;
    Ok((owner, claim, pool))
}

/// Runs `work` on `runtime`, the caller waiting on a plain channel: no
/// `block_on`, so the caller may be anywhere, an async task included.
fn wait<T: Send + 'static>(
    runtime: &Runtime,
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = answer.send(work.await);
    });
    answered
        .recv()
        .map_err(|_| backend_error("its runtime stopped before answering"))?
}

/// Bring the schema to the latest version, in one transaction.
async fn migrate(client: &mut Client) -> Result<()> {
    let transaction = client.transaction().await.map_err(database_error)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(database_error)?;
    transaction
        .batch_execute("CREATE TABLE IF NOT EXISTS keel_schema (version integer NOT NULL)")
        .await
        .map_err(database_error)?;
    let version: Option<i32> = transaction
        .query_opt("SELECT version FROM keel_schema", &[])
        .await
        .map_err(database_error)?
        .map(|row| row.get(0));
    let version = usize::try_from(version.unwrap_or(0)).unwrap_or(usize::MAX);
    if version > MIGRATIONS.len() {
        return Err(Error::CorruptMeta {
            what: "PostgreSQL schema".to_owned(),
            reason: format!(
                "the database is at schema version {version}, written by a newer keel; this one knows up to {}",
                MIGRATIONS.len()
            ),
        });
    }
    for step in &MIGRATIONS[version..] {
        transaction
            .batch_execute(step)
            .await
            .map_err(database_error)?;
    }
    let latest = i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX);
    transaction
        .execute("DELETE FROM keel_schema", &[])
        .await
        .map_err(database_error)?;
    transaction
        .execute("INSERT INTO keel_schema (version) VALUES ($1)", &[&latest])
        .await
        .map_err(database_error)?;
    transaction.commit().await.map_err(database_error)
}

/// A batch as the state it leaves: the keys and values to put, and the
/// keys to remove.
struct Settled {
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
    removed: Vec<Vec<u8>>,
}

/// A batch as the state it leaves: per key, its last change. Puts and
/// removals then touch disjoint keys, so the two statements may run in
/// either order.
fn settle(writes: &[Write]) -> Settled {
    let mut last: std::collections::HashMap<&[u8], Option<&[u8]>> =
        std::collections::HashMap::with_capacity(writes.len());
    for write in writes {
        match write {
            Write::Put(key, value) => last.insert(key, Some(value)),
            Write::Remove(key) => last.insert(key, None),
        };
    }
    let (mut keys, mut values, mut removed) = (Vec::new(), Vec::new(), Vec::new());
    for (key, value) in last {
        match value {
            Some(value) => {
                keys.push(key.to_vec());
                values.push(value.to_vec());
            }
            None => removed.push(key.to_vec()),
        }
    }
    Settled {
        keys,
        values,
        removed,
    }
}

/// The seqs a batch appends, per conversation (the event keys it puts).
#[derive(Default)]
struct Appended {
    conversations: Vec<String>,
    first: Vec<i64>,
    last: Vec<i64>,
}

fn appended(keys: &[Vec<u8>]) -> Appended {
    let mut ranges: std::collections::BTreeMap<&str, (i64, i64)> =
        std::collections::BTreeMap::new();
    for key in keys {
        if key.first() != Some(&b'e') {
            continue;
        }
        let (Some(conversation), Some(seq)) = (
            crate::keys::conversation_of_event(key),
            crate::keys::seq_of(key).and_then(|seq| i64::try_from(seq).ok()),
        ) else {
            continue;
        };
        let range = ranges.entry(conversation).or_insert((seq, seq));
        range.0 = range.0.min(seq);
        range.1 = range.1.max(seq);
    }
    let mut written = Appended::default();
    for (conversation, (first, last)) in ranges {
        written.conversations.push(conversation.to_owned());
        written.first.push(first);
        written.last.push(last);
    }
    written
}

/// `LIMIT` takes a bigint; `usize::MAX` means all.
fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn commit(&self, writes: &[Write]) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let Settled {
            keys,
            values,
            removed,
        } = settle(writes);
        let written = match &self.claim {
            Some(_) => appended(&keys),
            None => Appended::default(),
        };
        let pool = self.pool.clone();
        let claim = self.claim.clone();
        self.run(async move {
            let mut client = pool.get().await.map_err(pool_error)?;
            let transaction = client.transaction().await.map_err(database_error)?;
            // A node's epoch, read and held (`FOR SHARE`: a node taking
            // over waits for this transaction, and this one sees it if it
            // came first). The statements all go out before any answer
            // comes back; if the epoch moved, nothing is committed.
            let fence = async {
                match &claim {
                    None => Ok(None),
                    Some(claim) => transaction
                        .query_opt(
                            "SELECT epoch FROM keel_nodes WHERE node = $1 FOR SHARE",
                            &[&claim.node],
                        )
                        .await
                        .map(|row| row.map(|row| row.get::<_, i64>(0))),
                }
            };
            let delete = async {
                if removed.is_empty() {
                    return Ok(0);
                }
                transaction.execute(DELETE, &[&removed]).await
            };
            let upsert = async {
                if keys.is_empty() {
                    return Ok(0);
                }
                transaction.execute(UPSERT, &[&keys, &values]).await
            };
            let writers = async {
                match &claim {
                    Some(claim) if !written.conversations.is_empty() => {
                        transaction
                            .execute(
                                WRITERS,
                                &[
                                    &written.conversations,
                                    &claim.node,
                                    &claim.epoch,
                                    &written.first,
                                    &written.last,
                                ],
                            )
                            .await
                    }
                    _ => Ok(0),
                }
            };
            let (held, _, _, _) =
                tokio::try_join!(fence, delete, upsert, writers).map_err(database_error)?;
            if let Some(claim) = &claim {
                if held != Some(claim.epoch) {
                    // Dropped without a commit: rolled back.
                    return Err(Error::Fenced {
                        node: claim.node.clone(),
                        epoch: claim.epoch,
                        now: held,
                    });
                }
            }
            transaction.commit().await.map_err(database_error)
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let pool = self.pool.clone();
        let key = key.to_vec();
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt("SELECT value FROM keel_kv WHERE key = $1", &[&key])
                .await
                .map_err(database_error)?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    fn visit_range(
        &self,
        start: &[u8],
        end: &[u8],
        count: usize,
        visit: &mut Visit<'_>,
    ) -> Result<()> {
        if count == 0 || start >= end {
            return Ok(());
        }
        let Some(runtime) = &self.runtime else {
            return Err(Error::Closed);
        };
        let pool = self.pool.clone();
        let (start, end, at_most) = (start.to_vec(), end.to_vec(), limit(count));
        // The rows come over in chunks, a few ahead of the reader; a
        // reader that stops early (an error of its own) drops the
        // receiver, and the scan ends at its next chunk.
        let (chunks, mut received) = tokio::sync::mpsc::channel::<Result<Vec<Entry>>>(4);
        runtime.spawn(async move {
            let scan = async {
                let client = pool.get().await.map_err(pool_error)?;
                let parameters: [&(dyn ToSql + Sync); 3] = [&start, &end, &at_most];
                let rows = client
                    .query_raw(RANGE, parameters)
                    .await
                    .map_err(database_error)?;
                pin_mut!(rows);
                let mut chunk = Vec::with_capacity(CHUNK);
                while let Some(row) = rows.try_next().await.map_err(database_error)? {
                    chunk.push((row.get(0), row.get(1)));
                    if chunk.len() == CHUNK
                        && chunks
                            .send(Ok(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK))))
                            .await
                            .is_err()
                    {
                        return Ok(());
                    }
                }
                if !chunk.is_empty() {
                    let _ = chunks.send(Ok(chunk)).await;
                }
                Ok(())
            };
            if let Err(error) = scan.await {
                let _ = chunks.send(Err(error)).await;
            }
        });
        // Waiting without a runtime of the caller's: see `wait`.
        while let Some(chunk) = futures_executor::block_on(received.recv()) {
            for (key, value) in chunk? {
                visit(&key, &value)?;
            }
        }
        Ok(())
    }

    fn last(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>> {
        Ok(self.tail(start, end, 1)?.pop())
    }

    fn tail(&self, start: &[u8], end: &[u8], count: usize) -> Result<Vec<Entry>> {
        if count == 0 || start >= end {
            return Ok(Vec::new());
        }
        let pool = self.pool.clone();
        let (start, end, at_most) = (start.to_vec(), end.to_vec(), limit(count));
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let rows = client
                .query(TAIL, &[&start, &end, &at_most])
                .await
                .map_err(database_error)?;
            let mut entries: Vec<Entry> = rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            entries.reverse();
            Ok(entries)
        })
    }

    fn contains(&self, key: &[u8]) -> Result<bool> {
        let pool = self.pool.clone();
        let key = key.to_vec();
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let row = client
                .query_opt("SELECT 1 FROM keel_kv WHERE key = $1", &[&key])
                .await
                .map_err(database_error)?;
            Ok(row.is_some())
        })
    }

    fn disk_bytes(&self) -> Result<Option<u64>> {
        let pool = self.pool.clone();
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            let bytes: i64 = client
                .query_one("SELECT pg_total_relation_size('keel_kv')", &[])
                .await
                .map_err(database_error)?
                .get(0);
            Ok(Some(u64::try_from(bytes).unwrap_or(0)))
        })
    }

    /// `VACUUM` marks the space of removed rows free for reuse; the
    /// files keep their length (giving it back to the system takes
    /// `VACUUM FULL`, which locks the table: an operator's call).
    fn reclaim(&self) -> Result<Reclaim> {
        let pool = self.pool.clone();
        self.run(async move {
            let client = pool.get().await.map_err(pool_error)?;
            client
                .batch_execute("VACUUM keel_kv")
                .await
                .map_err(database_error)?;
            Ok(Reclaim::ByItself)
        })
    }
}

impl Drop for PostgresBackend {
    /// The pool and the owner's connection close before this returns, so
    /// the database is free for the next keel at once; the runtime then
    /// stops without blocking (the caller may be an async task).
    fn drop(&mut self) {
        let owner = self.owner.take();
        self.pool.close();
        if let Some(runtime) = self.runtime.take() {
            let _ = wait(&runtime, async move {
                drop(owner);
                // Dropping the client ends its connection task; give it
                // the moment it needs to send Terminate and close.
                tokio::task::yield_now().await;
                Ok(())
            });
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_settles_to_each_keys_last_change() {
        let writes = vec![
            Write::Put(b"a".to_vec(), b"1".to_vec()),
            Write::Remove(b"a".to_vec()),
            Write::Put(b"a".to_vec(), b"2".to_vec()),
            Write::Put(b"b".to_vec(), b"1".to_vec()),
            Write::Remove(b"b".to_vec()),
            Write::Remove(b"c".to_vec()),
        ];
        let Settled {
            keys,
            values,
            mut removed,
        } = settle(&writes);
        let puts: Vec<(Vec<u8>, Vec<u8>)> = keys.into_iter().zip(values).collect();
        assert_eq!(puts, vec![(b"a".to_vec(), b"2".to_vec())]);
        removed.sort();
        assert_eq!(removed, vec![b"b".to_vec(), b"c".to_vec()]);
    }

    #[test]
    fn a_url_is_shown_without_its_password() {
        let config: tokio_postgres::Config = "postgres://keel:secret@db.example:5433/keel"
            .parse()
            .unwrap();
        let shown = shown(&config);
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("db.example:5433"), "{shown}");
        assert!(shown.contains("\"keel\""), "{shown}");
    }
}
