//! The drill itself: the fake provider, the daemon's first life, the
//! conversations and their workers, then kill after kill, each followed by
//! the next life and the checks, and at the end the settling.

use super::checks::{check_effects, check_log, settle};
use super::worker::Worker;
use super::*;

pub(in crate::drill) async fn drill(options: &Options, seed: u64) -> anyhow::Result<Report> {
    let started = Instant::now();
    in_temp_dir("keel-drill-crash-", seed, |dir| async move {
        drill_in(options, seed, started, &dir).await
    })
    .await
}

/// A drill's report, which says whether it failed and where its
/// directory was kept.
pub(in crate::drill) trait Kept {
    fn failed(&self) -> bool;
    fn keep(&mut self, dir: String);
}

impl Kept for Report {
    fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    fn keep(&mut self, dir: String) {
        self.kept = Some(dir);
    }
}

/// Run `body` in a new temporary directory named `prefix…`, removed
/// afterwards unless the drill failed.
pub(in crate::drill) async fn in_temp_dir<
    R: Kept,
    F: std::future::Future<Output = anyhow::Result<R>>,
>(
    prefix: &str,
    seed: u64,
    body: impl FnOnce(PathBuf) -> F,
) -> anyhow::Result<R> {
    let temp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")?;
    // Keep the evidence of a failed drill (the data dir, the daemons' logs
    // and the side-effect file): on a violation, or when it could not go on.
    match body(temp.path().to_path_buf()).await {
        Ok(mut report) => {
            if report.failed() {
                report.keep(temp.keep().display().to_string());
            }
            Ok(report)
        }
        // A drill that stopped before anything was written (no daemon at
        // `--addr`, say) has nothing to keep.
        Err(error) if !holds_a_file(temp.path()) => {
            Err(error.context(format!("the drill stopped (seed {seed})")))
        }
        Err(error) => {
            let kept = temp.keep();
            Err(error.context(format!(
                "the drill stopped (seed {seed}); its directory is kept in {}",
                kept.display()
            )))
        }
    }
}

/// Whether `dir` or a directory under it holds a file.
pub(in crate::drill) fn holds_a_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            let path = entry.path();
            if path.is_dir() {
                holds_a_file(&path)
            } else {
                true
            }
        })
    })
}

pub(in crate::drill) async fn drill_in(
    options: &Options,
    seed: u64,
    started: Instant,
    dir: &Path,
) -> anyhow::Result<Report> {
    let dir = dir.to_path_buf();
    let workdir = dir.join("work");
    std::fs::create_dir_all(&workdir).context("creating the conversations' directory")?;
    let run_id = format!("{}-{seed:x}", std::process::id());
    let effects = workdir.join("effects.log");
    let (mut lives, client, mock_url) = match &options.addr {
        None => {
            let mock_url =
                crate::mock_llm::start_in_process(crate::mock_llm::Settings::default()).await?;
            let mut lab = ChildDaemon::new(&dir, &mock_url, &format!("drill-{seed:x}"))?;
            lab.env(RUN_ENV, &run_id);
            let client = lab.client();
            lab.spawn()?;
            lab.ready(&client).await?;
            (Lives::Own(lab), client, Some(mock_url))
        }
        Some(addr) => {
            let client = Client::from_env_at(addr);
            let daemon = RunningDaemon::find(addr, options.restart.clone(), &dir, &client).await?;
            (Lives::Running(daemon), client, options.mock_url.clone())
        }
    };
    // The commands a daemon of somebody else's runs mark themselves.
    let mark = matches!(lives, Lives::Running(_)).then(|| run_id.clone());
    let http = keel_api::http::client();

    let shared = Shared {
        book: Arc::new(Mutex::new(Book::default())),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let mut ids = Vec::new();
    for index in 0..options.conversations {
        ids.push(create(&client, index, &workdir).await?);
    }
    let mut workers = tokio::task::JoinSet::new();
    // Each worker says when its event stream is open (or drops its end
    // when it could not open it): no kill lands before, so that a stream
    // refused by a daemon between lives is never the drill's own doing.
    let (opened, mut streams_open) = tokio::sync::mpsc::channel(ids.len().max(1));
    for (index, id) in ids.iter().enumerate() {
        let worker = Worker {
            opened: Some(opened.clone()),
            approvals: Approvals::default(),
            client: client.clone(),
            senders: Vec::new(),
            stream_from: None,
            shared: shared.clone(),
            id: id.clone(),
            rng: fastrand::Rng::with_seed(seed.wrapping_add(index as u64 + 1)),
            effects: effects.clone(),
            mark: mark.clone(),
            nonce: 0,
            index,
            gated: is_gated(index),
            // Aimed at sub-agents: spawn them in half the messages.
            spawn_per_256: if options.at == Boundary::ChildrenRunning {
                128
            } else {
                40
            },
        };
        workers.spawn(worker.run());
    }
    drop(opened);
    for _ in 0..ids.len() {
        if streams_open.recv().await.is_none() {
            break;
        }
    }

    let bar = if options.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(options.kills as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} kills {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let log_progress = !options.json && !std::io::stderr().is_terminal();
    let progress_every = (options.kills / 20).max(1);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills_by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut missed_aims = 0;
    for kill in 1..=options.kills {
        if let Some(mock_url) = &mock_url {
            queue_faults(&http, mock_url, &mut rng).await?;
        }
        match options.at {
            Boundary::Any => tokio::time::sleep(Duration::from_millis(rng.u64(20..400))).await,
            aimed => {
                // Not the moment right after the restart: let work begin.
                tokio::time::sleep(Duration::from_millis(rng.u64(0..100))).await;
                if !aim(&shared, aimed).await {
                    missed_aims += 1;
                }
            }
        }
        let states: BTreeSet<String> = {
            let book = shared.book();
            let mut states: BTreeSet<String> = book
                .states
                .values()
                .map(|state| state_name(*state))
                .collect();
            if book.children.values().any(|state| at_work(*state)) {
                states.insert("children_running".to_owned());
            }
            states
        };
        for state in states {
            *kills_by_state.entry(state).or_default() += 1;
        }
        let killed_life = lives.life();
        lives.kill().await?;
        shared.book().kills = kill;
        lives.next_life(&client).await?;
        // Boot reaped what the killed life left: nothing of it runs.
        let left = lives.survivors(&run_id);
        if left.is_empty() {
            shared.passed(1);
        }
        for survivor in left {
            shared.violation(
                "no tool process outlives its daemon",
                None,
                None,
                format!("{survivor} (killed life {killed_life})"),
            );
        }
        // A finished sub-agent's log is whole once checked to its end: it
        // is checked once more at the end, not after every kill (there are
        // hundreds after a long drill, and the check is per kill).
        for id in with_children(&client, &ids).await {
            let done = shared
                .book()
                .checked
                .get(&id)
                .is_some_and(|checked| checked.finished);
            if !done {
                check_log(&client, &shared, &id, false).await;
            }
        }
        bar.inc(1);
        let violations = shared.book().violations.len();
        bar.set_message(format!("{violations} violations"));
        // Where nobody sees the bar (a log, CI), a line now and then.
        if log_progress && (kill % progress_every == 0 || kill == options.kills) {
            eprintln!(
                "keel drill crash: {kill}/{} kills, {violations} violations, {:.0} s",
                options.kills,
                started.elapsed().as_secs_f64()
            );
        }
    }
    bar.finish_and_clear();

    shared.stop.store(true, Ordering::SeqCst);
    while let Some(joined) = workers.join_next().await {
        if let Err(error) = joined {
            shared.violation(
                "the drill's workers run to the end",
                None,
                None,
                format!("a worker panicked: {error}"),
            );
        }
    }
    settle(&client, &shared, &ids).await;
    let all = with_children(&client, &ids).await;
    settle(&client, &shared, &all).await;
    for id in &all {
        // What is new since the last kill, then the whole log once more.
        check_log(&client, &shared, id, false).await;
        check_log(&client, &shared, id, true).await;
    }
    let tool_calls = check_effects(&client, &shared, &all, &effects).await;
    for survivor in lives.finish(&run_id)? {
        shared.violation(
            "no tool process outlives its daemon",
            None,
            None,
            format!("{survivor} after the last stop"),
        );
    }

    let book = shared.book();
    Ok(Report {
        kept: None,
        seed,
        addr: options.addr.clone(),
        faults_queued: mock_url.is_some(),
        daemon_pid: match &lives {
            Lives::Own(_) => None,
            Lives::Running(daemon) => Some(daemon.pid()),
        },
        at: options.at,
        conversations: options.conversations,
        kills: options.kills,
        recoveries: options.kills,
        kills_by_state,
        missed_aims,
        turns: book.turns,
        tool_calls,
        sub_agents: all.len() - ids.len(),
        approvals: book.approvals,
        checks_passed: book.checks_passed,
        violations: book.violations.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Now and then (80 times in 256), one or two failures (500, 503, 529)
/// queued at the fake provider at `mock_url`, so that requests retry.
pub(in crate::drill) async fn queue_faults(
    http: &reqwest::Client,
    mock_url: &str,
    rng: &mut fastrand::Rng,
) -> anyhow::Result<()> {
    if rng.u8(..) >= 80 {
        return Ok(());
    }
    let faults: Vec<Value> = (0..rng.u32(1..3))
        .map(|_| {
            let status = [500, 503, 529][rng.usize(..3)];
            json!({ "status": status })
        })
        .collect();
    // The fake provider is in this process (or was named with
    // --mock-url); a failure here is the drill's, not keel's.
    http.post(format!("{mock_url}/_mock/script"))
        .json(&faults)
        .send()
        .await
        .context("queueing faults at the fake provider")?;
    Ok(())
}

/// Wait until the book shows `boundary`; false if it did not in time.
pub(in crate::drill) async fn aim(shared: &Shared, boundary: Boundary) -> bool {
    let started = Instant::now();
    let appended_before = shared.book().appended;
    while started.elapsed() < AIM_PATIENCE {
        if boundary.reached(&shared.book(), appended_before) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

/// Every third conversation's `bash` calls wait for an approval.
pub(in crate::drill) fn is_gated(index: usize) -> bool {
    index % 3 == 2
}

pub(in crate::drill) async fn create(
    client: &Client,
    index: usize,
    workdir: &Path,
) -> anyhow::Result<String> {
    let mut tools = BTreeMap::new();
    if is_gated(index) {
        tools.insert("bash".to_owned(), ApiToolPolicy::Approve);
    }
    // The fake provider, named: a daemon at `--addr` configured with a
    // real provider refuses instead of being billed.
    let request = CreateConversation {
        cwd: Some(workdir.display().to_string()),
        provider: Some(ApiProvider::Mock),
        tools,
        retry: Some(ApiRetry {
            max_retries: Some(3),
            base_delay_ms: Some(20),
            max_delay_ms: Some(100),
            retry_after_cap_ms: Some(100),
        }),
        ..CreateConversation::default()
    };
    Ok(client.create(&request).await?.id)
}

/// `ids` and every sub-agent they started.
pub(in crate::drill) async fn with_children(client: &Client, ids: &[String]) -> Vec<String> {
    let mut all = ids.to_vec();
    if let Ok(list) = client.list(true).await {
        all.extend(
            list.conversations
                .into_iter()
                .filter(|conversation| {
                    conversation
                        .parent
                        .as_ref()
                        .is_some_and(|parent| ids.contains(parent))
                })
                .map(|conversation| conversation.id),
        );
    }
    all
}
