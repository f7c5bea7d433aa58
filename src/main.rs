use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use dyadfs::cli::{Cli, Command, NodeCommand, TransportCommand};
use dyadfs::daemon::UserError;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Started as /sbin/mount.fuse.dyadfs by mount(8): SOURCE MOUNTPOINT -o OPTIONS.
    if argv.first().is_some_and(dyadfs::fstab::is_helper) {
        return exec_as_mount(&argv);
    }
    // `--version` says more than the release: the commit, the protocol, the optional parts.
    let long_version: &'static str = Box::leak(dyadfs::daemon::long_version().into_boxed_str());
    let matches = Cli::command()
        .long_version(long_version)
        .get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let trace = match trace_layer(&cli) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("dyadfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let flusher = trace.as_ref().map(|t| t.flusher());
    init_logging(trace);
    if let Some(f) = &flusher {
        f.clone().every_second();
    }
    let result = run(cli.command);
    if let Some(f) = &flusher {
        f.flush();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dyadfs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// As the mount helper: becomes `dyadfs mount ...` (exec'd, so the daemon it starts sees those
/// arguments); returns only if that fails.
fn exec_as_mount(argv: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let err = match dyadfs::fstab::mount_argv(&argv[1..]) {
        Ok(args) => match std::env::current_exe() {
            Ok(exe) => std::process::Command::new(exe).args(&args[1..]).exec(),
            Err(e) => e,
        },
        Err(e) => std::io::Error::other(e),
    };
    eprintln!("dyadfs: {err}");
    ExitCode::FAILURE
}

/// Logs to stderr at `DYADFS_LOG` (info by default), and the trace, if any, takes the daemon's
/// own spans whatever the log level.
fn init_logging(trace: Option<dyadfs::trace::TraceLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, filter::Targets};
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            EnvFilter::try_from_env("DYADFS_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        );
    // The trace takes the daemon's own spans, whatever the log level.
    let spans = Targets::new().with_target("dyadfs", tracing::Level::DEBUG);
    tracing_subscriber::registry()
        .with(log)
        .with(trace.map(|t| t.with_filter(spans)))
        .init();
}

/// Runs one command.
fn run(command: Command) -> Result<(), UserError> {
    match command {
        Command::Mount(args) => {
            let config: dyadfs::daemon::config::MountConfig = args.into();
            match dyadfs::node::client::service_for(&config) {
                Some(socket) => dyadfs::node::client::attach(&socket, &config),
                None => dyadfs::daemon::mount(config),
            }
        }
        Command::Node(command) => node(command),
        Command::Stats(args) => dyadfs::client::stats(&args.mountpoint).map(|s| {
            if args.json {
                println!("{}", serde_json::to_string(&s).expect("serialize"));
            } else {
                print!("{}", s.table());
            }
        }),
        Command::Scrub(args) => dyadfs::client::scrub(&args.mountpoint).map(|r| {
            if args.json {
                println!("{}", serde_json::to_string(&r).expect("serialize"));
            } else {
                use dyadfs::stats::counted;
                println!(
                    "{}, {} checked, {} dropped, {} unreadable",
                    counted(r.files, "file"),
                    counted(r.chunks, "chunk"),
                    counted(r.dropped, "bad chunk"),
                    counted(r.unreadable, "file"),
                );
            }
        }),
        Command::Status(args) => dyadfs::client::status(&args.mountpoint).map(|(r, s)| {
            let hits = dyadfs::stats::HitRatios::of(&s);
            if args.json {
                let v = serde_json::json!({
                    "kind": s.kind,
                    "data_plane": s.data_plane,
                    "node": r.node,
                    "members": r.members,
                    "hit_ratios": hits,
                });
                println!("{v}");
            } else {
                println!("{} mount, data plane {}", s.kind, s.data_plane);
                print!("{}", r.table(&hits));
            }
        }),
        Command::Warm(args) => dyadfs::client::warm::warm(args.into()),
        Command::Prefetch(args) => {
            let stream = args.stream.clone();
            dyadfs::client::prefetch::prefetch(args.into()).map(|q| {
                use dyadfs::stats::counted;
                println!(
                    "queued {} for prefetch (stream {stream}); {} skipped; listed files \
                     missing when reached are counted in prefetch_missing (dyadfs stats)",
                    counted(q.files, "file"),
                    counted(q.skipped, "line")
                )
            })
        }
        // A key's directory (`~/.dyadfs`) is made if missing, private like the key.
        Command::Keygen(args) => args
            .file
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
            .map_or(Ok(()), |d| {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(d)
            })
            .and_then(|()| dyadfs::transport::auth::Secret::generate(&args.file))
            .map(|()| println!("wrote a new job secret to {}", args.file.display()))
            .map_err(|source| UserError::KeyFile {
                path: args.file.clone(),
                source,
            }),
        Command::Install(args) => dyadfs::install::install(&args.dir, &args.prefix, &args.bin_dir)
            .map(|links| {
                for link in links {
                    println!("installed {}", link.display());
                }
            })
            .map_err(|source| UserError::ToolFile {
                what: "mount helper",
                path: args.dir.join(dyadfs::fstab::HELPER_NAMES[0]),
                source,
            }),
        Command::Transport(TransportCommand::Serve(args)) => {
            dyadfs::daemon::serve_transport(args.into())
        }
        Command::Transport(TransportCommand::Pull(args)) => dyadfs::daemon::pull(args.into()),
        Command::DataPlane(a) => {
            dyadfs::transport::ucx::process::run(a.slots, a.slot_size, a.background)
                .map_err(Into::into)
        }
    }
}

/// Runs one `dyadfs node` command.
fn node(command: NodeCommand) -> Result<(), UserError> {
    match command {
        NodeCommand::Serve(args) => {
            dyadfs::node::serve((*args).try_into().map_err(UserError::Node)?)
        }
        NodeCommand::Evict(args) => dyadfs::node::client::evict(&args.service.socket, &args.key)
            .map(|(files, bytes, gone)| {
                println!(
                    "evicted {files} files ({}){}",
                    dyadfs::stats::human(bytes),
                    if gone {
                        "; the dataset is gone"
                    } else {
                        "; the dataset is served: its open files stay"
                    }
                )
            }),
        NodeCommand::Status(args) => dyadfs::node::client::status(&args.service.socket).map(|s| {
            if args.json {
                println!("{}", serde_json::to_string(&s).expect("serialize"));
            } else {
                print!("{}", s.table());
            }
        }),
    }
}

/// The trace of a serving daemon (`mount --trace`, in the process that stays in the
/// foreground: not the parent that only starts it).
fn trace_layer(cli: &Cli) -> Result<Option<dyadfs::trace::TraceLayer>, std::io::Error> {
    match &cli.command {
        // The process that starts the daemon checks the file first, so a refusal is its answer
        // (the daemon's own start would only say that it died).
        Command::Mount(a) if !a.foreground => {
            if let Some(file) = &a.trace {
                dyadfs::sys::private::open_private(file, true).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("trace file {}: {e}", file.display()))
                })?;
            }
            Ok(None)
        }
        Command::Mount(a) if a.foreground => match &a.trace {
            Some(file) => {
                let node = a
                    .node_id
                    .or_else(|| dyadfs::locator::membership::node_id_from_launcher().map(|l| l.1))
                    .unwrap_or(0);
                dyadfs::trace::TraceLayer::create(file, node).map(Some)
            }
            None => Ok(None),
        },
        _ => Ok(None),
    }
}
