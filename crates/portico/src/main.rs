//! The `portico` command: parses the command line and wires the planes together.

mod admin_client;
mod demo;
mod demo_backend;
mod demo_certs;
mod lifecycle;
mod logging;
mod mqtt;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The release and the commit it was built from: the first line of `portico --version`, and the `version` of
/// `GET /admin/process` (so an upgrade between two builds of one release shows which one serves).
macro_rules! release {
    () => {
        concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("PORTICO_GIT_COMMIT"), ")")
    };
}
const RELEASE: &str = release!();

/// `portico --version`: the release, the commit it was built from, and what this build can do.
const VERSION: &str = concat!(
    release!(),
    "\nfeatures: http1, http2 (clients and upstreams), tls (rustls, ring), mtls, websocket, grpc, pipelining, mqtt (3.1, 3.1.1, 5.0)"
);

#[derive(Parser)]
#[command(
    name = "portico",
    version = VERSION,
    about = "Portico: an edge gateway that load-balances and proxies HTTP",
    long_about = "Portico: an edge gateway that load-balances and proxies HTTP.\n\n\
                  Start with `portico demo`, then `curl http://127.0.0.1:8080/`.\n\
                  Configuration reference: docs/configuration.md",
    after_help = "Examples:\n  portico demo\n  portico check -c portico.yaml\n  portico run -c portico.yaml\n  portico upgrade -c portico.yaml"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the gateway with a configuration file.
    Run {
        /// The YAML configuration file.
        #[arg(short, long, value_name = "FILE", default_value = "portico.yaml")]
        config: PathBuf,
    },
    /// Validate a configuration file: exit 0 when valid, 1 with every error as FILE:LINE:COL otherwise.
    ///
    /// When valid, also lists what a reload would change (listeners, routes, clusters, endpoints) compared with
    /// the running Portico at the file's admin address, if one answers there, or with --against.
    Check {
        #[arg(short, long, value_name = "FILE", default_value = "portico.yaml")]
        config: PathBuf,
        /// Compare with this configuration file, or a running Portico's admin API (http://IP:PORT).
        #[arg(long, value_name = "FILE|URL")]
        against: Option<String>,
    },
    /// Upgrade the running Portico to the binary now on disk without dropping a connection (like SIGUSR2),
    /// through its admin API, and wait until the new process serves.
    Upgrade {
        #[arg(short, long, value_name = "FILE", default_value = "portico.yaml")]
        config: PathBuf,
        /// The admin API to ask (default: the `admin:` address in the configuration).
        #[arg(long, value_name = "URL")]
        admin: Option<String>,
    },
    /// Start three built-in demo backends behind a round-robin load balancer, ready for curl, and an MQTT
    /// broker, ready for an MQTT client; or, with
    /// `--config`, a configuration of yours (an example) with stand-in backends on its loopback endpoints.
    Demo {
        /// Where the load balancer listens.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        listen: String,
        /// Worker threads (`auto`: one per core).
        #[arg(long, default_value = "auto")]
        workers: String,
        /// Where the admin API listens (`/metrics`, `/admin/clusters`, ...); `off` for none.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9901")]
        admin: String,
        /// Where the MQTT broker listens (try mosquitto_sub / mosquitto_pub); `off` for none.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:1883")]
        mqtt: String,
        /// Serve this configuration instead, with a demo backend on each of its endpoints that is a free
        /// loopback address (plain HTTP/1): `portico demo -c examples/gateway.yaml`.
        #[arg(short, long, value_name = "FILE", conflicts_with_all = ["listen", "workers", "admin", "mqtt"])]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The planes beside HTTP that routes can name: `function:` targets.
    portico_http::handler::register_functions(Box::new(portico_functions::Plane));
    let result = match cli.command {
        Command::Run { config } => lifecycle::run_file(&config),
        Command::Check { config, against } => return lifecycle::check(&config, against.as_deref()),
        Command::Upgrade { config, admin } => lifecycle::upgrade(&config, admin.as_deref()),
        Command::Demo { config: Some(config), .. } => demo::run_config(&config),
        Command::Demo { listen, workers, admin, mqtt, config: None } => demo::run(&listen, &workers, &admin, &mqtt),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portico: {e:#}");
            ExitCode::FAILURE
        }
    }
}
