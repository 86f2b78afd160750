//! Start-up, signals, reload and graceful shutdown.

use anyhow::{anyhow, Context};
use arc_swap::ArcSwap;
use portico_config::LoadedConfig;
use portico_http::worker::{self, BoundListener};
use portico_http::HealthRegistry;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;

/// `portico check`: prints every problem as FILE:LINE:COL and exits 1, or says the file is valid.
pub fn check(path: &Path) -> ExitCode {
    match portico_config::load_file(path) {
        Ok(loaded) => match portico_http::build(&loaded, 1, &HealthRegistry::default()) {
            Ok(snapshot) => {
                println!(
                    "{}: valid ({} listener(s), {} route(s), {} cluster(s))",
                    path.display(),
                    snapshot.listeners.len(),
                    loaded.config.routes.len(),
                    snapshot.clusters.len()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

pub fn run_file(path: &Path) -> anyhow::Result<()> {
    let loaded = portico_config::load_file(path).map_err(|e| anyhow!("invalid configuration\n{e}"))?;
    serve(loaded, Some(path.to_path_buf()))
}

/// Errors go through a non-blocking writer: a slow stderr must never stall a worker.
fn init_logging(level: &str) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_target(false).try_init();
    guard
}

/// Runs the gateway until SIGTERM or SIGINT; SIGHUP reloads `config_path` (when there is one).
pub fn serve(loaded: LoadedConfig, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let _log_guard = init_logging(&loaded.config.log.level);
    let workers = loaded.config.workers.resolve();
    let health = HealthRegistry::default();
    let snapshot = portico_http::build(&loaded, workers, &health).map_err(|e| anyhow!("invalid configuration\n{e}"))?;

    // Bind everything before starting anything, so a taken port fails start-up with a clear error.
    let mut per_worker: Vec<Vec<BoundListener>> = (0..workers).map(|_| Vec::new()).collect();
    for l in &snapshot.listeners {
        for slot in per_worker.iter_mut() {
            let socket = worker::bind(l.address).with_context(|| {
                format!("cannot listen on {} (listener {:?}); is another process using it?", l.address, l.name)
            })?;
            slot.push(BoundListener { name: Arc::from(l.name.as_str()), socket });
        }
    }
    let listening: Vec<String> = snapshot.listeners.iter().map(|l| format!("{} ({})", l.address, l.name)).collect();
    let shared = Arc::new(ArcSwap::from_pointee(snapshot));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut threads = Vec::with_capacity(workers);
    for (index, listeners) in per_worker.into_iter().enumerate() {
        threads.push(
            worker::spawn(index, listeners, shared.clone(), shutdown_rx.clone())
                .context("cannot start a worker thread")?,
        );
    }
    tracing::info!(workers, "portico {} listening on {}", env!("CARGO_PKG_VERSION"), listening.join(", "));

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => {
                    if let Some(path) = &config_path {
                        reload(path, &shared, workers, &health);
                    } else {
                        tracing::warn!("SIGHUP ignored: no configuration file to reload");
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;

    let grace = shared.load().shutdown_grace;
    tracing::info!("shutting down: no new connections, in-flight requests have {grace:?} to finish");
    let _ = shutdown_tx.send(true);
    // Workers end on their own within the grace period; the extra second covers their last writes.
    let deadline = std::time::Instant::now() + grace + Duration::from_secs(1);
    for t in threads {
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Loads, validates and builds a new snapshot; swaps it in only when all of that succeeded.
fn reload(path: &Path, shared: &ArcSwap<portico_http::Snapshot>, workers: usize, health: &HealthRegistry) {
    let result = portico_config::load_file(path).and_then(|loaded| portico_http::build(&loaded, workers, health));
    match result {
        Ok(next) => {
            let current = shared.load();
            for l in &next.listeners {
                if current.listener(&l.name).is_none_or(|c| c.address != l.address) {
                    tracing::warn!(listener = %l.name, "listener addresses are bound at start-up; restart to apply {}", l.address);
                }
            }
            shared.store(Arc::new(next));
            tracing::info!("configuration reloaded from {}", path.display());
        }
        Err(errors) => {
            tracing::error!("reload failed, keeping the running configuration:\n{errors}")
        }
    }
}
