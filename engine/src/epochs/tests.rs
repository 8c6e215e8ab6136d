use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use object_store::path::Path;

use super::*;
use crate::checkpoint::CheckpointStore;

/// A runtime that fails chosen epochs once and records what it ran.
#[derive(Default)]
struct Scripted {
    fail_once: Mutex<Vec<u64>>,
    ran: Mutex<Vec<u64>>,
    replaced: Mutex<u32>,
    /// Epochs fired as the last (flushing) one.
    flushed: Mutex<Vec<u64>>,
    /// Asks for a stop while this epoch runs.
    stop_during: Option<(u64, StopHandle)>,
    /// Every epoch fired, as fired.
    fired: Mutex<Vec<EpochFire>>,
}

#[async_trait]
impl EpochRuntime for Scripted {
    async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome> {
        let EpochFire { epoch, last, .. } = fire;
        self.ran.lock().unwrap().push(epoch);
        self.fired.lock().unwrap().push(fire);
        if last {
            self.flushed.lock().unwrap().push(epoch);
        }
        if let Some((at, handle)) = &self.stop_during
            && *at == epoch
        {
            handle.stop();
        }
        Ok(EpochOutcome {
            events: 10,
            ..Default::default()
        })
    }
    async fn check_complete(&self, epoch: u64) -> Result<()> {
        let mut fail = self.fail_once.lock().unwrap();
        match fail.iter().position(|e| *e == epoch) {
            Some(i) => {
                fail.remove(i);
                Err(not_committed(epoch, "a member waits"))
            }
            None => Ok(()),
        }
    }
    async fn replace_instances(&self) -> Result<bool> {
        *self.replaced.lock().unwrap() += 1;
        Ok(true)
    }
}

async fn store() -> Arc<CheckpointStore> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    Arc::new(
        CheckpointStore::open(store, Path::from("q"), "abc")
            .await
            .unwrap(),
    )
}

#[tokio::test]
async fn a_failed_epoch_runs_again_from_the_last_commit() {
    let cs = store().await;
    let rt = Scripted {
        fail_once: Mutex::new(vec![4]),
        ..Default::default()
    };
    let log = EpochLog::new(Some(cs.clone()), 2);
    let run = run_epochs(&rt, &log, StopAfter::Epochs(6), |_, _| {})
        .await
        .unwrap();
    // Epoch 4 was not complete at its commit: 3 and 4 run again after
    // the commit of 2.
    assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3, 4, 3, 4, 5]);
    assert_eq!((run.epochs, run.events, run.recoveries), (6, 60, 1));
    assert_eq!(cs.committed().await.unwrap().unwrap().epoch, 5);
    // The commit carries the progress: every epoch run (retries too),
    // and a checkpoint per commit; the failure is recorded apart.
    let progress = cs.commit_record().await.unwrap().unwrap().progress;
    assert_eq!((progress.totals.epochs, progress.totals.events), (8, 80));
    let committed: Vec<u64> = progress.checkpoints.iter().map(|c| c.epoch).collect();
    assert_eq!(committed, vec![0, 2, 4, 5]);
    assert!(progress.checkpoints.iter().all(|c| c.requests > 0));
    let failure = cs.failure().await.unwrap().unwrap();
    assert_eq!(failure.epoch, 4);
    assert!(failure.message.contains("a member waits"), "{failure:?}");
    // A second run of the same bounded query has nothing to do.
    let again = run_epochs(&rt, &log, StopAfter::Epochs(6), |_, _| {})
        .await
        .unwrap();
    assert_eq!((again.epochs, again.resumed.map(|c| c.epoch)), (0, Some(5)));
}

#[tokio::test]
async fn an_epoch_that_keeps_failing_ends_the_run() {
    let rt = Scripted {
        fail_once: Mutex::new(vec![1; TRIES_PER_EPOCH as usize]),
        ..Default::default()
    };
    let log = EpochLog::new(Some(store().await), 1);
    let err = run_epochs(&rt, &log, StopAfter::Epochs(4), |_, _| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("epoch 1 is not committed"), "{err}");
    assert_eq!(*rt.replaced.lock().unwrap(), TRIES_PER_EPOCH - 1);
}

#[tokio::test]
async fn without_checkpoints_a_failure_is_not_retried() {
    let rt = Scripted {
        fail_once: Mutex::new(vec![0]),
        ..Default::default()
    };
    // Without a store nothing is checked, so nothing fails either.
    let log = EpochLog::new(None, 1);
    let run = run_epochs(&rt, &log, StopAfter::Epochs(2), |_, _| {})
        .await
        .unwrap();
    assert_eq!((run.epochs, *rt.replaced.lock().unwrap()), (2, 0));
}

fn standing(stop_at: u64) -> (Scripted, StopAfter) {
    let (handle, signal) = stop_signal();
    let rt = Scripted {
        stop_during: Some((stop_at, handle)),
        ..Default::default()
    };
    let interval = Duration::from_millis(1);
    (rt, StopAfter::Signalled { interval, signal })
}

#[tokio::test]
async fn a_stopped_standing_run_commits_its_last_epoch_without_flushing() {
    let cs = store().await;
    let (rt, stop) = standing(3);
    // Commits every 5 epochs: the stop commits epoch 3 all the same.
    // Commits every 5 epochs: a stop during epoch 3 commits epoch 4.
    let log = EpochLog::new(Some(cs.clone()), 5);
    let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
    assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    let checkpoints: Vec<bool> = rt
        .fired
        .lock()
        .unwrap()
        .iter()
        .map(|f| f.checkpoint)
        .collect();
    assert_eq!(checkpoints, [true, false, false, false, true]);
    assert!(rt.flushed.lock().unwrap().is_empty(), "nothing flushed");
    assert_eq!((run.epochs, run.stopped), (5, Stopped::Signal));
    let commit = cs.committed().await.unwrap().unwrap();
    assert_eq!((commit.epoch, commit.last), (4, false));
    // A restart goes on after it until stopped again; epoch 5 is a
    // checkpoint of its own.
    let (rt, stop) = standing(5);
    let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
    assert_eq!(*rt.ran.lock().unwrap(), vec![5]);
    assert_eq!(run.resumed.map(|c| c.epoch), Some(4));
    assert!(
        rt.fired.lock().unwrap()[0].fresh,
        "nothing decided 5 before"
    );
}

#[tokio::test]
async fn without_checkpoints_a_stopped_standing_run_flushes() {
    let (rt, stop) = standing(2);
    let run = run_epochs(&rt, &EpochLog::new(None, 1), stop, |_, _| {})
        .await
        .unwrap();
    assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(*rt.flushed.lock().unwrap(), vec![3]);
    assert_eq!(run.stopped, Stopped::Signal);
}

#[tokio::test]
async fn a_stop_between_epochs_does_not_wait_for_the_interval() {
    let (handle, signal) = stop_signal();
    let rt = Scripted::default();
    let stop = StopAfter::Signalled {
        interval: Duration::from_secs(600),
        signal,
    };
    let asked = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle.stop();
    });
    let log = EpochLog::new(Some(store().await), 1);
    let started = Instant::now();
    let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
    asked.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));
    // Woken in the pause after epoch 0, which was committed: done.
    assert_eq!((run.epochs, run.stopped), (1, Stopped::Signal));
}
