//! The spawner's threads for its calls: each starts a child (confining it
//! first, for a confined call) and then waits for it, so a thread is busy
//! for as long as its child runs. They are kept for the next call once
//! their child is reaped, instead of one thread started and ended per
//! call: a thread's start and end (its stack, its signal stack, the
//! allocator's heap for it) were about a third of the spawner's CPU per
//! tool call (docs/benchmarks.md, "A connection costs a route table;
//! keel's CPU counts the spawner").
//!
//! There are as many threads as calls running at once, and a thread idle
//! for [`IDLE`] ends. A thread never confines itself: confining happens
//! on a short-lived thread of its own (`sandbox.rs`), so every pooled
//! thread is as unrestricted as the spawner and may serve any call.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What a thread of the pool runs: one call, from its start to its reap.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// How long a thread waits for its next call before it ends.
const IDLE: Duration = Duration::from_secs(10);

/// A pooled thread's stack: a confined call lists directories and builds
/// the confinement's rules (`sandbox.rs`) before it waits.
const STACK: usize = 256 * 1024;

/// An idle thread: its id, and where its next job goes.
type Idle = (u64, SyncSender<Job>);

/// The threads idle now, each by the sender of its next job.
#[derive(Clone, Default)]
pub(super) struct Pool {
    idle: Arc<Mutex<Vec<Idle>>>,
    next_id: Arc<AtomicU64>,
}

impl Pool {
    /// Run `job` on an idle thread, or on a new one. `Err` when no thread
    /// could be started (the machine is out of them): the job is dropped
    /// unrun, and with it what it held.
    pub(super) fn run(&self, mut job: Job) -> io::Result<()> {
        loop {
            let taken = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let Some((_, next)) = taken else { break };
            // A thread whose receiver is gone ended (it panicked): try
            // another.
            match next.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pool = self.clone();
        std::thread::Builder::new()
            .name("keel-call".to_owned())
            .stack_size(STACK)
            .spawn(move || pool.serve(id, job))
            .map(|_| ())
    }

    /// A pooled thread: run `first`, then each job given to it while it is
    /// idle, until it waited [`IDLE`] for one.
    fn serve(&self, id: u64, first: Job) {
        let mut job = first;
        loop {
            job();
            let (next, jobs) = mpsc::sync_channel::<Job>(1);
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((id, next));
            match self.wait(id, &jobs) {
                Some(given) => job = given,
                None => return,
            }
        }
    }

    /// This idle thread's next job, or `None` once it waited [`IDLE`] and
    /// took itself off the idle list.
    fn wait(&self, id: u64, jobs: &Receiver<Job>) -> Option<Job> {
        match jobs.recv_timeout(IDLE) {
            Ok(job) => Some(job),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                let before = idle.len();
                idle.retain(|(idle_id, _)| *idle_id != id);
                if idle.len() < before {
                    return None;
                }
                drop(idle);
                // A caller took this thread off the list just now: its job
                // is on the way (the caller sends right after, and the
                // channel holds one without waiting).
                jobs.recv().ok()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn thread_id_job(seen: &Arc<Mutex<Vec<std::thread::ThreadId>>>, done: &SyncSender<()>) -> Job {
        let seen = seen.clone();
        let done = done.clone();
        Box::new(move || {
            seen.lock().unwrap().push(std::thread::current().id());
            done.send(()).unwrap();
        })
    }

    #[test]
    fn a_thread_is_kept_for_the_next_call() {
        let pool = Pool::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (done, finished) = mpsc::sync_channel(4);
        pool.run(thread_id_job(&seen, &done)).unwrap();
        finished.recv().unwrap();
        // The thread puts itself on the idle list after its job: wait for it.
        while pool.idle.lock().unwrap().is_empty() {
            std::thread::yield_now();
        }
        pool.run(thread_id_job(&seen, &done)).unwrap();
        finished.recv().unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[0], seen[1],
            "the second call ran on the first's thread"
        );
    }

    #[test]
    fn calls_at_once_each_get_a_thread() {
        let pool = Pool::default();
        let running = Arc::new(AtomicUsize::new(0));
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let (started, all_started) = mpsc::channel();
        for _ in 0..4 {
            let running = running.clone();
            let released = released.clone();
            let started = started.clone();
            pool.run(Box::new(move || {
                running.fetch_add(1, Ordering::SeqCst);
                started.send(()).unwrap();
                // Each holds its thread until released: four at once.
                released.lock().unwrap().recv().unwrap();
            }))
            .unwrap();
        }
        for _ in 0..4 {
            all_started.recv().unwrap();
        }
        assert_eq!(running.load(Ordering::SeqCst), 4);
        for _ in 0..4 {
            release.send(()).unwrap();
        }
    }
}
