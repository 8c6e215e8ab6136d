//! Checkpoints on an S3 Express One Zone directory bucket, through the S3
//! API of the AWS stand-in (ministack): the bucket is named as a directory
//! bucket (`<name>--<zone>--x-s3`), whose listings come back unsorted and
//! whose conditional writes take `If-None-Match`, and the checkpoint store
//! uses only what such a bucket serves. A NEXMark query checkpoints there
//! every epoch, its process is stopped midway (its runtime shut down with
//! every task in it), and a second run resumes after the last commit and
//! runs the epochs after it to the end.

use crate::common;

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::memory::InMemory;
use object_store::path::Path;
use skein::registry::registries;
use skein_engine::checkpoint::{CheckpointStore, Commit, Decided, MemberObject, StateKind};
use skein_engine::context::CheckpointSpec;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, plan_query, session};

const EPOCHS: u64 = 12;
const EVENTS: u64 = 60_000;

/// The directory bucket on the stand-in, as object_store reaches S3.
fn bucket_store(bucket: &str) -> Arc<dyn ObjectStore> {
    let (id, secret) = common::aws_credentials();
    Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_endpoint(common::aws_endpoint())
            .with_region(common::aws_region())
            .with_access_key_id(id)
            .with_secret_access_key(secret)
            .with_allow_http(true)
            .build()
            .expect("an S3 store"),
    )
}

async fn directory_bucket() -> (String, Arc<dyn ObjectStore>) {
    common::require_aws();
    let bucket = format!("{}--use1-az4--x-s3", common::unique_name("skein-cp"));
    assert_eq!(
        skein_sinks::store::directory_bucket_zone(&bucket),
        Some("use1-az4")
    );
    // The SDK takes such a name for S3 Express and asks for a session
    // first, which the stand-in does not serve: it creates it as any bucket.
    let config = common::aws_sdk_config().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&config)
            .force_path_style(true)
            .disable_s3_express_session_auth(true)
            .build(),
    );
    common::ensure_bucket(&s3, &bucket).await;
    let store = bucket_store(&bucket);
    (bucket, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_store_works_on_a_directory_bucket() {
    let (_, store) = directory_bucket().await;
    let cs = CheckpointStore::open(store.clone(), Path::from("q"), "code")
        .await
        .expect("opening the store");
    for e in 0..3 {
        let state = MemberObject {
            state: Some((StateKind::Whole, vec![e as u8; 4])),
            ..Default::default()
        };
        cs.put_member(1, 0, e, state).await.unwrap();
        let created = cs
            .put_member_new(0, 0, e, MemberObject::default())
            .await
            .unwrap();
        assert!(created, "epoch {e} is new");
    }
    assert!(
        !cs.put_member_new(0, 0, 1, MemberObject::default())
            .await
            .unwrap(),
        "a conditional write finds the epoch taken"
    );
    let next = Decided {
        from: 3,
        through: 5,
        last: false,
    };
    cs.commit(
        Commit {
            epoch: 2,
            last: false,
        },
        Some(next),
        vec![],
        &Default::default(),
    )
    .await
    .unwrap();
    let log = cs.driver_log().await.unwrap();
    assert_eq!(log.committed.map(|c| c.epoch), Some(2));
    assert_eq!(log.last_at(4), Some(false));
    // One batched delete: the states before the newest whole one and the
    // entries before the commit.
    assert_eq!(cs.forget_now(2, &Default::default()).await.unwrap(), 4);
    assert_eq!(
        cs.member_state(1, 0, 2).await.unwrap().unwrap().state,
        vec![2; 4]
    );
    assert!(cs.member(0, 0, 1).await.unwrap().is_none());
    assert!(cs.member(0, 0, 2).await.unwrap().is_some());
}

#[test]
fn a_query_stopped_midway_resumes_from_a_directory_bucket() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_, store) = rt.block_on(directory_bucket());
    let sql = skein::run::nexmark_sql(5, EVENTS, 10_000, 2).unwrap();
    let root = Path::from(common::unique_name("q5"));
    // The first run, stopped after epoch 5 with whatever was in flight.
    let (killed_store, killed_sql, killed_root) = (store.clone(), sql.clone(), root.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.block_on(async {
            let (plan, runtime, options) = setup(&killed_sql, killed_store, killed_root).await;
            tokio::spawn(async move {
                let _ = run_local(&plan, &runtime, &options, EPOCHS, |e, _| {
                    if e >= 5 {
                        let _ = tx.send(());
                    }
                })
                .await;
            });
        });
        rx.recv().expect("the first run reached epoch 5");
        rt.shutdown_background();
    })
    .join()
    .unwrap();
    let report = rt.block_on(async {
        let (plan, runtime, options) = setup(&sql, store, root).await;
        run_local(&plan, &runtime, &options, EPOCHS, |_, _| {})
            .await
            .expect("the resumed run")
    });
    let resumed = report.resumed_after.expect("resumed after a commit");
    assert!(resumed >= 4, "{report:?}");
    assert_eq!(report.epochs, EPOCHS - resumed - 1, "{report:?}");
    assert!(report.checkpoint_puts > 0, "{report:?}");
}

/// NEXMark q5 on an in-process runtime checkpointing every epoch under
/// `root` of `store`.
async fn setup(
    sql: &str,
    store: Arc<dyn ObjectStore>,
    root: Path,
) -> (
    skein_engine::planner::QueryPlan,
    Arc<LocalRuntime>,
    PlanOptions,
) {
    let regs = registries();
    let ctx = session(&regs.catalog, 2);
    let mut options = PlanOptions {
        group_size: 2,
        ..Default::default()
    };
    let plan = plan_query(&ctx, sql, &options).await.unwrap();
    let cs = CheckpointStore::open(store, root, &plan.query_code)
        .await
        .unwrap();
    options.run = cs.manifest().run.clone();
    options.checkpoint = Some(CheckpointSpec { interval: 1 });
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    runtime.set_checkpoints(Some(Arc::new(cs)));
    (plan, runtime, options)
}
