//! The parts of one mount, built and joined: the cache, the filesystem over it, and in a
//! cluster the locator, the control server (pulls and locator RPCs), the pullers and UCX.

use std::sync::Arc;
use std::time::Duration;

use super::UserError;
use crate::cache::{Cache, CacheConfig};
use crate::cli::MountArgs;
use crate::fs::{BackingStore, DyadFs, FsConfig};
use crate::stats::Stats;
use crate::transport::auth::Secret;

/// The default ceiling of idle cache descriptors (`--open-files`).
const MAX_OPEN_FILES: u64 = 65536;

pub(super) fn serve(args: &MountArgs) -> Result<(), UserError> {
    // Signals are taken by one thread (sigwait) that unmounts; block them everywhere else.
    let set = crate::sys::StopSignals::block();
    // Nothing depends on getting more: the cache keeps half of what there is.
    let limit = crate::sys::raise_descriptor_limit();
    let stats = Arc::new(Stats::default());
    let cache = Arc::new(
        Cache::open(
            &CacheConfig {
                dir: args.ssd.clone(),
                chunk_size: args.chunk_size as u32,
                capacity: args.capacity,
                open_files: args
                    .open_files
                    .unwrap_or((limit / 2).clamp(8, MAX_OPEN_FILES)),
            },
            stats.clone(),
        )
        .map_err(|e| e.to_string())?,
    );
    // Crash leftovers are deleted while the mount already serves: no scan of a million data
    // files before the mount is ready.
    let sweeper = cache.clone();
    let _ = std::thread::Builder::new()
        .name("cache-sweep".into())
        .spawn(move || {
            if let Err(e) = sweeper.sweep_orphans() {
                tracing::warn!(error = %e, "sweeping the cache's leftover files failed");
            }
        });
    let config = FsConfig {
        metadata_ttl: args.metadata_ttl,
        passthrough: !args.no_passthrough,
        readahead_threads: args.readahead_threads.into(),
        wait: args.wait,
        max_inodes: args.max_inodes as usize,
    };
    let backing_err = |e| format!("backing dir {}: {e}", args.backing.display());
    let backing = BackingStore::new(args.backing.clone()).relieving(cache.files());
    let producer = |id| {
        crate::fs::write::Producer::open(&args.ssd, cache.clone(), id)
            .map(Arc::new)
            .map_err(|e| format!("cache dir {}: {e}", args.ssd.display()))
    };
    if args.peers.is_none() && args.rendezvous.is_none() {
        let source = Arc::new(BackingStore::new(args.backing.clone()).relieving(cache.files()));
        let names = Arc::new(crate::locator::names::LocalNames::default());
        let fs = DyadFs::new(backing, names, producer(0)?, source, cache, stats, config)
            .map_err(backing_err)?;
        return super::run_session(args, fs, set);
    }
    // Several nodes: the locator, the control server (pulls and locator RPCs) and UCX.
    let id = super::node_id(args)?;
    let members = match (&args.peers, &args.rendezvous) {
        (Some(file), _) => super::membership(file, id)?,
        (None, Some(dir)) => {
            let me = crate::locator::Member {
                id,
                addr: args.listen.ok_or("--rendezvous needs --listen")?,
                rack: args.rack.clone(),
            };
            let k = args.nodes.unwrap_or(1) as usize;
            crate::locator::rendezvous::rendezvous(
                dir,
                &me,
                k,
                args.peer_timeout.max(Duration::from_secs(60)),
            )
            .map_err(|e| e.to_string())?
        }
        (None, None) => unreachable!("checked above"),
    };
    let listen = match args.listen {
        Some(a) => a,
        None => members.member(id).expect("own id checked").addr,
    };
    let secret = match (&args.secret_file, &args.rendezvous) {
        (Some(file), _) => Some(Arc::new(Secret::load(file)?)),
        (None, Some(dir)) => Some(Arc::new(Secret::rendezvous(
            dir,
            args.peer_timeout.max(Duration::from_secs(60)),
        )?)),
        (None, None) => {
            tracing::warn!(
                "INSECURE: no job secret (--insecure): any process that reaches {listen} can read \
                 every cached file and change the produced namespace"
            );
            None
        }
    };
    // One worker: the runtime only answers locator RPCs and sends publishes (pulls run on the
    // threads that need the bytes), and a second worker mostly costs wake-ups to steal work.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let worker = Arc::new(
        crate::transport::ucx::Worker::new(32, args.chunk_size as usize)
            .map_err(|e| format!("UCX: {e}"))?,
    );
    let locator = crate::locator::service::LocatorService::new(
        members,
        args.peer_timeout,
        stats.clone(),
        secret.clone(),
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    // Background copies (`--replicate`, ours or a peer's) go through a worker of their own whose
    // progress thread has the lowest CPU priority.
    let background = Arc::new(
        crate::transport::ucx::Worker::new_background(4, args.chunk_size as usize)
            .map_err(|e| format!("UCX: {e}"))?,
    );
    let server = crate::transport::server::Server {
        worker: worker.clone(),
        background: Some(background.clone()),
        store: Arc::new(crate::locator::source::CacheStore {
            cache: cache.clone(),
            stats: stats.clone(),
        }),
        node_id: id,
        faults: Default::default(),
        rpc: Some(Arc::new(crate::locator::service::Handler(locator.clone()))),
        secret: secret.clone(),
        conns: Default::default(),
    };
    runtime.spawn(async move {
        if let Err(e) = crate::transport::server::serve(listener, server).await {
            tracing::error!(error = %e, "control server stopped");
        }
    });
    let producer = producer(id)?;
    {
        let p = producer.clone();
        let _ = locator
            .on_release
            .set(Box::new(move |object, size, mtime_ns, drop| {
                p.released(object, crate::core::Version { size, mtime_ns }, drop)
            }));
    }
    let names = Arc::new(crate::locator::cluster_names::ClusterNames {
        locator: locator.clone(),
        runtime: runtime.handle().clone(),
    });
    {
        let c = cache.clone();
        let _ = locator.holdings.set(Box::new(move || c.complete_entries()));
    }
    crate::locator::source::start_publisher(&cache, locator.clone(), runtime.handle());
    // This node's tables start empty: the others re-announce what they held before it serves.
    let answered = runtime.block_on(locator.rejoin(args.peer_timeout.min(Duration::from_secs(2))));
    tracing::info!(answered, "told the peers this node (re)started");
    let pull_config = crate::transport::pull::PullConfig {
        node_id: id,
        chunk: args.chunk_size as u32,
        window: 4,
        timeout: args.peer_timeout,
        background: false,
        secret,
    };
    let source = Arc::new(crate::locator::source::ClusterSource {
        locator: crate::locator::source::ServiceLink {
            service: locator,
            runtime: runtime.handle().clone(),
        },
        puller: crate::transport::pull::Puller::new(worker, pull_config),
        backing: BackingStore::new(args.backing.clone()).relieving(cache.files()),
        stats: stats.clone(),
    });
    tracing::info!(node = id, %listen, replicate = args.replicate, "cluster mode");
    if args.replicate {
        let copier = crate::transport::pull::Puller::new(
            background,
            crate::transport::pull::PullConfig {
                background: true,
                ..source.puller.cfg.clone()
            },
        );
        crate::locator::replicate::start_replicator(
            source.clone(),
            copier,
            cache.clone(),
            stats.clone(),
        );
    }
    let fs =
        DyadFs::new(backing, names, producer, source, cache, stats, config).map_err(backing_err)?;
    let r = super::run_session(args, fs, set);
    runtime.shutdown_timeout(Duration::from_secs(1));
    r
}
