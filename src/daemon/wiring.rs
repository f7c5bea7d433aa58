//! The parts of one mount, built and joined: the cache, the filesystem over it, and in a
//! cluster the locator, the control server (pulls and locator RPCs), the pullers and UCX;
//! handed back to `daemon/mod.rs` to be mounted ([`Built`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::UserError;
use super::config::MountConfig;
use crate::backing::{BackingStore, EmptyTree, SharedFs};
use crate::cache::names_log::NamesLog;
use crate::cache::{Cache, CacheConfig};
use crate::cluster::names::ClusterNames;
use crate::cluster::peers::{Handler, RpcPeers};
use crate::cluster::replicate::start_replicator;
use crate::cluster::source::{
    CacheStore, ClusterSource, Fetcher, ServiceLink, page_map, recheck_chunk, start_publisher,
};
use crate::core::Version;
use crate::core::names::{Name, Namespace};
use crate::core::source::Source;
use crate::fill::Reader;
use crate::fs::StatusFn;
use crate::fs::quota::Quota;
use crate::fs::write::Producer;
use crate::fs::{DyadFs, FsConfig};
use crate::locator::Membership;
use crate::locator::gossip::{self, GossipConfig, Peer};
use crate::locator::service::{Hooks, LocatorService};
use crate::stats::Stats;
use crate::transport::auth::Secret;
use crate::transport::plane::DataPlane;
use crate::transport::pull::{PullConfig, Puller};
use crate::transport::server::{Server, Serving};

/// The default ceiling of idle cache descriptors (`--open-files`).
const MAX_OPEN_FILES: u64 = 65536;

/// What every mount has, single node or cluster.
struct Base {
    /// Blocked in every thread; the session's signal thread waits for them.
    signals: crate::sys::StopSignals,
    stats: Arc<Stats>,
    cache: Arc<Cache>,
    config: FsConfig,
}

/// Descriptors the daemon's table holds from the start (512 KiB of kernel memory): beyond it,
/// each doubling stalls one open for an RCU grace period (see `presize_descriptor_table`).
const DESCRIPTOR_TABLE: u64 = 1 << 16;

/// A mount built and not yet mounted: its file system, the stop signals its session waits
/// for, and in a cluster the control runtime (its port, gossip and publishes), shut down once
/// the session ends.
pub(super) struct Built<S: Source> {
    pub fs: DyadFs<S>,
    pub signals: crate::sys::StopSignals,
    pub runtime: Option<tokio::runtime::Runtime>,
}

/// A single node's mount or a cluster's (their sources differ).
pub(super) enum Wired {
    Single(Built<BackingStore>),
    Cluster(Built<ClusterSource>),
}

/// Builds the mount the arguments describe, ready to be mounted.
pub(super) fn build(args: &MountConfig) -> Result<Wired, UserError> {
    crate::sys::fix_mmap_threshold();
    // Signals are taken by one thread (sigwait) that unmounts; block them everywhere else.
    let signals = crate::sys::StopSignals::block();
    // Nothing depends on getting more: the cache keeps half of what there is.
    let limit = crate::sys::raise_descriptor_limit();
    crate::sys::presize_descriptor_table(limit.min(DESCRIPTOR_TABLE));
    let stats = Arc::new(Stats::default());
    stats.managed.store(args.managed, Ordering::Relaxed);
    let base = Base {
        signals,
        cache: open_cache(args, limit, &stats)?,
        stats,
        config: args.fs.clone(),
    };
    if !args.cluster.is_cluster() {
        single_node(args, base)
    } else {
        cluster(args, base)
    }
}

/// Opens the cache; leftovers of a crash are deleted in the background while the mount already
/// serves (no scan of a million data files before it is ready).
fn open_cache(args: &MountConfig, limit: u64, stats: &Arc<Stats>) -> Result<Arc<Cache>, UserError> {
    let config = CacheConfig {
        dir: args.ssd.clone(),
        chunk_size: args.chunk_size as u32,
        capacity: args.capacity,
        pack_max: args.pack_max.until_init(),
        max_partial_chunks: args.max_partial_chunks,
        open_files: args
            .open_files
            .unwrap_or((limit / 2).clamp(8, MAX_OPEN_FILES)),
    };
    let cache = Arc::new(super::takeover::open_cache(
        &config,
        stats,
        &args.mountpoint,
    )?);
    let sweeper = cache.clone();
    let _ = std::thread::Builder::new()
        .name("cache-sweep".into())
        .spawn(move || {
            if let Err(e) = sweeper.sweep_orphans() {
                tracing::warn!(error = %e, "sweeping the cache's leftover files failed");
            }
        });
    if !args.scrub_interval.is_zero() {
        let (scrubbed, stats) = (cache.clone(), stats.clone());
        let (every, rate) = (args.scrub_interval, args.scrub_rate);
        let _ = std::thread::Builder::new()
            .name("cache-scrub".into())
            .spawn(move || {
                crate::sys::lower_thread_priority();
                loop {
                    std::thread::sleep(every);
                    scrubbed.scrub_paced(rate);
                    stats.background_scrubs.fetch_add(1, Ordering::Relaxed);
                }
            });
    }
    Ok(cache)
}

/// The shared file system, beneath its root; idle cache descriptors are closed when the
/// process runs out of them.
fn backing(args: &MountConfig, cache: &Cache) -> BackingStore {
    BackingStore::new(args.backing.clone()).relieving(cache.files())
}

fn producer(b: &Base, args: &MountConfig, id: u32) -> Result<Arc<Producer>, UserError> {
    let quota = Quota::new(args.max_staged_per_user, b.stats.clone());
    Producer::open(&args.ssd, b.cache.clone(), id, quota)
        .map(Arc::new)
        .map_err(|source| UserError::CacheDir {
            path: args.ssd.clone(),
            source,
        })
}

fn backing_err(args: &MountConfig) -> impl Fn(crate::fs::Error) -> UserError + '_ {
    move |source| UserError::Backing {
        path: args.backing.clone(),
        source,
    }
}

/// One node: the shared file system is the only source, names live in this process.
fn single_node(args: &MountConfig, b: Base) -> Result<Wired, UserError> {
    let source = Arc::new(backing(args, &b.cache));
    let (journal, restored) = names_log(args)?;
    let names = Arc::new(crate::locator::names::LocalNames::restored(
        restored,
        journal,
        args.max_names_per_user,
    ));
    let producer = producer(&b, args, 0)?;
    sweep_unnamed(&producer, &names.entries(), &b.stats);
    let names = Arc::new(crate::locator::watching::Watched::new(names));
    built(args, b, names, producer, source, None).map(Wired::Single)
}

/// The names this node held before it (re)started, and the journal that keeps its changes
/// (`<ssd>/names.log`).
fn names_log(
    args: &MountConfig,
) -> Result<(Arc<NamesLog>, crate::cache::names_log::Names), UserError> {
    let (log, names) = NamesLog::open(&args.ssd).map_err(|source| UserError::CacheDir {
        path: args.ssd.join("names.log"),
        source,
    })?;
    tracing::info!(names = names.len(), "names restored from the journal");
    Ok((Arc::new(log), names))
}

/// Deletes the produced objects that no name reaches any more (a crash between keeping an
/// object and publishing its name, or between unpublishing and deleting it): on a single node
/// every name of its objects is its own, so what `names` does not name is nobody's.
fn sweep_unnamed(producer: &Producer, names: &[(String, String, Name)], stats: &Stats) {
    let named: std::collections::HashSet<&str> = names
        .iter()
        .filter(|(_, _, n)| !n.dir)
        .map(|(_, _, n)| n.object.as_str())
        .collect();
    reclaim(producer, stats, &producer.kept_objects(), |o| {
        !named.contains(o)
    });
}

/// Deletes the objects of `kept` that are `unnamed`, counted.
fn reclaim(
    producer: &Producer,
    stats: &Stats,
    kept: &[(String, Version)],
    unnamed: impl Fn(&str) -> bool,
) {
    for (object, version) in kept {
        if unnamed(object) {
            tracing::info!(object, "a kept object no name reaches: deleted");
            producer.released(object, *version, true);
            stats.unnamed_reclaimed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// In a cluster, the names of this node's objects live at their directories' homes: the
/// objects it kept from before this start that no member's names point at are deleted, once
/// every member has answered (twice, a few seconds apart, so a name moving between homes, a
/// rename, is not taken for none). Objects kept since this start are never swept.
fn start_sweep(
    locator: &Arc<LocatorService>,
    producer: &Arc<Producer>,
    stats: &Arc<Stats>,
    runtime: &tokio::runtime::Handle,
) {
    let kept = producer.kept_objects();
    if kept.is_empty() {
        return;
    }
    let (locator, producer, stats) = (locator.clone(), producer.clone(), stats.clone());
    runtime.spawn(async move {
        const TRIES: usize = 60;
        const APART: Duration = Duration::from_secs(5);
        let me = locator.me();
        let mut unnamed: Option<std::collections::HashSet<String>> = None;
        for _ in 0..TRIES {
            if let Some(named) = locator.objects_named(me).await {
                let now: std::collections::HashSet<String> = kept
                    .iter()
                    .map(|(o, _)| o.clone())
                    .filter(|o| !named.contains(o))
                    .collect();
                match unnamed.take() {
                    None if now.is_empty() => return,
                    None => unnamed = Some(now),
                    Some(before) => {
                        let twice = |o: &str| before.contains(o) && now.contains(o);
                        return reclaim(&producer, &stats, &kept, twice);
                    }
                }
            }
            tokio::time::sleep(APART).await;
        }
        tracing::warn!("not every member answered: no kept object was taken for unnamed");
    });
}

/// The filesystem over the base and the given names, producer and source, and the metrics
/// endpoint over its counters.
fn built<S: Source>(
    args: &MountConfig,
    b: Base,
    names: Arc<dyn Namespace>,
    producer: Arc<Producer>,
    source: Arc<S>,
    status: Option<StatusFn>,
) -> Result<Built<S>, UserError> {
    let backing = backing(args, &b.cache);
    let shared: Arc<dyn SharedFs> = if args.managed {
        Arc::new(EmptyTree(backing))
    } else {
        Arc::new(backing)
    };
    let fs = DyadFs::new(shared, names, producer, source, b.cache, b.stats, b.config)
        .map_err(backing_err(args))?;
    if let Some(f) = status {
        fs.set_status(f);
    }
    if let Some(addr) = args.metrics_listen {
        let (snapshot, stats) = (fs.snapshots(), fs.stats_handle());
        let local = crate::metrics::serve(addr, move || {
            crate::metrics::render(&snapshot(), &stats.latency)
        })
        .map_err(|source| UserError::Listen { addr, source })?;
        tracing::info!(%local, "serving Prometheus metrics at /metrics");
    }
    Ok(Built {
        fs,
        signals: b.signals,
        runtime: None,
    })
}

/// Several nodes: the locator, the control server (pulls and locator RPCs), UCX, the
/// publisher, and a source that asks the locator and pulls from peers.
fn cluster(args: &MountConfig, b: Base) -> Result<Wired, UserError> {
    let id = super::members::node_id(args)?;
    let members = super::members::members(args, id)?;
    let mut ids: Vec<u32> = members.members().map(|m| m.id).collect();
    ids.sort_unstable();
    b.stats.node_id.store(id.into(), Ordering::Relaxed);
    let rank = ids.iter().position(|&m| m == id).unwrap_or(0);
    b.stats.node_rank.store(rank as u64, Ordering::Relaxed);
    b.stats.members.store(ids.len() as u64, Ordering::Relaxed);
    let listen = match args.cluster.listen {
        Some(a) => a,
        None => members.member(id).expect("own id checked").addr,
    };
    let secret = job_secret(args, listen)?;
    if let Some(key) = &secret {
        check_key(&members, id, key, args.cluster.peer_timeout)?;
    }
    let runtime = control_runtime()?;
    let (worker, background) = data_planes(args, &b.stats)?;
    let producer = producer(&b, args, id)?;
    let (journal, restored) = names_log(args)?;
    let hooks = locator_hooks(&producer, &b.cache, journal);
    let locator = LocatorService::new(
        members,
        args.cluster.peer_timeout,
        b.stats.clone(),
        RpcPeers::new(id, secret.clone()),
        hooks,
    );
    // Before it serves: a home that restarted answers for its directories at once.
    locator.restore_names(restored, args.max_names_per_user);
    let server = Server {
        worker: worker.clone(),
        background: Some(background.clone()),
        store: Arc::new(CacheStore {
            cache: b.cache.clone(),
            stats: b.stats.clone(),
            fetcher: Some(Fetcher {
                locator: locator.clone(),
                reader: Reader {
                    cache: b.cache.clone(),
                    stats: b.stats.clone(),
                    source: Arc::new(backing(args, &b.cache)),
                },
            }),
        }),
        node_id: id,
        faults: Default::default(),
        rpc: Some(Arc::new(Handler(locator.clone()))),
        secret: secret.clone(),
        conns: Default::default(),
        pending: Default::default(),
        members: Arc::new(ids.iter().copied().collect()),
        serving: Serving::new(args.cluster.serve_threads),
    };
    start_gossip(args, id, listen, &locator, secret.clone(), runtime.handle())?;
    start_control_port(&runtime, listen, server)?;
    let events = b
        .cache
        .take_events()
        .expect("the cache's events are taken here alone");
    start_publisher(events, locator.clone(), runtime.handle());
    // This node's tables start empty: the others re-announce what they held before it serves.
    let answered =
        runtime.block_on(locator.rejoin(args.cluster.peer_timeout.min(Duration::from_secs(2))));
    tracing::info!(answered, "told the peers this node (re)started");
    start_sweep(&locator, &producer, &b.stats, runtime.handle());
    let names = Arc::new(ClusterNames {
        locator: locator.clone(),
        runtime: runtime.handle().clone(),
        failover_wait: args.cluster.failure_detection * 2,
        refresher: Default::default(),
        calls: tokio::sync::Semaphore::new(crate::cluster::names::CALLS_AT_ONCE),
        registering: Default::default(),
    });
    let pull_config = PullConfig {
        node_id: id,
        chunk: args.chunk_size as u32,
        window: 4,
        timeout: args.cluster.peer_timeout,
        background: false,
        secret,
        eager_max: args.cluster.eager_max.min(args.chunk_size) as u32,
    };
    let (l, rt) = (locator.clone(), runtime.handle().clone());
    let status: StatusFn = Box::new(move || rt.block_on(l.status()));
    let source = Arc::new(ClusterSource {
        locator: ServiceLink {
            service: locator,
            runtime: runtime.handle().clone(),
        },
        puller: Puller::new(worker, pull_config),
        backing: backing(args, &b.cache),
        stats: b.stats.clone(),
        maps: Default::default(),
        spent: Default::default(),
    });
    let fill_limit = args.cluster.replicate.fill_limit(true, !args.managed);
    tracing::info!(node = id, %listen, replicate = ?args.cluster.replicate, ?fill_limit, "cluster mode");
    if let Some(limit) = fill_limit {
        let cfg = PullConfig {
            background: true,
            ..source.puller.cfg.clone()
        };
        let copier = Puller::new(background, cfg);
        start_replicator(
            source.clone(),
            copier,
            b.cache.clone(),
            b.stats.clone(),
            limit,
        );
    }
    let built = built(args, b, names, producer, source, Some(status));
    holding(runtime, built)
}

/// A cluster's mount, holding its control runtime; a mount that could not be built gives the
/// runtime its grace at once.
fn holding(
    runtime: tokio::runtime::Runtime,
    built: Result<Built<ClusterSource>, UserError>,
) -> Result<Wired, UserError> {
    match built {
        Ok(built) => Ok(Wired::Cluster(Built {
            runtime: Some(runtime),
            ..built
        })),
        Err(e) => {
            runtime.shutdown_timeout(RUNTIME_GRACE);
            Err(e)
        }
    }
}

/// How long a cluster's control runtime is given to stop once its mount ends.
pub(super) const RUNTIME_GRACE: Duration = Duration::from_secs(1);

/// The runtime of the control port, gossip and publishes. One worker: it only answers locator
/// RPCs and sends publishes (pulls run on the threads that need the bytes), and a second worker
/// mostly costs wake-ups to steal work.
pub(crate) fn control_runtime() -> Result<tokio::runtime::Runtime, UserError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()
        .map_err(|source| UserError::Start {
            what: "tokio runtime",
            source,
        })
}

/// The data planes chunks move through (`--data-plane`): the readers', and one for background
/// copies (`--replicate`, ours or a peer's) whose UCX progress thread has the lowest CPU
/// priority.
pub(crate) fn data_planes(
    args: &MountConfig,
    stats: &Stats,
) -> Result<(Arc<DataPlane>, Arc<DataPlane>), UserError> {
    let ucx = args.cluster.data_plane.uses_ucx() && ucx_loaded(args.cluster.data_plane)?;
    stats
        .data_plane
        .store(if ucx { 2 } else { 1 }, Ordering::Relaxed);
    let tls = args
        .cluster
        .data_plane
        .ucx_tls(args.cluster.ucx_over_tcp)
        .map_err(UserError::UcxOverTcp)?;
    let plane = |slots: usize, background: bool| -> Result<Arc<DataPlane>, UserError> {
        let size = args.chunk_size as usize;
        Ok(Arc::new(DataPlane::new(ucx, slots, size, background, tls)?))
    };
    tracing::info!(
        ucx,
        "data plane: chunks by UCX RMA above --eager-max, or all inline"
    );
    Ok((plane(32, false)?, plane(4, true)?))
}

/// Whether a data plane that would use UCX can: the library is loaded now (it is linked to
/// nothing), saying which one; where none loads, `--data-plane ucx` fails the mount with where
/// it looked and `auto` moves chunks on the sealed stream.
fn ucx_loaded(kind: crate::daemon::config::DataPlaneKind) -> Result<bool, UserError> {
    match ucx_sys::load() {
        Ok(path) => {
            tracing::info!(library = %path.display(), version = %crate::transport::ucx::version(), "UCX loaded");
            Ok(true)
        }
        Err(why) if kind == crate::daemon::config::DataPlaneKind::Auto => {
            tracing::warn!("--data-plane auto: {why}; chunks move on the sealed stream");
            Ok(false)
        }
        Err(why) => Err(UserError::NoUcx(why)),
    }
}

/// What the locator does for this node: journal its names, release objects it is told to,
/// re-announce copies, check a chunk a peer found bad.
fn locator_hooks(producer: &Arc<Producer>, cache: &Arc<Cache>, journal: Arc<NamesLog>) -> Hooks {
    let (p, c, cc, cp) = (
        producer.clone(),
        cache.clone(),
        cache.clone(),
        cache.clone(),
    );
    Hooks {
        journal: Some(journal),
        on_release: Box::new(move |object, size, mtime_ns, drop| {
            p.released(object, Version { size, mtime_ns }, drop)
        }),
        holdings: Box::new(move |visit| c.visit_held(visit)),
        pages_of: Box::new(move |path, version, offset| page_map(&cp, path, version, offset)),
        on_bad_chunk: Box::new(move |path, version, offset| {
            recheck_chunk(&cc, path, version, offset)
        }),
    }
}

/// Binds the control port and serves it on `runtime`.
pub(crate) fn start_control_port(
    runtime: &tokio::runtime::Runtime,
    listen: std::net::SocketAddr,
    server: Server,
) -> Result<(), UserError> {
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(listen))
        .map_err(|source| UserError::Listen {
            addr: listen,
            source,
        })?;
    runtime.spawn(async move {
        if let Err(e) = crate::transport::server::serve(listener, server).await {
            tracing::error!(error = %e, "control server stopped");
        }
    });
    Ok(())
}

/// Gossip on the control port's address (UDP): the locator learns who is down, and re-homes
/// what a dead node was home of.
pub(crate) fn start_gossip(
    args: &MountConfig,
    id: u32,
    listen: SocketAddr,
    locator: &Arc<LocatorService>,
    secret: Option<Arc<Secret>>,
    runtime: &tokio::runtime::Handle,
) -> Result<(), UserError> {
    // A later start of this node must win over the one the others declared down.
    let incarnation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let cfg = GossipConfig {
        me: Peer {
            id,
            addr: listen,
            incarnation,
        },
        members: locator
            .membership
            .members()
            .map(|m| (m.id, m.addr))
            .collect(),
        secret,
        detect_within: args.cluster.failure_detection,
    };
    let (l, rt) = (locator.clone(), runtime.clone());
    let on_change = Box::new(move |node, down| {
        rt.spawn(l.clone().member_changed(node, down));
    });
    gossip::start(cfg, locator.liveness.clone(), on_change).map_err(|source| UserError::Listen {
        addr: listen,
        source,
    })
}

/// A node whose key no running peer accepts has the wrong one (a wrong `--secret-file`): it
/// would be refused by all, serve alone from the shared FS and be declared down by the others.
/// The mount is refused instead, naming the peers whose proofs do not check out under its key.
/// Peers that do not answer (not started yet) say nothing: this node may be the first. Asks at
/// most [`KEY_CHECKS`] of them, at once, each within the peer timeout (at most 5 s).
pub(crate) fn check_key(
    members: &Membership,
    id: u32,
    key: &Secret,
    timeout: Duration,
) -> Result<(), UserError> {
    use crate::transport::handshake::{KeyCheck, check_key};
    let others: Vec<(u32, SocketAddr)> = members
        .members()
        .filter(|m| m.id != id)
        .map(|m| (m.id, m.addr))
        .take(KEY_CHECKS)
        .collect();
    let t = timeout.min(Duration::from_secs(5));
    let answers: Vec<(u32, KeyCheck)> = std::thread::scope(|s| {
        let asked: Vec<_> = others
            .iter()
            .map(|&(n, addr)| s.spawn(move || (n, check_key(addr, key, id, t))))
            .collect();
        asked.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    if answers.iter().any(|(_, a)| *a == KeyCheck::Accepted) {
        return Ok(());
    }
    let refused: Vec<String> = answers
        .iter()
        .filter(|(_, a)| *a == KeyCheck::WrongKey)
        .map(|(n, _)| n.to_string())
        .collect();
    if refused.is_empty() {
        tracing::info!("no peer answered the key check yet: this node may be the first");
        return Ok(());
    }
    Err(UserError::WrongKey(refused.join(", ")))
}

/// The most peers a starting node asks to prove the key.
const KEY_CHECKS: usize = 16;

/// The job secret every connection proves: the key file, the rendezvous's, or none
/// (`--insecure`, said loudly).
fn job_secret(args: &MountConfig, listen: SocketAddr) -> Result<Option<Arc<Secret>>, UserError> {
    Ok(
        match (&args.cluster.secret_file, &args.cluster.rendezvous) {
            (Some(file), _) => Some(Arc::new(Secret::load(file).map_err(UserError::Secret)?)),
            (None, Some(dir)) => {
                let wait = args.cluster.peer_timeout.max(Duration::from_secs(60));
                Some(Arc::new(
                    Secret::rendezvous(dir, wait).map_err(UserError::Secret)?,
                ))
            }
            (None, None) => {
                tracing::warn!(
                    "INSECURE: no job secret (--insecure): any process that reaches {listen} can read \
                 every cached file and change the produced namespace"
                );
                None
            }
        },
    )
}
