//! Start-up, signals, reload (SIGHUP, the admin API, file watching) and graceful shutdown.

use anyhow::{anyhow, Context};
use arc_swap::ArcSwap;
use portico_admin::{AdminState, ReloadStatus};
use portico_config::LoadedConfig;
use portico_core::access_log::AccessLogSink;
use portico_core::listeners::{bind_per_worker, lock, ListenerPlan, WorkerSockets};
use portico_core::supervisor::{Supervisor, Workers};
use portico_core::watch::watched_stamps;
use portico_core::worker::{BoundListener, Plane};
use portico_http::plane::HttpPlane;
use portico_http::{Registry, Snapshot};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// `portico upgrade`: asks the running Portico (at the configuration's admin address, or `admin`) for a
/// zero-downtime upgrade to the binary now on disk, and waits until the new process answers.
pub fn upgrade(config: &Path, admin: Option<&str>) -> anyhow::Result<()> {
    // The admin token, when the file configures one: an upgrade changes state.
    let mut token = None;
    let url = match admin {
        Some(url) => {
            if let Ok(loaded) = portico_config::load_file(config) {
                token = loaded.config.admin.as_ref().and_then(|a| a.read_token(&loaded).ok().flatten());
            }
            url.to_string()
        }
        None => {
            let loaded = portico_config::load_file(config).map_err(|e| anyhow!("invalid configuration\n{e}"))?;
            let admin = loaded.config.admin.as_ref().ok_or_else(|| {
                anyhow!("{} has no `admin:` address; give --admin http://IP:PORT, or send SIGUSR2", config.display())
            })?;
            token = admin.read_token(&loaded).map_err(|e| anyhow!("{e}"))?;
            format!("http://{}", admin.address)
        }
    };
    let addr = crate::admin_client::address(&url)?;
    let pid_of = |json: &serde_json::Value| json["pid"].as_u64();
    let (_, before) = crate::admin_client::json(addr, "GET", "/admin/process")?
        .ok_or_else(|| anyhow!("no Portico answers at {url}"))?;
    let old = pid_of(&before).ok_or_else(|| anyhow!("{url}/admin/process did not give a pid"))?;
    match crate::admin_client::json_with_token(addr, "POST", "/admin/upgrade", token.as_deref())? {
        Some((202, _)) => {}
        Some((status, body)) => return Err(anyhow!("the upgrade was refused ({status}): {}", body["error"])),
        None => return Err(anyhow!("no Portico answers at {url}")),
    }
    // The old process answers on the shared admin socket until it has drained: wait for the new one.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < deadline {
        if let Ok(Some((_, now))) = crate::admin_client::json(addr, "GET", "/admin/process") {
            if let Some(new) = pid_of(&now).filter(|&pid| pid != old) {
                println!("upgraded: pid {old} -> {new} (version {})", now["version"].as_str().unwrap_or("?"));
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(anyhow!("pid {old} still answers after 40 s: the new process did not take over (see the log)"))
}

/// `portico check`: prints every problem as FILE:LINE:COL and exits 1, or says the file is valid and what a
/// reload would change compared with `against` (a file, or a running Portico's admin URL; by default the admin
/// address in the file, when something answers there).
pub fn check(path: &Path, against: Option<&str>) -> ExitCode {
    let result = portico_http::build_checked(portico_config::check_file(path), &Registry::new(1));
    match result {
        Ok(snapshot) => {
            let loaded = snapshot.source.clone();
            println!(
                "{}: valid ({} listener(s), {} route(s), {} cluster(s))",
                path.display(),
                snapshot.listeners.len(),
                loaded.config.routes.len(),
                snapshot.clusters.len()
            );
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
            for l in &snapshot.listeners {
                for c in l.tls.iter().flat_map(|t| &t.certificates) {
                    let days = (c.not_after - now) / 86_400;
                    if c.not_after < now {
                        println!("warning: {} (listener {}) expired {} day(s) ago", c.file, l.name, -days);
                    } else if days < 14 {
                        println!("warning: {} (listener {}) expires in {days} day(s)", c.file, l.name);
                    }
                }
            }
            let target = against.map(str::to_string).or_else(|| {
                loaded.config.admin.as_ref().map(|a| format!("http://{}", a.address)).filter(|_| against.is_none())
            });
            match target.map(|t| running_config(&t, against.is_some()).map(|c| (t, c))) {
                Some(Ok((from, Some(running)))) => {
                    let changes = portico_config::diff(&running, &loaded.config);
                    println!("compared with {from}:");
                    if changes.is_empty() {
                        println!("  no listener, route, cluster or endpoint changes");
                    }
                    for change in changes {
                        println!("  {change}");
                    }
                }
                Some(Ok((_, None))) | None => {}
                // The file is valid, which is what the exit status says; the comparison is extra information.
                Some(Err(e)) => {
                    eprintln!("warning: cannot compare, so what a reload would change is not listed: {e:#}")
                }
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

/// The configuration to compare with: a file, or the one a running Portico reports on `/admin/config`.
/// `Ok(None)` when an admin address taken from the file itself does not answer (nothing is running there).
fn running_config(target: &str, asked: bool) -> anyhow::Result<Option<portico_config::Config>> {
    let Some(authority) = target.strip_prefix("http://") else {
        let text = std::fs::read_to_string(target)
            .map_err(|e| anyhow!("cannot read {target}: {e}; check the path given with --against"))?;
        let loaded = portico_config::load_str(&text, target).map_err(|e| anyhow!("{target} is invalid\n{e}"))?;
        return Ok(Some(loaded.config));
    };
    let addr = crate::admin_client::address(authority)?;
    let json = match crate::admin_client::json(addr, "GET", "/admin/config")? {
        Some((_, json)) => json,
        None if !asked => return Ok(None),
        None => return Err(anyhow!("nothing answers at {target}; check the address given with --against")),
    };
    let yaml = json["yaml"].as_str().ok_or_else(|| anyhow!("{target}/admin/config has no configuration"))?;
    let loaded = portico_config::load_str(yaml, "running configuration")
        .map_err(|e| anyhow!("the running configuration does not parse here\n{e}"))?;
    Ok(Some(loaded.config))
}

pub fn run_file(path: &Path) -> anyhow::Result<()> {
    // A worker process starts from its master's running configuration, not from a file edited since.
    let loaded = match portico_core::processes::masters_configuration() {
        Some(passed) => passed.map_err(|e| anyhow!(e))?,
        None => load_checked(path)?,
    };
    serve(loaded, Some(path.to_path_buf()))
}

/// The configuration in `path`, or every problem it has, as `portico check` lists them (with those only
/// building the snapshot finds).
pub fn load_checked(path: &Path) -> anyhow::Result<LoadedConfig> {
    let checked = portico_config::check_file(path);
    if !checked.problems.is_empty() {
        let problems = portico_http::build_checked(checked, &Registry::new(1)).err().map(|e| e.to_string());
        return Err(anyhow!("invalid configuration\n{}", problems.unwrap_or_default()));
    }
    Ok(checked.into_result()?)
}

/// Gives the worker processes the configuration text their master applied, and their new sockets.
type ForwardFn = Box<dyn Fn(&str, Option<portico_core::processes::ListenerUpdate>) -> Result<(), String> + Send + Sync>;

/// Who accepts on the listeners, and so takes a reload's listener changes.
enum Listeners {
    /// Worker threads of this process: their sockets, which reloads change.
    Threads(Arc<Mutex<WorkerSockets>>),
    /// The master's worker processes: how many, and what gives them the configuration text the master validated
    /// and applied, then their new sockets.
    Processes(usize, ForwardFn),
    /// In a worker process: its master binds the sockets and passes them.
    FromMaster,
}

/// Applies new configurations: validates fully, swaps the snapshot only when all is well, and records the
/// outcome for the log, the metrics and the admin API.
struct Reloader {
    path: PathBuf,
    shared: Arc<ArcSwap<Snapshot>>,
    registry: Arc<Registry>,
    /// The MQTT broker, which takes reloaded `mqtt.limits`.
    broker: Option<portico_mqtt::Broker>,
    admin: OnceLock<Arc<AdminState>>,
    /// One reload at a time, whatever triggered it.
    lock: Mutex<()>,
    listeners: Listeners,
    /// Notified once a reload applied a new snapshot (the health checker sleeps until then).
    reloaded: Arc<tokio::sync::Notify>,
}

impl Reloader {
    fn reload(&self, trigger: &str) -> Result<(), String> {
        self.reload_from(None, trigger)
    }

    /// Reloads from the file, or (in a worker process) from the configuration text its master applied.
    fn reload_from(&self, source: Option<&str>, trigger: &str) -> Result<(), String> {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        portico_core::systemd::reloading();
        let checked = match source {
            Some(text) => portico_config::check_str(text, &self.path.display().to_string()),
            None => portico_config::check_file(&self.path),
        };
        // For the reload history: the text tried, and what it changes compared with the running one.
        let before = self.shared.load().source.clone();
        let tried = checked.partial.as_ref().map(|l| l.source.clone());
        let result = portico_http::build_checked(checked, &self.registry).map_err(|e| e.to_string());
        // Listeners added or moved are bound before anything is applied, so an address that cannot be had
        // fails the reload and the running configuration stays.
        let result = result.and_then(|next| {
            crate::mqtt::protocol_changes(&self.shared.load().source, &next.source)?;
            crate::mqtt::mqtt_listeners_kept_with_worker_processes(&self.shared.load().source, &next.source)?;
            // The password file is read before anything is applied: one that cannot be read fails the reload.
            let auth = match &self.broker {
                Some(_) => {
                    Some(portico_mqtt::plane::auth(&next.source).map_err(|e| format!("MQTT authentication: {e}"))?)
                }
                None => None,
            };
            let plan = ListenerPlan::between(&addresses(&self.shared.load()), &addresses(&next));
            let workers = match &self.listeners {
                _ if plan.is_empty() => return Ok((next, None, auth)),
                Listeners::Threads(table) => lock(table).sockets.len(),
                Listeners::Processes(count, _) => *count,
                Listeners::FromMaster => return Ok((next, None, auth)),
            };
            let bound = plan.bind(workers)?;
            Ok((next, Some((plan, bound)), auth))
        });
        let outcome = match result {
            Ok((next, listener_changes, auth)) => {
                let current = self.shared.load();
                let (old, new) = (&current.source.config, &next.source.config);
                let startup_only = [
                    ("access_log", format!("{:?}", old.access_log) != format!("{:?}", new.access_log)),
                    ("workers", old.workers != new.workers),
                    ("admin", format!("{:?}", old.admin) != format!("{:?}", new.admin)),
                    ("watch", old.watch != new.watch),
                    ("log", old.log.level != new.log.level || old.log.format != new.log.format),
                    ("user", old.user != new.user || old.group != new.group),
                    ("process_model", old.process_model != new.process_model),
                    ("rate_limits", old.rate_limits != new.rate_limits),
                ];
                for (key, changed) in startup_only {
                    if changed {
                        tracing::warn!("`{key}` is applied at start-up; restart to change it");
                    }
                }
                if let (Some(broker), Some(auth)) = (&self.broker, auth) {
                    portico_mqtt::plane::reload(broker, old, new, auth);
                }
                let next = Arc::new(next);
                // The configuration first: a worker accepts on a listener only once its configuration has it.
                self.shared.store(next.clone());
                for (name, address) in listener_changes.iter().flat_map(|(plan, _)| &plan.start) {
                    tracing::info!(listener = %name, "listening on {address}");
                }
                for (name, address) in listener_changes.iter().flat_map(|(plan, _)| &plan.stop) {
                    tracing::info!(listener = %name, "no longer listening on {address}; its connections go on");
                }
                let mut forward_changes = None;
                match (&self.listeners, listener_changes) {
                    (Listeners::Threads(table), Some((plan, bound))) => plan.apply(bound, &mut lock(table)),
                    (_, changes) => forward_changes = changes,
                }
                next.prune_health(&self.registry);
                self.reloaded.notify_one();
                self.registry.global.reloads.fetch_add(1, Ordering::Relaxed);
                let forwarded = match &self.listeners {
                    Listeners::Processes(_, forward) => forward(&next.source.source, forward_changes),
                    _ => Ok(()),
                };
                match forwarded {
                    Ok(()) => {
                        tracing::info!(trigger, "configuration reloaded from {}", self.path.display());
                        Ok(())
                    }
                    Err(e) => {
                        self.registry.global.reload_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(trigger, "reload of {}: {e}", self.path.display());
                        Err(e)
                    }
                }
            }
            Err(errors) => {
                self.registry.global.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(trigger, "reload failed, keeping the running configuration:\n{errors}");
                Err(errors)
            }
        };
        if let Some(admin) = self.admin.get() {
            let after = self.shared.load().source.clone();
            let changes = match &outcome {
                Ok(()) => portico_config::diff(&before.config, &after.config).iter().map(|c| c.to_string()).collect(),
                Err(_) => Vec::new(),
            };
            admin.record_reload_attempt(portico_admin::Attempt {
                trigger: trigger.to_string(),
                before: Some(before.source.clone()),
                after: if outcome.is_ok() { Some(after.source.clone()) } else { tried },
                changes,
                error: outcome.as_ref().err().cloned(),
            });
        }
        portico_core::systemd::ready(if outcome.is_ok() {
            "serving (reloaded)"
        } else {
            "serving (last reload failed)"
        });
        outcome
    }
}

/// The listeners a snapshot serves, by name and address.
fn addresses(snapshot: &Snapshot) -> Vec<(&str, std::net::SocketAddr)> {
    snapshot.listeners.iter().map(|l| (l.name.as_str(), l.address)).collect()
}

/// Runs the gateway until SIGTERM or SIGINT; SIGHUP reloads `config_path` (when there is one).
///
/// Three roles share this: a single process with worker threads (the default), the master of worker processes,
/// and one of those worker processes (started by the master with its sockets and an index).
pub fn serve(loaded: LoadedConfig, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let _log_guard = crate::logging::init(&loaded.config.log);
    let worker_process = portico_core::processes::identity();
    if let Some(identity) = worker_process {
        portico_core::processes::become_worker(identity);
    }
    let master = worker_process.is_none() && loaded.config.process_model == portico_config::ProcessModel::MultiProcess;
    // The rate-limit table, before any worker and before the snapshot's filters look for it: made here, or in
    // a worker process mapped from the master's.
    portico_core::rate_table::init(worker_process.is_some(), loaded.config.rate_limits.max_keys)
        .context("cannot make the rate-limit table")?;
    // Limits and statistics are divided among all workers, whichever process runs them.
    let workers = worker_process.map_or_else(|| loaded.config.workers.resolve(), |w| w.count);
    let registry = Arc::new(Registry::new(workers));
    // First: connection limits left unset are derived from the raised open-file limit when the snapshot is built.
    portico_core::process_setup::raise_fd_limit(&loaded, worker_process.is_none());
    let snapshot = portico_http::build(&loaded, &registry).map_err(|e| anyhow!("invalid configuration\n{e}"))?;
    portico_core::panic::install_panic_hook();

    // Bind everything before starting anything, so a taken port fails start-up with a clear error.
    // Sockets passed by systemd (socket activation), by the process being upgraded, or by the master to a worker
    // process, are used for the listeners with their address.
    let inherited = portico_core::systemd::Inherited::from_env();
    let admin_addr = loaded.config.admin.as_ref().and_then(|a| a.address.parse::<std::net::SocketAddr>().ok());
    let claimed: Vec<std::net::SocketAddr> = snapshot.listeners.iter().map(|l| l.address).chain(admin_addr).collect();
    if worker_process.is_none() {
        inherited.warn_unused(&claimed);
    }
    let mut admin_socket: Option<std::net::TcpListener> = None;
    // A worker process runs one worker thread; the others bind a socket per worker.
    let slots = if worker_process.is_some() { 1 } else { workers };
    let mut per_worker = match worker_process {
        Some(_) => vec![portico_core::processes::sockets_from_master(&inherited)?],
        None => bind_per_worker(&addresses(&snapshot), &inherited, workers)?,
    };
    if master {
        crate::mqtt::only_first_worker_serves_mqtt(&loaded, &mut per_worker);
    }
    // Signals are handled from before the first connection is accepted: a SIGHUP or SIGTERM that arrives as
    // soon as the port answers must reload or drain, not kill the process.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // SIGCHLD: a master's worker process exited (what wakes it to start another; nothing polls).
    let (mut term, mut int, mut hup, mut usr1, mut usr2, mut chld) = runtime.block_on(async {
        anyhow::Ok((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
            signal(SignalKind::user_defined1())?,
            signal(SignalKind::user_defined2())?,
            signal(SignalKind::child())?,
        ))
    })?;
    if worker_process.is_some() {
        portico_core::processes::unblock_signals();
    }
    // Worker processes write the access log themselves (appending, a whole batch per write).
    let access_log = match &loaded.config.access_log {
        Some(cfg) if !master => {
            Some(AccessLogSink::start(cfg, &loaded, registry.global.clone()).context("cannot open the access log")?)
        }
        _ => None,
    };
    let listening: Vec<String> = snapshot.listeners.iter().map(|l| format!("{} ({})", l.address, l.name)).collect();
    // A worker process has no admin API (the master's covers it) and leaves watching files to the master.
    let admin_address = loaded.config.admin.as_ref().filter(|_| worker_process.is_none()).map(|a| a.address.clone());
    // Read at start-up, like the rest of `admin:` (validation has checked that it can be read).
    let admin_token = match loaded.config.admin.as_ref().filter(|_| worker_process.is_none()) {
        Some(admin) => admin.read_token(&loaded).map_err(|e| anyhow!("admin token: {e}"))?,
        None => None,
    };
    let watch = loaded.config.watch && worker_process.is_none();
    let shared = Arc::new(ArcSwap::from_pointee(snapshot));
    let http_view: Arc<dyn portico_core::view::PlaneView> =
        Arc::new(portico_http::plane::HttpView { snapshot: shared.clone(), registry: registry.clone() });
    // Every plane's metrics: HTTP's, then the functions' (for the functions the running configuration has).
    let mut views: Vec<Arc<dyn portico_core::view::PlaneView>> =
        vec![http_view.clone(), Arc::new(portico_functions::FunctionsView { running: http_view.clone() })];
    // One broker per process. With worker processes, one broker in all: the first worker process's, which
    // alone is given the MQTT listeners' sockets (see `crate::mqtt::only_first_worker_serves_mqtt`).
    let threads = loaded.config.process_model == portico_config::ProcessModel::Threads;
    let broker = match worker_process {
        _ if threads => Some(crate::mqtt::open(&loaded)?),
        Some(w) if w.index == 0 && crate::mqtt::has_mqtt_listener(&loaded) => Some(crate::mqtt::open(&loaded)?),
        _ => None,
    };
    let mqtt_listeners: Arc<dyn portico_mqtt::plane::Listeners> =
        Arc::new(crate::mqtt::SnapshotListeners(shared.clone()));
    if let Some(broker) = &broker {
        // The HTTP routes that reach the broker: in every worker thread of a process with one (worker
        // processes other than the first have none, so none of them has the bridge: it answers 503 in all).
        if threads {
            portico_http::mqtt_publish::register_mqtt_publisher(Box::new(crate::mqtt::BridgePublisher(broker.clone())));
            portico_http::websocket::register_mqtt_websocket(Box::new(crate::mqtt::WebSocketBroker(broker.clone())));
        }
        views.push(Arc::new(portico_mqtt::plane::MqttView {
            broker: broker.clone(),
            listeners: mqtt_listeners.clone(),
        }));
    }
    // Each plane serves the listeners of its own `protocol`, so their order does not matter.
    let mut planes: Vec<Arc<dyn Plane>> = Vec::new();
    if let Some(broker) = &broker {
        planes.push(Arc::new(portico_mqtt::plane::MqttPlane { broker: broker.clone(), listeners: mqtt_listeners }));
    }
    planes.push(Arc::new(HttpPlane { snapshot: shared.clone() }));
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    // Reloads change the listeners of worker threads; a worker process's come from its master.
    let worker_sockets = (!master).then(|| {
        let changes = per_worker.iter().map(|_| None).collect();
        Arc::new(Mutex::new(WorkerSockets { sockets: std::mem::take(&mut per_worker), changes }))
    });
    let mut pool = if master {
        Workers::Processes(portico_core::processes::Master::new(per_worker, registry.global.clone(), {
            let shared = shared.clone();
            Arc::new(move || shared.load().source.clone())
        }))
    } else {
        Workers::Threads(Supervisor {
            first_index: worker_process.map_or(0, |w| w.index),
            threads: Vec::with_capacity(slots),
            sockets: worker_sockets.clone().unwrap_or_default(),
            deaths: vec![(0, std::time::Instant::now(), None); slots],
            planes: planes.into(),
            shutdown: shutdown_rx.clone(),
            access_log: access_log.clone(),
            global: registry.global.clone(),
            ended: (0..slots).map(|_| Default::default()).collect(),
            exited: Default::default(),
        })
    };
    // Wakes the health checker after a reload (with no health checks configured, nothing else does).
    let reloaded = Arc::new(tokio::sync::Notify::new());
    let reloader = config_path.map(|path| {
        let listeners = match (&pool, worker_sockets.clone()) {
            (Workers::Processes(m), _) => Listeners::Processes(m.count(), Box::new(m.reloader())),
            (Workers::Threads(_), Some(table)) if worker_process.is_none() => Listeners::Threads(table),
            _ => Listeners::FromMaster,
        };
        Arc::new(Reloader {
            listeners,
            path,
            shared: shared.clone(),
            registry: registry.clone(),
            broker: broker.clone(),
            admin: OnceLock::new(),
            lock: Mutex::new(()),
            reloaded: reloaded.clone(),
        })
    });
    let admin = match admin_address {
        Some(address) => {
            let reload: Option<portico_admin::ReloadFn> = reloader.clone().map(|r| {
                let f: portico_admin::ReloadFn = Arc::new(move || r.reload("admin API"));
                f
            });
            let state = Arc::new(AdminState {
                planes: views.clone(),
                global: registry.global.clone(),
                ready: AtomicBool::new(false),
                reload,
                last_reload: Mutex::new(ReloadStatus::default()),
                // One code path for every trigger: the admin API raises the same signal an operator would.
                upgrade: Some(Arc::new(|| {
                    // SAFETY: kill(2) on our own pid with a signal this process handles.
                    match unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) } {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error().to_string()),
                    }
                })),
                workers: match &pool {
                    Workers::Processes(m) => Some(m.gatherer()),
                    Workers::Threads(_) => None,
                },
                version: crate::RELEASE,
                guard: portico_admin::auth::Guard::new(admin_token.clone()),
                dashboard: portico_admin::Dashboard::default(),
            });
            let addr = address.parse().with_context(|| format!("invalid admin address {address}"))?;
            let passed =
                inherited.sockets_for(addr).with_context(|| format!("cannot use the socket passed for {address}"))?;
            let listener = match passed.into_iter().next() {
                Some(socket) => socket,
                None => std::net::TcpListener::bind(addr).with_context(|| {
                    format!("cannot serve the admin API on {address}; is another process using it?")
                })?,
            };
            admin_socket = Some(listener.try_clone()?);
            portico_admin::serve(listener, state.clone())?;
            if let Some(r) = &reloader {
                let _ = r.admin.set(state.clone());
            }
            Some(state)
        }
        None => None,
    };
    // Every passed socket in use has its copies by now: the originals go, so that a socket whose listener a
    // reload moves or removes closes when its copies do (and one no listener uses does not wait for nothing).
    drop(inherited);

    // A worker process runs as whatever its master became.
    if worker_process.is_none() {
        portico_core::process_setup::drop_privileges(&loaded.config)?;
    }
    match &mut pool {
        Workers::Threads(supervisor) => {
            for index in 0..slots {
                let thread = supervisor.spawn(index).context("cannot start a worker thread")?;
                supervisor.threads.push(Some(thread));
            }
        }
        Workers::Processes(m) => m.start_all().context("cannot start the worker processes")?,
    }
    // The master's worker processes check health themselves (each routes by its own view).
    if !master {
        portico_http::health::spawn(shared.clone(), reloaded, shutdown_rx.clone())
            .context("cannot start the health checker")?;
    }
    if worker_process.is_some() {
        let reloader = reloader.clone();
        let trigger = format!("master, in worker process {}", worker_process.map_or(0, |w| w.index));
        let apply = move |text: &str| match &reloader {
            Some(r) => r.reload_from(Some(text), &trigger),
            None => Err("no configuration file".to_string()),
        };
        // The sockets its master passes after a reload: taken like a reload's in a process with worker threads.
        let table = worker_sockets.clone().unwrap_or_default();
        let listen = move |add: Vec<BoundListener>, stop: portico_core::processes::Stops| {
            for l in &add {
                tracing::debug!(listener = %l.name, "listening on a socket passed by the master");
            }
            lock(&table).change(0, &stop, add);
            Ok(())
        };
        let (view, all, global) = (http_view.clone(), views.clone(), registry.global.clone());
        let answer = move |verb: &str| match verb {
            "metrics" => portico_admin::render_metrics(&all, &global, true),
            "clusters" => view.admin_view("clusters").map(|v| v.to_string()).unwrap_or_default(),
            "errors" => view.admin_view("errors").map(|v| v.to_string()).unwrap_or_default(),
            // The dashboard's counters, which the master sums over its worker processes once a second.
            "sample" => {
                let mut samples = Vec::new();
                for plane in &all {
                    plane.sample(&mut samples);
                }
                serde_json::Value::from(samples.iter().map(|s| s.to_json()).collect::<Vec<_>>()).to_string()
            }
            _ => String::new(),
        };
        portico_core::processes::serve_control(answer, apply, listen).context("cannot answer the master")?;
    }
    if let Some(a) = &admin {
        a.ready.store(true, Ordering::SeqCst);
    }
    match worker_process {
        Some(w) => tracing::debug!(worker = w.index, "worker process serving"),
        None if master => tracing::info!(
            workers,
            "portico {} listening on {} (a master with {workers} worker processes)",
            env!("CARGO_PKG_VERSION"),
            listening.join(", ")
        ),
        None => tracing::info!(workers, "portico {} listening on {}", env!("CARGO_PKG_VERSION"), listening.join(", ")),
    }
    // The bound address (not the configured text), so it can be pasted into curl.
    if let Some(addr) = admin_socket.as_ref().and_then(|socket| socket.local_addr().ok()) {
        tracing::info!("admin API on http://{addr}");
    }

    portico_core::systemd::ready(&format!("serving on {}", listening.join(", ")));
    let mut handed_over = false;
    runtime.block_on(async {
        let mut watch_tick = tokio::time::interval(Duration::from_secs(1));
        let mut stamps = reloader.as_ref().map(|r| watched_stamps(&r.path, &shared.load().source));
        // A worker thread notifies this as it ends, a worker process's exit is a SIGCHLD, and a restart after
        // its back-off is a deadline: nothing here wakes up periodically unless `watch: true`.
        let exited = match &pool {
            Workers::Threads(s) => Some(s.exited.clone()),
            Workers::Processes(_) => None,
        };
        loop {
            let restart_due = pool.next_due();
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                // A worker process hands reloads and upgrades to its master (`pidof -s portico` may name a
                // worker): the master validates, then gives every worker the same configuration.
                _ = hup.recv() => match &reloader {
                    _ if worker_process.is_some() => portico_core::processes::forward_to_master(worker_process, libc::SIGHUP),
                    // Off this thread: a slow DNS answer must not hold up SIGTERM.
                    Some(r) => { let r = r.clone(); tokio::task::spawn_blocking(move || r.reload("SIGHUP")); }
                    None => tracing::warn!("SIGHUP ignored: no configuration file to reload"),
                },
                _ = async {
                    match &exited {
                        Some(exited) => exited.notified().await,
                        None => std::future::pending().await,
                    }
                } => pool.check(),
                _ = chld.recv() => pool.check(),
                _ = tokio::time::sleep_until(restart_due.unwrap_or_else(std::time::Instant::now).into()),
                    if restart_due.is_some() => pool.check(),
                _ = usr2.recv() => {
                    if worker_process.is_some() {
                        portico_core::processes::forward_to_master(worker_process, libc::SIGUSR2);
                        continue;
                    }
                    // Zero-downtime upgrade: the binary now on disk takes over the same sockets; once it says it
                    // is ready, this process drains like on SIGTERM. If it fails, this one keeps serving.
                    // Every worker's socket: each has its own queue of connections waiting to be accepted.
                    let copies = pool.sockets();
                    let mut sockets: Vec<&std::net::TcpListener> = copies.iter().collect();
                    sockets.extend(admin_socket.as_ref());
                    match portico_core::upgrade::hand_over(&sockets) {
                        Ok(pid) => {
                            tracing::info!(new_pid = pid, "upgrade: the new process is ready; draining this one");
                            handed_over = true;
                            break;
                        }
                        Err(e) => tracing::error!("upgrade failed, this process keeps serving: {e:#}"),
                    }
                }
                _ = usr1.recv() => {
                    if let Some(log) = &access_log {
                        log.reopen();
                        tracing::info!("access log reopened (SIGUSR1)");
                    }
                    if let Workers::Processes(m) = &pool {
                        m.signal_all(libc::SIGUSR1);
                    }
                }
                _ = watch_tick.tick(), if watch && reloader.is_some() => {
                    if let Some(r) = &reloader {
                        let now = Some(watched_stamps(&r.path, &shared.load().source));
                        // A certificate being replaced may be missing for a moment: wait until it is back. A
                        // changed configuration file is reloaded at once (it may name other files now).
                        let config_changed = now.as_ref().is_some_and(|n| n[0].is_some())
                            && now.as_ref().map(|n| n[0]) != stamps.as_ref().map(|s| s[0]);
                        let complete = now.iter().flatten().all(Option::is_some);
                        if now != stamps && (config_changed || complete) {
                            stamps = now;
                            let r = r.clone();
                            tokio::task::spawn_blocking(move || r.reload("file change"));
                        }
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;

    if let Some(a) = &admin {
        a.ready.store(false, Ordering::SeqCst);
    }
    // After an upgrade the service goes on in the new process: systemd must not hear that it stops.
    if !handed_over {
        portico_core::systemd::stopping();
    }
    let grace = shared.load().shutdown_grace;
    if worker_process.is_none() {
        tracing::info!("shutting down: no new connections, in-flight requests have {grace:?} to finish");
    }
    let _ = shutdown_tx.send(true);
    if handed_over || worker_process.is_some() {
        // The new process (an upgrade's, or the worker process that replaces this one) waits for the MQTT
        // store: released as soon as the MQTT connections are drained, while HTTP connections take their
        // grace period.
        if let Some(broker) = broker.clone().filter(|b| b.store().is_some()) {
            std::thread::spawn(move || match broker.close_store_when_drained(Duration::from_secs(5)) {
                true => tracing::info!("upgrade: the MQTT store is closed, for the new process"),
                false => tracing::warn!("upgrade: the MQTT store did not close in time; the new process waits"),
            });
        }
    }
    match pool {
        Workers::Processes(m) => m.stop(grace),
        Workers::Threads(supervisor) => {
            // The supervisor's copies of the listening sockets go too, so the kernel stops accepting at once.
            drop(std::mem::take(&mut lock(&supervisor.sockets).sockets));
            // Workers end on their own within the grace period; the extra second covers their last writes.
            let deadline = std::time::Instant::now() + grace + Duration::from_secs(1);
            for t in supervisor.threads.into_iter().flatten() {
                while !t.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if t.is_finished() {
                    let _ = t.join();
                }
            }
        }
    }
    // The workers flushed their access-log lines as they ended: let the writer write them before exiting.
    if let Some(log) = &access_log {
        log.finish(Duration::from_secs(2));
    }
    if worker_process.is_none() {
        tracing::info!("stopped");
    }
    Ok(())
}
