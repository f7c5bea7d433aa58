//! `dyadfs transport serve|pull`: the data plane as standalone processes, for tests,
//! diagnostics and the benchmark against ucx_perftest.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use super::UserError;
use super::config::{PullToolConfig, ServeConfig, UcxConfig};
use crate::transport::plane::DataPlane;
use crate::transport::pull::{self, PullConfig};
use crate::transport::server::{self, DirStore, Faults};

fn runtime() -> Result<tokio::runtime::Runtime, UserError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| UserError::Start {
            what: "tokio runtime",
            source,
        })
}

fn worker(u: &UcxConfig) -> Result<Arc<DataPlane>, UserError> {
    let (slots, size) = (u.slots as usize, u.slot_size as usize);
    Ok(Arc::new(DataPlane::new(
        u.data_plane.uses_ucx(),
        slots,
        size,
        false,
        // A measuring tool: UCX's transports are what the caller's UCX_TLS says.
        None,
    )?))
}

pub fn serve(args: ServeConfig) -> Result<(), UserError> {
    let w = worker(&args.ucx)?;
    let rt = runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|source| UserError::Listen {
                addr: args.listen,
                source,
            })?;
        // Scripts wait for this line before pulling.
        println!("serving {} on {}", args.root.display(), args.listen);
        let store = Arc::new(DirStore { root: args.root });
        let faults = Faults {
            corrupt: args.corrupt,
        };
        let server = server::Server {
            worker: w,
            background: None,
            store,
            node_id: args.ucx.node_id,
            faults,
            rpc: None,
            secret: None,
            conns: Default::default(),
            pending: Default::default(),
            members: Default::default(),
            serving: server::Serving::new(64),
        };
        server::serve(listener, server)
            .await
            .map_err(|source| UserError::Start {
                what: "control server",
                source,
            })
    })
}

pub fn pull(args: PullToolConfig) -> Result<(), UserError> {
    let file = |what, path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| UserError::ToolFile { what, path, source }
    };
    let meta =
        std::fs::metadata(&args.version_of).map_err(file("--version-of", &args.version_of))?;
    let version = crate::core::version_of(&meta);
    let len = args.len.unwrap_or(version.size.saturating_sub(args.offset));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&args.out)
        .map_err(file("--out", &args.out))?;
    out.set_len(version.size)
        .map_err(file("--out", &args.out))?;
    let w = worker(&args.ucx)?;
    let cfg = PullConfig {
        node_id: args.ucx.node_id,
        chunk: args.ucx.slot_size as u32,
        window: args.window as usize,
        timeout: args.ucx.timeout,
        background: false,
        secret: None,
        eager_max: args.eager_max.min(args.ucx.slot_size) as u32,
    };
    let start = Instant::now();
    let mut sink = |off: u64, bytes: &[u8], _crc: u32| out.write_all_at(bytes, off);
    let puller = pull::Puller::new(w, cfg);
    let n = puller.pull(
        args.peer,
        &pull::Want {
            path: args.path.clone(),
            version,
            offset: args.offset,
            len,
        },
        &mut sink,
    )?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "pulled {n} bytes in {secs:.3} s: {:.1} MB/s",
        n as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}
