//! `portico demo`: three built-in backends on loopback behind a round-robin load balancer.

use anyhow::{anyhow, Context};
use portico_testkit::Backend;

pub fn run(listen: &str, workers: &str) -> anyhow::Result<()> {
    let backends = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| Backend::start(name).with_context(|| format!("cannot start demo backend {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let endpoints: String = backends.iter().map(|b| format!("      - address: {}\n", b.addr)).collect();
    let yaml = format!(
        "workers: {workers}\nlisteners:\n  - name: demo\n    address: {listen}\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: demo\nclusters:\n  demo:\n    balancer: round_robin\n    endpoints:\n{endpoints}"
    );
    let loaded = portico_config::load_str(&yaml, "<demo>").map_err(|e| anyhow!("{e}"))?;
    eprintln!("Portico demo: load balancer on http://{listen}/ in front of:");
    for b in &backends {
        eprintln!("  {} at http://{}/", b.name, b.addr);
    }
    eprintln!("Try:  curl http://{listen}/      (again: the next backend answers)");
    eprintln!("      curl http://{listen}/echo  (what the backend received)");
    eprintln!("Stop with Ctrl-C.\n");
    crate::lifecycle::serve(loaded, None)
}
