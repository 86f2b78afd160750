//! What a process sets up about itself before it serves: the user it runs as and how many files it may open.

/// `user:` (and `group:`): once the sockets are bound and the logs open, a process started as root goes on as
/// that user, so a bug cannot use root's rights. Reloads then read the configuration and certificates as that
/// user.
pub fn drop_privileges(config: &portico_config::Config) -> std::io::Result<()> {
    let Some(user) = &config.user else { return Ok(()) };
    if !privdrop_needed() {
        tracing::warn!(user, "`user` is set but Portico was not started as root: it keeps running as it is");
        return Ok(());
    }
    let mut drop = privdrop::PrivDrop::default().user(user);
    if let Some(group) = &config.group {
        drop = drop.group(group);
    }
    drop.apply()
        .map_err(|e| std::io::Error::other(format!("cannot switch to user {user:?}; check that it exists: {e}")))?;
    tracing::info!(user, "running as {user}");
    Ok(())
}

fn privdrop_needed() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Descriptors kept out of the derived connection limits: upstream connections beyond one per client,
/// listeners, the access log, TLS files.
const RESERVED_DESCRIPTORS: u64 = 1024;

/// The connection limit of a listener without `limits.max_connections`: half the open files the process may
/// have, less a reserve (a client connection usually needs an upstream one too), shared by the `deriving`
/// listeners that derive theirs; at least 256.
pub fn derived_connection_limit(deriving: usize) -> usize {
    let open_files = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(RESERVED_DESCRIPTORS * 2, |(soft, _)| soft);
    let share = open_files.saturating_sub(RESERVED_DESCRIPTORS) / 2 / deriving.max(1) as u64;
    usize::try_from(share).unwrap_or(usize::MAX).max(256)
}

/// Raises the soft limit on open files to the hard limit, says what connection limit each listener has, and
/// warns when the open files are below what the configured limits need (a descriptor per client connection,
/// plus pooled upstream connections).
pub fn raise_fd_limit(loaded: &portico_config::LoadedConfig, warn: bool) {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!("cannot read or raise the open-file limit: {e}");
            return;
        }
    };
    let listeners = &loaded.config.listeners;
    let deriving = listeners.iter().filter(|l| l.limits.max_connections.is_none()).count();
    // Worker processes raise their own limit; their master has reported once for all of them.
    if warn {
        for l in listeners {
            match l.limits.max_connections {
                Some(n) => {
                    tracing::info!(listener = %l.name, "at most {n} client connections (limits.max_connections)")
                }
                None => tracing::info!(
                    listener = %l.name,
                    "at most {} client connections (derived from the open-file limit {limit}; set \
                     limits.max_connections to choose)",
                    derived_connection_limit(deriving)
                ),
            }
        }
    }
    let connections: u64 = listeners.iter().filter_map(|l| l.limits.max_connections).map(|n| n as u64).sum();
    // Upstream connections are pooled and usually far fewer than client connections: a margin, not a double.
    let needed = connections.saturating_add(RESERVED_DESCRIPTORS);
    if limit < needed && warn {
        tracing::warn!(
            "the open-file limit is {limit}, but the listeners allow {connections} client connections, which with \
             upstream connections need about {needed} descriptors; raise the hard limit (LimitNOFILE= in the \
             systemd unit, or `ulimit -Hn` as root) or lower limits.max_connections. Past the limit, new \
             connections wait in the kernel's queue"
        );
    }
}
