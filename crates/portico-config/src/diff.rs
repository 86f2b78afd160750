//! What changes between two configurations, as an operator reads it before a reload: listeners, routes,
//! clusters and endpoints added, removed or changed.

use crate::schema::Config;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One difference, shown as a line by `portico check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added {
        kind: &'static str,
        name: String,
    },
    Removed {
        kind: &'static str,
        name: String,
    },
    /// A listener keeps its name but not its address: applied only by a restart.
    ListenerMoved {
        name: String,
        from: String,
        to: String,
    },
    EndpointAdded {
        cluster: String,
        address: String,
    },
    EndpointRemoved {
        cluster: String,
        address: String,
    },
    /// Some other setting of a cluster or route differs.
    Changed {
        kind: &'static str,
        name: String,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Added { kind, name } => write!(f, "+ {kind} {name}"),
            Change::Removed { kind, name } => write!(f, "- {kind} {name}"),
            Change::ListenerMoved { name, from, to } => {
                write!(f, "! listener {name}: {from} -> {to} (moved by a reload; with worker processes, by a restart)")
            }
            Change::EndpointAdded { cluster, address } => write!(f, "+ endpoint {address} in cluster {cluster}"),
            Change::EndpointRemoved { cluster, address } => write!(f, "- endpoint {address} in cluster {cluster}"),
            Change::Changed { kind, name } => write!(f, "~ {kind} {name}: settings changed"),
        }
    }
}

/// Each route's settings by its name (the router's name for it, so a route added above another does not make
/// the other look changed).
fn route_names(cfg: &Config) -> BTreeMap<String, String> {
    crate::route::route_names(&cfg.routes).into_iter().zip(cfg.routes.iter().map(|r| format!("{r:?}"))).collect()
}

/// The differences from `old` to `new`, in a stable order.
pub fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let mut out = Vec::new();
    let old_listeners: BTreeMap<&str, &str> =
        old.listeners.iter().map(|l| (l.name.as_str(), l.address.as_str())).collect();
    let new_listeners: BTreeMap<&str, &str> =
        new.listeners.iter().map(|l| (l.name.as_str(), l.address.as_str())).collect();
    for (name, address) in &new_listeners {
        match old_listeners.get(name) {
            None => out.push(Change::Added { kind: "listener", name: name.to_string() }),
            Some(before) if before != address => out.push(Change::ListenerMoved {
                name: name.to_string(),
                from: before.to_string(),
                to: address.to_string(),
            }),
            Some(_) => {}
        }
    }
    for name in old_listeners.keys().filter(|n| !new_listeners.contains_key(*n)) {
        out.push(Change::Removed { kind: "listener", name: name.to_string() });
    }

    let (old_routes, new_routes) = (route_names(old), route_names(new));
    for (name, text) in &new_routes {
        match old_routes.get(name) {
            None => out.push(Change::Added { kind: "route", name: name.clone() }),
            Some(before) if before != text => out.push(Change::Changed { kind: "route", name: name.clone() }),
            Some(_) => {}
        }
    }
    for name in old_routes.keys().filter(|n| !new_routes.contains_key(*n)) {
        out.push(Change::Removed { kind: "route", name: name.clone() });
    }

    for (name, cluster) in &new.clusters {
        let Some(before) = old.clusters.get(name) else {
            out.push(Change::Added { kind: "cluster", name: name.clone() });
            continue;
        };
        let addresses =
            |c: &crate::schema::Cluster| c.endpoints.iter().map(|e| e.address.clone()).collect::<BTreeSet<_>>();
        let (was, is) = (addresses(before), addresses(cluster));
        for address in is.difference(&was) {
            out.push(Change::EndpointAdded { cluster: name.clone(), address: address.clone() });
        }
        for address in was.difference(&is) {
            out.push(Change::EndpointRemoved { cluster: name.clone(), address: address.clone() });
        }
        // Every other setting, and the weights of the endpoints that stay, compared as a whole.
        if settings(before) != settings(cluster) || !same_weights(before, cluster) {
            out.push(Change::Changed { kind: "cluster", name: name.clone() });
        }
    }
    for name in old.clusters.keys().filter(|n| !new.clusters.contains_key(*n)) {
        out.push(Change::Removed { kind: "cluster", name: name.clone() });
    }
    out
}

/// A cluster's settings without its endpoints.
fn settings(c: &crate::schema::Cluster) -> String {
    let mut c = c.clone();
    c.endpoints.clear();
    format!("{c:?}")
}

/// The endpoints present in both have the same weights.
fn same_weights(a: &crate::schema::Cluster, b: &crate::schema::Cluster) -> bool {
    let weights = |c: &crate::schema::Cluster| {
        c.endpoints.iter().map(|e| (e.address.clone(), e.weight)).collect::<BTreeMap<_, _>>()
    };
    let (wa, wb) = (weights(a), weights(b));
    wa.iter().all(|(addr, w)| wb.get(addr).is_none_or(|v| v == w))
}
