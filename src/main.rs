use std::process::ExitCode;

use clap::Parser;
use dyadfs::cli::{Cli, Command, TransportCommand};
use dyadfs::daemon::UserError;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Started as /sbin/mount.fuse.dyadfs by mount(8): SOURCE MOUNTPOINT -o OPTIONS.
    // It becomes `dyadfs mount ...` (exec'd, so the daemon it starts sees those arguments).
    if argv.first().is_some_and(dyadfs::fstab::is_helper) {
        use std::os::unix::process::CommandExt;
        let err = match dyadfs::fstab::mount_argv(&argv[1..]) {
            Ok(args) => match std::env::current_exe() {
                Ok(exe) => std::process::Command::new(exe).args(&args[1..]).exec(),
                Err(e) => e,
            },
            Err(e) => std::io::Error::other(e),
        };
        eprintln!("dyadfs: {err}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse_from(argv);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DYADFS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Mount(args) => dyadfs::daemon::mount(args.into()),
        Command::Stats(args) => dyadfs::daemon::stats(&args.mountpoint).map(|s| {
            if args.json {
                println!("{}", serde_json::to_string(&s).expect("serialize"));
            } else {
                print!("{}", s.table());
            }
        }),
        Command::Scrub(args) => dyadfs::daemon::scrub(&args.mountpoint).map(|r| {
            if args.json {
                println!("{}", serde_json::to_string(&r).expect("serialize"));
            } else {
                println!(
                    "{} files, {} chunks checked, {} bad chunks dropped, {} files unreadable",
                    r.files, r.chunks, r.dropped, r.unreadable
                );
            }
        }),
        Command::Status(args) => dyadfs::daemon::status(&args.mountpoint).map(|(r, s)| {
            let hits = dyadfs::stats::HitRatios::of(&s);
            if args.json {
                let v = serde_json::json!({
                    "node": r.node,
                    "members": r.members,
                    "hit_ratios": hits,
                });
                println!("{v}");
            } else {
                print!("{}", r.table(&hits));
            }
        }),
        Command::Warm(args) => dyadfs::daemon::warm::warm(args.into()),
        Command::Keygen(args) => dyadfs::transport::auth::Secret::generate(&args.file)
            .map(|()| println!("wrote a new job secret to {}", args.file.display()))
            .map_err(|source| UserError::KeyFile {
                path: args.file.clone(),
                source,
            }),
        Command::Install(args) => dyadfs::fstab::install(&args.dir)
            .map(|link| println!("installed {}", link.display()))
            .map_err(|source| UserError::ToolFile {
                what: "mount helper",
                path: args.dir.join(dyadfs::fstab::HELPER_NAMES[0]),
                source,
            }),
        Command::Transport(TransportCommand::Serve(args)) => {
            dyadfs::daemon::serve_transport(args.into())
        }
        Command::Transport(TransportCommand::Pull(args)) => dyadfs::daemon::pull(args.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dyadfs: {e}");
            ExitCode::FAILURE
        }
    }
}
