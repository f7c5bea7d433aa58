//! Counters of one mount, and the names under which `dyadfs stats --json` reports them.
//! The key names are a contract with scripts outside the project: add keys, never rename.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde::{Deserialize, Serialize};

/// Extended attribute of the mount root through which the daemon reports its stats.
pub const STATS_XATTR: &str = "user.dyadfs.stats";
/// Reading it (on the mount's root) runs a scrub and answers its report (`dyadfs scrub`).
pub const SCRUB_XATTR: &str = "user.dyadfs.scrub";
/// The root's extended attribute `dyadfs status` reads: a [`StatusReport`] in JSON.
pub const STATUS_XATTR: &str = "user.dyadfs.status";

/// One member as this node sees it (`dyadfs status`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberStatus {
    pub id: u32,
    pub addr: String,
    pub rack: String,
    /// `self`, `up`, `suspect` (failed a call lately; not declared down) or `down` (the
    /// cluster's failure detection declared it).
    pub state: String,
    /// Complete files and bytes its cache holds (`None`: it did not answer).
    pub files: Option<u64>,
    pub bytes: Option<u64>,
}

/// The cluster as this node sees it (`dyadfs status`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusReport {
    pub node: u32,
    pub members: Vec<MemberStatus>,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub local_hits: AtomicU64,
    pub backing_fetches: AtomicU64,
    pub bytes_from_backing: AtomicU64,
    pub bytes_from_local: AtomicU64,
    pub evictions: AtomicU64,
    pub passthrough_opens: AtomicU64,
    /// GETATTRs the kernel sent: attributes it asked for again (after a passthrough read on a
    /// writable mount, or once its attribute TTL ran out).
    pub attr_requests: AtomicU64,
    pub uncached_reads: AtomicU64,
    pub checksum_failures: AtomicU64,
    /// Staged chunks pulled over UCX that failed their seal (changed in the shared slab) and
    /// were read again elsewhere.
    pub forged_chunks: AtomicU64,
    /// Produced objects no name reached any more, deleted at mount.
    pub unnamed_reclaimed: AtomicU64,
    /// Background scrubs done (`--scrub-interval`).
    pub background_scrubs: AtomicU64,
    /// Writes to the cache's file system that failed (full, over quota, read-only, a failing
    /// disk): each read concerned was served uncached.
    pub cache_write_errors: AtomicU64,
    pub peer_fetches: AtomicU64,
    pub bytes_from_peers: AtomicU64,
    pub lookups_node: AtomicU64,
    pub lookups_rack: AtomicU64,
    pub lookups_global: AtomicU64,
    /// Locator messages this node sent to other nodes (each a round trip; a batch counts once),
    /// and those it answered for other nodes.
    pub locator_calls: AtomicU64,
    pub locator_answers: AtomicU64,
    /// Holders the node tier learned from the global homes' feeds (holder hints).
    pub locator_hints: AtomicU64,
    pub coordinated_waits: AtomicU64,
    pub bytes_served_to_peers: AtomicU64,
    pub files_produced: AtomicU64,
    pub bytes_written: AtomicU64,
    pub name_waits: AtomicU64,
    /// Lookups that did not wait because their user had too many waiting already.
    pub name_waits_refused: AtomicU64,
    /// Writes and truncates refused because their uid reached `--max-staged-per-user`.
    pub quota_refusals: AtomicU64,
    /// Opens and lookups refused (EACCES) because the shared file system, asked as the caller,
    /// said no (a node service's mount: `fs::rights`).
    pub rights_denied: AtomicU64,
    pub replicated_files: AtomicU64,
    pub bytes_replicated: AtomicU64,
    /// Files (and their bytes) prefetch lists brought into the cache.
    pub prefetched_files: AtomicU64,
    pub prefetched_bytes: AtomicU64,
    /// Files pulled from a peer in a batch with others of the same holder (one connection,
    /// the requests in one write).
    pub batched_pulls: AtomicU64,
    /// Pulls a holder refused: it had not got the bytes (a copy it dropped, or pages of a
    /// partial copy it lacks, which a page map should have said).
    pub pulls_refused: AtomicU64,
    /// Listed files a prefetch left alone because its caller may not read them.
    pub prefetch_denied: AtomicU64,
    /// Listed files that were not there when the prefetch threads reached them.
    pub prefetch_missing: AtomicU64,
    /// Directory listings served from a read-ahead of a walk.
    pub dirs_read_ahead: AtomicU64,
    /// Listed entries handed to the kernel with their attributes (READDIRPLUS).
    pub listed_with_attrs: AtomicU64,
    /// Stats of the shared file system made, and those answered from memory instead (read
    /// within the metadata TTL, the kernel having forgotten the inode).
    pub backing_stats: AtomicU64,
    pub backing_stats_remembered: AtomicU64,
    /// Members the cluster declares down now (gossip), and how often this node re-homed what a
    /// dead member was home of.
    pub members_down: AtomicU64,
    pub failovers: AtomicU64,
    /// This node's id, its rank among the members' ids (sorted) and their number (set once
    /// at mount; `dyadfs warm --cluster` splits its list by them).
    pub node_id: AtomicU64,
    pub node_rank: AtomicU64,
    pub members: AtomicU64,
    /// Files this node's tables hold as a rack home and as a global home (their rows).
    pub home_rack_files: AtomicU64,
    pub home_global_files: AtomicU64,
    /// Copies this node's feed as a global home has recorded since it started (each rack's
    /// first copy of a file: what nodes read as holder hints).
    pub home_feed_copies: AtomicU64,
    /// This node's copies gained or dropped that their rack homes acknowledged (what it holds,
    /// as the locator knows it: a restarted node's count passes what it holds once all of its
    /// republish landed).
    pub copies_published: AtomicU64,
    /// Produced names this node keeps, as their directory's home or its backup.
    pub home_names: AtomicU64,
    /// Passthrough opens allowed. This and `no_open` are what the kernel agreed to at INIT,
    /// reported only: `DyadFs::kernel_offers` sets them, the core decides from its own copy.
    pub passthrough: AtomicBool,
    /// `--no-open` in effect: the kernel opens files without asking.
    pub no_open: AtomicBool,
    /// No `--backing`: DYAD's managed directory.
    pub managed: AtomicBool,
    /// How chunks move between nodes: 0 single node, 1 the sealed stream, 2 UCX.
    pub data_plane: AtomicU64,
    /// How FUSE requests arrive: 0 /dev/fuse, 1 the kernel's io_uring queues.
    pub fuse_transport: AtomicU64,
    /// Latency histograms (`mount --metrics-listen`).
    pub latency: Latencies,
}

/// What `dyadfs stats --json` prints: counters since mount, and the cache as it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Snapshot {
    pub local_hits: u64,
    pub backing_fetches: u64,
    pub bytes_from_backing: u64,
    pub bytes_from_local: u64,
    pub cached_bytes: u64,
    pub cached_files: u64,
    /// Segment files holding the packed ones (absent from a daemon older than the key: 0).
    #[serde(default)]
    pub cache_segments: u64,
    pub capacity_bytes: u64,
    pub evictions: u64,
    pub passthrough: bool,
    /// (Absent from a daemon older than the key: false.)
    #[serde(default)]
    pub no_open: bool,
    /// What the mount is: "managed" (no `--backing`: only what the job's producers write) or
    /// "dataset" (a shared-FS directory, cached). (Absent from older daemons: "".)
    #[serde(default)]
    pub kind: String,
    /// How chunks move between nodes: "none" (single node), "stream" or "ucx".
    #[serde(default)]
    pub data_plane: String,
    /// How FUSE requests arrive: "dev" (/dev/fuse) or "uring" (the kernel's io_uring queues).
    /// (Absent from older daemons: "".)
    #[serde(default)]
    pub fuse_transport: String,
    pub passthrough_opens: u64,
    /// (Absent from a daemon older than the key: 0.)
    #[serde(default)]
    pub attr_requests: u64,
    pub uncached_reads: u64,
    pub checksum_failures: u64,
    /// Staged chunks that failed their seal. (Absent from older daemons: 0.)
    #[serde(default)]
    pub forged_chunks: u64,
    /// Unnamed produced objects deleted at mount. (Absent from older daemons: 0.)
    #[serde(default)]
    pub unnamed_reclaimed: u64,
    /// Produced files this node keeps as their only copy. (Absent from older daemons: 0.)
    #[serde(default)]
    pub kept_files: u64,
    /// Chunks of large files partly cached (pages a random reader touched), each with a page
    /// table in memory (`--max-partial-chunks`). (Absent from older daemons: 0.)
    #[serde(default)]
    pub partial_chunks: u64,
    /// Background scrubs done (`--scrub-interval`). (Absent from older daemons: 0.)
    #[serde(default)]
    pub background_scrubs: u64,
    /// Writes to the cache's file system that failed (ENOSPC, EDQUOT, EROFS, EIO): fills
    /// served uncached instead, files that could not be cached, log appends. (Absent from a
    /// daemon older than the key: 0.)
    #[serde(default)]
    pub cache_write_errors: u64,
    /// The daemon's process id (to signal it).
    pub pid: u32,
    /// Files (first pull of each) and bytes pulled from other nodes' caches.
    pub peer_fetches: u64,
    pub bytes_from_peers: u64,
    /// Misses answered by this node's tier (cached answers), by its rack home, and lookups this
    /// node (as a rack home) sent to a global home.
    pub lookups_node: u64,
    pub lookups_rack: u64,
    pub lookups_global: u64,
    /// Locator round trips this node made to other nodes (a batch counts once), and those it
    /// answered for them. (Absent from older daemons: 0.)
    #[serde(default)]
    pub locator_calls: u64,
    #[serde(default)]
    pub locator_answers: u64,
    /// Holders learned from the global homes' feeds instead of asked file by file.
    #[serde(default)]
    pub locator_hints: u64,
    /// Times this node waited for another node's fetch instead of reading the backing store.
    pub coordinated_waits: u64,
    /// Bytes this node's cache served to other nodes.
    pub bytes_served_to_peers: u64,
    /// Files written under the mount and published on close, and the bytes written.
    #[serde(default)]
    pub files_produced: u64,
    #[serde(default)]
    pub bytes_written: u64,
    /// Lookups of unpublished names that waited for a producer (`--wait`).
    #[serde(default)]
    pub name_waits: u64,
    /// Lookups that answered at once because their user had too many waiting already.
    #[serde(default)]
    pub name_waits_refused: u64,
    /// Writes and truncates refused with EDQUOT: their uid reached `--max-staged-per-user`.
    #[serde(default)]
    pub quota_refusals: u64,
    /// Opens and lookups refused with EACCES by the shared file system asked as the caller (a
    /// mount the node service serves).
    #[serde(default)]
    pub rights_denied: u64,
    /// Files and bytes `--replicate` copied from other nodes (counted in `bytes_from_peers`
    /// too).
    #[serde(default)]
    pub replicated_files: u64,
    #[serde(default)]
    pub bytes_replicated: u64,
    /// Inodes the daemon holds for the kernel, and cache data files held open while idle.
    #[serde(default)]
    pub inodes: u64,
    #[serde(default)]
    pub open_files: u64,
    /// Members the cluster declares down now, and re-homings after a death (several nodes).
    #[serde(default)]
    pub members_down: u64,
    #[serde(default)]
    pub failovers: u64,
    /// This node's id, its rank among the members (sorted by id) and their number.
    #[serde(default)]
    pub node_id: u64,
    #[serde(default)]
    pub node_rank: u64,
    #[serde(default)]
    pub members: u64,
    /// Files prefetch lists brought into the cache (`dyadfs prefetch`), their bytes (counted in
    /// `bytes_from_peers` or `bytes_from_backing` too), and listed files not taken yet.
    #[serde(default)]
    pub prefetched_files: u64,
    #[serde(default)]
    pub prefetched_bytes: u64,
    /// Files pulled from a peer in a batch (see `Stats::batched_pulls`).
    #[serde(default)]
    pub batched_pulls: u64,
    /// Pulls a holder refused (see `Stats::pulls_refused`).
    #[serde(default)]
    pub pulls_refused: u64,
    #[serde(default)]
    pub prefetch_pending: u64,
    /// Listed files left alone because the list's owner may not read them.
    #[serde(default)]
    pub prefetch_denied: u64,
    /// Listed files missing when reached. (Absent from older daemons: 0.)
    #[serde(default)]
    pub prefetch_missing: u64,
    /// Directory listings a walk (`find`, `os.walk`) found read ahead by the daemon.
    #[serde(default)]
    pub dirs_read_ahead: u64,
    /// Entries a listing gave the kernel with their attributes, so a scan that stats what it
    /// lists made no lookup for them.
    #[serde(default)]
    pub listed_with_attrs: u64,
    /// Stats of the shared file system the daemon made (lookups, refreshes once the metadata
    /// TTL passed, the stat read-ahead of a scan), and those answered from memory instead:
    /// read less than the TTL before, their inode since forgotten by the kernel.
    #[serde(default)]
    pub backing_stats: u64,
    #[serde(default)]
    pub backing_stats_remembered: u64,
    /// Files this node keeps a row for as a rack home and as a global home (about 170 and 190
    /// bytes each; docs/BENCHMARKS.md, "What a locator row costs").
    #[serde(default)]
    pub home_rack_files: u64,
    #[serde(default)]
    pub home_global_files: u64,
    #[serde(default)]
    pub home_feed_copies: u64,
    #[serde(default)]
    pub copies_published: u64,
    #[serde(default)]
    pub home_names: u64,
}

/// This node's opens by where their bytes came from: its cache, a peer's, the shared file
/// system (fractions of the opens that needed a file; `dyadfs status`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HitRatios {
    pub local: f64,
    pub peer: f64,
    pub shared_fs: f64,
    pub opens: u64,
}

impl HitRatios {
    pub fn of(s: &Snapshot) -> HitRatios {
        let opens = s.local_hits + s.peer_fetches + s.backing_fetches;
        let f = |n: u64| {
            if opens == 0 {
                0.0
            } else {
                n as f64 / opens as f64
            }
        };
        HitRatios {
            local: f(s.local_hits),
            peer: f(s.peer_fetches),
            shared_fs: f(s.backing_fetches),
            opens,
        }
    }
}

impl StatusReport {
    /// The human-readable form of `dyadfs status` without `--json`.
    pub fn table(&self, hits: &HitRatios) -> String {
        let mut out = format!(
            "node {} of {} members\n{:<6} {:<10} {:<8} {:>10} {:>12}  {}\n",
            self.node,
            self.members.len(),
            "ID",
            "RACK",
            "STATE",
            "FILES",
            "BYTES",
            "ADDRESS"
        );
        for m in &self.members {
            let opt = |v: Option<u64>, f: fn(u64) -> String| v.map(f).unwrap_or("-".into());
            out += &format!(
                "{:<6} {:<10} {:<8} {:>10} {:>12}  {}\n",
                m.id,
                m.rack,
                m.state,
                opt(m.files, |v| v.to_string()),
                opt(m.bytes, short),
                m.addr
            );
        }
        out += &format!(
            "this node's opens: {:.1}% local, {:.1}% from peers, {:.1}% from the shared file \
             system ({} opens that needed a file)\n",
            100.0 * hits.local,
            100.0 * hits.peer,
            100.0 * hits.shared_fs,
            hits.opens
        );
        out
    }
}

/// Bytes in binary units, short.
pub fn short(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (bytes as f64, 0);
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The gauges a snapshot reads from the cache and the file system.
pub struct Gauges {
    pub cached_bytes: u64,
    pub cached_files: u64,
    /// Segment files the cache's packed objects live in (see `cache::segments`).
    pub cache_segments: u64,
    pub capacity_bytes: u64,
    pub inodes: u64,
    pub open_files: u64,
    pub prefetch_pending: u64,
    /// Produced files this node keeps as their only copy.
    pub kept_files: u64,
    /// Chunks partly cached, with a page table each.
    pub partial_chunks: u64,
}

impl Stats {
    pub fn snapshot(&self, g: Gauges) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let Gauges {
            cached_bytes,
            cached_files,
            cache_segments,
            capacity_bytes,
            inodes,
            open_files,
            prefetch_pending,
            kept_files,
            partial_chunks,
        } = g;
        Snapshot {
            local_hits: get(&self.local_hits),
            backing_fetches: get(&self.backing_fetches),
            bytes_from_backing: get(&self.bytes_from_backing),
            bytes_from_local: get(&self.bytes_from_local),
            cached_bytes,
            cached_files,
            cache_segments,
            capacity_bytes,
            evictions: get(&self.evictions),
            passthrough: self.passthrough.load(Ordering::Relaxed),
            no_open: self.no_open.load(Ordering::Relaxed),
            kind: if self.managed.load(Ordering::Relaxed) {
                "managed"
            } else {
                "dataset"
            }
            .into(),
            data_plane: match get(&self.data_plane) {
                1 => "stream",
                2 => "ucx",
                _ => "none",
            }
            .into(),
            fuse_transport: match get(&self.fuse_transport) {
                1 => "uring",
                _ => "dev",
            }
            .into(),
            passthrough_opens: get(&self.passthrough_opens),
            attr_requests: get(&self.attr_requests),
            uncached_reads: get(&self.uncached_reads),
            checksum_failures: get(&self.checksum_failures),
            forged_chunks: get(&self.forged_chunks),
            unnamed_reclaimed: get(&self.unnamed_reclaimed),
            kept_files,
            partial_chunks,
            background_scrubs: get(&self.background_scrubs),
            cache_write_errors: get(&self.cache_write_errors),
            pid: std::process::id(),
            peer_fetches: get(&self.peer_fetches),
            bytes_from_peers: get(&self.bytes_from_peers),
            lookups_node: get(&self.lookups_node),
            lookups_rack: get(&self.lookups_rack),
            lookups_global: get(&self.lookups_global),
            locator_calls: get(&self.locator_calls),
            locator_answers: get(&self.locator_answers),
            locator_hints: get(&self.locator_hints),
            coordinated_waits: get(&self.coordinated_waits),
            bytes_served_to_peers: get(&self.bytes_served_to_peers),
            files_produced: get(&self.files_produced),
            bytes_written: get(&self.bytes_written),
            name_waits: get(&self.name_waits),
            name_waits_refused: get(&self.name_waits_refused),
            quota_refusals: get(&self.quota_refusals),
            rights_denied: get(&self.rights_denied),
            replicated_files: get(&self.replicated_files),
            bytes_replicated: get(&self.bytes_replicated),
            inodes,
            open_files,
            members_down: get(&self.members_down),
            failovers: get(&self.failovers),
            node_id: get(&self.node_id),
            node_rank: get(&self.node_rank),
            members: get(&self.members).max(1),
            prefetched_files: get(&self.prefetched_files),
            prefetched_bytes: get(&self.prefetched_bytes),
            batched_pulls: get(&self.batched_pulls),
            pulls_refused: get(&self.pulls_refused),
            prefetch_pending,
            prefetch_denied: get(&self.prefetch_denied),
            prefetch_missing: get(&self.prefetch_missing),
            dirs_read_ahead: get(&self.dirs_read_ahead),
            listed_with_attrs: get(&self.listed_with_attrs),
            backing_stats: get(&self.backing_stats),
            backing_stats_remembered: get(&self.backing_stats_remembered),
            home_rack_files: get(&self.home_rack_files),
            home_global_files: get(&self.home_global_files),
            home_feed_copies: get(&self.home_feed_copies),
            copies_published: get(&self.copies_published),
            home_names: get(&self.home_names),
        }
    }
}

impl Snapshot {
    /// The human-readable form of `dyadfs stats` without `--json`.
    pub fn table(&self) -> String {
        let rows: [(&str, String); 65] = [
            ("kind", self.kind.clone()),
            ("data plane", self.data_plane.clone()),
            ("fuse transport", self.fuse_transport.clone()),
            ("local hits", self.local_hits.to_string()),
            ("passthrough opens", self.passthrough_opens.to_string()),
            ("backing fetches", self.backing_fetches.to_string()),
            ("bytes from backing", human(self.bytes_from_backing)),
            ("bytes from local", human(self.bytes_from_local)),
            ("peer fetches", self.peer_fetches.to_string()),
            ("bytes from peers", human(self.bytes_from_peers)),
            ("lookups node", self.lookups_node.to_string()),
            ("lookups rack", self.lookups_rack.to_string()),
            ("lookups global", self.lookups_global.to_string()),
            ("locator calls", self.locator_calls.to_string()),
            ("locator answers", self.locator_answers.to_string()),
            ("locator hints", self.locator_hints.to_string()),
            ("coordinated waits", self.coordinated_waits.to_string()),
            ("bytes served to peers", human(self.bytes_served_to_peers)),
            ("files produced", self.files_produced.to_string()),
            ("bytes written", human(self.bytes_written)),
            ("name waits", self.name_waits.to_string()),
            ("name waits refused", self.name_waits_refused.to_string()),
            ("quota refusals", self.quota_refusals.to_string()),
            ("rights denied", self.rights_denied.to_string()),
            ("replicated files", self.replicated_files.to_string()),
            ("bytes replicated", human(self.bytes_replicated)),
            ("prefetched files", self.prefetched_files.to_string()),
            ("prefetched bytes", human(self.prefetched_bytes)),
            ("batched pulls", self.batched_pulls.to_string()),
            ("pulls refused", self.pulls_refused.to_string()),
            ("prefetch pending", self.prefetch_pending.to_string()),
            ("prefetch denied", self.prefetch_denied.to_string()),
            ("prefetch missing", self.prefetch_missing.to_string()),
            ("dirs read ahead", self.dirs_read_ahead.to_string()),
            ("listed with attributes", self.listed_with_attrs.to_string()),
            ("backing stats", self.backing_stats.to_string()),
            (
                "backing stats remembered",
                self.backing_stats_remembered.to_string(),
            ),
            ("uncached reads", self.uncached_reads.to_string()),
            ("attribute requests", self.attr_requests.to_string()),
            ("cached bytes", human(self.cached_bytes)),
            ("cached files", self.cached_files.to_string()),
            ("cache segments", self.cache_segments.to_string()),
            ("capacity", human(self.capacity_bytes)),
            ("evictions", self.evictions.to_string()),
            ("checksum failures", self.checksum_failures.to_string()),
            ("forged chunks dropped", self.forged_chunks.to_string()),
            (
                "unnamed objects reclaimed",
                self.unnamed_reclaimed.to_string(),
            ),
            ("produced files kept here", self.kept_files.to_string()),
            ("chunks partly cached", self.partial_chunks.to_string()),
            ("background scrubs", self.background_scrubs.to_string()),
            ("cache write errors", self.cache_write_errors.to_string()),
            ("inodes", self.inodes.to_string()),
            ("open cache files", self.open_files.to_string()),
            ("members down", self.members_down.to_string()),
            ("failovers", self.failovers.to_string()),
            ("passthrough", self.passthrough.to_string()),
            ("no-open", self.no_open.to_string()),
            ("daemon pid", self.pid.to_string()),
            ("node id", self.node_id.to_string()),
            ("members", self.members.to_string()),
            ("home rack files", self.home_rack_files.to_string()),
            ("home global files", self.home_global_files.to_string()),
            ("home feed copies", self.home_feed_copies.to_string()),
            ("copies published", self.copies_published.to_string()),
            ("home names", self.home_names.to_string()),
        ];
        // One column for the values, however long the longest label is.
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:<width$} {v}\n"))
            .collect()
    }
}

/// Bytes in binary units with the exact count (`dyadfs stats`' table).
/// `n` things, in the singular for one: "1 file", "2 files".
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub fn human(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{} ({bytes})", short(bytes))
    }
}

type Histograms = Family<Vec<(String, String)>, Histogram, fn() -> Histogram>;

/// 50 us .. ~6.7 s in 18 doublings.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 18))
}

/// Latency histograms, observed where the work happens and exported by the metrics endpoint:
/// opens, chunk fills by source (`peer`, `shared_fs`) and locator lookups by tier (`rack`,
/// `global`).
#[derive(Debug, Clone)]
pub struct Latencies {
    pub open: Histogram,
    pub fill: Histograms,
    pub lookup: Histograms,
    /// The families' series of the labels every daemon uses, taken once: finding a series by
    /// its labels costs three allocations, a hash and a lock, on every fill and every locate.
    known: [(&'static str, &'static str, Histogram); 4],
}

impl Default for Latencies {
    fn default() -> Self {
        let fill: Histograms = Family::new_with_constructor(buckets);
        let lookup: Histograms = Family::new_with_constructor(buckets);
        let series = |family: &Histograms, key: &'static str, value: &'static str| {
            (
                key,
                value,
                family.get_or_create(&labels(key, value)).clone(),
            )
        };
        Latencies {
            open: buckets(),
            known: [
                series(&fill, "source", "peer"),
                series(&fill, "source", "shared_fs"),
                series(&lookup, "tier", "rack"),
                series(&lookup, "tier", "global"),
            ],
            fill,
            lookup,
        }
    }
}

fn labels(key: &str, value: &str) -> Vec<(String, String)> {
    vec![(key.into(), value.into())]
}

impl Latencies {
    /// A chunk run filled from `source` (`peer` or `shared_fs`) since `start`.
    pub fn fill(&self, source: &str, start: Instant) {
        self.observe(&self.fill, "source", source, start);
    }

    /// A locator question answered by `tier` (`rack` or `global`) since `start`.
    pub fn lookup(&self, tier: &str, start: Instant) {
        self.observe(&self.lookup, "tier", tier, start);
    }

    fn observe(&self, family: &Histograms, key: &str, value: &str, start: Instant) {
        let secs = start.elapsed().as_secs_f64();
        match self.known.iter().find(|(k, v, _)| *k == key && *v == value) {
            Some((_, _, h)) => h.observe(secs),
            None => family.get_or_create(&labels(key, value)).observe(secs),
        }
    }
}
